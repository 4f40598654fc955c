"""`with_raw_response` and `with_streaming_response`: a response's HTTP headers next to the parsed object,
as in the openai SDK.

    raw = await client.chat.completions.with_raw_response.create(messages=[...], max_tokens=64)
    raw.headers["x-request-id"]        # from the final target call
    raw.headers["x-specapi-acceptance-rate"]
    chat = raw.parse()                 # the SpeculativeChatCompletion

    async with client.chat.completions.with_streaming_response.create(messages=[...]) as response:
        chat = await response.parse()  # the async client's parse() is awaited, as the SDK's is

`headers` are those of the final call specapi made to the target, plus the `x-specapi-*` headers the
proxy sends (`SpeculativeStats.to_headers()`). For a stream, `parse()` returns the stream and the
headers are those known when it opened: speculation has not called the target yet, so only a stream
served by the target alone carries the target's headers, and no `x-specapi-*` header is set (the
statistics arrive with the stream's end, as `stream.speculative`).

`RawResponse` is an `openai`'s `LegacyAPIResponse` (what the SDK's `with_raw_response` returns, and what
libraries such as LiteLLM check for); its body was read by specapi, so `parse()` is the only way to it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Generic, TypeVar

import httpx2

from ..transport._calls import capture_target_response
from ..transport._sdk import LegacyAPIResponse
from .streaming import SpeculativeStream
from ..core.types import SpeculativeChatCompletion, SpeculativeCompletion, SpeculativeParsedChatCompletion

__all__ = ["RawResponse", "AsyncRawCreate", "AsyncStreamedResponse", "AsyncStreamingCreate", "StreamedHeaders"]

T = TypeVar("T")

_NOWHERE = "http://specapi.invalid/v1"


class RawResponse(LegacyAPIResponse[T]):
    """A response with its headers; `parse()` returns the object `create` would have returned."""

    def __init__(self, parsed: T, headers: httpx2.Headers, http_response: httpx2.Response | None) -> None:
        # Not the SDK's __init__: there is no request of the SDK's to read a body from.
        self._parsed = parsed
        self._headers = headers
        self._stream = False
        self._stream_cls = None
        self._parsed_by_type = {}
        self.retries_taken = 0
        request = http_response.request if http_response is not None and http_response._request is not None else httpx2.Request("POST", _NOWHERE)
        status = http_response.status_code if http_response is not None else 200
        # A stand-in for properties the SDK reads from its response (`status_code`, `url`, `request_id`).
        self.http_response = httpx2.Response(status, headers=headers, request=request)

    @property
    def headers(self) -> httpx2.Headers:  # type: ignore[override]
        return self._headers

    def parse(self, *, to: type[Any] | None = None) -> T:  # type: ignore[override]
        """The object `create` returns (`to` is not supported: the body was read already)."""
        if to is not None:
            raise TypeError("specapi's raw responses parse only to the type create returns")
        return self._parsed

    def __repr__(self) -> str:
        return f"<RawResponse [{self.status_code}] {type(self._parsed).__name__}>"


async def raw_call(call: Callable[[], Awaitable[T]]) -> RawResponse[T]:
    """Run `call` while recording the target's last response; attach the statistics as headers."""
    with capture_target_response() as box:
        parsed = await call()
    headers = httpx2.Headers(box.http_response.headers if box.http_response is not None else {})
    if isinstance(parsed, (SpeculativeCompletion, SpeculativeChatCompletion, SpeculativeParsedChatCompletion)):
        headers.update(parsed.speculative.to_headers())  # a stream's statistics come at its end
    return RawResponse(parsed, headers, box.http_response)


class AsyncRawCreate:
    """`resource.with_raw_response`: the same `create` (and `parse`, for chat), returning a `RawResponse`."""

    def __init__(self, create: Callable[..., Awaitable[Any]], parse: Callable[..., Awaitable[Any]] | None = None) -> None:
        self._create = create
        self._parse = parse

    async def create(self, **params: Any) -> RawResponse[Any]:
        return await raw_call(lambda: self._create(**params))

    async def parse(self, **params: Any) -> RawResponse[Any]:
        if self._parse is None:
            raise AttributeError("parse exists on chat.completions only")
        parse = self._parse
        return await raw_call(lambda: parse(**params))


class StreamedHeaders(Generic[T]):
    """What `with_streaming_response` yields, on either client: headers at once, then `parse()`."""

    def __init__(self, raw: RawResponse[T]) -> None:
        self._raw = raw
        self.headers = raw.headers
        self.http_response = raw.http_response
        self.status_code = raw.status_code


class AsyncStreamedResponse(StreamedHeaders[T]):
    """What `with_streaming_response` yields on the async client: headers at once, `await parse()`."""

    async def parse(self) -> T:
        return self._raw.parse()


@contextlib.asynccontextmanager
async def streamed(call: Callable[[], Awaitable[T]]) -> AsyncIterator[AsyncStreamedResponse[T]]:
    """The response of `call` for the length of a `with` block; a stream left unread is closed at its end."""
    raw = await raw_call(call)
    try:
        yield AsyncStreamedResponse(raw)
    finally:
        parsed = raw.parse()
        if isinstance(parsed, SpeculativeStream):
            await parsed.close()


class AsyncStreamingCreate:
    """`resource.with_streaming_response`: `async with ....create(...) as response: await response.parse()`."""

    def __init__(self, create: Callable[..., Awaitable[Any]], parse: Callable[..., Awaitable[Any]] | None = None) -> None:
        self._create = create
        self._parse = parse

    def create(self, **params: Any) -> contextlib.AbstractAsyncContextManager[AsyncStreamedResponse[Any]]:
        return streamed(lambda: self._create(**params))

    def parse(self, **params: Any) -> contextlib.AbstractAsyncContextManager[AsyncStreamedResponse[Any]]:
        if self._parse is None:
            raise AttributeError("parse exists on chat.completions only")
        parse = self._parse
        return streamed(lambda: parse(**params))
