"""One request's life in the engine: what was asked (`GenerationRequest`), what comes out (`Piece`,
`Finished`), and the one object that holds everything the request's rounds share (`RequestState`).

The `Engine` holds what all requests of a client share (the target, the path resolver, the policy and
drafter it was built with); every choice made for one request (its verifier, its prefill style, its
drafter and policy, its output so far, a prefetched draft, the books) lives on its `RequestState`.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..transport._calls import Meter
from ..core.context import Context
from ..dialects.logprobs import LogprobShape, joined, learnt_offsets, render
from ..dialects.openai import Prefill
from ..parts.drafters import Draft, Drafter
from .output import Output, prompt_count_split, token_boundary_split, token_count_split
from ..parts.policy import DraftLengthPolicy
from ..core.stats import RoundRecord, SpeculativeStats
from ..parts.verifiers import Verification, Verifier

__all__ = ["GenerationRequest", "Piece", "Finished", "Prefetched", "RequestState"]


@dataclass(frozen=True)
class GenerationRequest:
    context: Context
    max_tokens: int | None  # None: the caller set none, so the server's own limit applies
    stop: tuple[str, ...] = ()
    stream: bool = False  # the caller streams: a final target-alone step is streamed too


@dataclass(frozen=True)
class Piece:
    """Text the target accepted, ready to hand out (with the caller's logprobs of its tokens, if asked)."""

    text: str
    logprobs: Any = None


@dataclass(frozen=True)
class Finished:
    finish_reason: str
    stats: SpeculativeStats
    prompt_tokens: int | None
    completion_tokens: int
    #: The target's own usage object (every field it sent: cached tokens, details) when the whole answer
    #: is one target call; None when the answer was assembled from several calls.
    usage: Mapping[str, Any] | None = None
    #: The target alone's stream would carry the usage unasked, on its last chunk (llama-server's completions).
    stream_usage: bool = False
    #: The caller's logprobs (the `logprobs` object of the choice; of a stream, that of the tokens not yet out).
    logprobs: Any = None
    #: The prompt tokens the target reported cached on the request's first call that reported it.
    prompt_cached_tokens: int | None = None


@dataclass(frozen=True)
class Prefetched:
    """A draft of the next round started while the current one is verified (pipelined drafting)."""

    task: asyncio.Task[Draft]
    assumed: str  # the accepted text the prefetched draft continues


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

    # -- the caller's logprobs ------------------------------------------------------------------
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

    def learn_offsets(self, logprobs: Any) -> None:
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
        if out.scores_lost and self.inexact_reason is None:
            self.inexact_reason = "approximate: the target did not show the logprobs of every token one by one: some are missing"
        return render(shape, out.take_scores(final=True))

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
