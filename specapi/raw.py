"""`with_raw_response`: a response's HTTP headers next to the parsed object, as in the openai SDK.

    raw = await client.chat.completions.with_raw_response.create(messages=[...], max_tokens=64)
    raw.headers["x-request-id"]        # from the final target call
    raw.headers["x-specapi-acceptance-rate"]
    chat = raw.parse()                 # the SpeculativeChatCompletion

`headers` are those of the final call specapi made to the target, plus the `x-specapi-*` headers the
proxy sends (`SpeculativeStats.to_headers()`). For a stream, `parse()` returns the stream and the
headers are those known when it opened: speculation has not called the target yet, so only a stream
served by the target alone carries the target's headers, and no `x-specapi-*` header is set (the
statistics arrive with the stream's end, as `stream.speculative`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import httpx2

from ._calls import capture_target_response

__all__ = ["RawResponse", "AsyncRawCreate"]

T = TypeVar("T")


class RawResponse(Generic[T]):
    """A response with its headers; `parse()` returns the object `create` would have returned."""

    def __init__(self, parsed: T, headers: httpx2.Headers, http_response: httpx2.Response | None) -> None:
        self._parsed = parsed
        self.headers = headers
        self.http_response = http_response

    @property
    def status_code(self) -> int:
        return self.http_response.status_code if self.http_response is not None else 200

    def parse(self) -> T:
        return self._parsed

    def __repr__(self) -> str:
        return f"<RawResponse [{self.status_code}] {type(self._parsed).__name__}>"


async def raw_call(call: Callable[[], Awaitable[T]]) -> RawResponse[T]:
    """Run `call` while recording the target's last response; attach the statistics as headers."""
    with capture_target_response() as box:
        parsed = await call()
    headers = httpx2.Headers(box.http_response.headers if box.http_response is not None else {})
    stats = getattr(parsed, "speculative", None)
    if stats is not None and hasattr(parsed, "choices"):
        headers.update(stats.to_headers())
    return RawResponse(parsed, headers, box.http_response)


class AsyncRawCreate:
    """`resource.with_raw_response`: the same `create`, returning a `RawResponse`."""

    def __init__(self, create: Callable[..., Awaitable[Any]]) -> None:
        self._create = create

    async def create(self, **params: Any) -> RawResponse[Any]:
        return await raw_call(lambda: self._create(**params))
