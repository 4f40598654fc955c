"""Figures over repeated runs and requests: percentiles, median and spread, and the verdict a spread allows.

Pure functions. A single run of a scenario is one draw from a noisy machine: the same command gives
1.43x, then 1.24x. `specapi bench --repeat N` runs each scenario N times; each figure is then given as
its median with the lowest and highest run (`Spread`), and a speedup counts as a win only when every
run was faster than the target alone (the spread clears 1.0x), as a loss only when every run was slower.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "PERCENTILES",
    "Spread",
    "WIN",
    "EVEN",
    "LOSS",
    "NO_SPECULATION",
    "percentile",
    "percentiles",
    "poisson_arrivals",
    "spread_of",
    "verdict_class",
]

#: The percentiles reported for time to first token and inter-token latency.
PERCENTILES = (50, 90, 99)

WIN, EVEN, LOSS, NO_SPECULATION = "win", "even", "loss", "no speculation"

#: A speedup at or above the upper bound is a win, at or below the lower bound a loss, between: even.
BAND = (0.95, 1.05)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0-100) with linear interpolation between closest ranks (numpy's default);
    None for no values."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def percentiles(values: Iterable[float], qs: Sequence[int] = PERCENTILES) -> dict[str, float | None]:
    """``{"p50": ..., "p90": ..., "p99": ...}`` of `values` (None each when there are none)."""
    data = list(values)
    return {f"p{q}": percentile(data, q) for q in qs}


@dataclass(frozen=True)
class Spread:
    """A figure over repeated runs: the median, the lowest and the highest run, every value in run order."""

    median: float
    low: float
    high: float
    values: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"median": round(self.median, 6), "min": round(self.low, 6), "max": round(self.high, 6), "runs": [round(v, 6) for v in self.values]}


def spread_of(values: Iterable[float | None]) -> Spread | None:
    """The spread of the values that are known (None when none is)."""
    known = tuple(v for v in values if v is not None)
    if not known:
        return None
    return Spread(median=statistics.median(known), low=min(known), high=max(known), values=known)


def verdict_class(speedup: Spread | float | None, *, speculated: bool = True) -> str | None:
    """"win", "even", "loss" or "no speculation" (None: no figure).

    A win needs the median at or above 1.05x and every run above 1.0x; a loss the median at or below
    0.95x and every run below 1.0x; anything else is even (the runs do not agree on a side of 1.0x). A
    scenario in which no request speculated is "no speculation" whatever its ratio: the two sides ran the
    same target calls, and the ratio is noise."""
    if not speculated:
        return NO_SPECULATION
    if speedup is None:
        return None
    if not isinstance(speedup, Spread):
        speedup = Spread(speedup, speedup, speedup, (speedup,))
    if speedup.median >= BAND[1] and speedup.low > 1.0:
        return WIN
    if speedup.median <= BAND[0] and speedup.high < 1.0:
        return LOSS
    return EVEN


def poisson_arrivals(count: int, rate: float, seed: int) -> list[float]:
    """Send times (seconds from the start) of `count` requests arriving as a Poisson process of `rate`
    requests per second: exponential gaps, drawn from `seed` so that both sides get the same schedule."""
    if rate <= 0:
        raise ValueError(f"the request rate must be > 0, got {rate}")
    draw = random.Random(seed)
    times, now = [], 0.0
    for _ in range(count):
        times.append(now)
        now += draw.expovariate(rate)
    return times
