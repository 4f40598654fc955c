"""Deciding one round: which draft tokens the target keeps, and what it says instead. Pure functions.

Inputs are the target's scored positions over the draft text (from any verifier) and the draft's
tokens. Greedy rounds keep tokens while they are the target's argmax; sampled rounds use the
speculative-sampling rule (accept with min(1, p/q), resample from the residual) where a target token
lines up with a draft token, and sample directly from p where tokenizations differ, which is always
exact. Nothing here emits a byte the target's distribution did not produce.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from .alignment import Listed, ScoredToken, spans, token_bytes
from .lossy import EXACT, AcceptanceRule, divergence
from .sampling import TokenDist, acceptance_probability, argmax_token, residual, sample_token

__all__ = ["Emitted", "RoundDecision", "SamplingParams", "decide_round", "DEFAULT_EOS_TOKENS"]

#: Token strings that end generation (shown in top lists, never as text).
DEFAULT_EOS_TOKENS = frozenset(
    {"<|endoftext|>", "</s>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<eos>", "<end_of_turn>", "<|end|>"}
)


@dataclass(frozen=True)
class SamplingParams:
    """How the target samples: temperature 0 means greedy."""

    temperature: float = 1.0
    top_p: float = 1.0
    raw_logprobs: bool = True  # the target's logprobs ignore temperature
    draft_raw_logprobs: bool = True  # the draft's do
    #: The caller's sampler truncates (top_k, min_p, ...) in a way logprob lists cannot show: only a
    #: path where the target draws its own tokens reproduces it.
    target_sampler_only: bool = False
    #: The sampling fields the caller set; the others take the target server's defaults where known.
    explicit: frozenset[str] = frozenset({"temperature", "top_p"})
    #: How draft tokens are kept: exact (the default) or a lossy rule the caller opted into.
    acceptance: AcceptanceRule = EXACT
    #: A sampled request whose path keeps only the target's own picks: the draft model proposes its most
    #: likely tokens (temperature 0, a point mass), so a position is kept with probability p(x) itself.
    point_mass_draft: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Emitted:
    """A target token added to the output: `data` is its bytes; `eos` marks the end of text and
    carries no token."""

    token: str
    data: bytes
    logprob: float | None = None
    top: dict[str, float] | None = None
    eos: bool = False
    count: int = 1  # how many target tokens `data` stands for (a plain target step returns many at once)
    finish_reason: str = "stop"  # with `eos`: why the text ended ("length": the server's own limit)
    #: The target's ids of the `count` tokens, when known (token-id verification keeps them).
    ids: tuple[int, ...] | None = None
    #: The caller's logprobs as the server rendered this token's entry (`token` its spelling there, `logprob`
    #: its value): its top entries in the server's order. None: `top` alone says them.
    listed: Listed | None = None


@dataclass(frozen=True)
class RoundDecision:
    emitted: tuple[Emitted, ...]
    accepted: int
    accepted_by_position: tuple[bool, ...]
    all_accepted: bool
    stalled: bool = False
    gap: float = 0.0
    #: The next position could not be decided exactly from the lists: the target alone must decide it.
    handover: bool = False
    #: Lossy acceptance: kept tokens exact verification would have rejected for certain, and the summed
    #: log-probability gap of the tokens the lossy rule kept to the target's most likely ones.
    divergent: int = 0
    logprob_gap: float = 0.0
    #: specapi drew these tokens itself from whole distributions, on a context kept in ids: a token that
    #: ends inside a character stays (cutting it for what was drawn would bias the draw).
    keeps_partial: bool = False
    #: A token specapi could not keep (its bytes unknown) is drawn again by the next step: the draw is no
    #: longer the target's exactly, and the response says so.
    redrawn: bool = False


def _emit(token: str, position: ScoredToken, eos_tokens: Collection[str]) -> Emitted | None:
    """The output for `token` chosen at `position`; None when it adds nothing (an empty token)."""
    dist = position.distribution()  # the position's scores: a list may leave out the token it scored
    if token in eos_tokens:
        return Emitted(token=token, data=b"", logprob=dist.get(token), top=dist, eos=True)
    data = token_bytes(token)
    if not data:
        return None
    return Emitted(token=token, data=data, logprob=dist.get(token), top=dist)


def _without_eos(q: TokenDist, eos_tokens: Collection[str]) -> TokenDist:
    """The draft's proposal distribution as verified: drafts never propose the end of text (it cannot
    be sent as text), so the proposals come from q conditioned on "not end of text"."""
    eos_mass = sum(p for t, p in q.probs.items() if t in eos_tokens)
    if eos_mass <= 0.0:
        return q
    if eos_mass >= 1.0:
        return TokenDist(probs={}, gap=1.0)
    scale = 1.0 - eos_mass
    return TokenDist(probs={t: p / scale for t, p in q.probs.items() if t not in eos_tokens}, gap=min(1.0, q.gap / scale))


class _Verdict(NamedTuple):
    """How one position was decided: its token kept (`keep`), or replaced by `choice` (None: nothing to
    emit); `handover`: the lists cannot decide it exactly. `gap`: the lists' coverage gap there; with a
    lossy rule's keep, the tokens exact verification would have rejected and their log-probability gap."""

    keep: bool
    choice: str | None = None
    gap: float = 0.0
    divergent: int = 0
    logprob_gap: float = 0.0
    handover: bool = False


