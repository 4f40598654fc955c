"""A proxy that does nothing: it forwards each request's body to the upstream and relays the reply's
bytes as they come (no parsing, no speculation, no statistics). `proxy_load.py --relay-baseline` runs
it as a third arm: what any Python proxy on the same machine costs the target alone's throughput,
so that `specapi serve`'s figures can be read against that floor as well as against the target alone.

Same stack as `specapi serve`: Starlette on uvicorn (uvloop and httptools when installed), aiohttp
upstream with pooled connections. Loopback only.

    python benchmarks/byte_relay.py --upstream http://127.0.0.1:8001/v1 --port 8002 --api-key KEY
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


def create_app(upstream: str, api_key: str) -> Starlette:
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
    args = parser.parse_args()
    uvicorn.run(create_app(args.upstream, args.api_key), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
