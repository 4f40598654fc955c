"""Server-sent events as OpenAI sends them: `data: {json}\\n\\n` per chunk, then `data: [DONE]\\n\\n`.

`EventStreamResponse` streams pre-encoded events and stops as soon as the client disconnects; its
`on_close` hook (which closes the upstream work) runs exactly once, however the stream ends.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from ..transport._json import dumps
from .disconnect import ClientDisconnected, run_unless_disconnected

__all__ = ["encode_event", "DONE_EVENT", "EventStreamResponse"]

DONE_EVENT = b"data: [DONE]\n\n"


def encode_event(data: Mapping[str, Any]) -> bytes:
    """One SSE `data:` event holding `data` as compact JSON (JSON never contains a raw newline)."""
    return b"data: " + dumps(data) + b"\n\n"


class EventStreamResponse(StreamingResponse):
    """A `text/event-stream` response over an async generator of encoded events.

    When streaming ends, for whatever reason (exhausted, client gone, server cancelling the request), the
    generator is closed and then `await on_close(disconnected)` runs once; `disconnected` says whether the
    client left before the end.
    """

    def __init__(
        self,
        events: AsyncGenerator[bytes, None],
        *,
        headers: Mapping[str, str] | None = None,
        on_close: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        merged = {"cache-control": "no-cache", "x-accel-buffering": "no", **(headers or {})}
        super().__init__(events, status_code=200, headers=merged, media_type="text/event-stream")
        self._events = events
        self._on_close = on_close

    async def _pump(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for event in self._events:
            if event.endswith(DONE_EVENT):  # the last event (and any sent with it): it ends the body in the same write
                break
            await send({"type": "http.response.body", "body": event, "more_body": True})
        else:
            event = b""
        await send({"type": "http.response.body", "body": event, "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        left = False
        try:
            # In this task, from now: the first chunk is ready, and goes out before the steps already waiting.
            await run_unless_disconnected(self._pump(send), receive)
        except ClientDisconnected:
            left = True
        finally:
            await self._events.aclose()
            if self._on_close is not None:
                await self._on_close(left)
