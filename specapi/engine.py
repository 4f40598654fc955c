"""The round loop: draft, verify, accept, repeat. One async generator drives every request.

`generate` yields a `Piece` of text each time the target has accepted some, then a final `Finished`
with the statistics; `client.py` collects them into a response or a stream. All the decisions are pure
functions (`acceptance.decide_round`); this module only sequences the calls and keeps the books.
"""

from __future__ import annotations

import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from ._calls import Clock, Meter, RoleClient
from ._exceptions import DraftError, EndpointError, MalformedResponseError
from .acceptance import Emitted, decide_round
from .alignment import complete_utf8_prefix, token_bytes
from .context import Context
from .drafters import Draft, Drafter
from .policy import DraftLengthPolicy, PolicyState
from .sampling import COVERAGE_TOLERANCE
from .stats import RoleUsage, RoundRecord, SpeculativeStats
from .verifiers import Verifier, plain_step

__all__ = ["GenerationRequest", "Piece", "Finished", "Engine"]


@dataclass(frozen=True)
class GenerationRequest:
    context: Context
    max_tokens: int
    stop: tuple[str, ...] = ()


@dataclass(frozen=True)
class Piece:
    """Text the target accepted, with the tokens that spell it."""

    text: str
    tokens: tuple[Emitted, ...] = ()


@dataclass(frozen=True)
class Finished:
    finish_reason: str
    stats: SpeculativeStats
    prompt_tokens: int | None
    completion_tokens: int


def _seed(rng: random.Random, seeded: bool) -> int | None:
    return rng.randrange(2**31) if seeded else None


@dataclass
class _Books:
    """Mutable per-request bookkeeping."""

    rounds: list[RoundRecord] = field(default_factory=list)
    fallback_reason: str | None = None
    inexact_reason: str | None = None
    max_gap: float = 0.0
    prompt_tokens: int | None = None
    ttft_s: float | None = None


