"""Serve a ``SimProvider`` over real HTTP: a Starlette app, and ``run_server`` to run it with uvicorn.

    run_server(host="127.0.0.1", port=8001, capabilities="vllm", latency="lan", seed=0)

is what ``specapi simulate --port 8001 --profile vllm --latency lan`` runs. Latency is real here: the
provider sleeps with ``asyncio.sleep``, less the time it spent computing the answer.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import socket
import sys
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

if TYPE_CHECKING:
    from .faults import Faults
    from .latency import LatencyProfile
    from .profiles import Capabilities
    from .provider import SimProvider

__all__ = ["create_app", "run_server", "serving_provider"]

_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers
_M_ARENA_MAX = -8
_MMAP_THRESHOLD_BYTES = 256 * 1024


def tune_malloc() -> bool:
    """Two glibc settings so a long-running simulator's heap stops growing; False where not glibc.

    * The mmap threshold, pinned at 256 KiB. glibc starts at 128 KiB and raises the threshold to the size
      of every mmapped block freed, so later arrays of that size come from the main heap instead, between
      the small long-lived arrays of the distribution memo, and the heap grows by holes it cannot hand
      back (measured in a 20,000-request soak: the heap grew 80.4 -> 85.2 MB, 2.6 MB of it free holes). A
      threshold set explicitly is never adjusted: large arrays stay mmapped and go back to the system
      when freed.
    * One malloc arena. glibc gives threads other than the main one arenas of their own (the server has
      a few: the event loop's workers and another), with holes of their own: without this setting a
      second arena held 1.2 MB, 0.8 MB of it free, after 4,000–6,000 soak requests. With one arena
      the soak's resident memory grew 0.6 MB from 6,000 to 20,000 requests instead of 1.5 MB (one
      probe run each; the Python heap itself was flat in both).

    Called before the server starts its threads (arenas already made stay).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no C library with mallopt (musl's returns 0: nothing set)
        return False
    threshold = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    arenas = mallopt(_M_ARENA_MAX, 1)
    return bool(threshold and arenas)


def create_app(provider: SimProvider) -> Starlette:
    """A Starlette app forwarding every request under ``/`` to ``provider.handle``."""

    async def endpoint(request: Request) -> Response:
        try:
            body = await request.body()
        except ClientDisconnect:
            # The client hung up (a cancelled speculative call): nothing to answer, nothing to log.
            return Response(status_code=499)
        path = request.url.path
        if request.url.query:
            path += "?" + request.url.query
        result = await provider.handle(request.method, path, body or None, dict(request.headers))
        if result.stream is not None:
            stream = result.stream

            async def chunks() -> Any:
                try:
                    async for chunk in stream:
                        yield chunk
                finally:
                    await stream.aclose()

            return StreamingResponse(chunks(), status_code=result.status, headers=result.headers)
        return Response(result.body, status_code=result.status, headers=result.headers)

    app = Starlette(routes=[Route("/{path:path}", endpoint, methods=["GET", "POST", "PUT", "DELETE"])])
    app.state.provider = provider
    return app


def serving_provider(
    *,
    capabilities: str | Capabilities = "vllm",
    latency: str | LatencyProfile = "lan",
    seed: int = 0,
    faults: Faults | None = None,
) -> SimProvider:
    """The provider ``run_server`` serves, ready before its first request.

    Two things keep a served simulator's own pauses out of what a client measures through it:

    * Once its models are built, garbage is collected and what is left frozen (``gc.freeze()``), so that
      the collector's full passes no longer walk the models' tables. Without it such a pass stopped the
      event loop, and every stream in flight, for 53-107 ms now and then (two logs); in twelve bursts of 100
      streams on the LAN profile one after another, the wall time of a burst over the next one's ranged
      0.87-1.13, against 0.98-1.02 with the heap frozen.
    * It records no calls (``max_calls=0``): nothing reads them over HTTP, and the latest 1,000, each
      with its streamed chunks, made the full passes grow again (10, 14, then 24 ms as they filled up;
      4.6-5.2 ms without them).
    """
    from .provider import SimProvider

    provider = SimProvider(
        capabilities=capabilities, latency=latency, seed=seed, faults=faults, deduct_compute_time=True, max_calls=0
    )
    provider.warm_up()
    gc.collect()
    gc.freeze()
    return provider


def run_server(
    *,
    host: str = "127.0.0.1",
    port: int = 8001,
    sock: socket.socket | None = None,
    capabilities: str | Capabilities = "vllm",
    latency: str | LatencyProfile = "lan",
    seed: int = 0,
    faults: Faults | None = None,
    log_level: str = "info",
) -> None:
    """Run a simulated provider with uvicorn until interrupted (blocks). ``sock``: already bound to
    ``host:port`` (``specapi simulate`` binds first, so that a busy port fails before the models are built)."""
    import uvicorn

    tune_malloc()
    provider = serving_provider(capabilities=capabilities, latency=latency, seed=seed, faults=faults)
    config = uvicorn.Config(create_app(provider), host=host, port=port, log_level=log_level)
    server = uvicorn.Server(config)
    server.run(sockets=[sock] if sock is not None else None)
