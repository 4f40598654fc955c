"""Draft-length policies: strategy objects that say how many tokens to draft next (0 = don't speculate).

A policy sees a `PolicyState` (what has happened so far on this client, and in this request) and
returns a length; it is told each round's outcome through `observe`. Policies are shared by all the
requests of a client, so what they learn carries over to later requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ._exceptions import ConfigurationError
from .stats import RoundRecord

__all__ = ["PolicyState", "DraftLengthPolicy", "FixedDraftLength"]


@dataclass(frozen=True)
class PolicyState:
    remaining_tokens: int
    rounds_so_far: int


class DraftLengthPolicy(Protocol):
    name: str

    def choose(self, state: PolicyState) -> int: ...

    def observe(self, record: RoundRecord) -> None: ...

    def observe_plain(self, tokens: int, latency_s: float) -> None: ...


class FixedDraftLength:
    """Always draft `k` tokens."""

    name = "fixed"

    def __init__(self, k: int) -> None:
        if not isinstance(k, int) or k < 1:
            raise ConfigurationError(f"num_speculative_tokens must be an integer >= 1, got {k!r}")
        self.k = k

    def choose(self, state: PolicyState) -> int:
        return self.k

    def observe(self, record: RoundRecord) -> None:
        pass

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        pass
