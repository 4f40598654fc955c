"""Records that add up: per-round records, per-role usage and the statistics attached to every response."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

__all__ = ["MODEL_DRAFTER", "PIPELINED", "RoleUsage", "RoundRecord", "drafter_of", "SpeculativeStats", "money", "format_money", "header_value", "HEADER_PREFIX"]


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


#: `RoundRecord.drafter` of a round drafted by a draft model's call (the one drafter whose draft costs a call).
MODEL_DRAFTER = "draft-model"
#: What `RoundRecord.drafter` ends with when the draft was made during the previous round's verification.
PIPELINED = "+pipelined"


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
    #: The request sampled (temperature > 0): acceptance differs from greedy, and is learnt apart.
    sampled: bool = False


def drafter_of(record: RoundRecord) -> str:
    """The drafter a round's draft came from (a pipelined draft is its drafter's)."""
    return record.drafter.removesuffix(PIPELINED)


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
    #: The rule that decided the rounds: "exact", or the lossy "threshold"/"typical" the caller opted into
    #: (then `exact` is False); `acceptance_note` says why a lossy request was decided exactly instead.
    acceptance: str = "exact"
    acceptance_note: str | None = None
    #: Lossy acceptance's measured divergence: emitted tokens exact verification would have rejected
    #: for certain (greedy: not the target's argmax), and the summed log-probability gap of the kept
    #: draft tokens to the target's most likely token (server logprobs, nats).
    divergent_tokens: int = 0
    logprob_gap: float = 0.0
    #: What the load on the upstreams changed for this request, if anything (`specapi.parts.policy.LOAD_*`):
    #: a shorter or longer draft, or the target alone, because its calls cost the other requests in flight.
    load_reason: str | None = None
    #: Set on the response whose request confirmed that the target refuses a verification path's
    #: request shape (its plain request accepted): the path's name ("echo", ...). From then on that
    #: model's requests go to the target alone, and their `fallback_reason` says why.
    verification_refused: str | None = None
    #: What the caller's `seed` fixed, for a sampled request that set one (None otherwise): the target's
    #: own seeded sample (a request the target wrote alone, sent the seed unchanged), or specapi's draws.
    seed_note: str | None = None

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
    def mean_logprob_gap(self) -> float:
        """`logprob_gap` per generated token."""
        return self.logprob_gap / self.generated_tokens if self.generated_tokens else 0.0

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

    def to_dict(self, *, rounds: bool = False) -> dict[str, Any]:
        """The statistics as plain JSON types (`json.dumps` accepts it); the one shape used everywhere.

        `specapi run --json`, the bench's JSON report (per request, under `"speculative"`), the proxy's
        `"speculative"` field and its `x-specapi-*` headers (`to_headers()`) all use these names, which
        are the attribute names of this class:

            speculated, fallback_reason, load_reason, verification_refused, seed_note, exact, exact_reason, verification,
            num_rounds, drafted_tokens, accepted_tokens, acceptance_rate, mean_accepted_length,
            generated_tokens, tokens_per_target_call, max_coverage_gap, wall_s, ttft_s,
            acceptance, acceptance_note, divergent_tokens, logprob_gap, mean_logprob_gap,
            cost_usd, draft{...}, target{...}

        `draft` and `target` hold `requests`, `failed_requests`, `prompt_tokens`, `completion_tokens`,
        `cached_tokens`, `latency_s` and `cost_usd`. Money is a decimal string in USD (`"0.0021"`, exact,
        never a float) or `null` when a price is unknown; times are seconds as floats. With
        `rounds=True`, `"rounds"` adds the per-round records (`drafted`, `accepted`, `emitted`,
        `draft_latency_s`, `verify_latency_s`, `drafter`, `accepted_by_position`).
        """
        data: dict[str, Any] = {
            "speculated": self.speculated,
            "fallback_reason": self.fallback_reason,
            "exact": self.exact,
            "exact_reason": self.exact_reason,
            "verification": self.verification,
            "num_rounds": self.num_rounds,
            "drafted_tokens": self.drafted_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": round(self.acceptance_rate, 6),
            "mean_accepted_length": round(self.mean_accepted_length, 6),
            "generated_tokens": self.generated_tokens,
            "discarded_draft_tokens": self.discarded_draft_tokens,
            "load_reason": self.load_reason,
            "verification_refused": self.verification_refused,
            "seed_note": self.seed_note,
            "tokens_per_target_call": round(self.tokens_per_target_call, 6),
            "max_coverage_gap": round(self.max_coverage_gap, 9),
            "wall_s": round(self.wall_s, 6),
            "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 6),
            "acceptance": self.acceptance,
            "acceptance_note": self.acceptance_note,
            "divergent_tokens": self.divergent_tokens,
            "logprob_gap": round(self.logprob_gap, 6),
            "mean_logprob_gap": round(self.mean_logprob_gap, 6),
            "cost_usd": money(self.cost_usd),
            "draft": _usage_dict(self.draft),
            "target": _usage_dict(self.target),
        }
        if rounds:
            data["rounds"] = [_round_dict(r) for r in self.rounds]
        return data

    def to_headers(self, scrub: Callable[[str], str] = str) -> dict[str, str]:
        """`to_dict()` as HTTP headers: `x-specapi-<name>` with `_` as `-` (`x-specapi-num-rounds`), the
        roles' fields as `x-specapi-target-<name>`; `true`/`false` for booleans; a `null` (an unknown
        cost, no reason) is left out. Free text goes through `scrub` and is cut to 256 characters."""
        headers: dict[str, str] = {}
        for name, value in self.to_dict().items():
            if isinstance(value, dict):
                for inner, item in value.items():
                    _put(headers, f"{name}-{inner}", item, scrub)
            else:
                _put(headers, name, value, scrub)
        return headers

    def summary(self) -> str:
        """One line: tokens, rounds, acceptance, exactness, path and cost per role."""
        if self.speculated:
            head = (
                f"{self.generated_tokens} tokens in {self.num_rounds} rounds, "
                f"{self.accepted_tokens}/{self.drafted_tokens} drafted accepted ({self.acceptance_rate:.0%}), "
                f"{self.tokens_per_target_call:.2f} tokens per target call"
            )
        else:
            head = f"{self.generated_tokens} tokens from the target alone ({self.fallback_reason or 'no speculation'})"
        if self.acceptance != "exact":
            head += f", {self.divergent_tokens} divergent (gap {self.logprob_gap:.2f} nats)"
        exact = "exact" if self.exact else f"not exact ({self.exact_reason})" if self.exact_reason else "not exact"
        cost = f"cost draft {format_money(self.draft.cost_usd)}, target {format_money(self.target.cost_usd)}"
        return f"{head}; {exact}; path {self.verification}; {self.wall_s:.2f}s; {cost}"

    def __repr__(self) -> str:
        return (
            f"SpeculativeStats(generated_tokens={self.generated_tokens}, num_rounds={self.num_rounds}, "
            f"acceptance_rate={self.acceptance_rate:.2f}, exact={self.exact}, verification={self.verification!r}, "
            f"speculated={self.speculated}, wall_s={self.wall_s:.3f}, cost_usd={money(self.cost_usd)!r})"
        )


def passed_on(target: RoleUsage, reason: str, wall_s: float, *, generated_tokens: int | None = None, ttft_s: float | None = None) -> SpeculativeStats:
    """The statistics of an answer the target wrote alone and specapi passed on as it came: no draft, no
    round, `reason` saying why; the generated tokens are the target's billed ones unless given."""
    return SpeculativeStats(
        target=target,
        draft=RoleUsage(),
        speculated=False,
        fallback_reason=reason,
        verification="none",
        generated_tokens=target.completion_tokens if generated_tokens is None else generated_tokens,
        wall_s=wall_s,
        ttft_s=ttft_s,
    )


