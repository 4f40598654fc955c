"""A round's draft made ahead of its turn: the first round's draft made before the prompt is tokenized,
and the next round's draft made while this one is verified (kept when its guess of the accepted text
held, waited for and counted when it did not)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from ..transport._calls import Clock
from ..core.context import Context
from ..parts.drafters import Draft, ModelDrafter, usable_prefix
from .request import Prefetched, RequestState

__all__ = ["first_draft", "settle", "start_prefetch", "take_prefetch"]


def first_draft(state: RequestState, context: Context, k: int) -> Draft | None:
    """The draft made before the prompt was tokenized, for the first round (cut to its `k` tokens)."""
    draft, state.first_draft = state.first_draft, None
    if draft is None:
        return None
    if context.accepted:  # the first round went otherwise: the draft is billed, never verified
        state.discarded_draft_tokens += len(draft.tokens)
        return None
    if len(draft.tokens) <= k:
        return draft
    rest = usable_prefix(draft.tokens[:k])  # cut at a complete character
    state.discarded_draft_tokens += len(draft.tokens) - len(rest)
    return replace(draft, tokens=rest, confidence=draft.confidence[: len(rest)])


def start_prefetch(model: ModelDrafter, context: Context, k: int, state: RequestState) -> Prefetched:
    """Draft the next round while this one is verified, guessing that every draft token is kept."""
    assert state.draft_meter is not None
    task = asyncio.ensure_future(model.draft(context, k, state.draft_meter, state.seed()))
    return Prefetched(task=task, assumed=context.accepted)


def take_prefetch(prefetched: Prefetched, context: Context, k: int, clock: Clock, state: RequestState) -> Coroutine[Any, Any, Draft | None] | None:
    """The prefetched draft minus the tokens the round already produced, if the guess held.

    A stale guess is not cancelled: the server may have processed it already, and what it bills
    is counted when the request ends."""
    if not context.accepted.startswith(prefetched.assumed):
        state.stale.append(prefetched.task)
        return None
    produced = context.accepted[len(prefetched.assumed) :].encode("utf-8")

    async def usable() -> Draft | None:
        started = clock()
        try:
            draft = await prefetched.task
        except Exception:
            return None  # a failed guess costs nothing but the call: draft afresh
        skipped, offset = 0, 0
        while offset < len(produced) and skipped < len(draft.tokens):
            offset += len(draft.tokens[skipped].data)
            skipped += 1
        if draft.text.encode("utf-8")[: len(produced)] != produced or offset != len(produced):
            return None
        rest = usable_prefix(draft.tokens[skipped : skipped + k])  # cut at a complete character
        state.discarded_draft_tokens += len(draft.tokens) - skipped - len(rest)
        if not rest:
            return None
        return Draft(tokens=rest, latency_s=clock() - started, drafter=draft.drafter, pipelined=True, model=draft.model)

    return usable()


async def settle(state: RequestState) -> None:
    """Wait for the stale prefetches (their usage reaches the draft meter) and count their tokens."""
    if not state.stale:
        return
    results = await asyncio.gather(*state.stale, return_exceptions=True)
    state.discarded_draft_tokens += sum(len(r.tokens) for r in results if isinstance(r, Draft))
    state.stale.clear()
