"""Speculation statistics as response headers (`x-specapi-*`), for clients that only see headers.

The same numbers are in the body's `"speculative"` field (`SpeculativeStats.to_dict()`); streams carry
them in their last chunk only, since headers are sent before the first token.
"""

from __future__ import annotations

from collections.abc import Callable

from ..stats import SpeculativeStats

__all__ = ["stats_headers", "header_value", "PREFIX"]

PREFIX = "x-specapi-"
_MAX_HEADER_CHARS = 256


def header_value(value: object, *, limit: int = _MAX_HEADER_CHARS) -> str:
    """`value` as a safe header value: printable ASCII on one line, at most `limit` characters."""
    text = str(value)
    safe = "".join(ch if " " <= ch <= "~" else " " for ch in text).strip()
    return safe if len(safe) <= limit else safe[: limit - 3] + "..."


def _flag(value: bool) -> str:
    return "true" if value else "false"


def stats_headers(stats: SpeculativeStats, scrub: Callable[[str], str] = str) -> dict[str, str]:
    """The `x-specapi-*` headers of a response with these statistics; free text goes through `scrub`."""
    headers = {
        "speculated": _flag(stats.speculated),
        "exact": _flag(stats.exact),
        "verification": stats.verification,
        "rounds": str(stats.num_rounds),
        "drafted-tokens": str(stats.drafted_tokens),
        "accepted-tokens": str(stats.accepted_tokens),
        "acceptance-rate": f"{stats.acceptance_rate:.6f}",
        "generated-tokens": str(stats.generated_tokens),
        "target-requests": str(stats.target.requests),
        "draft-requests": str(stats.draft.requests),
        "cost-usd": "unknown" if stats.cost_usd is None else str(stats.cost_usd),
        "wall-s": f"{stats.wall_s:.6f}",
    }
    if stats.fallback_reason:
        headers["fallback-reason"] = scrub(stats.fallback_reason)
    if stats.exact_reason:
        headers["exact-reason"] = scrub(stats.exact_reason)
    return {PREFIX + name: header_value(value) for name, value in headers.items()}
