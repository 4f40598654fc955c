"""What speculation should achieve, from measured acceptance and latencies. Pure functions, no I/O.

The arithmetic is docs/performance.md's, with fixed per-call costs:

* a round drafting K tokens yields E(K) tokens: ``1 + s_1 + ... + s_K`` where ``s_i`` is the chance
  that the first i draft tokens are all accepted (``s_i = a_1 * ... * a_i``, ``a_i`` the acceptance at
  position i given the positions before it were accepted). With one rate a for every position,
  ``E(K) = (1 - a^(K+1)) / (1 - a)``;
* a round costs a draft call ``L_D + K t_D`` (zero for prompt lookup, which makes no call) plus a
  verify call ``V_0 + K v``; with pipelined drafting the next draft is started during the verify call,
  so a round whose K tokens were all accepted waits only for what the verify call did not cover;
* the target alone produces N tokens in ``L_T + N t_T``;
* N tokens take ``N / E(K) + 1/2`` rounds: the last round is cut short by ``max_tokens``, so on
  average half of it is wasted;
* predicted speedup = ``(L_T + N t_T) / ((N / E(K) + 1/2) * round(K))``.

Acceptance beyond the positions that were measured is taken to stay at the last measured rate (said
as much in the report: a best draft length beyond the measured positions is an extrapolation).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from ..parts import policy

__all__ = [
    "LatencyModel",
    "Prediction",
    "break_even_acceptance",
    "best_draft_length",
    "conditional_acceptance",
    "expected_tokens",
    "expected_tokens_by_position",
    "fit_line",
    "predict",
    "predicted_speedup",
    "speedup_of_rounds",
    "round_time",
    "survival",
]

#: Longest draft considered when looking for the best length or the break-even acceptance.
MAX_DRAFT_LENGTH = 16

#: Rounds lost at the end of a request, on average: the last round is cut short by max_tokens.
END_OF_REQUEST_ROUNDS = 0.5


def expected_tokens(alpha: float, k: int) -> float:
    """E(K) = (1 - a^(K+1)) / (1 - a): tokens per round with acceptance a at every position (K + 1 at a = 1)."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"acceptance must be in [0, 1], got {alpha!r}")
    if k < 0:
        raise ValueError(f"draft length must be >= 0, got {k!r}")
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _rate_at(conditional: Sequence[float], index: int) -> float:
    if not conditional:
        return 0.0
    return conditional[index] if index < len(conditional) else conditional[-1]


def survival(conditional: Sequence[float], k: int) -> list[float]:
    """``[s_1, ..., s_k]``: the chance that the first i draft tokens are all accepted."""
    result, alive = [], 1.0
    for i in range(k):
        alive *= _rate_at(conditional, i)
        result.append(alive)
    return result


def expected_tokens_by_position(conditional: Sequence[float], k: int) -> float:
    """E(K) = 1 + s_1 + ... + s_K from per-position acceptance (the last rate repeats beyond the list)."""
    if k < 0:
        raise ValueError(f"draft length must be >= 0, got {k!r}")
    return policy.expected_tokens_by_position(conditional, k)  # the formula the adaptive policy sizes rounds with


def conditional_acceptance(rounds: Sequence[Sequence[bool]]) -> list[float]:
    """``a_i`` = accepted at position i / rounds that drafted position i with every earlier one accepted.

    ``rounds`` are per-round acceptance flags by draft position (``RoundRecord.accepted_by_position``).
    The list stops at the first position no round reached.
    """
    reached: list[int] = []
    kept: list[int] = []
    for flags in rounds:
        for i, ok in enumerate(flags):
            if i == len(reached):
                reached.append(0)
                kept.append(0)
            reached[i] += 1
            kept[i] += bool(ok)
            if not ok:
                break
    result = []
    for r, k in zip(reached, kept):
        if r == 0:
            break
        result.append(k / r)
    return result


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float] | None:
    """Least-squares ``y = intercept + slope * x`` with both kept >= 0; None when x never varies."""
    if len(xs) != len(ys):
        raise ValueError("xs and ys differ in length")
    if len(xs) < 2:
        return None
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var <= 1e-12:
        return None
    slope = max(0.0, sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / var)
    return max(0.0, mean_y - slope * mean_x), slope


@dataclass(frozen=True, kw_only=True)
class LatencyModel:
    """Seconds per call, as fixed cost plus cost per token.

    ``target_fixed_s`` / ``target_per_token_s``: the target alone (``L_T``, ``t_T``: ``L_T + N t_T`` for N
    tokens). ``draft_fixed_s`` / ``draft_per_token_s``: one draft call (``L_D + K t_D``).
    ``verify_fixed_s`` / ``verify_per_token_s``: one verify call scoring K draft tokens. ``draft_share``:
    the fraction of rounds whose draft needs a call (0 for prompt lookup, 1 for a draft model).
    """

    target_fixed_s: float
    target_per_token_s: float
    draft_fixed_s: float = 0.0
    draft_per_token_s: float = 0.0
    verify_fixed_s: float = 0.0
    verify_per_token_s: float = 0.0
    draft_share: float = 1.0

    def draft_s(self, k: int) -> float:
        return self.draft_fixed_s + k * self.draft_per_token_s if k > 0 else 0.0

    def verify_s(self, k: int) -> float:
        return self.verify_fixed_s + k * self.verify_per_token_s

    def baseline_s(self, n_tokens: float) -> float:
        return self.target_fixed_s + n_tokens * self.target_per_token_s


