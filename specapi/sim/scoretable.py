"""A fixed-size table of scored positions, allocated whole when it is made.

Echo verification sends a growing prompt round after round, and a server returns the logprobs of every
prompt position each time; the simulator keeps what it scored so that a round costs only its new
positions. Python objects per position (a key tuple, a record, its top list) take about 530 bytes each,
and a cache of them grows until its bound, which at 100 streams of long prompts is tens of thousands of
positions: resident memory would climb for as long as a run lasts. This table holds the same facts in
numpy arrays written once at creation, so its memory is resident from the start and never grows, as a
server's preallocated KV cache is.

Layout: ``slots`` rows in sets of two (a key hashes to a set; the least recently used row of the two is
replaced). A row holds the key (64-bit hash, 0 = empty), the logprob, the rank (-1 = not asked), how many
alternatives, and up to ``width`` alternatives (id, logprob). Keys are 64-bit hashes of the position's
prefix, token, ``k`` and ``with_rank``, so a false hit needs a 64-bit collision.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["ScoreTable"]

_WAYS = 2


class ScoreTable:
    """Rows of (key → logprob, rank, top alternatives), ``slots`` of them, two per set, least recently
    used replaced. Not thread-safe: the caller holds a lock."""

    def __init__(self, *, slots: int, width: int) -> None:
        if slots < _WAYS or slots & (slots - 1):
            raise ValueError(f"slots must be a power of two of at least {_WAYS}, got {slots}")
        self.slots = slots
        self.width = width
        self._set_mask = np.uint64(slots // _WAYS - 1)
        # Filled, not just allocated: the pages are resident now, not as rows come in.
        self._keys = _filled((slots,), np.uint64, 0)
        self._used = _filled((slots,), np.uint64, 0)  # tick of the last read or write
        self._logprob = _filled((slots,), np.float64, 0.0)
        self._rank = _filled((slots,), np.int32, -1)
        self._count = _filled((slots,), np.int16, 0)
        self._top_ids = _filled((slots, width), np.int32, 0)
        self._top_logprobs = _filled((slots, width), np.float64, 0.0)
        self._tick = 0

    @property
    def nbytes(self) -> int:
        """The table's memory, all of it allocated and written at creation."""
        arrays = (self._keys, self._used, self._logprob, self._rank, self._count, self._top_ids, self._top_logprobs)
        return sum(a.nbytes for a in arrays)

    def get_many(
        self, keys: Sequence[int]
    ) -> list[tuple[float, int | None, tuple[tuple[int, float], ...]] | None]:
        """For each key, ``(logprob, rank, top)`` if its row is held, else ``None``."""
        if not keys:
            return []
        wanted = np.fromiter(keys, dtype=np.uint64, count=len(keys))
        first = (wanted & self._set_mask).astype(np.int64) * _WAYS
        row = np.where(self._keys[first] == wanted, first, np.where(self._keys[first + 1] == wanted, first + 1, -1))
        hit = row >= 0
        out: list[tuple[float, int | None, tuple[tuple[int, float], ...]] | None] = [None] * len(keys)
        if not hit.any():
            return out
        rows = row[hit]
        self._tick += 1
        self._used[rows] = self._tick
        counts = self._count[rows].tolist()
        logprobs = self._logprob[rows].tolist()
        ranks = self._rank[rows].tolist()
        widest = max(counts)
        top_ids = self._top_ids[rows, :widest].tolist()
        top_logprobs = self._top_logprobs[rows, :widest].tolist()
        for j, index in enumerate(np.flatnonzero(hit).tolist()):
            n = counts[j]
            out[index] = (
                logprobs[j],
                None if ranks[j] < 0 else ranks[j],
                tuple(zip(top_ids[j][:n], top_logprobs[j][:n])),
            )
        return out

    def put(self, key: int, logprob: float, rank: int | None, top: Sequence[tuple[int, float]]) -> bool:
        """Hold one row (replacing the older row of its set); ``False`` if ``top`` is wider than the table."""
        if len(top) > self.width:
            return False
        first = (int(key) & int(self._set_mask)) * _WAYS
        if self._keys[first] == key or self._keys[first + 1] == key:
            return True  # another caller scored it meanwhile
        row = first if self._used[first] <= self._used[first + 1] else first + 1
        self._tick += 1
        self._keys[row] = key
        self._used[row] = self._tick
        self._logprob[row] = logprob
        self._rank[row] = -1 if rank is None else rank
        self._count[row] = len(top)
        for j, (token, value) in enumerate(top):
            self._top_ids[row, j] = token
            self._top_logprobs[row, j] = value
        return True


def _filled(shape: tuple[int, ...], dtype: type, value: float) -> np.ndarray:
    array = np.empty(shape, dtype=dtype)
    array.fill(value)
    return array
