"""Every route the proxy does not serve itself, passed to the target as it came.

    /v1/<path>   the target's base URL + <path>      (/v1/embeddings, /v1/responses, /v1/files, ...)
    /<path>      the target's server root + <path>   (vLLM's /tokenize, /detokenize, /version, ...)

The method, query string, body and headers go as the client sent them, but for the credentials (the
target's key replaces the client's, which was the proxy's) and the hop-by-hop headers; the status,
headers and body come back as the target sent them. A body the target streams (server-sent events, or
any body without a length) is relayed as it comes; the others are read whole, then sent with their
length. The transports decompress what they read, so `content-encoding` is dropped with the length. A
target that cannot be reached gets the proxy's own error naming it (502, or 504 for a timeout).
"""

from __future__ import annotations

from collections.abc import Iterable

import openai
from starlette.background import BackgroundTask
from starlette.responses import Response, StreamingResponse

from ..transport._calls import RoleClient
from ..transport._http import Reply
from ..dialects import server_root

__all__ = ["upstream_url", "forwarded_headers", "forward"]

_HOP_BY_HOP = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer", "trailers",
    "transfer-encoding", "upgrade", "host", "content-length",
})  # fmt: skip
#: Not sent on: the client's credentials are for the proxy; the transports choose their own encodings.
_NOT_SENT = _HOP_BY_HOP | {"authorization", "accept-encoding"}
#: Not returned: the body is re-framed, and arrives decompressed.
_NOT_RETURNED = _HOP_BY_HOP | {"content-encoding"}


def upstream_url(role: RoleClient, path: str, query: str) -> str:
    """The target's URL for the proxy's `path`: under its base URL for `/v1/...`, else at its server root."""
    if path == "/v1" or path.startswith("/v1/"):
        url = role.base_url + path[len("/v1/") :]
    else:
        url = server_root(role) + path
    return f"{url}?{query}" if query else url


def forwarded_headers(role: RoleClient, headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The client's headers for the target: its own, but for credentials and hop-by-hop ones; then the
    target's key and the endpoint's own headers."""
    sent = {name: value for name, value in headers if name.lower() not in _NOT_SENT}
    for name, value in {**(role.endpoint.headers or {}), **role.sdk.auth_headers}.items():
        for existing in [key for key in sent if key.lower() == name.lower()]:
            del sent[existing]
        if isinstance(value, str):
            sent[name] = value
    return sent


def _returned_headers(reply: Reply) -> list[tuple[bytes, bytes]]:
    items = reply.headers.multi_items() if hasattr(reply.headers, "multi_items") else reply.headers.items()
    return [(name.lower().encode("latin-1"), value.encode("latin-1")) for name, value in items if name.lower() not in _NOT_RETURNED]


def _streamed(reply: Reply) -> bool:
    content_type = reply.headers.get("content-type", "")
    return content_type.startswith("text/event-stream") or "content-length" not in reply.headers


async def forward(role: RoleClient, method: str, path: str, query: str, headers: Iterable[tuple[str, str]], body: bytes) -> Response:
    """The target's answer to the client's request, as a response to send on (raises the target's
    `EndpointError` when it cannot be reached, or the connection breaks before the answer is whole)."""
    wire = role.wire
    url = upstream_url(role, path, query)
    try:
        reply = await wire.transport.stream(method, url, forwarded_headers(role, headers), body or None, wire.timeout)
    except openai.APIError as exc:
        raise role.error(f"{type(exc).__name__} on {method} {path}", cause=exc) from exc
    returned = _returned_headers(reply)
    if _streamed(reply):
        # Closed however the relay ends (Starlette runs the background task after a disconnect too).
        streaming = StreamingResponse(reply.chunks(), status_code=reply.status, background=BackgroundTask(reply.close))
        streaming.raw_headers = returned
        return streaming
    try:
        content = await reply.read()
    except openai.APIError as exc:
        raise role.error(f"{type(exc).__name__} on {method} {path}", cause=exc) from exc
    finally:
        await reply.close()
    response = Response(content, status_code=reply.status)
    response.raw_headers = [*returned, *(header for header in response.raw_headers if header[0] == b"content-length")]
    return response
