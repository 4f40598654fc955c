"""The lean HTTP layer under `RoleClient`: JSON bodies as bytes in, status, headers and bytes out.

Speculation makes two or more upstream calls where the target alone makes one, so the client's CPU
per call decides how far it scales. Measured by `benchmarks/cpu_per_call.py` on this 2-core machine
(loopback, a canned echo + logprobs body; figures in `benchmarks/README.md`): the openai SDK's
request machinery costs about 2 ms of CPU per call, raw `httpx2` about 1.7 ms, raw `aiohttp` about
0.6 ms. So the default transport is aiohttp (`AiohttpTransport`), and the SDK's types stay at the
public edges.

An injected `httpx2.AsyncClient` (`Endpoint(http_client=...)`, or the one inside an
`Endpoint(client=openai.AsyncOpenAI(...))`) is honoured as it is: `Httpx2Transport` sends through it
raw, so mock transports, respx and the simulator's in-process transport keep working.

Both raise the openai SDK's transport errors (`openai.APITimeoutError`, `openai.APIConnectionError`)
for timeouts and failed connections, as the SDK would; statuses come back as they are (the caller
turns them into the SDK's status errors). Retries, metering and error naming live in `_calls.py`.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.request import getproxies

import httpx2
import openai

__all__ = ["Reply", "Timeout", "HTTPTransport", "AiohttpTransport", "Httpx2Transport", "SSEDecoder", "dumps", "timeout_of"]


@dataclass(frozen=True)
class Timeout:
    """Seconds allowed to connect (waiting for a pooled connection included) and between reads; None: no limit."""

    connect: float | None
    read: float | None


def timeout_of(value: Any) -> Timeout:
    """A per-call timeout as the SDK takes it (seconds, an `httpx2.Timeout`, or None) in our terms."""
    if isinstance(value, Timeout):
        return value
    if isinstance(value, httpx2.Timeout):
        connect = value.connect if value.pool is None or value.connect is None else value.connect + value.pool
        return Timeout(connect=connect, read=value.read)
    if value is None:
        return Timeout(None, None)
    return Timeout(float(value), float(value))


@dataclass
class Reply:
    """A response: `body` is the whole body for `send`; for `stream`, read `chunks()` then `close()`."""

    status: int
    headers: Mapping[str, str]
    url: str
    method: str
    body: bytes = b""
    _chunks: Any = None
    _close: Any = None

    def chunks(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def read(self) -> bytes:
        """The rest of a streamed body (used to read an error status's body)."""
        parts = [part async for part in self._chunks()]
        self.body = b"".join(parts)
        return self.body

    async def close(self) -> None:
        if self._close is not None:
            close, self._close = self._close, None
            await close()

    def request(self) -> httpx2.Request:
        return httpx2.Request(self.method, self.url)

    def http_response(self) -> httpx2.Response:
        """The reply as an `httpx2.Response` (for the SDK's error classes and `with_raw_response`)."""
        return httpx2.Response(self.status, headers=list(self.headers.items()), content=self.body, request=self.request())


class HTTPTransport(Protocol):
    async def send(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: Timeout) -> Reply: ...

    async def stream(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: Timeout) -> Reply: ...

    async def aclose(self) -> None: ...


def _default(value: Any) -> Any:
    dump = getattr(value, "model_dump", None)  # pydantic models, as the SDK serialises them
    if dump is not None:
        return dump(mode="json", exclude_unset=True)
    isoformat = getattr(value, "isoformat", None)
    if isoformat is not None:
        return isoformat()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(payload: Any) -> bytes:
    """A request body as the SDK (and httpx) writes it: compact UTF-8 JSON."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_default).encode()


class SSEDecoder:
    """Server-sent events from byte chunks: yields each event's `data` (lines joined by newlines);
    `feed_raw`/`end_raw` give it as the bytes that were sent (what a JSON parser reads as well)."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[str]:
        return [event.decode("utf-8") for event in self.feed_raw(chunk)]

    def end(self) -> list[str]:
        return [event.decode("utf-8") for event in self.end_raw()]

    def feed_raw(self, chunk: bytes) -> list[bytes]:
        buffer = self._buffer + chunk if self._buffer else chunk
        if self._data or b"\r" in buffer:
            self._buffer = buffer
            return self._lines()
        # The usual stream (\n line ends, one `data: ` line per event): split at the blank lines, and
        # read line by line only an event written otherwise. A streamed chunk is one event: reading it
        # line by line took about half of the decoding's time.
        blocks = buffer.split(b"\n\n")
        self._buffer = blocks.pop()
        events: list[bytes] = []
        for block in blocks:
            if block.startswith(b"data: ") and b"\n" not in block:
                events.append(block[6:])
                continue
            for line in block.split(b"\n"):
                self._line(line, events)
            self._line(b"", events)
        return events

    def end_raw(self) -> list[bytes]:
        events = self._lines()
        if self._buffer:
            self._line(self._buffer, events)
            self._buffer = b""
        self._line(b"", events)
        return events

    def _lines(self) -> list[bytes]:
        """The events of the buffer's complete lines (any line ends), line by line."""
        events: list[bytes] = []
        while True:
            cut = _line_end(self._buffer)
            if cut is None:
                return events
            line, size = cut
            text, self._buffer = self._buffer[:line], self._buffer[line + size :]
            self._line(text, events)

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if not line:
            if self._data:
                events.append(b"\n".join(self._data))
                self._data = []
            return
        if line.startswith(b":"):
            return  # a comment (keep-alive)
        name, _, value = line.partition(b":")
        if name == b"data":
            self._data.append(value[1:] if value.startswith(b" ") else value)


def _line_end(buffer: bytes) -> tuple[int, int] | None:
    """Where the first line of `buffer` ends (\\n, \\r\\n or \\r) and the terminator's size."""
    n = buffer.find(b"\n")
    r = buffer.find(b"\r", 0, n if n != -1 else len(buffer))
    if r != -1:
        if r + 1 == len(buffer):
            return None  # a \r\n may be split across chunks
        return r, 2 if buffer[r + 1 : r + 2] == b"\n" else 1
    return None if n == -1 else (n, 1)


async def _closed_at_shutdown(session: Any) -> AsyncIterator[None]:
    """Waits, started, until its loop shuts its async generators down (`asyncio.run` does at its end,
    the sync client's loop thread on close or at exit), then closes `session`: a client the caller never
    closed ends without aiohttp's "Unclosed client session" warnings, as the SDK's clients do."""
    try:
        yield
    finally:
        if not session.closed:
            await session.close()


#: How long an idle pooled connection is kept. Servers close idle keep-alive connections after 5 s
#: (uvicorn under vLLM and SGLang, llama.cpp's server, Node); a POST sent on a connection the server
#: is closing fails with "Server disconnected" and is not retried (not idempotent), so the pool lets a
#: connection go well before then.
KEEPALIVE_S = 3.0


class AiohttpTransport:
    """aiohttp with one pooled session per event loop (made on first use, closed by `aclose`)."""

    def __init__(self, *, max_connections: int = 1000, keepalive_s: float = KEEPALIVE_S) -> None:
        self._max_connections = max_connections
        self._keepalive_s = keepalive_s
        self._session: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timeouts: dict[Timeout, Any] = {}
        #: Closes the session when its loop shuts its async generators down (see `_closed_at_shutdown`).
        self._guard: AsyncIterator[None] | None = None
        self._guard_started = False

    def _session_for_loop(self) -> Any:
        import aiohttp

        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            if self._session is not None and not self._session.closed:
                self._session.detach()  # bound to another (finished) loop: it cannot be awaited here
            connector = aiohttp.TCPConnector(limit=self._max_connections, keepalive_timeout=self._keepalive_s)
            # Honour HTTP(S)_PROXY as the SDK does; aiohttp then looks the proxy up in a thread on every
            # request (about half of its CPU per call), so only when one is set.
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=bool(getproxies()), auto_decompress=True, skip_auto_headers=("User-Agent",)
            )
            self._loop = loop
            self._guard, self._guard_started = _closed_at_shutdown(self._session), False
        return self._session

    def _timeout(self, timeout: Timeout) -> Any:
        found = self._timeouts.get(timeout)
        if found is None:
            import aiohttp

            found = self._timeouts[timeout] = aiohttp.ClientTimeout(total=None, connect=timeout.connect, sock_read=timeout.read)
        return found

    async def _open(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: Timeout) -> Any:
        import aiohttp

        session = self._session_for_loop()
        if not self._guard_started and self._guard is not None:
            self._guard_started = True
            await self._guard.__anext__()  # now the loop knows it: asyncio.run closes it at the end
        try:
            return await session.request(method, url, headers=headers, data=body, timeout=self._timeout(timeout), allow_redirects=True)
        except asyncio.TimeoutError as exc:
            raise openai.APITimeoutError(request=httpx2.Request(method, url)) from exc
        except (aiohttp.ClientError, OSError, ValueError) as exc:
            raise openai.APIConnectionError(request=httpx2.Request(method, url)) from exc

    async def send(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: Timeout) -> Reply:
        import aiohttp

        response = await self._open(method, url, headers, body, timeout)
        try:
            data = await response.read()
        except asyncio.TimeoutError as exc:
            raise openai.APITimeoutError(request=httpx2.Request(method, url)) from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise openai.APIConnectionError(request=httpx2.Request(method, url)) from exc
        finally:
            response.release()
        return Reply(response.status, response.headers, url, method, data)

    async def stream(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: Timeout) -> Reply:
        import aiohttp

        response = await self._open(method, url, headers, body, timeout)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.content.iter_any():
                    yield chunk
            except asyncio.TimeoutError as exc:
                raise openai.APITimeoutError(request=httpx2.Request(method, url)) from exc
            except (aiohttp.ClientError, OSError) as exc:
                raise openai.APIConnectionError(request=httpx2.Request(method, url)) from exc

        async def close() -> None:
            if response.content.at_eof():
                response.release()
            else:
                response.close()  # an unfinished stream cannot go back to the pool: drop the connection

        return Reply(response.status, response.headers, url, method, _chunks=chunks, _close=close)

    async def aclose(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            if self._loop is asyncio.get_running_loop():
                await session.close()
            else:
                session.detach()


class Httpx2Transport:
    """Raw calls through an `httpx2.AsyncClient` someone else owns (tests' mocks, the simulator, proxies)."""

    def __init__(self, client: httpx2.AsyncClient) -> None:
        self.client = client

    async def _send(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: Timeout, stream: bool) -> httpx2.Response:
        request = self.client.build_request(
            method, url, headers=headers, content=body, timeout=httpx2.Timeout(None, connect=timeout.connect, read=timeout.read)
        )
        try:
            return await self.client.send(request, stream=stream)
        except httpx2.TimeoutException as exc:
            raise openai.APITimeoutError(request=request) from exc
        except Exception as exc:  # the SDK makes every other failure to send a connection error
            raise openai.APIConnectionError(request=request) from exc

    async def send(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: Timeout) -> Reply:
        response = await self._send(method, url, headers, body, timeout, stream=False)
        return Reply(response.status_code, response.headers, url, method, response.content)

    async def stream(self, method: str, url: str, headers: Mapping[str, str], body: bytes | None, timeout: Timeout) -> Reply:
        response = await self._send(method, url, headers, body, timeout, stream=True)
        request = response.request

        async def chunks() -> AsyncIterator[bytes]:
            try:
                async for chunk in response.aiter_bytes():
                    yield chunk
            except httpx2.TimeoutException as exc:
                raise openai.APITimeoutError(request=request) from exc
            except httpx2.HTTPError as exc:
                raise openai.APIConnectionError(request=request) from exc

        return Reply(response.status_code, response.headers, url, method, _chunks=chunks, _close=response.aclose)

    async def aclose(self) -> None:
        pass  # not ours to close
