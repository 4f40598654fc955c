"""One request's state in the engine (`RequestState`), and the only module that writes it.

The `Engine` holds what all requests of a client share (the target, the path resolver, the policy and
drafter it was built with); every choice made for one request (its verifier, its prefill style, its
drafter and policy, its output so far, a prefetched draft, the books) lives on its `RequestState`.
Every other module reads it: the engine sequences the calls and hands each one's outcome to a method
here (the plan, the policy's `Decision`, a round's `RoundDecision` and `RoundRecord`, what a
target-alone call reported as `AloneBooks`), which applies it. Each method is one transition, named
for what happened to the request; `finished` turns the books into the answer's statistics.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..transport._calls import Meter
from ..core.acceptance import RoundDecision
from ..core.context import Context
from ..dialects.logprobs import LogprobShape, joined, learnt_offsets, render
from ..dialects.openai import Prefill
from ..parts.draft_length import Decision
from ..parts.drafters import Draft, Drafter
from .output import Output, prompt_count_split, token_boundary_split, token_count_split
from .plan import Plan
from ..parts.policy import DraftLengthPolicy
from ..parts.probe import Capabilities
from .request import Finished, GenerationRequest, Prefetched
from ..core.stats import RoleUsage, RoundRecord, SpeculativeStats
from ..parts.verifiers import Verification, Verifier

__all__ = ["AloneBooks", "RequestState"]


@dataclass(frozen=True)
class AloneBooks:
    """What one target-alone call (a step, a stream, a relayed stream) reports to the request's books."""

    context: Context  # the context the call continued
    produced: int  # the answer's tokens before the call
    prompt_tokens: int | None  # the call's prompt as the target billed it (None: not reported)
    usage: Mapping[str, Any] | None  # the call's usage as the target reported it
    #: A step's `logprobs` objects, one per call asked (a step asked again longer is one more): the
    #: offsets convention is read from them, and the last stands for the caller's. Empty for a stream.
    logprobs: tuple[Any, ...] = ()


