"""Requests speculation cannot serve exactly go to the target unchanged: its answer (or its own
stream, chunk by chunk) passed on, with statistics that say why (`speculative.fallback_reason`).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ..transport._calls import Meter
from .responses import build
from .runtime import Runtime
from ..core.stats import passed_on
from .streaming import SpeculativeStream, parse_chat_chunk, parse_completion
from .validation import TRANSPORT_ARGS

__all__ = ["passthrough"]


async def passthrough(runtime: Runtime, chat: bool, path: str, kwargs: dict[str, Any], reason: str, options: Mapping[str, Any] | None = None) -> Any:
    """The target's answer to the caller's request as it is (`kwargs`: the body's fields and `extra_body`)."""
    meter = Meter(runtime.target.endpoint)
    started = runtime.clock()
    body = {k: v for k, v in kwargs.items() if k != "extra_body" and k not in TRANSPORT_ARGS and v is not None}
    body.update(kwargs.get("extra_body") or {})
    if body.get("stream"):
        chunks = _passthrough_chunks(runtime, path, body, meter, reason, started, options)
        return SpeculativeStream(chunks, parse_chat_chunk if chat else parse_completion)
    data = await runtime.target.post(path, body, meter, options=options)
    completion = int((data.get("usage") or {}).get("completion_tokens") or 0)
    stats = passed_on(meter.snapshot(), reason, runtime.clock() - started, generated_tokens=completion)
    return build(runtime.target, chat, data, stats)


async def _passthrough_chunks(
    runtime: Runtime, path: str, body: dict[str, Any], meter: Meter, reason: str, started: float, options: Mapping[str, Any] | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The target's own stream, each chunk passed on as it comes; the last one carries the statistics.

    Only a chunk the stream may end on (one that finishes a choice, or one without choices: usage) waits
    for the next, so that the statistics can go on the last; text goes on at once. A stream that ends on
    a chunk already passed on gets one more, without choices, for the statistics. Usage is always asked
    of the target (so the statistics are billed figures); its chunk is passed on only if the caller
    asked for it.
    """
    wanted_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    body = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
    held: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    async with contextlib.aclosing(runtime.target.stream(path, body, meter, options=options)) as chunks:
        async for chunk in chunks:
            if chunk.get("usage") and not chunk.get("choices") and not wanted_usage:
                continue
            if held is not None:
                yield held
                held = None
            if _may_end_a_stream(chunk):
                held = chunk
            else:
                yield chunk
            last = chunk
    if last is None:
        return
    if held is None:
        held = {key: last[key] for key in ("id", "object", "created", "model") if key in last}
        held["choices"] = []
    held["_speculative"] = passed_on(meter.snapshot(), reason, runtime.clock() - started)
    yield held


def _may_end_a_stream(chunk: Mapping[str, Any]) -> bool:
    """Whether a well-formed stream may end after `chunk`: it finishes a choice, or has none (usage)."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices:
        return True
    return any(isinstance(choice, Mapping) and choice.get("finish_reason") is not None for choice in choices)

