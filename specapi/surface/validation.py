"""A `create` call's arguments checked before any request: numbers in range, stops, limits, and
whether speculation can reproduce the request exactly (`unverifiable` says why not).

Bad arguments raise `ConfigurationError` (and, inside `bad_request()`, the SDK's `BadRequestError`
through `InvalidRequestError`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from openai import NotGiven, Omit

from ..transport._exceptions import ConfigurationError, InvalidRequestError
from ..core.acceptance import SamplingParams
from ..transport.endpoint import Endpoint
from ..core.context import PENALTIES

__all__ = [
    "CHAT_ARGS",
    "COMPLETION_ARGS",
    "TRANSPORT_ARGS",
    "bad_request",
    "check_number",
    "given_arguments",
    "prediction_text",
    "request_fields",
    "stops",
    "stream_options",
    "unverifiable",
    "validated_max_tokens",
    "validated_sampling",
    "validated_seed",
    "sendable",
    "with_limit",
]

#: The SDK's per-call request options (sent with every upstream request, not in the body).
TRANSPORT_ARGS = {"extra_headers", "extra_query", "timeout"}
#: Arguments the engine reproduces exactly.
COMPLETION_ARGS = {"prompt", "model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "user", "extra_body", "stream_options", "prediction"} | TRANSPORT_ARGS
CHAT_ARGS = {"messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "user", "extra_body", "stream_options", "metadata", "store", "prediction"} | TRANSPORT_ARGS
#: Sampling extras whose value changes nothing (forwarded, speculation still exact).
_NEUTRAL_EXTRAS = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0, "top_k": -1, "repetition_penalty": 1.0}
#: Extras that leave the text alone (`cache_prompt`: llama.cpp reusing a slot's cache, sent with every target call).
_HARMLESS_EXTRAS = {"user", "metadata", "store", "service_tier", "request_id", "cache_prompt"}
#: The penalties' window (llama.cpp): it changes nothing where no penalty is set, and is reproduced where they are.
_PENALTY_WINDOW = "repeat_last_n"
#: Sampler truncations that never change the most likely token: exact when greedy; when sampling,
#: only a path where the target draws its own tokens (fan-out) reproduces them.
_TRUNCATIONS = {"top_k", "min_p", "typical_p"}
#: Fields the engine sends itself; everything else the caller sent goes to the target as it is.
_ENGINE_FIELDS = {"prompt", "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options", "prediction", "extra_body"} | TRANSPORT_ARGS


def given_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments a caller gave to `create`: without `self`, the SDK's `omit`/`not_given` markers and unset extras."""
    return {
        name: value
        for name, value in arguments.items()
        if name != "self"
        and not isinstance(value, (Omit, NotGiven))
        and not (value is None and name in ("extra_headers", "extra_query", "extra_body"))
    }


@contextlib.contextmanager
def bad_request() -> Iterator[None]:
    """Bad arguments to `create` are also the SDK's `BadRequestError` (still raised before any request)."""
    try:
        yield
    except InvalidRequestError:
        raise
    except ConfigurationError as exc:
        raise InvalidRequestError(str(exc)) from None


