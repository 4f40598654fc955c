"""Records that add up: per-round records, per-role usage and the statistics attached to every response."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from decimal import Decimal

__all__ = ["RoleUsage", "RoundRecord", "SpeculativeStats"]


def _add_optional(a: Decimal | None, b: Decimal | None) -> Decimal | None:
    if a is None or b is None:
        return None
    return a + b


@dataclass(frozen=True)
class RoleUsage:
    """What one role (draft or target) was asked and billed for.

    Token counts are the sums of the provider's `usage` fields, not local estimates. `cost_usd` is
    `None` when the price of the model is unknown (never a guess). `requests` counts every HTTP request
    sent, retries and failed attempts included.
    """

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    latency_s: float = 0.0
    cost_usd: Decimal | None = Decimal(0)
    failed_requests: int = 0

    def __add__(self, other: RoleUsage) -> RoleUsage:
        if not isinstance(other, RoleUsage):
            return NotImplemented
        return RoleUsage(
            requests=self.requests + other.requests,
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            latency_s=self.latency_s + other.latency_s,
            cost_usd=_add_optional(self.cost_usd, other.cost_usd),
            failed_requests=self.failed_requests + other.failed_requests,
        )

    def __radd__(self, other: object) -> RoleUsage:
        if other == 0:  # lets sum() start from its default 0
            return self
        return NotImplemented  # type: ignore[return-value]

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class RoundRecord:
    """One draft-then-verify round.

    `drafted` draft tokens were proposed, `accepted` of them were kept, and `emitted` target tokens were
    added to the output (accepted ones plus a correction or bonus token). `accepted_by_position[i]` says
    whether the draft token at position i was accepted. Latencies are wall-clock seconds of the calls.
    """

    drafted: int
    accepted: int
    emitted: int
    draft_latency_s: float = 0.0
    verify_latency_s: float = 0.0
    drafter: str = ""
    accepted_by_position: tuple[bool, ...] = ()


@dataclass(frozen=True)
class SpeculativeStats:
    """Statistics attached to every response as `response.speculative`."""

    rounds: tuple[RoundRecord, ...] = ()
    draft: RoleUsage = field(default_factory=RoleUsage)
    target: RoleUsage = field(default_factory=RoleUsage)
    exact: bool = True
    exact_reason: str | None = None
    speculated: bool = True
    fallback_reason: str | None = None
    verification: str = "echo"
    generated_tokens: int = 0
    wall_s: float = 0.0
    ttft_s: float | None = None
    max_coverage_gap: float = 0.0
    #: Draft tokens the draft was billed for that never reached verification (stale pipelined drafts).
    discarded_draft_tokens: int = 0

    @property
    def num_rounds(self) -> int:
        return len(self.rounds)

    @property
    def drafted_tokens(self) -> int:
        return sum(r.drafted for r in self.rounds)

    @property
    def accepted_tokens(self) -> int:
        return sum(r.accepted for r in self.rounds)

    @property
    def acceptance_rate(self) -> float:
        drafted = self.drafted_tokens
        return self.accepted_tokens / drafted if drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Mean number of accepted draft tokens per round."""
        return self.accepted_tokens / len(self.rounds) if self.rounds else 0.0

    @property
    def tokens_per_target_call(self) -> float:
        return self.generated_tokens / self.target.requests if self.target.requests else 0.0

    @property
    def cost_usd(self) -> Decimal | None:
        return _add_optional(self.draft.cost_usd, self.target.cost_usd)

    def acceptance_by_position(self) -> list[float]:
        """Fraction of rounds whose draft token at position i was accepted, for i = 0, 1, ..."""
        counts: list[int] = []
        totals: list[int] = []
        for r in self.rounds:
            for i, ok in enumerate(r.accepted_by_position):
                if i == len(totals):
                    counts.append(0)
                    totals.append(0)
                totals[i] += 1
                counts[i] += ok
        return [c / t for c, t in zip(counts, totals)]

    def with_(self, **changes: object) -> SpeculativeStats:
        return replace(self, **changes)  # type: ignore[arg-type]

    def to_dict(self) -> dict:
        """A JSON-ready summary (used by the proxy and the bench)."""

        def usage(u: RoleUsage) -> dict:
            return {
                "requests": u.requests,
                "failed_requests": u.failed_requests,
                "prompt_tokens": u.prompt_tokens,
                "completion_tokens": u.completion_tokens,
                "cached_tokens": u.cached_tokens,
                "latency_s": round(u.latency_s, 6),
                "cost_usd": None if u.cost_usd is None else str(u.cost_usd),
            }

        return {
            "speculated": self.speculated,
            "fallback_reason": self.fallback_reason,
            "exact": self.exact,
            "exact_reason": self.exact_reason,
            "verification": self.verification,
            "rounds": self.num_rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 6),
            "mean_accepted_length": round(self.mean_accepted_length, 6),
            "generated_tokens": self.generated_tokens,
            "discarded_draft_tokens": self.discarded_draft_tokens,
            "wall_s": round(self.wall_s, 6),
            "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 6),
            "draft": usage(self.draft),
            "target": usage(self.target),
            "cost_usd": None if self.cost_usd is None else str(self.cost_usd),
        }