def _decide_position(
    position: ScoredToken, dist: dict[str, float], drafted: ScoredToken | None, params: SamplingParams, rng: random.Random, eos_tokens: Collection[str]
) -> _Verdict:
    """One position of a round by the caller's rule: a lossy rule keeps what it may, the exact rule
    decides the rest (greedy: the argmax; sampled: the draw of speculative sampling)."""
    if params.acceptance.lossy:
        kept = _lossy_keep(position, drafted, params, eos_tokens)
        if kept is not None:
            return _Verdict(keep=True, divergent=kept[0], logprob_gap=kept[1])
        # Not kept by the lossy rule: the exact rule decides this position.
    if params.greedy:
        choice = argmax_token(dist, prefer=position.text)
        return _Verdict(keep=choice == position.text, choice=choice)
    drawn = _sampled_choice(position, drafted, params, rng, eos_tokens)
    if drawn is None:
        # The lists cannot decide this position exactly (mass unseen, a nucleus reaching past the list).
        # Decided before anything is drawn here, so handing the position to the target alone keeps the
        # output exact.
        return _Verdict(keep=False, handover=True)
    choice, keep, gap = drawn
    return _Verdict(keep=keep, choice=choice, gap=gap)


def decide_round(
    positions: Sequence[ScoredToken],
    straddle: int,
    draft: Sequence[ScoredToken],
    params: SamplingParams,
    rng: random.Random,
    eos_tokens: Collection[str] = DEFAULT_EOS_TOKENS,
) -> RoundDecision:
    """Decide a round.

    `positions` are the target's tokens covering the draft text, each with the target's distribution
    at that position; the first carries `straddle` bytes of already committed text, in which case the
    round stalls (the engine then takes a plain target step). `draft` are the
    draft's tokens with the draft's distributions (used for sampled rounds).
    """
    draft_spans = spans(draft)
    draft_by_span = {span: token for span, token in zip(draft_spans, draft)}
    target_spans = spans(positions, start=-straddle)
    emitted: list[Emitted] = []
    gap, accepted_bytes, divergent, logprob_gap = 0.0, 0, 0, 0.0
    all_accepted, stalled, handover = True, False, False

    for index, (position, span) in enumerate(zip(positions, target_spans)):
        # A token merging committed text with the draft (`straddle`): the target's score here is
        # conditioned on a different split of the text than its own generation had, so neither keeping
        # nor replacing it is sound. Nor can a position the server listed nothing for be checked (e.g.
        # the first prompt token). Neither is decided here: the round stalls there, and a plain target
        # step decides the position.
        dist = None if index == 0 and straddle else position.distribution()
        verdict = _decide_position(position, dist, draft_by_span.get(span), params, rng, eos_tokens) if dist else _Verdict(keep=False)
        if verdict.handover:
            all_accepted, handover = False, True
            break
        gap = max(gap, verdict.gap)
        divergent, logprob_gap = divergent + verdict.divergent, logprob_gap + verdict.logprob_gap
        if verdict.keep:
            emitted.append(Emitted(token=position.text, data=position.data, logprob=position.logprob, top=dict(position.top or {})))
            accepted_bytes = span[1]
            continue
        all_accepted = False
        replacement = _emit(verdict.choice, position, eos_tokens) if verdict.choice is not None else None
        if replacement is None:
            stalled = not emitted
        else:
            emitted.append(replacement)
        break

    accepted_by_position = tuple(end <= accepted_bytes for _, end in draft_spans)
    return RoundDecision(
        emitted=tuple(emitted),
        accepted=sum(accepted_by_position),
        accepted_by_position=accepted_by_position,
        all_accepted=all_accepted,
        stalled=stalled,
        gap=gap,
        handover=handover,
        divergent=divergent,
        logprob_gap=logprob_gap,
    )


