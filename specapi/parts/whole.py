"""Verification paths where the target generates the whole answer itself, so output is exact by
construction and the draft only helps (Predicted Outputs) or is only measured (prefix match).

- `PredictedOutputsPath`: the draft's continuation goes to the target as OpenAI's `prediction`; the
  server reports how many predicted tokens it accepted and rejected (rejected ones are billed). Only
  free drafters propose here, and a suffix draft is sent only as far as it is likely to pay.
- `PrefixMatchPath`: the draft and the target generate side by side; the draft is compared with the
  target's text. Always exact, never faster than the target alone, and reported as such.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..transport._calls import Meter, RoleClient
from ..core.context import Context
from ..dialects.base import reading
from ..dialects.openai import generation_request, openai_format
from .drafters import Draft, Drafter
from ..core.stats import RoundRecord
from .suffix import screen_prediction

__all__ = ["WholeResult", "PredictedOutputsPath", "PrefixMatchPath"]

#: How much the draft proposes when the caller set no max_tokens.
_PREDICTION_TOKENS = 256


@dataclass(frozen=True)
class WholeResult:
    text: str
    finish_reason: str
    completion_tokens: int
    prompt_tokens: int | None
    record: RoundRecord | None


def _read(response: dict, context: Context) -> tuple[str, str, dict]:
    choice = response["choices"][0]
    text = openai_format(context).text(choice)
    return text, choice.get("finish_reason") or "stop", response.get("usage") or {}


@dataclass
class PredictedOutputsPath:
    target: RoleClient
    name: str = "predicted-outputs"

    async def run(
        self, context: Context, drafter: Drafter, draft_meter: Meter, target_meter: Meter, max_tokens: int | None, seeds: tuple[int | None, int | None], stop: tuple[str, ...]
    ) -> WholeResult:
        started = self.target.clock()
        # A draft call here delays the answer by its whole latency: a combined drafter proposes
        # with its free drafters only (suffix index, lookup, the user's prediction).
        draft = await drafter.free_only().draft(context, max_tokens or _PREDICTION_TOKENS, draft_meter, seeds[0])
        draft = screen_prediction(draft)  # a suffix draft goes only as far as it is likely to pay
        draft_latency = self.target.clock() - started
        path, body = generation_request(context, max_tokens, seeds[1], stop, prediction=draft.text)
        started = self.target.clock()
        response = await self.target.post(path, body, target_meter, options=context.options)
        with reading(self.target, "generation"):
            text, finish, usage = _read(response, context)
        details = usage.get("completion_tokens_details") or {}
        accepted = int(details.get("accepted_prediction_tokens") or 0)
        rejected = int(details.get("rejected_prediction_tokens") or 0)
        drafted = len(draft.tokens)
        accepted = min(accepted, drafted)
        # Rejected prediction tokens are billed as completion tokens but are not in the text.
        produced = max(0, int(usage.get("completion_tokens") or 0) - rejected)
        record = RoundRecord(
            drafted=drafted,
            accepted=accepted,
            emitted=produced,
            draft_latency_s=draft_latency,
            verify_latency_s=self.target.clock() - started,
            drafter=draft.drafter + f" (server rejected {rejected} predicted tokens, billed as output)",
            accepted_by_position=tuple(i < accepted for i in range(drafted)),
        )
        return WholeResult(text, finish, produced, usage.get("prompt_tokens"), record if drafted else None)


@dataclass
class PrefixMatchPath:
    target: RoleClient
    name: str = "prefix-match"

    async def run(
        self, context: Context, drafter: Drafter, draft_meter: Meter, target_meter: Meter, max_tokens: int | None, seeds: tuple[int | None, int | None], stop: tuple[str, ...]
    ) -> WholeResult:
        path, body = generation_request(context, max_tokens, seeds[1], stop)
        started = self.target.clock()
        draft_task = asyncio.ensure_future(self._timed_draft(drafter, context, max_tokens or _PREDICTION_TOKENS, draft_meter, seeds[0], self.target.clock))
        try:
            response = await self.target.post(path, body, target_meter, options=context.options)
        except BaseException:
            draft_task.cancel()
            raise
        target_latency = self.target.clock() - started
        try:
            draft, draft_latency = await draft_task
        except Exception:
            draft, draft_latency = Draft(tokens=()), 0.0
        with reading(self.target, "generation"):
            text, finish, usage = _read(response, context)
        matched, offset = [], 0
        for token in draft.tokens:
            piece = token.data.decode("utf-8", errors="replace")
            matched.append(text.startswith(piece, offset))
            if not matched[-1]:
                break
            offset += len(piece)
        matched += [False] * (len(draft.tokens) - len(matched))
        record = RoundRecord(
            drafted=len(draft.tokens),
            accepted=sum(matched),
            emitted=int(usage.get("completion_tokens") or 0),
            draft_latency_s=draft_latency,
            verify_latency_s=target_latency,
            drafter=draft.drafter,
            accepted_by_position=tuple(matched),
        )
        return WholeResult(text, finish, int(usage.get("completion_tokens") or 0), usage.get("prompt_tokens"), record if draft.tokens else None)

    @staticmethod
    async def _timed_draft(drafter: Drafter, context: Context, k: int, meter: Meter, seed: int | None, clock) -> tuple[Draft, float]:  # type: ignore[no-untyped-def]
        started = clock()
        draft = await drafter.draft(context, k, meter, seed)
        return draft, clock() - started
