"""Pure probability arithmetic over top-k logprob lists: no I/O.

An API reveals a distribution only through a top-k list of logprobs (plus the logprob of the token
actually seen). `TokenDist` turns such a list into probabilities at the request's temperature and top_p
and remembers how much probability mass the list failed to cover, so callers can tell exact results
from approximations.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

__all__ = [
    "COVERAGE_TOLERANCE",
    "TokenDist",
    "argmax_token",
    "acceptance_probability",
    "residual",
    "sample_token",
]

#: Missing mass below this counts as full coverage (logprobs are rounded floats).
COVERAGE_TOLERANCE = 1e-4

#: Servers report this for tokens outside their lists (OpenAI, vLLM): it means "probability 0 as far as we know".
_FLOOR_LOGPROB = -9000.0


def _clean(logprobs: Mapping[str, float | None]) -> dict[str, float]:
    return {t: lp for t, lp in logprobs.items() if lp is not None and lp > _FLOOR_LOGPROB and not math.isnan(lp)}


@dataclass(frozen=True)
class TokenDist:
    """A next-token distribution known on a finite set of tokens.

    `probs` holds the best estimate of each known token's probability; it sums to at most 1 (exactly
    1 once normalised for temperature or top_p). Sampling renormalises over the known tokens. `gap` bounds the probability mass (after temperature and
    top_p) that lies on tokens the list did not show; `gap == 0` means the distribution is exact.
    """

    probs: Mapping[str, float]
    gap: float = 0.0

    @property
    def exact(self) -> bool:
        return self.gap <= COVERAGE_TOLERANCE

    def get(self, token: str) -> float:
        return self.probs.get(token, 0.0)

    @classmethod
    def from_logprobs(
        cls,
        logprobs: Mapping[str, float | None],
        *,
        temperature: float = 1.0,
        top_p: float = 1.0,
        raw: bool = True,
        extra: Mapping[str, float | None] | None = None,
    ) -> TokenDist:
        """Build the distribution a sampler uses at `temperature`/`top_p` from a top-k logprob list.

        `logprobs` is the server's list: the k most likely tokens, so every token it leaves out is
        at most as likely as its least likely entry. `extra` holds tokens whose logprob is known but
        that may lie outside the list (the token a server scored): their own values are exact, but
        they say nothing about the unseen mass. `raw=True` means the server reported temperature-1
        logprobs (vLLM's default, OpenAI) and the temperature must be applied here; `raw=False`
        means they already include the temperature. All arithmetic on tempered values is in log space.
        """
        if temperature <= 0:
            raise ValueError("temperature must be > 0 for a sampling distribution; use argmax_token for greedy")
        listed = _clean(logprobs)
        known = dict(listed)
        for token, lp in _clean(extra or {}).items():
            known.setdefault(token, lp)
        if not known:
            return cls(probs={}, gap=1.0)
        missing_raw = max(0.0, 1.0 - math.fsum(math.exp(lp) for lp in known.values()))
        if raw and temperature != 1.0:
            # The normaliser of p^(1/T) needs the whole distribution: estimate it from the known tokens.
            scaled = {t: lp / temperature for t, lp in known.items()}
            log_total = _logsumexp(scaled.values())
            probs = {t: math.exp(v - log_total) for t, v in scaled.items()}
        else:
            # The logprobs are the sampling distribution itself: each listed value is exact even when the
            # list is short, so keep them as they are (rounding may push the sum a hair over 1).
            probs = {t: math.exp(lp) for t, lp in known.items()}
            total = sum(probs.values())
            if total > 1.0:
                probs = {t: v / total for t, v in probs.items()}
        if not listed:
            gap = 1.0 if missing_raw > COVERAGE_TOLERANCE / 10 else 0.0  # no list: nothing bounds the unseen tokens
        else:
            gap = _tempered_gap(missing_raw, min(listed.values()), temperature if raw else 1.0, known)
        if top_p < 1.0:
            probs, gap = _nucleus(probs, set(listed), top_p, gap)
        return cls(probs=probs, gap=gap)


def _logsumexp(values: Iterable[float]) -> float:
    values = list(values)
    top = max(values)
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


def _tempered_gap(missing_raw: float, min_logprob: float, temperature: float, known: Mapping[str, float]) -> float:
    """An upper bound on the share of the tempered distribution held by unseen tokens (log space, so
    that a temperature near 0 neither underflows nor divides by zero)."""
    if missing_raw <= COVERAGE_TOLERANCE / 10:
        return 0.0
    if temperature == 1.0:
        return min(1.0, missing_raw)
    if temperature > 1.0:
        # Above T = 1, spreading the missing mass over more tokens makes it weigh more once tempered:
        # without the vocabulary size there is no bound below 1.
        return 1.0
    # Each unseen token has p <= p_min, so sum p^(1/T) <= p_min^(1/T - 1) * missing.
    log_unseen = min_logprob * (1.0 / temperature - 1.0) + math.log(missing_raw)
    log_known = _logsumexp([lp / temperature for lp in known.values()])
    difference = log_known - log_unseen
    if difference > 700:
        return 0.0
    return min(1.0, 1.0 / (1.0 + math.exp(difference)))


def _nucleus(probs: Mapping[str, float], listed: set[str], top_p: float, gap: float) -> tuple[dict[str, float], float]:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised.

    Only the server's list is the head of the distribution (an unseen token is never more likely than
    a listed one, and tempering keeps the order); a known token outside the list can be anywhere below
    it. The true share of a listed token is at least its estimate times (1 - gap) when `probs` was
    normalised, or exactly its value when it was not (sum below 1): if even the lower bound of the
    cumulative mass of listed tokens reaches top_p, the cut is exact and every token outside the list
    is outside the nucleus. Otherwise the nucleus reaches past the list and the result is not exact.
    """
    total = sum(probs.values())
    normalised = total > 1.0 - 1e-9
    kept: dict[str, float] = {}
    lower = 0.0
    for token, p in sorted(((t, v) for t, v in probs.items() if t in listed), key=lambda kv: (-kv[1], kv[0])):
        kept[token] = p
        lower += p * (1.0 - gap) if normalised else p
        if lower >= top_p:
            mass = sum(kept.values())
            return {t: v / mass for t, v in kept.items()}, 0.0
    mass = sum(probs.values())
    return {t: v / mass for t, v in probs.items()}, max(gap, COVERAGE_TOLERANCE * 10)


def argmax_token(logprobs: Mapping[str, float | None], prefer: str | None = None) -> str | None:
    """The most likely token of a list; `prefer` wins ties (so a tie never rejects a matching draft)."""
    known = _clean(logprobs)
    if not known:
        return None
    best = max(known.values())
    if prefer is not None and known.get(prefer) == best:
        return prefer
    return next(t for t, lp in known.items() if lp == best)


def acceptance_probability(p: float, q: float) -> float:
    """min(1, p/q): the chance of keeping a draft token with target probability p and draft probability q."""
    if q <= 0.0:
        return 1.0 if p > 0.0 else 0.0
    return min(1.0, p / q)


def residual(p: TokenDist, q: TokenDist) -> TokenDist:
    """The distribution to resample from after a rejection: max(0, p - q), renormalised.

    Tokens q does not list are taken to have q = 0, which is exact when q's list covers its mass.
    """
    diff = {t: max(0.0, pt - q.get(t)) for t, pt in p.probs.items()}
    total = sum(diff.values())
    if total <= 1e-12:
        return p
    return TokenDist(probs={t: v / total for t, v in diff.items() if v > 0.0}, gap=max(p.gap, q.gap))


def sample_token(dist: TokenDist, rng: random.Random) -> str:
    """Draw one token by inverse CDF over a fixed (sorted) order, so a seeded rng is reproducible."""
    if not dist.probs:
        raise ValueError("cannot sample from an empty distribution")
    u = rng.random() * sum(dist.probs.values())
    cumulative = 0.0
    last = ""
    for token in sorted(dist.probs):
        cumulative += dist.probs[token]
        last = token
        if u < cumulative:
            return token
    return last
