"""The adaptive policy's measurements: a decayed straight-line fit of latency against tokens
(`_Linear`), the tokens a round is expected to keep (`expected_tokens_by_position`), and whether a
load curve was measured as far as a request's place in it (`load_measured`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..core.load import LoadCurve

__all__ = ["expected_tokens_by_position", "load_measured", "MEASURED_LOAD_REACH"]


def expected_tokens_by_position(acceptance: Sequence[float], k: int) -> float:
    """Expected tokens from a round drafting k: 1 + a1 + a1*a2 + ... (a_i = P(accept i | accepted < i))."""
    total, survive = 1.0, 1.0
    for i in range(k):
        survive *= acceptance[i] if i < len(acceptance) else (acceptance[-1] if acceptance else 0.0)
        total += survive
    return total


class _Linear:
    """Running least squares of latency = fixed + per_token * tokens, with a forgetting factor.

    The per-token cost, once measured, is kept while later samples all have one token count: the
    target's line is fed a one-token sample by every verify call and a longer one only by plain steps,
    so a burst of rounds would otherwise forget the target's per-token speed (and the policy would give
    a request's rest to measuring it again), though nothing contradicts it."""

    _SPREAD = 0.05  # variance of the token counts (weighted) from which the slope is re-measured

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self.n = self.sx = self.sy = self.sxx = self.sxy = 0.0
        self._slope: float | None = None

    def add(self, tokens: float, latency: float, *, keep_slope: bool = False) -> None:
        """One call of `tokens` that took `latency`; `keep_slope`: it moves the line's level, not its
        per-token cost, once one is measured (a call made under load, see `AdaptiveDraftLength.observe`)."""
        d = self.decay
        self.n = self.n * d + 1
        self.sx = self.sx * d + tokens
        self.sy = self.sy * d + latency
        self.sxx = self.sxx * d + tokens * tokens
        self.sxy = self.sxy * d + tokens * latency
        if keep_slope and self._slope is not None:
            return
        mean_x = self.sx / self.n
        var = self.sxx / self.n - mean_x * mean_x
        if var > self._SPREAD or (self._slope is None and var > 1e-9):
            self._slope = max(0.0, (self.sxy / self.n - mean_x * self.sy / self.n) / var)

    @property
    def known(self) -> bool:
        return self.n > 0

    @property
    def has_slope(self) -> bool:
        """Seen at least two different token counts, so the per-token cost is measured."""
        return self._slope is not None

    def predict(self, tokens: float) -> float:
        if self.n == 0:
            return 0.0
        mean_x, mean_y = self.sx / self.n, self.sy / self.n
        if self._slope is None:
            return mean_y  # a single token count seen so far: no slope yet
        fixed = max(0.0, mean_y - self._slope * mean_x)
        return fixed + self._slope * tokens

    def state(self) -> list[float | None]:
        """The running sums and the slope, as plain numbers (`AdaptiveDraftLength.measurements`)."""
        return [self.n, self.sx, self.sy, self.sxx, self.sxy, self._slope]

    def set_state(self, state: Sequence[float | None]) -> None:
        n, sx, sy, sxx, sxy, slope = state
        self.n, self.sx, self.sy, self.sxx, self.sxy = (float(v or 0.0) for v in (n, sx, sy, sxx, sxy))
        self._slope = None if slope is None else float(slope)


#: How far past the most requests in flight a curve's calls were measured at (`LoadCurve.most_seen`) a
#: request's place may be and its cost to the others still be read on the curve.
MEASURED_LOAD_REACH = 2


def load_measured(load: LoadCurve, rank: int) -> bool:
    """Whether the request at `rank` (in start order) is within the loads `load` has measured: its place
    at most `MEASURED_LOAD_REACH` times the most requests in flight any call on it started with.

    Beyond that the curve has not seen the burst, and reads no cost to the others (its certain slope is 0
    until calls under that load come back): in a cold burst of 100 streams through `specapi serve`, after
    a warm-up of two requests at a time, the 40 requests whose answers the suffix index knew were each
    admitted to a round of free drafts (a verify call of up to 32 tokens) on a cost of 0, where 4 are
    now (`benchmarks/README.md`: the wave was no faster for it; the engine's own start is what the
    default still costs there). The earliest requests go on and measure the load: the next burst, or
    the later requests of one that arrives spread out, reach twice as far."""
    return rank <= MEASURED_LOAD_REACH * load.most_seen