def _lone_surrogate(text: str) -> int | None:
    """Where `text` holds a lone surrogate (a half of a UTF-16 pair, which no UTF-8 text can carry), or None."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def _unsendable(value: Any, path: str, depth: int = 0) -> str | None:
    """Why no JSON body can carry the first value under `value` (keys included) that it cannot: a string
    with a lone surrogate, or a float that is NaN or infinite; None when every one can."""
    if isinstance(value, str):
        at = _lone_surrogate(value)
        return None if at is None else f"{path} holds a lone surrogate ({ascii(value[at])}) at character {at}: text must be valid Unicode (a surrogate escape in JSON must be one of a high-low pair)"
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} must be a finite number, got {value!r} (JSON has no NaN or Infinity)"
    if depth > 64:  # deeper arguments are refused by their own checks, or sent as they are
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            found = _unsendable(key, f"{path} key", depth + 1) or _unsendable(item, f"{path}.{key}", depth + 1)
            if found is not None:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = _unsendable(item, f"{path}[{index}]", depth + 1)
            if found is not None:
                return found
    return None


def sendable(kwargs: Mapping[str, Any]) -> None:
    """Refuse what no request body can carry, naming the argument: a lone surrogate (`"\\ud800"`: JSON may
    escape one, but it is no character, UTF-8 cannot encode it and tokenizers refuse it), or NaN and
    infinite numbers (JSON has none)."""
    for name, value in kwargs.items():
        why = _unsendable(value, name)
        if why is not None:
            raise ConfigurationError(why)


def check_number(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{name} must be a number, got {value!r}")
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise ConfigurationError(f"{name} must be in {bracket}{low}, {high}], got {value!r}")
    return float(value)


def stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise ConfigurationError(f"stop must be a non-empty string or a list of up to 16 of them, got {stop!r}")
    return tuple(stop)


def unverifiable(kwargs: Mapping[str, Any], allowed: set[str]) -> str | None:
    """Why speculation cannot reproduce this request exactly, or None if it can."""
    for name, value in kwargs.items():
        if name in allowed or value is None:
            continue
        if name in PENALTIES:
            continue  # decided per target once it is known (plan.py): exact where it counts the prompt in them
        if name == "logprobs" and value is False:
            continue
        if name == "echo" and value is False:
            continue
        return f"argument {name!r} is not reproduced by verification"
    extra = kwargs.get("extra_body") or {}
    greedy = kwargs.get("temperature") == 0
    for name, value in extra.items():
        if name in _HARMLESS_EXTRAS or (name in _NEUTRAL_EXTRAS and value == _NEUTRAL_EXTRAS[name]):
            continue
        if name in PENALTIES or name == _PENALTY_WINDOW:
            continue  # as the arguments above
        if name in _TRUNCATIONS and (greedy or isinstance(value, (int, float))):
            continue  # greedy: the most likely token survives any truncation; sampling: see request_fields
        return f"extra_body field {name!r} changes sampling in a way verification cannot reproduce"
    return None


def request_fields(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The caller's fields that every target request carries, and whether the caller's sampler
    truncates in a way logprob lists cannot show."""
    extras = {k: v for k, v in kwargs.items() if k not in _ENGINE_FIELDS and v is not None}
    extras.update(kwargs.get("extra_body") or {})
    truncated = any(name in _TRUNCATIONS and value != _NEUTRAL_EXTRAS.get(name) for name, value in extras.items())
    return extras, truncated


def validated_sampling(kwargs: Mapping[str, Any], target: Endpoint, draft: Endpoint | None) -> SamplingParams:
    temperature = check_number("temperature", kwargs["temperature"] if kwargs.get("temperature") is not None else 1.0, 0.0, 2.0)
    top_p = check_number("top_p", kwargs["top_p"] if kwargs.get("top_p") is not None else 1.0, 0.0, 1.0, low_open=True)
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        explicit=frozenset(name for name in ("temperature", "top_p") if kwargs.get(name) is not None),
        raw_logprobs=target.logprobs_mode == "raw",
        draft_raw_logprobs=draft is None or draft.logprobs_mode == "raw",
    )


def validated_max_tokens(value: Any, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"max_tokens must be an integer >= 1, got {value!r}")
    return value


def validated_seed(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigurationError(f"seed must be an integer, got {value!r}")
    return value


def with_limit(body: dict[str, Any], name: str, limit: int | None) -> dict[str, Any]:
    """A target-alone body with the caller's limit under the caller's name; none when the caller set none
    (the server's own default applies, as it would to the caller's request)."""
    return body if limit is None else {**body, name: limit}


def stream_options(kwargs: Mapping[str, Any]) -> tuple[bool, bool]:
    """Whether the caller asked for a stream, and for usage in it."""
    stream = kwargs.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise ConfigurationError(f"stream must be a boolean, got {stream!r}")
    stream = bool(stream)
    options = kwargs.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"stream_options must be an object, got {options!r}")
    if options and not stream:
        raise ConfigurationError("stream_options is only allowed with stream=True")
    return stream, bool(options.get("include_usage"))


def prediction_text(prediction: Any) -> str | None:
    """OpenAI's `prediction={"type": "content", "content": "..."}`, or a plain string."""
    if prediction is None:
        return None
    if isinstance(prediction, str):
        return prediction
    if isinstance(prediction, Mapping) and prediction.get("type") == "content":
        content = prediction.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    raise ConfigurationError(f"prediction must be {{'type': 'content', 'content': str}} or a string, got {prediction!r}")
