"""Reading request bodies as the simulated server does: typed fields, ranges, and the 400s they raise.

``ApiError`` is a refusal with an OpenAI-shaped body; ``read_sampling`` and ``read_prompt`` turn the fields
shared by completions and chat into plain values.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .corpus import decode_text, encode_text, is_known_token
from .responses import error_body

__all__ = [
    "CHAT_FIELDS",
    "COMPLETION_FIELDS",
    "ApiError",
    "Sampling",
    "parse_json",
    "read_bool",
    "read_int",
    "read_number",
    "read_prompt",
    "read_prompts",
    "read_sampling",
    "reject_unknown_fields",
    "retry_after_headers",
    "route_path",
]

_COMMON_FIELDS = frozenset({
    "model", "max_tokens", "temperature", "top_p", "n", "stream", "stream_options", "logprobs", "stop",
    "presence_penalty", "frequency_penalty", "logit_bias", "user", "seed",
})
COMPLETION_FIELDS = _COMMON_FIELDS | {"prompt", "suffix", "echo", "best_of"}
"""Fields of OpenAI's ``/v1/completions``."""
CHAT_FIELDS = _COMMON_FIELDS | {
    "messages", "max_completion_tokens", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls",
    "response_format", "prediction", "store", "metadata", "reasoning_effort", "service_tier", "modalities",
    "audio", "web_search_options", "prompt_cache_key", "safety_identifier", "verbosity",
}
"""Fields of OpenAI's ``/v1/chat/completions``."""


class ApiError(Exception):
    """A request the simulated server refuses; becomes an OpenAI-shaped error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, type=type, param=param, code=code)
        self.headers = dict(headers or {})


def route_path(path: str) -> str:
    """``path`` without query, trailing slash and ``/v1`` prefix: ``/v1/completions?x`` -> ``/completions``."""
    path = "/" + path.split("?", 1)[0].strip("/")
    if path == "/v1" or path.startswith("/v1/"):
        path = path[3:] or "/"
    return path


def retry_after_headers(seconds: float) -> dict[str, str]:
    """``Retry-After`` in whole seconds (rounded up) and ``retry-after-ms``, as the openai SDK reads them."""
    return {"retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(int(seconds * 1000))}


def parse_json(raw: bytes | str, *, dialect: str = "openai") -> Any:
    """The JSON value of a request body (``None`` when empty).

    A body that is not JSON, not UTF-8, or escapes a lone surrogate (``"\\ud800"``, which no UTF-8
    text can hold) is refused: a 400, except by llama-server, whose JSON parser's errors come back as
    500s (observed: ``[json.exception.parse_error.101] ... surrogate U+D800..U+DBFF must be followed by
    U+DC00..U+DFFF``)."""
    if not raw:
        return None
    try:
        value = json.loads(raw)
        json.dumps(value, ensure_ascii=False).encode("utf-8")  # a lone surrogate cannot be encoded
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError and UnicodeEncodeError are ValueErrors
        if dialect == "llamacpp":
            raise ApiError(500, f"[json.exception.parse_error.101] parse error: {exc}", type="server_error") from None
        raise ApiError(400, f"We could not parse the JSON body of your request ({exc}).") from None
    return value


def reject_unknown_fields(body: Mapping[str, Any], known: frozenset[str]) -> None:
    """400 on the first field outside ``known``, with OpenAI's message."""
    for name in body:
        if name not in known:
            raise ApiError(400, f"Unrecognized request argument supplied: {name}", param=name)


def read_bool(body: Mapping[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean", param=name)
    return value


def read_int(
    body: Mapping[str, Any],
    name: str,
    default: int | None,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer", param=name)
    if minimum is not None and value < minimum:
        raise ApiError(400, f"{name} must be at least {minimum}, got {value}.", param=name)
    if maximum is not None and value > maximum:
        raise ApiError(400, f"{name} must be at most {maximum}, got {value}.", param=name)
    return value


def read_number(body: Mapping[str, Any], name: str, default: float, *, minimum: float, maximum: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (isinstance(value, float) and not math.isfinite(value)):
        raise ApiError(400, f"{name} must be a number", param=name)  # an int of any size is a number (and finite)
    if not minimum <= value <= maximum:
        raise ApiError(400, f"{name} must be between {minimum} and {maximum}, got {value}.", param=name)
    return float(value)


@dataclass(frozen=True)
class Sampling:
    """The generation settings of a request. ``max_tokens`` is ``None`` when the request sets none."""

    max_tokens: int | None
    temperature: float
    top_p: float
    seed: int | None
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool


def read_sampling(
    body: Mapping[str, Any], *, default_max_tokens: int | None, allow_zero: bool, max_n: int
) -> Sampling:
    """``max_tokens`` (or ``max_completion_tokens``), ``temperature``, ``top_p``, ``seed``, ``stop``, ``n``,
    ``stream`` and ``stream_options``. ``allow_zero``: ``max_tokens = 0`` is accepted (echo)."""
    max_tokens = read_int(body, "max_tokens", None, minimum=0)
    if max_tokens is None:
        max_tokens = read_int(body, "max_completion_tokens", default_max_tokens, minimum=0)
    if max_tokens == 0 and not allow_zero:
        raise ApiError(400, "max_tokens must be at least 1, got 0.", param="max_tokens")
    temperature = read_number(body, "temperature", 1.0, minimum=0.0, maximum=2.0)
    top_p = read_number(body, "top_p", 1.0, minimum=0.0, maximum=1.0)
    if top_p <= 0.0:
        raise ApiError(400, "top_p must be in (0, 1], got 0.", param="top_p")
    stop = body.get("stop")
    if stop is None:
        stops: tuple[str, ...] = ()
    elif isinstance(stop, str):
        stops = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stops = tuple(stop)
    else:
        raise ApiError(400, "stop must be a string or a list of strings", param="stop")
    stream = read_bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object", param="stream_options")
    if options and not stream:
        raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")
    return Sampling(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=read_int(body, "seed", None),
        stop=stops,
        n=read_int(body, "n", 1, minimum=1, maximum=max_n) or 1,
        stream=stream,
        include_usage=bool(options and options.get("include_usage")),
    )


def _one_prompt(prompt: Any) -> tuple[list[int], str] | None:
    if isinstance(prompt, str):
        return encode_text(prompt), prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        if not all(is_known_token(t) for t in prompt):
            raise ApiError(400, "prompt holds a token id outside the tokenizer", param="prompt")
        return list(prompt), decode_text(prompt)
    return None


def read_prompts(prompt: Any, *, batch: bool) -> list[tuple[list[int], str]]:
    """Token ids and text of each prompt of a completions ``prompt``: a string, a list of token ids, or
    (with ``batch``; else only a list of one) a list of such prompts."""
    one = _one_prompt(prompt)
    if one is not None:
        return [one]
    if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        if len(prompt) > 1 and not batch:
            raise ApiError(400, "batched prompts are not supported by this server", param="prompt")
        prompts = [_one_prompt(p) for p in prompt]
        if all(p is not None for p in prompts):
            return [p for p in prompts if p is not None]
    raise ApiError(400, "prompt must be a string or a non-empty list of token ids", param="prompt")


def read_prompt(prompt: Any) -> tuple[list[int], str]:
    """Token ids and text of a completions ``prompt``: a string or a list of token ids (or a batch of one)."""
    return read_prompts(prompt, batch=False)[0]