def money(value: Decimal | None) -> str | None:
    """Money as it appears in every JSON and header: a decimal string in USD, or None when unknown."""
    return None if value is None else str(value)


def format_money(value: Decimal | None) -> str:
    """Money for people: `$0.0021`, or `unknown`."""
    return "unknown" if value is None else f"${value}"


def _usage_dict(u: RoleUsage) -> dict[str, Any]:
    return {
        "requests": u.requests,
        "failed_requests": u.failed_requests,
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "cached_tokens": u.cached_tokens,
        "latency_s": round(u.latency_s, 6),
        "cost_usd": money(u.cost_usd),
    }


def _round_dict(r: RoundRecord) -> dict[str, Any]:
    return {
        "drafted": r.drafted,
        "accepted": r.accepted,
        "emitted": r.emitted,
        "draft_latency_s": round(r.draft_latency_s, 6),
        "verify_latency_s": round(r.verify_latency_s, 6),
        "drafter": r.drafter,
        "accepted_by_position": list(r.accepted_by_position),
    }


HEADER_PREFIX = "x-specapi-"
_MAX_HEADER_CHARS = 256


def header_value(value: object, *, limit: int = _MAX_HEADER_CHARS) -> str:
    """`value` as a safe header value: printable ASCII on one line, at most `limit` characters."""
    text = str(value)
    safe = "".join(ch if " " <= ch <= "~" else " " for ch in text).strip()
    return safe if len(safe) <= limit else safe[: limit - 3] + "..."


def _put(headers: dict[str, str], name: str, value: Any, scrub: Callable[[str], str]) -> None:
    if value is None:
        return
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif name.endswith(("_reason", "_note")):
        text = scrub(str(value))
    else:
        text = str(value)
    headers[HEADER_PREFIX + name.replace("_", "-")] = header_value(text)
