"""The proxy's ASGI app: Starlette, with the two generation routes taken straight to their handlers, and
the OpenAI-shaped JSON error of a route or method the proxy does not have."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.types import Receive, Scope, Send

from .errors import ProxyError

__all__ = ["ProxyApp", "http_error"]

logger = logging.getLogger("specapi.server")


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    codes = {404: "not_found", 405: "method_not_allowed"}
    error = ProxyError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=codes.get(exc.status_code))
    return JSONResponse(error.body(), status_code=exc.status_code, headers=exc.headers)


class ProxyApp(Starlette):
    """Starlette, with the two generation routes taken straight to their handlers.

    Starlette's stack (its error and exception middleware, the router, the route's own exception
    wrapper) costs each request a few frames, and wraps `send` twice, so every chunk of a stream paid
    for three more calls. The generation handlers turn every error into a response themselves
    (`app._Proxy._generate`), so for them that stack does nothing; the other routes, and any middleware
    added to the app, go through it as before."""

    def __init__(self, *, generation: Mapping[str, Callable[[Request], Awaitable[Response]]], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._generation = generation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self._generation.get(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if handler is None or self.user_middleware or scope.get("root_path"):
            await super().__call__(scope, receive, send)
            return
        scope["app"] = self
        try:
            response = await handler(Request(scope, receive))
        except Exception:  # not one the handler answers itself: what Starlette's error middleware sends
            logger.exception("request on %s failed", scope["path"])
            response = PlainTextResponse("Internal Server Error", status_code=500)
        await response(scope, receive, send)
