"""Speculation statistics as response headers (`x-specapi-*`), for clients that only see headers.

The headers are `SpeculativeStats.to_headers()`: the body's `"speculative"` field
(`SpeculativeStats.to_dict()`) under the same names, `x-specapi-num-rounds`,
`x-specapi-acceptance-rate`, `x-specapi-target-cost-usd`, ... (a `null` is left out). Streams carry
the statistics in their last chunk only, since headers are sent before the first token.
"""

from __future__ import annotations

from collections.abc import Callable

from ..core.stats import HEADER_PREFIX as PREFIX
from ..core.stats import SpeculativeStats, header_value

__all__ = ["stats_headers", "header_value", "PREFIX"]


def stats_headers(stats: SpeculativeStats, scrub: Callable[[str], str] = str) -> dict[str, str]:
    """The `x-specapi-*` headers of a response with these statistics; free text goes through `scrub`."""
    return stats.to_headers(scrub)
