"""Lossy acceptance rules, opt-in only: keep draft tokens the exact rule might not. Pure functions.

`AcceptanceRule` says how a round keeps draft tokens:

* ``"exact"`` (the default): speculative sampling (greedy: the target's argmax); output has exactly
  the target's distribution.
* ``"threshold"``: keep a draft token while p_target(x) / p_draft(x) >= `threshold` (default 0.7, the
  blog post's ``ACCEPTANCE_THRESHOLD``).
* ``"typical"``: Medusa's typical acceptance (Cai et al. 2024, arXiv 2401.10774): keep a draft token
  while p_target(x) > min(epsilon, delta * exp(-H)), H the entropy of the target's distribution at
  that position. Defaults epsilon = 0.09, delta = 0.3: Medusa's `posterior_threshold` and
  `posterior_alpha` (its code's defaults).

A lossy rule only ever adds acceptances: a token it does not keep is decided by the exact rule, so
lossy output never keeps fewer draft tokens than exact output would. Probabilities are those the
exact rule samples from (the request's temperature and top_p); for greedy requests, the server's
temperature-1 values (at temperature 0 every distribution is a point mass and the rules would say
nothing). A top-k list shows only part of a distribution: `entropy` counts the unseen mass as one
outcome, a lower bound of H, so the typical rule is never more permissive than with the whole list.

`divergence` measures what a kept token costs: whether exact verification would have rejected it
for certain (greedy: it is not the target's argmax; sampled: the target gives it probability 0) and
the log-probability gap log p(argmax) - log p(x) to the target's own most likely choice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "ACCEPTANCE_MODES",
    "AcceptanceRule",
    "EXACT",
    "entropy",
    "threshold_keeps",
    "typical_keeps",
    "typical_floor",
    "divergence",
    "lossy_path_note",
]

ACCEPTANCE_MODES = ("exact", "threshold", "typical")


@dataclass(frozen=True, kw_only=True)
class AcceptanceRule:
    """How a round keeps draft tokens: `mode` one of ``ACCEPTANCE_MODES``, with the rules' parameters."""

    mode: str = "exact"
    threshold: float = 0.7
    epsilon: float = 0.09
    delta: float = 0.3

    def __post_init__(self) -> None:
        if self.mode not in ACCEPTANCE_MODES:
            raise ValueError(f"acceptance must be one of {', '.join(ACCEPTANCE_MODES)}; got {self.mode!r}")
        for value, argument in ((self.threshold, "acceptance_threshold"), (self.epsilon, "typical_epsilon"), (self.delta, "typical_delta")):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{argument} must be a number >= 0, got {value!r}")
        if self.epsilon > 1 or self.delta > 1:
            raise ValueError(f"typical acceptance's epsilon and delta must be in [0, 1], got {self.epsilon!r} and {self.delta!r}")

    @property
    def lossy(self) -> bool:
        return self.mode != "exact"

    @property
    def needs_distribution(self) -> bool:
        """The rule reads the target's whole list at each position (entropy), not just the drafted
        token's probability and the most likely token."""
        return self.mode == "typical"

    def describe(self) -> str:
        if self.mode == "threshold":
            return f"threshold (p_target/p_draft >= {self.threshold:g})"
        if self.mode == "typical":
            return f"typical (p_target > min({self.epsilon:g}, {self.delta:g}*exp(-H)))"
        return "exact"

    def keeps(self, p: float, q: float | None, probs: Mapping[str, float]) -> bool | None:
        """Whether the rule keeps a draft token with target probability `p` and draft probability `q`
        at a position whose target distribution is `probs`; None when it cannot say (no `q`)."""
        if self.mode == "threshold":
            return None if q is None else threshold_keeps(p, q, self.threshold)
        if self.mode == "typical":
            return typical_keeps(p, probs, self.epsilon, self.delta)
        return None


EXACT = AcceptanceRule()


def threshold_keeps(p: float, q: float, threshold: float) -> bool:
    """The blog's rule: keep while p / q >= threshold (a draft probability of 0 keeps any p > 0)."""
    if q <= 0.0:
        return p > 0.0
    return p / q >= threshold


def entropy(probs: Mapping[str, float]) -> float:
    """Entropy (nats) of a distribution known on some tokens; unseen mass counts as one outcome."""
    values = [p for p in probs.values() if p > 0.0]
    unseen = max(0.0, 1.0 - math.fsum(values))
    if unseen > 1e-12:
        values.append(unseen)
    total = math.fsum(values)
    return -math.fsum(p / total * math.log(p / total) for p in values) if total > 0 else 0.0


def typical_floor(probs: Mapping[str, float], epsilon: float, delta: float) -> float:
    """min(epsilon, delta * exp(-H)): the probability a token must exceed under typical acceptance."""
    return min(epsilon, delta * math.exp(-entropy(probs)))


def typical_keeps(p: float, probs: Mapping[str, float], epsilon: float, delta: float) -> bool:
    return p > typical_floor(probs, epsilon, delta)


def divergence(token: str, probs: Mapping[str, float], logprobs: Mapping[str, float], greedy: bool) -> tuple[bool, float]:
    """For a kept token: would exact verification have rejected it for certain, and its log-probability
    gap to the target's most likely token.

    `probs` is the distribution the rule used (certain rejection: greedy, `token` is not its argmax;
    sampled, it gives `token` probability 0, e.g. outside the nucleus); `logprobs` are the server's
    own values, which give the gap log p(argmax) - log p(token) (0 for the argmax itself).
    """
    best = max(probs.values(), default=0.0)
    p = probs.get(token, 0.0)
    certain = p < best if greedy else p <= 0.0
    listed = [lp for lp in logprobs.values() if lp is not None]
    own = logprobs.get(token)
    gap = 0.0 if own is None or not listed else max(0.0, max(listed) - own)
    return certain, gap


def lossy_path_note(rule: AcceptanceRule, path: str) -> str:
    """Why a path decides exactly although `rule` is lossy: it shows no distribution per position."""
    return (
        f"acceptance {rule.mode!r} needs the target's probabilities at each draft position; the {path} path "
        "shows only the target's own tokens, so drafts were decided exactly"
    )