def round_time(model: LatencyModel, k: int, conditional: Sequence[float] = (), *, pipelined: bool = False) -> float:
    """Expected seconds of one round drafting k tokens.

    Sequential: draft call then verify call. Pipelined (the engine drafts k + 1 tokens ahead during the
    verify call, guessing all k are kept): when all k were accepted (chance ``s_k``) the round waits only
    for the part of that draft the verify call did not cover, ``max(0, draft(k + 1) - verify(k))``, and
    drafts again if the prefetched draft disagrees with the target's bonus token (chance ``1 - a_(k+1)``).
    """
    draft = model.draft_s(k) * model.draft_share
    verify = model.verify_s(k)
    if not pipelined or model.draft_share == 0.0:
        return draft + verify
    s_k = survival(conditional, k)[-1] if k > 0 else 1.0
    next_ok = _rate_at(conditional, k)
    overlap_wait = max(0.0, model.draft_s(k + 1) - verify) * model.draft_share
    hit_draft = overlap_wait + (1.0 - next_ok) * draft
    return verify + (1.0 - s_k) * draft + s_k * hit_draft


def predicted_speedup(
    model: LatencyModel, conditional: Sequence[float], k: int, n_tokens: float, *, pipelined: bool = False
) -> float:
    """Target-alone time over speculative time for n_tokens, drafting k per round."""
    if n_tokens <= 0 or k < 1:
        raise ValueError("need n_tokens > 0 and k >= 1")
    per_round = round_time(model, k, conditional, pipelined=pipelined)
    return speedup_of_rounds(model, expected_tokens_by_position(conditional, k), per_round, n_tokens)


def speedup_of_rounds(model: LatencyModel, tokens_per_round: float, round_s: float, n_tokens: float) -> float:
    """Target-alone time over speculative time for n_tokens, in rounds that yield `tokens_per_round`
    in `round_s` each (on average, for rounds of several kinds), plus the half round lost at the end."""
    speculative = (n_tokens / tokens_per_round + END_OF_REQUEST_ROUNDS) * round_s
    if speculative <= 0.0:
        return math.inf
    return model.baseline_s(n_tokens) / speculative


def best_draft_length(
    model: LatencyModel, conditional: Sequence[float], n_tokens: float, *, max_k: int = MAX_DRAFT_LENGTH, pipelined: bool = False
) -> tuple[int, float]:
    """The draft length (1..max_k) with the highest predicted speedup, and that speedup."""
    best = (1, predicted_speedup(model, conditional, 1, n_tokens, pipelined=pipelined))
    for k in range(2, max_k + 1):
        speedup = predicted_speedup(model, conditional, k, n_tokens, pipelined=pipelined)
        if speedup > best[1] + 1e-12:
            best = (k, speedup)
    return best


def break_even_acceptance(
    model: LatencyModel,
    n_tokens: float,
    *,
    k: int | None = None,
    max_k: int = MAX_DRAFT_LENGTH,
    pipelined: bool = False,
    tolerance: float = 1e-4,
) -> float | None:
    """The smallest acceptance rate (the same at every position) at which speculation matches the target alone.

    With ``k`` given, for that draft length; otherwise for the best length up to ``max_k`` at each rate.
    None when even acceptance 1 (a draft that is always right) cannot match the target alone: the fixed
    cost of the calls outweighs every token a round can yield.
    """

    def best_at(alpha: float) -> float:
        lengths = [k] if k is not None else range(1, max_k + 1)
        return max(predicted_speedup(model, [alpha], length, n_tokens, pipelined=pipelined) for length in lengths)

    if best_at(1.0) < 1.0:
        return None
    if best_at(0.0) >= 1.0:
        return 0.0
    low, high = 0.0, 1.0
    while high - low > tolerance:
        middle = (low + high) / 2
        if best_at(middle) >= 1.0:
            high = middle
        else:
            low = middle
    return high


@dataclass(frozen=True)
class Prediction:
    """What the arithmetic says for one scenario (all speedups are target-alone time / speculative time)."""

    draft_length: int
    expected_tokens: float
    round_s: float
    speedup: float
    best_draft_length: int
    best_speedup: float
    break_even_acceptance: float | None
    break_even_at_length: float | None
    extrapolated: bool  # the best length lies beyond the measured positions

    def to_dict(self) -> dict:
        return {
            "draft_length": self.draft_length,
            "expected_tokens_per_round": round(self.expected_tokens, 4),
            "round_s": round(self.round_s, 6),
            "speedup": round(self.speedup, 4),
            "best_draft_length": self.best_draft_length,
            "best_speedup": round(self.best_speedup, 4),
            "break_even_acceptance": None if self.break_even_acceptance is None else round(self.break_even_acceptance, 4),
            "break_even_acceptance_at_draft_length": None if self.break_even_at_length is None else round(self.break_even_at_length, 4),
            "best_length_extrapolated": self.extrapolated,
        }


def predict(
    model: LatencyModel, conditional: Sequence[float], k: int, n_tokens: float, *, pipelined: bool = False, max_k: int = MAX_DRAFT_LENGTH
) -> Prediction:
    """Every figure of a `Prediction` for drafting k tokens per round over n_tokens."""
    best_k, best = best_draft_length(model, conditional, n_tokens, max_k=max_k, pipelined=pipelined)
    return Prediction(
        draft_length=k,
        expected_tokens=expected_tokens_by_position(conditional, k),
        round_s=round_time(model, k, conditional, pipelined=pipelined),
        speedup=predicted_speedup(model, conditional, k, n_tokens, pipelined=pipelined),
        best_draft_length=best_k,
        best_speedup=best,
        break_even_acceptance=break_even_acceptance(model, n_tokens, max_k=max_k, pipelined=pipelined),
        break_even_at_length=break_even_acceptance(model, n_tokens, k=k, pipelined=pipelined),
        extrapolated=best_k > len(conditional),
    )
