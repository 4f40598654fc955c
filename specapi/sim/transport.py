"""Serve a ``SimProvider`` in-process through ``httpx2``, the HTTP library of the openai SDK.

    provider = SimProvider(capabilities="vllm")
    client = openai.AsyncOpenAI(
        base_url="http://sim/v1", api_key="x", http_client=httpx2.AsyncClient(transport=SimTransport(provider))
    )

No sockets, no threads: each request goes straight to ``SimProvider.handle``. Streamed responses keep their
per-chunk timing, and closing the response early closes the provider's stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import httpx2

if TYPE_CHECKING:
    from .provider import SimProvider
    from .streams import SSEStream

__all__ = ["SimTransport"]


class _ByteStream(httpx2.AsyncByteStream):
    def __init__(self, stream: SSEStream) -> None:
        self._stream = stream

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class SimTransport(httpx2.AsyncBaseTransport):
    """An ``httpx2`` async transport whose server is a ``SimProvider``."""

    def __init__(self, provider: SimProvider) -> None:
        self.provider = provider

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        path = request.url.path
        query = request.url.query
        if query:
            path += "?" + (query.decode() if isinstance(query, bytes) else query)
        response = await self.provider.handle(request.method, path, body or None, dict(request.headers))
        if response.stream is not None:
            return httpx2.Response(
                response.status, headers=response.headers, stream=_ByteStream(response.stream), request=request
            )
        return httpx2.Response(response.status, headers=response.headers, content=response.body, request=request)
