"""A round's draft made ahead of its turn: the first round's draft made before the prompt is tokenized,
and the next round's draft made while this one is verified (kept when its guess of the accepted text
held, waited for and counted when it did not). Each function says how many drafted tokens it left
unverified; the engine books them (`RequestState.discarded`)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from dataclasses import replace
from typing import Any

from ..transport._calls import Clock, Meter
from ..core.context import Context
from ..parts.drafters import Draft, ModelDrafter, usable_prefix
from .request import Prefetched

__all__ = ["first_draft", "settle", "start_prefetch", "take_prefetch"]


def first_draft(draft: Draft, context: Context, k: int) -> tuple[Draft | None, int]:
    """The draft made before the prompt was tokenized, for the first round (cut to its `k` tokens), and
    the tokens of it left unverified."""
    if context.accepted:  # the first round went otherwise: the draft is billed, never verified
        return None, len(draft.tokens)
    if len(draft.tokens) <= k:
        return draft, 0
    rest = usable_prefix(draft.tokens[:k])  # cut at a complete character
    return replace(draft, tokens=rest, confidence=draft.confidence[: len(rest)]), len(draft.tokens) - len(rest)


def start_prefetch(model: ModelDrafter, context: Context, k: int, meter: Meter, seed: int | None) -> Prefetched:
    """Draft the next round while this one is verified, guessing that every draft token is kept."""
    task = asyncio.ensure_future(model.draft(context, k, meter, seed))
    return Prefetched(task=task, assumed=context.accepted)


def take_prefetch(prefetched: Prefetched, context: Context, k: int, clock: Clock) -> Coroutine[Any, Any, tuple[Draft | None, int]] | None:
    """The prefetched draft minus the tokens the round already produced, if the guess held (None: it
    did not), with the tokens of it left unverified.

    A stale guess is not cancelled: the server may have processed it already, and what it bills
    is counted when the request ends (`settle`)."""
    if not context.accepted.startswith(prefetched.assumed):
        return None
    produced = context.accepted[len(prefetched.assumed) :].encode("utf-8")

    async def usable() -> tuple[Draft | None, int]:
        started = clock()
        try:
            draft = await prefetched.task
        except Exception:
            return None, 0  # a failed guess costs nothing but the call: draft afresh
        skipped, offset = 0, 0
        while offset < len(produced) and skipped < len(draft.tokens):
            offset += len(draft.tokens[skipped].data)
            skipped += 1
        if draft.text.encode("utf-8")[: len(produced)] != produced or offset != len(produced):
            return None, 0
        rest = usable_prefix(draft.tokens[skipped : skipped + k])  # cut at a complete character
        discarded = len(draft.tokens) - skipped - len(rest)
        if not rest:
            return None, discarded
        return Draft(tokens=rest, latency_s=clock() - started, drafter=draft.drafter, pipelined=True, model=draft.model), discarded

    return usable()


async def settle(stale: list[asyncio.Task[Draft]]) -> int:
    """Wait for the stale prefetches (their usage reaches the draft meter): the tokens they drafted."""
    results = await asyncio.gather(*stale, return_exceptions=True)
    return sum(len(r.tokens) for r in results if isinstance(r, Draft))
