"""How an upstream's call latency grows with the requests in flight: measured, never configured.

One `LoadCurve` per upstream connection pool (shared by a client's copies and by other models on the
same server). The client counts the requests it has in flight through it (`enter`/`leave`); every
non-streamed call adds a sample (requests in flight when the call started, its latency) to a running
least-squares line, latency = base + slope * requests, that forgets old samples so it follows the load
as it changes. The slope is what one more request in flight costs every call on that upstream: on a
saturated server, or a client short of CPU, speculation's extra calls slow everyone else's down.

What a request's calls are charged for the others (`cost_to_others`) is the slope less two standard
errors of it: only a cost the samples can tell from jitter. Calls at one and two requests in flight a
few milliseconds apart by chance would otherwise read as milliseconds per request, and multiplied by the
requests ahead (15 in a burst of 16) send requests to the target alone that speculation would have served
faster (`benchmarks/concurrency.py`: a burst's first calls did exactly that before this rule).

`AdaptiveDraftLength` reads it (see its docstring); at one request in flight nothing is added.

What the line cannot see at a burst's start (no call has come back yet) the client's own queue shows:
`queue_delay` is how long a step of the event loop waits for its turn right now. In a cold burst of 100
streams through `specapi serve` it grew with each request's place, to about 40 ms; with 16 requests on one
client it stayed under 3 ms (`benchmarks/README.md`). Each call of a round waits about that long again, the
target alone's stream once.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import itertools
import math
from collections.abc import Callable

__all__ = ["LoadCurve", "current_request", "new_request_id", "queue_delay"]

#: The id of the request the running task works for (set by the client around the engine's loop).
current_request: contextvars.ContextVar[int | None] = contextvars.ContextVar("specapi_request", default=None)
_ids = itertools.count(1)


def new_request_id() -> int:
    """Ids in the order requests start, so that earlier requests rank first."""
    return next(_ids)


async def queue_delay(clock: Callable[[], float]) -> float:
    """How long a step of the running event loop waits for its turn now: the time one `sleep(0)` takes.

    Every task that is ready runs first, so it is the work queued ahead of this one (a burst's other
    requests starting), and microseconds on an idle loop."""
    started = clock()
    await asyncio.sleep(0)
    return max(0.0, clock() - started)


class LoadCurve:
    """Requests in flight on one upstream, and its call latency as a line in that number."""

    #: How much each gap between a stream's tokens moves `stream_pace` (a running mean over the last
    #: few hundred gaps of all streams), and how many gaps it needs before it is read.
    PACE_WEIGHT = 0.02
    PACE_MIN_GAPS = 16

    def __init__(self, *, decay: float = 0.99) -> None:
        self._active: list[int] = []
        self._decay = decay
        self._n = self._sx = self._sy = self._sxx = self._sxy = self._syy = 0.0
        self._max_x = 1.0  # the most requests in flight any sample saw
        self._pace = 0.0
        self._pace_gaps = 0

    @property
    def requests(self) -> int:
        return len(self._active)

    def enter(self, request_id: int) -> None:
        bisect.insort(self._active, request_id)

    def leave(self, request_id: int) -> None:
        index = bisect.bisect_left(self._active, request_id)
        if index < len(self._active) and self._active[index] == request_id:
            del self._active[index]

    def rank(self, request_id: int | None) -> int:
        """1 for the earliest request in flight, 2 for the next, ...; the last place if unknown."""
        if request_id is None:
            return max(1, self.requests)
        return max(1, bisect.bisect_right(self._active, request_id))

    @property
    def most_seen(self) -> int:
        """The most requests in flight any call on the line started with (1 before any call)."""
        return int(self._max_x)

    @property
    def samples(self) -> float:
        """How many calls the line holds (older ones count for less)."""
        return self._n

    def add(self, requests: int, latency_s: float) -> None:
        """A call that started with `requests` in flight took `latency_s`."""
        d = self._decay
        x = float(max(1, requests))
        self._max_x = max(self._max_x, x)
        self._n = self._n * d + 1
        self._sx = self._sx * d + x
        self._sy = self._sy * d + latency_s
        self._sxx = self._sxx * d + x * x
        self._sxy = self._sxy * d + x * latency_s
        self._syy = self._syy * d + latency_s * latency_s

    @property
    def slope(self) -> float | None:
        """Seconds added to a call per extra request in flight (>= 0); None until two loads were seen."""
        if self._n == 0:
            return None
        mean_x = self._sx / self._n
        var = self._sxx / self._n - mean_x * mean_x
        if var <= 1e-6:
            return None
        return max(0.0, (self._sxy / self._n - mean_x * self._sy / self._n) / var)

    @property
    def certain_slope(self) -> float:
        """The slope less two standard errors (>= 0; 0 while unmeasured): the part of it that is not noise."""
        slope = self.slope
        n = self._n
        if slope is None or n <= 2.0:
            return 0.0
        mean_x, mean_y = self._sx / n, self._sy / n
        var_x = self._sxx / n - mean_x * mean_x
        cov = self._sxy / n - mean_x * mean_y
        var_y = self._syy / n - mean_y * mean_y
        residual = max(0.0, var_y - cov * cov / var_x) * n / (n - 2.0)  # per sample, around the line
        return max(0.0, slope - 2.0 * math.sqrt(residual / (n * var_x)))

    def inflation(self) -> float:
        """How much slower a call is now than at one request in flight (>= 1; 1 while unmeasured).

        Read on the line with its certain slope (through the samples' mean), and no further out than
        the most requests its samples saw: a slope measured at one and two requests in flight, the
        jitter of a few calls, once read as calls tens of times slower at the 100 of a cold burst, and
        that hid the wait the burst's first rounds measured (`benchmarks/README.md`)."""
        slope = self.certain_slope
        if slope <= 0.0 or self.requests <= 1 or self._n == 0:
            return 1.0
        mean_x, mean_y = self._sx / self._n, self._sy / self._n
        one = mean_y + slope * (1.0 - mean_x)
        now = mean_y + slope * (min(self.requests, self._max_x) - mean_x)
        return max(1.0, now / one) if one > 0 else 1.0

    def pace(self, seconds_per_token: float) -> None:
        """A stream's tokens came `seconds_per_token` apart (after its first): how fast streams write now."""
        self._pace_gaps += 1
        weight = max(self.PACE_WEIGHT, 1.0 / self._pace_gaps)  # the plain mean until the weight takes over
        self._pace += weight * (seconds_per_token - self._pace)

    @property
    def stream_pace(self) -> float | None:
        """Seconds between a stream's tokens now (a running mean over all streams); None until measured.

        A call pays the server's queue and its prefill each time; a stream pays them once and then
        writes at this pace. Under load the two part: in a cold burst of 100 streams on the simulator
        the first token took 0.2 s where it takes 0.03 s alone, and the tokens after it still came
        25 ms apart (`benchmarks/README.md`)."""
        return self._pace if self._pace_gaps >= self.PACE_MIN_GAPS else None

    def cost_to_others(self, rank: int) -> float:
        """Seconds a call by the request at `rank` adds to the requests ahead of it, together (the
        certain slope once for each): 0 for the first request in flight, or while the slope is unmeasured.

        Ranking by start time admits requests to speculation in order, as DSpark admits draft
        slots: the first ones speculate, later ones join while their calls still pay."""
        if rank <= 1:
            return 0.0
        return self.certain_slope * (rank - 1)