def _sampled_choice(
    position: ScoredToken, drafted: ScoredToken | None, params: SamplingParams, rng: random.Random, eos_tokens: Collection[str]
) -> tuple[str | None, bool, float] | None:
    """A sampled position: the token chosen, whether it is the drafted one, and the lists' coverage
    gap; None when the lists cannot decide it exactly (decided before anything is drawn)."""
    p = TokenDist.from_logprobs(position.listed(), extra=position.scored(), temperature=params.temperature, top_p=params.top_p, raw=params.raw_logprobs)
    q = None
    if drafted is not None and drafted.text == position.text:
        q = _without_eos(
            TokenDist.from_logprobs(
                drafted.listed(), extra=drafted.scored(), temperature=params.temperature, top_p=params.top_p, raw=params.draft_raw_logprobs
            ),
            eos_tokens,
        )
    if not p.exact or (q is not None and not _residual_exact(p, q, params)):
        return None
    if q is not None:
        keep = rng.random() < acceptance_probability(p.get(position.text), q.get(position.text))
        choice = position.text if keep else sample_token(residual(p, q), rng)
        return choice, keep, max(p.gap, q.gap)
    # Tokenizations differ here: no q for this token, so sample the position from p itself.
    choice = sample_token(p, rng)
    return choice, choice == position.text, p.gap


def _lossy_keep(
    position: ScoredToken, drafted: ScoredToken | None, params: SamplingParams, eos_tokens: Collection[str]
) -> tuple[bool, float] | None:
    """Whether the lossy rule keeps the draft token at `position`: None if not (or it cannot say),
    else whether exact verification would have rejected it for certain, and its log-probability gap."""
    if position.logprob is None or position.text in eos_tokens:
        return None
    temperature = 1.0 if params.greedy else params.temperature
    top_p = 1.0 if params.greedy else params.top_p
    raw = True if params.greedy else params.raw_logprobs
    p = TokenDist.from_logprobs(position.listed(), extra=position.scored(), temperature=temperature, top_p=top_p, raw=raw)
    q_value = None
    if drafted is not None and drafted.text == position.text and drafted.logprob is not None:
        draft_raw = True if params.greedy else params.draft_raw_logprobs
        q = _without_eos(
            TokenDist.from_logprobs(drafted.listed(), extra=drafted.scored(), temperature=temperature, top_p=top_p, raw=draft_raw), eos_tokens
        )
        q_value = q.get(position.text)
    if not params.acceptance.keeps(p.get(position.text), q_value, p.probs):
        return None
    return divergence(position.text, p.probs, position.distribution(), params.greedy)


def _residual_exact(p: TokenDist, q: TokenDist, params: SamplingParams) -> bool:
    """Whether min(1, p/q) and the residual max(0, p - q) are known exactly.

    A draft list that leaves mass unseen still gives exact values for the tokens it lists, unless
    tempering needs its normaliser: then it is enough that q is known wherever p has mass.
    """
    if q.exact:
        return True
    if len(p.probs) == 1 and p.exact:
        # p is a point mass (the target's own pick, as on fan-out): min(1, p/q) is 1 for that token
        # and 0 for any other, and the residual is p itself, whatever q is.
        return True
    tempered = params.draft_raw_logprobs and params.temperature != 1.0
    return not tempered and all(token in q.probs for token in p.probs)
