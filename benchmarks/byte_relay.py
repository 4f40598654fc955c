"""A proxy that does nothing: it forwards each request's body to the upstream and relays the reply's
bytes as they come (no parsing, no speculation, no statistics). `proxy_load.py --relay-baseline` runs
it as a third arm: what any Python proxy on the same machine costs the target alone's throughput,
so that `specapi serve`'s figures can be read against that floor as well as against the target alone.

Same stack as `specapi serve`: Starlette on uvicorn (uvloop and httptools when installed), aiohttp
upstream with pooled connections. Loopback only. `--workers N` runs N processes on the port, as
`specapi serve --workers N` does; with `--started-dir`, each writes a file there named by its process id
once it serves (how a load test knows that all of them are up).

    python benchmarks/byte_relay.py --upstream http://127.0.0.1:8001/v1 --port 8002 --api-key KEY
    python benchmarks/byte_relay.py --upstream http://127.0.0.1:8001/v1 --port 8002 --api-key KEY --workers 2
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def create_app(upstream: str, api_key: str, started_dir: str | None = None) -> Starlette:
    session: dict[str, aiohttp.ClientSession] = {}
    headers = {"authorization": f"Bearer {api_key}", "content-type": "application/json"}

    async def relay(request: Request) -> Response:
        if "client" not in session:
            session["client"] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1000))
        body = await request.body()
        reply = await session["client"].post(upstream + request.url.path.removeprefix("/v1"), data=body, headers=headers)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in reply.content.iter_any():
                    yield chunk
            finally:
                reply.release()

        kept = {name: value for name, value in reply.headers.items() if name.lower() == "content-type"}
        return StreamingResponse(chunks(), status_code=reply.status, headers=kept)

    async def ready(request: Request) -> Response:
        return JSONResponse({"status": "ready"})

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if started_dir:
            with open(os.path.join(started_dir, str(os.getpid())), "w"):
                pass
        yield
        if "client" in session:
            await session.pop("client").close()

    routes: list[Any] = [
        Route("/v1/completions", relay, methods=["POST"]),
        Route("/v1/chat/completions", relay, methods=["POST"]),
        Route("/ready", ready),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="the upstream's base URL, e.g. http://127.0.0.1:8001/v1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--api-key", required=True, help="the upstream's key")
    parser.add_argument("--workers", type=int, default=1, help="processes on the port (uvicorn's workers)")
    parser.add_argument("--started-dir", default=None, help="each process writes a file here once it serves")
    args = parser.parse_args()
    if args.workers == 1:
        uvicorn.run(create_app(args.upstream, args.api_key, args.started_dir), host="127.0.0.1", port=args.port, log_level="warning")
        return
    # Workers import the app by name: they read its settings from the environment.
    os.environ.update({"BYTE_RELAY_UPSTREAM": args.upstream, "BYTE_RELAY_KEY": args.api_key, "BYTE_RELAY_STARTED": args.started_dir or ""})
    uvicorn.run("byte_relay:app_from_environment", factory=True, app_dir=os.path.dirname(os.path.abspath(__file__)),
                host="127.0.0.1", port=args.port, log_level="warning", workers=args.workers)


def app_from_environment() -> Starlette:
    return create_app(os.environ["BYTE_RELAY_UPSTREAM"], os.environ["BYTE_RELAY_KEY"], os.environ.get("BYTE_RELAY_STARTED") or None)


if __name__ == "__main__":
    main()
