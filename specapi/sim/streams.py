"""Streamed answers: OpenAI-shaped SSE chunks, delivered at the simulated token times.

``completion_chunks`` / ``chat_chunks`` cut generations into ``Chunk``s (one per generated token, plus the
role, echo, prefix and finish chunks), each tagged with the output step it belongs to and the tokens it
bills. ``timed_events`` turns them into the bytes of the stream with the delay before each (from a
``RequestTiming``), applying the request's body faults. ``SSEStream`` delivers the events, sleeping
between them, and reports billed tokens as they go out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .corpus import EOS_TOKEN_ID, token_str
from .faults import FaultPlan, drop_logprobs, mismatch_logprobs, truncate
from .generation import Generation, TokenRecord, text_offsets
from .latency import RequestTiming, Sleep
from .profiles import Capabilities
from .responses import chat_logprob_items, completion_logprobs

__all__ = [
    "Chunk",
    "SSEStream",
    "StreamEvent",
    "chat_chunks",
    "completion_chunks",
    "shown_tokens",
    "timed_events",
]


@dataclass(frozen=True)
class Chunk:
    """One chunk of a stream: the output step whose arrival it waits for, its JSON, the tokens it bills."""

    step: int
    payload: dict[str, Any]
    billed: int = 0


@dataclass
class StreamEvent:
    """Bytes to send after waiting ``delay_s``, and the tokens they bill."""

    delay_s: float
    data: bytes
    billed: int = 0


DONE = b"data: [DONE]\n\n"


def sse(payload: Any) -> bytes:
    """One server-sent event carrying ``payload`` as JSON."""
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def shown_tokens(gen: Generation, *, with_end: bool = False) -> list[TokenRecord]:
    """Generated tokens as logprobs list them: end-of-text is billed, and shown only `with_end` (vLLM)."""
    return [r for r in gen.tokens if with_end or r.token_id != EOS_TOKEN_ID]


def _pieces(gen: Generation, with_end: bool = False) -> list[tuple[TokenRecord | None, str, int, int]]:
    """Per generated token: its record (``None`` for end-of-text), its share of the final text, its offset
    and the tokens it bills. A generation without tokens gives one empty piece billing nothing."""
    offsets = text_offsets(gen.token_ids)
    limit = len(gen.text)
    ends = offsets[1:] + [limit]
    pieces: list[tuple[TokenRecord | None, str, int, int]] = []
    for record, start, end in zip(gen.tokens, offsets, ends):
        shown = None if record.token_id == EOS_TOKEN_ID and not with_end else record
        pieces.append((shown, gen.text[min(start, limit) : min(max(end, start), limit)], start, 1))
    if not pieces:
        pieces.append((None, gen.text, 0, 0))
    return pieces


def _interleave(choices: Sequence[Generation], with_end: bool = False) -> list[tuple[int, int, tuple[TokenRecord | None, str, int, int]]]:
    """``(step, choice index, piece)`` in arrival order: step by step, choice by choice."""
    per_choice = [_pieces(gen, with_end) for gen in choices]
    out = []
    for step in range(max(len(p) for p in per_choice)):
        for index, pieces in enumerate(per_choice):
            if step < len(pieces):
                out.append((step, index, pieces[step]))
    return out


def completion_chunks(
    *,
    ident: str,
    created: int,
    model: str,
    choices: Sequence[Generation],
    caps: Capabilities,
    echo: bool,
    logprobs: int | None,
    prompt_text: str,
    prompt_records: Sequence[TokenRecord] | None,
    render: Callable[[int], str] = token_str,
    first_index: int = 0,
) -> list[Chunk]:
    """``text_completion`` chunks: the echoed prompt first (with its logprobs), then one per token.
    ``first_index``: the index of the first choice (a later prompt of a list of prompts)."""

    def chunk(index: int, text: str, lp: Any, finish: str | None) -> dict[str, Any]:
        return {
            "id": ident,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [{"index": first_index + index, "text": text, "logprobs": lp, "finish_reason": finish}],
        }

    chunks = []
    if echo:
        lp = None
        if logprobs is not None and prompt_records is not None:
            offsets = text_offsets([r.token_id for r in prompt_records])
            if caps.offsets_unknown:
                offsets = [-1] * len(offsets)
            lp = completion_logprobs(prompt_records, offsets, include_chosen=caps.logprobs_all, render=render)
        chunks.extend(Chunk(0, chunk(index, prompt_text, lp, None)) for index in range(len(choices)))
    base = len(prompt_text) if (caps.offsets_from_prompt_start or echo) else 0
    last_step = {index: len(_pieces(gen)) - 1 for index, gen in enumerate(choices)}
    rendered = dict.fromkeys(range(len(choices)), 0)  # the rendered length so far, per choice (`offsets_rendered`)
    for step, index, (record, text, offset, billed) in _interleave(choices, caps.lists_end_token):
        lp = None
        if logprobs is not None:
            if caps.completions_logprobs_chat_shape:
                lp = {"content": chat_logprob_items([record] if record else [], render=render)}
            else:
                at = -1 if caps.offsets_unknown else base + (rendered[index] if caps.offsets_rendered else offset)
                rendered[index] += len(render(record.token_id)) if record else 0
                lp = completion_logprobs([record] if record else [], [at] if record else [],
                                         include_chosen=caps.logprobs_all, render=render)
        finish = choices[index].finish_reason if step == last_step[index] else None
        chunks.append(Chunk(step, chunk(index, text, lp, finish), billed))
    return chunks


def chat_chunks(
    *,
    ident: str,
    created: int,
    model: str,
    choices: Sequence[Generation],
    logprobs: bool,
    prefix: str,
    render: Callable[[int], str] = token_str,
    with_end: bool = False,
) -> list[Chunk]:
    """``chat.completion.chunk``s: the role, the continued prefix (llama.cpp prefill), one per token, the
    finish reason. ``with_end``: the end-of-text token's logprobs are shown (vLLM)."""

    def chunk(index: int, delta: dict[str, Any], lp: Any, finish: str | None) -> dict[str, Any]:
        return {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}],
        }

    chunks = []
    for index in range(len(choices)):
        chunks.append(Chunk(0, chunk(index, {"role": "assistant", "content": ""}, None, None)))
        if prefix:
            chunks.append(Chunk(0, chunk(index, {"content": prefix}, None, None)))
    last = 0
    for step, index, (record, text, _, billed) in _interleave(choices, with_end):
        lp = {"content": chat_logprob_items([record] if record else [], render=render)} if logprobs else None
        chunks.append(Chunk(step, chunk(index, {"content": text}, lp, None), billed))
        last = step
    chunks.extend(Chunk(last, chunk(index, {}, None, gen.finish_reason)) for index, gen in enumerate(choices))
    return chunks


