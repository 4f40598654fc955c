"""From an HTTP request to `create(**kwargs)`: body size, JSON, required fields, model and token limits.

Pure functions apart from `read_body`. Fields OpenAI does not define (`top_k`, `repeat_penalty`, ...)
move to `extra_body`, as the openai SDK sends them, so specapi can tell neutral extras from ones that
change sampling. Everything else is checked by the client itself (its `ConfigurationError`s become 400s).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from typing import Any

from starlette.requests import Request

from ..transport._exceptions import ConfigurationError
from ..dialects.openai import CHAT_FIELDS, COMPLETION_FIELDS
from ..surface.validation import sendable
from .errors import ProxyError

__all__ = ["read_body", "parse_json_object", "completion_arguments", "chat_arguments", "COMPLETION_FIELDS", "CHAT_FIELDS"]

#: specapi's own acceptance arguments: refused in a request body rather than sent upstream.
_ACCEPTANCE_FIELDS = frozenset({"acceptance", "acceptance_threshold", "typical_epsilon", "typical_delta"})


def _too_large(limit: int) -> ProxyError:
    return ProxyError(413, f"Request body too large: the limit is {limit} bytes.", code="request_too_large")


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 `ProxyError` as soon as it is known to exceed `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise _too_large(limit)
        except ValueError:
            raise ProxyError(400, "Invalid Content-Length header.", code="invalid_request") from None
    body = bytearray()
    async for part in request.stream():
        body += part
        if len(body) > limit:  # chunked bodies declare no length
            raise _too_large(limit)
    return bytes(body)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object, or a 400 `ProxyError` saying what is wrong with it."""
    if not raw.strip():
        raise ProxyError(400, "The request body is empty; send a JSON object.", code="invalid_json")
    try:
        data = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ProxyError(400, f"We could not parse the JSON body of your request ({exc}).", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ProxyError(400, f"The request body must be a JSON object, got {type(data).__name__}.", code="invalid_json")
    return data


def _arguments(
    body: Mapping[str, Any], *, required: str, fields: frozenset[str], model: str, max_tokens_limit: int | None, served: Collection[str] = ()
) -> dict[str, Any]:
    if body.get(required) is None:
        raise ProxyError(400, f"Missing required parameter: '{required}'.", param=required, code="missing_required_parameter")
    for name, value in body.items():
        try:
            sendable({name: value})
        except ConfigurationError as exc:  # before the relay too, which sends the body without `create`
            raise ProxyError(400, str(exc), param=name, code="invalid_value") from None
    requested = body.get("model")
    if requested is not None and requested != model and requested not in served:
        names = ", ".join(f"`{name}`" for name in [model, *(s for s in served if s != model)])
        raise ProxyError(
            404, f"The model `{requested}` does not exist on this proxy; it serves {names}.", param="model", code="model_not_found"
        )
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ProxyError(400, f"'stream' must be a boolean, got {stream!r}.", param="stream", code="invalid_type")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if max_tokens_limit is not None and isinstance(value, int) and not isinstance(value, bool) and value > max_tokens_limit:
            raise ProxyError(
                400, f"'{name}' is {value}, more than this proxy's limit of {max_tokens_limit}.", param=name, code="max_tokens_exceeded"
            )
    for name in _ACCEPTANCE_FIELDS & body.keys():
        # Lossy acceptance is the proxy's choice (`--acceptance`, with `--allow-lossy-acceptance`), never a request's.
        raise ProxyError(
            400, f"'{name}' cannot be set per request: this proxy's acceptance rule is set when it starts "
            "(specapi serve --acceptance, which a lossy rule needs --allow-lossy-acceptance for).", param=name, code="invalid_request",
        )
    kwargs = {name: value for name, value in body.items() if name in fields and name != "model"}
    if requested is not None and requested != model:
        kwargs["model"] = requested  # another model of the target's server: verified against it
    extra = {name: value for name, value in body.items() if name not in fields}
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def completion_arguments(body: Mapping[str, Any], *, model: str, max_tokens_limit: int | None, served: Collection[str] = ()) -> dict[str, Any]:
    """Keyword arguments for `client.completions.create` from a `/v1/completions` body. `model`: the
    configured target model (a body without one gets it); `served`: the other models a body may name."""
    return _arguments(body, required="prompt", fields=COMPLETION_FIELDS, model=model, max_tokens_limit=max_tokens_limit, served=served)


def chat_arguments(body: Mapping[str, Any], *, model: str, max_tokens_limit: int | None, served: Collection[str] = ()) -> dict[str, Any]:
    """Keyword arguments for `client.chat.completions.create`; a request without a bound gets the proxy's
    limit where one was set (`ServerConfig.max_tokens_limit`, an opt-in), else none (the target's own)."""
    kwargs = _arguments(body, required="messages", fields=CHAT_FIELDS, model=model, max_tokens_limit=max_tokens_limit, served=served)
    if max_tokens_limit is not None and kwargs.get("max_tokens") is None and kwargs.get("max_completion_tokens") is None:
        kwargs["max_tokens"] = max_tokens_limit
    return kwargs