class Engine:
    """Runs requests against one target (and optionally one drafter) with one verifier and one policy."""

    def __init__(
        self,
        *,
        target: RoleClient,
        verifier: Verifier | None,
        drafter: Drafter | None,
        draft_meter_endpoint: RoleClient | None,
        policy: DraftLengthPolicy,
        clock: Clock = time.perf_counter,
    ) -> None:
        self.target = target
        self.verifier = verifier
        self.drafter = drafter
        self.draft_client = draft_meter_endpoint
        self.policy = policy
        self.clock = clock

    async def generate(self, request: GenerationRequest, *, unverifiable_reason: str | None = None) -> AsyncIterator[Piece | Finished]:
        started = self.clock()
        sampling = request.context.sampling
        seeded = request.context.seed is not None
        rng = random.Random(request.context.seed)
        target_meter = Meter(self.target.endpoint)
        draft_meter = Meter(self.draft_client.endpoint) if self.draft_client else None
        books = _Books(fallback_reason=unverifiable_reason)
        context = request.context
        tokens: list[Emitted] = []
        text = ""
        finish_reason = "length"
        top_k = 1 if sampling.greedy else self.target.endpoint.max_logprobs
        speculate = self.verifier is not None and self.drafter is not None and unverifiable_reason is None

        produced = 0
        while produced < request.max_tokens:
            remaining = request.max_tokens - produced
            k = min(self.policy.choose(PolicyState(remaining, len(books.rounds))), remaining - 1) if speculate else 0
            new: list[Emitted] = []
            if k > 0:
                draft = await self._draft(context, k, draft_meter, _seed(rng, seeded), books)
                if draft is None:
                    speculate = False
                    continue
                if draft.tokens:
                    outcome = await self._round(context, draft, target_meter, rng, seeded, top_k, books)
                    if outcome is None:
                        speculate = False
                        continue
                    new = outcome
            if not new:
                # Nothing drafted, nothing decided, or no speculation: the target takes a plain step,
                # of one token while speculating, of everything that remains otherwise.
                step_tokens = 1 if speculate else remaining
                step = await plain_step(self.target, context, step_tokens, target_meter, _seed(rng, seeded), list(request.stop) or None)
                if books.prompt_tokens is None and not context.accepted and step.prompt_tokens is not None:
                    books.prompt_tokens = step.prompt_tokens
                self.policy.observe_plain(step.completion_tokens, step.latency_s)
                if step.text:
                    count = step.completion_tokens or 1
                    if step.finish_reason == "length":
                        count = step_tokens  # the server stopped at exactly the tokens it was allowed
                    new = [Emitted(token=step.text, data=step.text.encode("utf-8"), count=min(count, remaining))]
                if step.finish_reason != "length" or not step.text:
                    new.append(Emitted(token="", data=b"", eos=True))

            # Apply the new tokens: end of text, max_tokens, stop strings.
            before = len(text)
            ended = False
            for token in new:
                if token.eos:
                    finish_reason, ended = "stop", True
                    break
                tokens.append(token)
                produced += token.count
                text += token.data.decode("utf-8")
                if produced >= request.max_tokens:
                    break
            cut = _find_stop(text, request.stop, before)
            if cut is not None:
                text = text[:cut]
                finish_reason, ended = "stop", True
            piece = text[before:]
            if piece:
                if books.ttft_s is None:
                    books.ttft_s = self.clock() - started
                yield Piece(text=piece, tokens=tuple(new))
            context = context.advanced(piece)
            if ended:
                break

        stats = SpeculativeStats(
            rounds=tuple(books.rounds),
            draft=draft_meter.snapshot() if draft_meter else RoleUsage(),
            target=target_meter.snapshot(),
            exact=books.inexact_reason is None,
            exact_reason=books.inexact_reason,
            speculated=bool(books.rounds),
            fallback_reason=books.fallback_reason,
            verification=getattr(self.verifier, "name", "none") if books.rounds else "none",
            generated_tokens=produced,
            wall_s=self.clock() - started,
            ttft_s=books.ttft_s,
            max_coverage_gap=books.max_gap,
        )
        yield Finished(finish_reason=finish_reason, stats=stats, prompt_tokens=books.prompt_tokens, completion_tokens=produced)

    async def _draft(self, context: Context, k: int, meter: Meter | None, seed: int | None, books: _Books) -> Draft | None:
        assert self.drafter is not None and meter is not None
        try:
            return await self.drafter.draft(context, k, meter, seed)
        except (DraftError, MalformedResponseError) as exc:
            books.fallback_reason = f"draft failed, continued with the target alone: {exc}"
            return None

    async def _round(
        self, context: Context, draft: Draft, meter: Meter, rng: random.Random, seeded: bool, top_k: int, books: _Books
    ) -> list[Emitted] | None:
        assert self.verifier is not None
        try:
            verification = await self.verifier.verify(context, draft.text, meter, _seed(rng, seeded), top_k)
        except MalformedResponseError as exc:
            books.fallback_reason = f"target response could not be verified against, continued with the target alone: {exc}"
            return None
        except EndpointError as exc:
            if exc.status_code not in (400, 422):
                raise
            # The target refuses the verification request's shape (e.g. echo with logprobs): a plain
            # request may still be fine, and if it is not, the plain step raises the real error.
            books.fallback_reason = f"target refused the verification request, continued with the target alone: {exc}"
            return None
        if books.prompt_tokens is None and not context.accepted and verification.prompt_tokens is not None:
            books.prompt_tokens = verification.prompt_tokens
        decision = decide_round(verification.positions, verification.straddle, draft.tokens, context.sampling, rng)
        new = list(decision.emitted)
        if decision.all_accepted and not decision.stalled:
            if verification.bonus is not None:
                bonus = verification.bonus
                new.append(Emitted(token=bonus.text, data=token_bytes(bonus.text) or b"", logprob=bonus.logprob, top=dict(bonus.top or {})))
            elif verification.finish_reason == "stop":
                new.append(Emitted(token="", data=b"", eos=True))
        if not context.sampling.greedy:
            books.max_gap = max(books.max_gap, decision.gap)
            if decision.gap > COVERAGE_TOLERANCE and books.inexact_reason is None:
                books.inexact_reason = (
                    f"approximate: the top-{top_k} logprob lists left up to {decision.gap:.2%} of the probability mass unseen"
                )
        new = _whole_characters(new, context.sampling.greedy, books)
        record = RoundRecord(
            drafted=len(draft.tokens),
            accepted=decision.accepted,
            emitted=sum(1 for t in new if not t.eos),
            draft_latency_s=draft.latency_s,
            verify_latency_s=verification.latency_s,
            drafter=draft.drafter,
            accepted_by_position=decision.accepted_by_position,
        )
        books.rounds.append(record)
        self.policy.observe(record)
        return new


def _whole_characters(tokens: list[Emitted], greedy: bool, books: _Books) -> list[Emitted]:
    """Drop trailing tokens that end inside a UTF-8 character: text can only be sent back whole.

    The next round re-derives them from the same text, which is exact for greedy decoding; for sampling
    it re-draws a token, so the response says it is approximate.
    """
    data = b"".join(t.data for t in tokens)
    if complete_utf8_prefix(data) == data:
        return tokens
    kept = list(tokens)
    while kept and complete_utf8_prefix(b"".join(t.data for t in kept)) != b"".join(t.data for t in kept):
        kept.pop()
    if not greedy and books.inexact_reason is None:
        books.inexact_reason = "approximate: a token ended inside a UTF-8 character and was drawn again"
    return kept


def _find_stop(text: str, stops: tuple[str, ...], new_from: int) -> int | None:
    """Where the earliest stop string begins, searching only matches that involve new text."""
    best: int | None = None
    for stop in stops:
        index = text.find(stop, max(0, new_from - len(stop) + 1))
        if index != -1 and (best is None or index < best):
            best = index
    return best