@dataclass
class RequestState:
    """Everything one request's rounds share: its choices, its output so far, and its books."""

    request: GenerationRequest
    seeded: bool
    target_meter: Meter
    draft_meter: Meter | None
    top_k: int
    drafter: Drafter | None = None  # this request's (a seeded request's may differ from the client's)
    policy: DraftLengthPolicy | None = None
    verifier: Verifier | None = None  # the round path's verifier (None: no round path)
    verification: str = "none"  # the name of the path's verifier (or whole-answer path), for the stats
    prefill: Prefill = Prefill()  # how the target continues an assistant message on this path
    #: The target's chat content hides a token run left unfinished, its logprobs show it (llama-server):
    #: a chat step that the text goes on from is asked with logprobs and cut back to whole runs.
    whole_runs: bool = False
    output: Output | None = None
    prefetch: Prefetched | None = None
    #: The first round's draft, drafted before the prompt was tokenized (a greedy request on token ids).
    first_draft: Draft | None = None
    #: Pipelined drafts that turned out stale: not verified, but billed once the server answers.
    stale: list[asyncio.Task[Draft]] = field(default_factory=list)

    # -- the books ------------------------------------------------------------------------------
    rounds: list[RoundRecord] = field(default_factory=list)
    round_drafters: list[str] = field(default_factory=list)  # the drafter of each round (pipelined or not)
    fallback_reason: str | None = None
    inexact_reason: str | None = None
    max_gap: float = 0.0
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    path_note: str | None = None
    boundaries_checked: int = 0  # how many of the output's token starts a scored prompt has confirmed
    #: The target read its own output back with other token boundaries (see `check_prompt_count`).
    retokenized: bool = False
    discarded_draft_tokens: int = 0
    acceptance: str = "exact"  # the rule the rounds are decided with (see lossy.py)
    acceptance_note: str | None = None
    divergent: int = 0
    logprob_gap: float = 0.0
    load_reason: str | None = None  # what the load on the upstreams changed (the policy's `load_reason`)
    #: The target refused a verification request (HTTP 400): the shape's fault only if the plain request
    #: that follows is accepted (else the caller's request is at fault, and its error is the answer).
    refusal: str | None = None
    refused_path: str | None = None  # the path this request's refusal wrote off (see `Engine._learn_refusal`)
    plain_calls: int = 0  # target-alone calls whose text is in the answer
    plain_usage: Mapping[str, Any] | None = None  # the usage the last of them reported
    plain_logprobs: Any = None  # the caller's logprobs as the last of them sent them
    #: The caller's logprobs of a streamed whole answer, as the target's chunks carried them, not yet out.
    streamed_logprobs: list[Any] | None = None
    logprob_shape: LogprobShape | None = None  # how the caller's logprobs are written (None: not asked)

    # -- seeds ----------------------------------------------------------------------------------
    #: The seed a fan-out call used on this exact context (accepted text, seed), when its pick could
    #: not be read: the step that decides that position draws the same token again with it.
    pending_seed: tuple[str, int] | None = None
    #: How long a step of the event loop waited for its turn before the first round (0 with no other
    #: request in flight): `PolicyState.queue_delay_s` of the first round.
    queue_delay_s: float = 0.0
    _rng: random.Random | None = None
    _base: int | None = None
    #: The target wrote the whole answer alone, sent the caller's seed unchanged.
    alone_with_callers_seed: bool = False
    #: Drafts come from the verifier's native draft call (whole distributions): no pipelined model drafts.
    native_drafts: bool = False

    @property
    def out(self) -> Output:
        assert self.output is not None, "the output is made once the request is planned"
        return self.output

    # -- the plan and the start -----------------------------------------------------------------
    def adopt(self, planned: Plan, *, whole_runs: bool, seeded: tuple[Drafter | None, DraftLengthPolicy]) -> None:
        """Take the plan's choices (`seeded`: the drafter and policy of a request whose drafts decide
        its draws, see `Plan.seeded_drafts`)."""
        path = planned.path
        self.request, self.top_k = planned.request, planned.top_k
        self.path_note, self.prefill = path.note, path.prefill
        self.whole_runs = whole_runs
        self.acceptance, self.acceptance_note = planned.acceptance, planned.acceptance_note
        # A request the plan keeps with the target alone asks what the caller asked (no counting logprobs).
        self.verifier = path.verifier if planned.speculate else None
        chosen = path.whole if path.whole is not None else path.verifier
        self.verification = chosen.name if chosen is not None else "none"
        self.fallback_reason = planned.fallback_reason
        self.logprob_shape = planned.logprob_shape
        if planned.seeded_drafts:
            self.drafter, self.policy = seeded

    def waited_in_queue(self, seconds: float) -> None:
        self.queue_delay_s = seconds

    def drafted_first(self, draft: Draft | None) -> None:
        """The first round's draft, made before the prompt was tokenized."""
        self.first_draft = draft

    def take_first_draft(self) -> Draft | None:
        draft, self.first_draft = self.first_draft, None
        return draft

    def tokenized(self, ids: tuple[int, ...]) -> None:
        """The target tokenized the prompt: from here on it is sent ids."""
        self.request = replace(self.request, context=replace(self.request.context, token_ids=ids))
        if self.prompt_tokens is None:
            # The server counts the prompt as the ids it runs (a first round of several prompts bills
            # their sum, not the prompt's own count).
            self.prompt_tokens = len(ids)

    def open_output(self) -> Output:
        """The answer's output, made once the request (and its prompt's ids) are settled."""
        request = self.request
        self.output = Output(start=request.context, max_tokens=request.max_tokens, stop=request.stop)
        return self.output

    # -- why the answer is what it is -----------------------------------------------------------
    def fell_back(self, reason: str, *, keep_earlier: bool = False, refused: bool = False) -> None:
        """Speculation stopped for `reason` (`keep_earlier`: unless it had stopped already; `refused`:
        the target refused the request's shape, see `refusal`)."""
        self.fallback_reason = (self.fallback_reason or reason) if keep_earlier else reason
        if refused:
            self.refusal = reason

    def refusal_confirmed(self, path: str) -> None:
        self.refused_path = path

    def approximate(self, reason: str) -> None:
        """The answer is not the target's exactly, for `reason` (the first reason found stands)."""
        if self.inexact_reason is None:
            self.inexact_reason = reason

    def text_began(self, seconds: float) -> None:
        """The first text was handed out `seconds` after the request came."""
        self.ttft_s = seconds

    def chose(self, decision: Decision) -> None:
        """The policy's choice of the next round's length: what the load changed, and why it stops."""
        if decision.load_reason is not None and (decision.length <= 0 or self.load_reason is None):
            self.load_reason = decision.load_reason
        if decision.length <= 0:
            self.fell_back(decision.reason or "the draft-length policy turned speculation off", keep_earlier=True)

    # -- drafts ---------------------------------------------------------------------------------
    def drafts_natively(self) -> None:
        self.native_drafts = True

    def take_prefetch(self) -> Prefetched | None:
        prefetched, self.prefetch = self.prefetch, None
        return prefetched

    def prefetching(self, prefetched: Prefetched) -> None:
        self.prefetch = prefetched

    def went_stale(self, task: asyncio.Task[Draft]) -> None:
        """A prefetched draft whose guess did not hold: not verified, billed once its server answers."""
        self.stale.append(task)

    def discarded(self, tokens: int) -> None:
        """Draft tokens drafted (and billed) but never verified."""
        self.discarded_draft_tokens += tokens

    def settled_stale(self, tokens: int) -> None:
        """The stale drafts were waited for: `tokens` drafted in all."""
        self.discarded_draft_tokens += tokens
        self.stale.clear()

    # -- rounds ---------------------------------------------------------------------------------
    def prompt_counted(self, count: int | None) -> None:
        """A call at the answer's start billed the prompt as `count` tokens (the first count stands)."""
        if self.prompt_tokens is None and count is not None:
            self.prompt_tokens = count

    def decided(self, decision: RoundDecision, sampled: bool) -> None:
        """The books of a round's decision: what lossy acceptance kept, and the coverage gap."""
        self.divergent += decision.divergent
        if decision.redrawn:
            self.approximate("approximate: a drawn token's bytes could not be read back, and it was drawn again")
        self.logprob_gap += decision.logprob_gap
        if sampled:
            self.max_gap = max(self.max_gap, decision.gap)

    def redraw_at(self, accepted: str, seed: int | None) -> None:
        """The target's pick after `accepted` could not be read: the step that decides it draws with `seed`."""
        self.pending_seed = (accepted, seed) if seed is not None else None

    def book_round(self, record: RoundRecord, drafter: str) -> None:
        self.rounds.append(record)
        self.round_drafters.append(drafter)

    # -- the target alone -----------------------------------------------------------------------
    def step_seed(self, context: Context, step_tokens: int | None) -> int | None:
        """The seed of a target-alone step of `step_tokens` from `context` (None: the rest): a step asked
        again draws the same tokens; a position a fan-out call drew unreadably is drawn with its seed."""
        out = self.out
        remaining = out.remaining
        whole_answer = step_tokens is None or (remaining is not None and step_tokens >= remaining)
        seed = self.plain_seed(context, whole_answer, out.produced)
        if self.pending_seed is not None and self.pending_seed[0] == context.accepted:
            seed = self.pending_seed[1]
        self.pending_seed = None
        return seed

    def book_alone(self, books: AloneBooks) -> None:
        """A target-alone call whose text is in the answer."""
        for logprobs in books.logprobs:
            self._learn_offsets(logprobs)
        if books.logprobs:
            self.plain_logprobs = books.logprobs[-1]
        self.plain_calls += 1
        self.plain_usage = books.usage
        if not books.context.accepted:
            self.prompt_counted(books.prompt_tokens)
        self.check_prompt_count(books.prompt_tokens, books.context, books.produced)

    def rewrote(self, prompt_tokens: int | None, *, kept: bool) -> None:
        """The target wrote the answer again alone from the prompt (once per request); `kept`: it began
        with the text already handed out, and replaces the rest."""
        self.retokenized = False
        self.plain_calls += 1  # the answer is now this call's and the earlier ones' (their usage is not its)
        if not kept:
            return
        self.inexact_reason = None
        self.fell_back("the target re-read its own output with other token boundaries: it wrote the answer again alone", keep_earlier=True)
        if prompt_tokens is not None:
            # The target alone's own request: its prompt as the server counts it (a BOS it adds included),
            # where a verification call's count less its draft's would be off by the draft's re-tokenization.
            self.prompt_tokens = prompt_tokens

    def answered_whole(self, record: RoundRecord | None, prompt_tokens: int | None) -> None:
        """A whole-answer path's one draft and one target call (the target got the caller's seed)."""
        self.alone_with_callers_seed = True
        if record is not None:
            self.rounds.append(record)
        self.prompt_tokens = prompt_tokens

    # -- the caller's logprobs ------------------------------------------------------------------
    def caller_logprobs_streamed(self, objects: list[Any]) -> None:
        """`logprobs` objects of a stream the target writes alone, handed on with its text."""
        if self.streamed_logprobs is None:
            self.streamed_logprobs = []
        self.streamed_logprobs.extend(objects)

    def piece_logprobs(self) -> Any:
        """The caller's logprobs of the tokens handed out since the last piece (None: not asked, or
        left for the end, where the target's own list may stand in for them)."""
        out, shape = self.out, self.logprob_shape
        if self.streamed_logprobs is not None:
            taken, self.streamed_logprobs[:] = list(self.streamed_logprobs), []
            return joined(taken)
        if shape is None or out.scores is None or out.scores_lost:
            return None
        return render(shape, out.take_scores(final=False))

    def _learn_offsets(self, logprobs: Any) -> None:
        """Read the server's `text_offset` convention from a target-alone step at the answer's start."""
        shape = self.logprob_shape
        if shape is not None and shape.learn_offsets and self.output is not None and not self.output.text:
            self.logprob_shape = learnt_offsets(shape, logprobs, len(self.request.context.prompt or ""))

    def final_logprobs(self, alone: bool) -> Any:
        """The caller's logprobs of the tokens not handed out yet. The target's own list as it sent it
        when one target call wrote the whole answer (`alone`) and its tokens could not be kept one by
        one, or the answer is collected; else written from the kept tokens' scores."""
        out, shape = self.output, self.logprob_shape
        if self.streamed_logprobs is not None:
            return joined(self.streamed_logprobs)
        if shape is None or out is None or out.scores is None:
            return None
        if alone and self.plain_logprobs is not None and (out.scores_lost or not self.request.stream):
            return self.plain_logprobs
        if out.scores_lost:
            self.approximate("approximate: the target did not show the logprobs of every token one by one: some are missing")
        return render(shape, out.take_scores(final=True))

    # -- the end --------------------------------------------------------------------------------
    def finished(self, finish_reason: str, produced: int, wall_s: float, caps: Capabilities | None) -> Finished:
        """The request's end: its statistics from the books, and its usage and logprobs as the target
        alone would report them where one target call wrote the whole answer."""
        if not self.rounds and self.path_note:
            self.fell_back(self.path_note, keep_earlier=True)
        # One target call wrote the whole answer: its usage is the answer's, as the target alone reports it.
        alone = not self.rounds and self.plain_calls == 1 and not self.retokenized
        logprobs = self.final_logprobs(alone)
        lossy = self.acceptance != "exact"
        stats = SpeculativeStats(
            rounds=tuple(self.rounds),
            draft=self.draft_meter.snapshot() if self.draft_meter else RoleUsage(),
            target=self.target_meter.snapshot(),
            exact=self.inexact_reason is None and not lossy,
            exact_reason=self.inexact_reason or (
                f"lossy acceptance {self.acceptance!r} (opted in): kept draft tokens exact verification might reject" if lossy else None
            ),
            speculated=bool(self.rounds),
            fallback_reason=self.fallback_reason,
            verification=self.verification if self.rounds else "none",
            generated_tokens=produced,
            wall_s=wall_s,
            ttft_s=self.ttft_s,
            max_coverage_gap=self.max_gap,
            discarded_draft_tokens=self.discarded_draft_tokens,
            acceptance=self.acceptance,
            acceptance_note=self.acceptance_note,
            divergent_tokens=self.divergent,
            logprob_gap=self.logprob_gap,
            load_reason=self.load_reason,
            verification_refused=self.refused_path,
            seed_note=self.seed_note(),
        )
        return Finished(
            finish_reason=finish_reason, stats=stats, prompt_tokens=self.prompt_tokens, completion_tokens=produced,
            usage=self.plain_usage if alone and isinstance(self.plain_usage, Mapping) else None,
            stream_usage=caps is not None and caps.stream_usage_unasked and not self.request.context.is_chat, logprobs=logprobs,
            prompt_cached_tokens=self.target_meter.first_cached,
        )

    # -- seeds ----------------------------------------------------------------------------------
    @property
    def rng(self) -> random.Random:
        """The request's random draws, seeded with its seed. Made at the first draw: most requests (greedy,
        unseeded) never draw, and seeding one from the system's entropy costs as much as a JSON chunk."""
        if self._rng is None:
            self._rng = random.Random(self.request.context.seed)
        return self._rng

    def seed(self) -> int | None:
        """A seed for the next call, drawn from the request's seed so that runs repeat. Sampled calls
        always get one (random when the caller gave none), so a draw can be repeated exactly."""
        if self.seeded or not self.request.context.sampling.greedy:
            return self.rng.randrange(2**31)
        return None

    def position_seed(self, position: int) -> int | None:
        """The seed of a target call whose draw is the output's token at `position` (0: the first).

        Seeds follow positions, not calls: on the paths that keep the target's own picks, the token at
        each position is then the target's draw with that position's seed given the tokens before it,
        whatever the drafts, the draft lengths and the rounds were, so the same seed gives the same text
        on every call. A position drawn again (a round that ended before it) draws with the same seed;
        the earlier draw was discarded without deciding anything, so the draw kept is still independent
        of the text before it (docs/algorithm.md)."""
        if not self.seeded and self.request.context.sampling.greedy:
            return None
        if self._base is None:
            self._base = random.Random(self.request.context.seed).randrange(2**63)
        return _mix64(self._base + position) & 0x7FFFFFFF

    def seeds_from(self, position: int) -> Callable[[], int | None]:
        """Seeds for calls drawing the tokens at `position`, `position + 1`, ... in turn."""
        positions = itertools.count(position)
        return lambda: self.position_seed(next(positions))

    def plain_seed(self, context: Context, whole_answer: bool, position: int) -> int | None:
        """The seed of a target-alone call drawing from `position` on. A call that writes the whole answer
        before any round (nothing accepted yet) is the request the target alone would get: it carries the
        caller's seed unchanged (or none), so its text is the target's own for that seed."""
        if whole_answer and not context.accepted and not self.rounds:
            self.alone_with_callers_seed = True
            return self.request.context.seed
        return self.position_seed(position)

    def seed_note(self) -> str | None:
        """What the caller's seed fixed (see `SpeculativeStats.seed_note`)."""
        seed = self.request.context.seed
        if seed is None or self.request.context.sampling.greedy:
            return None
        if self.alone_with_callers_seed:
            return f"seed {seed} went to the target unchanged: the target drew the text itself with that seed"
        return (
            f"seed {seed} fixes specapi's draws (each target call gets a seed derived from it and the output position): "
            f"the same request gives the same text again, but not the text the target alone gives for seed {seed}"
        )

    # -- exactness ------------------------------------------------------------------------------
    def _retokenized(self, reason: str | None) -> None:
        if reason is not None:
            self.retokenized = True
            self.inexact_reason = reason

    def check_token_boundaries(self, verification: Verification, context: Context, draft: Draft, token_starts: list[int]) -> None:
        """Say so when the target read the text so far with other token boundaries than it generated
        (`output.token_boundary_split`)."""
        if verification.starts_from_end is None or self.inexact_reason is not None:
            return
        accepted = len(context.accepted.encode("utf-8"))
        # Boundaries checked in earlier rounds stay checked: appended text re-splits only the end of the
        # text, so each round looks at the newest boundaries (and the last one already seen) only.
        newest = token_starts[max(0, self.boundaries_checked - 1) :]
        self.boundaries_checked = len(token_starts)
        self._retokenized(token_boundary_split(verification.starts_from_end, accepted, len(draft.text.encode("utf-8")), newest))

    def check_token_counts(self, verification: Verification, accepted: int, context: Context, produced: int) -> None:
        """The same guard where no scored prompt is returned (fan-out: `output.token_count_split`)."""
        if self.inexact_reason is None:
            self._retokenized(token_count_split(verification.prompt_counts, accepted, bool(context.accepted), self.prompt_tokens, produced))

    def check_prompt_count(self, count: int | None, context: Context, produced: int) -> None:
        """Say so when a call on the text so far was billed another count than the prompt plus the
        tokens the target generated: it re-tokenized its own output (`output.prompt_count_split`)."""
        if self.inexact_reason is None:
            self._retokenized(prompt_count_split(count, 0, bool(context.accepted), self.prompt_tokens, produced))


def _mix64(value: int) -> int:
    """SplitMix64's finaliser: neighbouring positions get unrelated seeds."""
    value = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return value ^ (value >> 31)
