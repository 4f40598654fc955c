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
    """`await work`, unless the client leaves first: then cancel it, wait for it, and raise `ClientDisconnected`."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_for_disconnect(receive))
    try:
        await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
        # Let the cancelled work unwind (close its upstream connections) before going on.
        await asyncio.gather(task, watcher, return_exceptions=True)
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()
