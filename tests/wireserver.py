"""A tiny HTTP/1.1 server on loopback, run in the test's own event loop, answering with a handler
function and recording every request (not a test module).

    async with WireServer(handler) as server:       # handler(WireRequest) -> WireReply (sync or async)
        Endpoint(model="m", base_url=server.base_url)
        server.requests[-1].json()

It reaches specapi's default transport (aiohttp over real sockets), which mock transports cannot.
A reply may stream its body in chunks, with a pause before each, or drop the connection.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WireRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class WireReply:
    status: int = 200
    body: Any = None  # a dict/list (sent as JSON) or bytes
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[bytes] | None = None  # streamed with chunked encoding, each after `pause` seconds
    pause: float = 0.0
    delay: float = 0.0  # seconds before the headers
    drop: bool = False  # close the connection without answering


def sse(*events: Any) -> WireReply:
    """A server-sent-events reply: each event a dict (as JSON) or a string such as "[DONE]"."""
    chunks = [f"data: {e if isinstance(e, str) else json.dumps(e)}\n\n".encode() for e in events]
    return WireReply(headers={"content-type": "text/event-stream"}, chunks=chunks)


class WireServer:
    def __init__(self, handler: Callable[[WireRequest], Any]) -> None:
        self.handler = handler
        self.requests: list[WireRequest] = []
        self.connections = 0
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def base_url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aenter__(self) -> WireServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.close()
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {}
                for line in lines[1:]:
                    if ":" in line:
                        name, value = line.split(":", 1)
                        headers[name.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                request = WireRequest(method, path, headers, body)
                self.requests.append(request)
                reply = self.handler(request)
                if inspect.isawaitable(reply):
                    reply = await reply
                if reply.delay:
                    await asyncio.sleep(reply.delay)
                if reply.drop:
                    writer.close()
                    return
                await self._write(writer, reply)
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, reply: WireReply) -> None:
        headers = {k.lower(): v for k, v in reply.headers.items()}
        status = f"HTTP/1.1 {reply.status} X\r\n".encode()
        if reply.chunks is None:
            body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            headers.setdefault("content-type", "application/json")
            headers["content-length"] = str(len(body))
            writer.write(status + "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode() + b"\r\n" + body)
            await writer.drain()
            return
        headers["transfer-encoding"] = "chunked"
        writer.write(status + "".join(f"{k}: {v}\r\n" for k, v in headers.items()).encode() + b"\r\n")
        await writer.drain()
        for chunk in reply.chunks:
            if reply.pause:
                await asyncio.sleep(reply.pause)
            writer.write(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()
