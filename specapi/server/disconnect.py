"""Noticing that a client has gone, and cancelling the work done on its behalf.

An ASGI server answers `receive()` with `http.disconnect` once the client closes its connection (and,
after the request body has been read, with nothing else that matters). Racing the work against that
message turns a disconnect into a cancellation of the upstream calls, instead of tokens paid for nobody.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

__all__ = ["ClientDisconnected", "wait_for_disconnect", "run_unless_disconnected"]

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed its connection before the response was ready; the work was cancelled."""


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client has disconnected (call only after the request body has been read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def run_unless_disconnected(work: Awaitable[T], receive: Receive) -> T:
    """`await work`, unless the client leaves first: then cancel it, let it unwind (close its upstream
    connections) and raise `ClientDisconnected`.

    The work runs in the calling task, from now: only the watcher is a task of its own. Given a task
    of its own, the work would start behind every step already waiting for the event loop, and in a
    burst of 100 streams through the proxy each request's first upstream call then waited for all the
    others' handlers (cold bursts ran at 0.82x the target alone's throughput, 0.90x with the work
    started at once, medians of five: `benchmarks/README.md`)."""
    running = asyncio.current_task()
    assert running is not None, "run_unless_disconnected runs in a task"
    left = False

    async def watch() -> None:
        nonlocal left
        await wait_for_disconnect(receive)
        left = True
        running.cancel()

    watcher = asyncio.ensure_future(watch())
    try:
        return await work
    except asyncio.CancelledError:
        if not left:
            raise  # cancelled by someone else (the server shutting down): not ours to turn into an error
        uncancel = getattr(running, "uncancel", None)  # Python 3.11+: the cancellation was ours, and is handled
        if uncancel is not None:
            uncancel()
        raise ClientDisconnected() from None
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