def timed_events(
    chunks: Sequence[Chunk],
    timing: RequestTiming,
    plan: FaultPlan,
    *,
    usage: dict[str, Any] | None,
    late_billed: int = 0,
    done: bool = True,
    usage_on_last: dict[str, Any] | None = None,
) -> tuple[list[StreamEvent], list[dict[str, Any]]]:
    """The stream's events, and the payloads sent.

    Each chunk waits for its step's arrival time. With ``usage``, chunks carry ``"usage": null`` and a last
    chunk with no choices carries the usage. ``late_billed`` tokens (rejected predictions) are billed with
    the final chunk. ``usage_on_last``: the usage on the last chunk itself, unasked (llama-server's
    completions streams). A truncating fault cuts the stream in half, inside a chunk, before ``[DONE]`` (sent unless ``done`` is False).
    """
    arrivals = [timing.first_token_s]
    for gap in timing.gaps_s:
        arrivals.append(arrivals[-1] + gap)
    events: list[StreamEvent] = []
    sent: list[dict[str, Any]] = []
    now = 0.0
    for item in chunks:
        payload = item.payload
        if plan.drop_logprobs:
            payload = drop_logprobs(payload)
        if plan.mismatch_logprobs:
            payload = mismatch_logprobs(payload)
        if usage is not None:
            payload = {**payload, "usage": None}
        elif usage_on_last is not None and item is chunks[-1]:
            payload = {**payload, "usage": usage_on_last}
        at = arrivals[min(item.step, len(arrivals) - 1)]
        events.append(StreamEvent(max(0.0, at - now), sse(payload), item.billed))
        now = max(now, at)
        sent.append(payload)
    if usage is not None:
        final = {**chunks[-1].payload, "choices": [], "usage": usage}
        events.append(StreamEvent(0.0, sse(final)))
        sent.append(final)
    events[-1].billed += late_billed
    if done:
        events.append(StreamEvent(0.0, DONE))
    if plan.truncate:
        events = events[: max(1, len(events) // 2)]
        last = events[-1]
        events[-1] = StreamEvent(last.delay_s, truncate(last.data), last.billed)
    return events, sent


class SSEStream:
    """Server-sent events, each delivered after its delay. Async-iterate it for bytes; ``aclose()`` ends it
    early. ``on_billed(n)`` runs as billed chunks go out; ``on_close()`` runs once, at the end or on close."""

    def __init__(
        self,
        events: Sequence[StreamEvent],
        *,
        sleep: Sleep,
        on_billed: Callable[[int], None],
        on_close: Callable[[], None],
    ) -> None:
        self._events = iter(events)
        self._sleep = sleep
        self._on_billed = on_billed
        self._on_close = on_close
        self._closed = False

    def __aiter__(self) -> SSEStream:
        return self

    async def __anext__(self) -> bytes:
        event = None if self._closed else next(self._events, None)
        if event is None:
            await self.aclose()
            raise StopAsyncIteration
        if event.delay_s > 0:
            await self._sleep(event.delay_s)
        if event.billed:
            self._on_billed(event.billed)
        return event.data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_close()
