"""What a call cost, in USD as `Decimal`: the endpoint's own prices, else genai-prices, else None."""

from __future__ import annotations

from decimal import Decimal
from functools import lru_cache

from .endpoint import Endpoint

__all__ = ["call_cost"]

_MILLION = Decimal(1_000_000)


@lru_cache(maxsize=256)
def _known_to_genai_prices(model: str, provider: str | None) -> bool:
    from genai_prices import Usage, calc_price

    try:
        calc_price(Usage(input_tokens=1, output_tokens=1), model_ref=model, provider_id=provider)
    except LookupError:
        return False
    return True


def call_cost(endpoint: Endpoint, *, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Decimal | None:
    """The price of one response's usage. `prompt_tokens` includes `cached_tokens` (OpenAI's convention)."""
    if endpoint.has_prices:
        cached_price = endpoint.cached_input_price_per_mtok
        if cached_price is None:
            cached_price = endpoint.input_price_per_mtok
        uncached = prompt_tokens - cached_tokens
        return (
            uncached * endpoint.input_price_per_mtok  # type: ignore[operator]
            + cached_tokens * cached_price
            + completion_tokens * endpoint.output_price_per_mtok  # type: ignore[operator]
        ) / _MILLION
    if not _known_to_genai_prices(endpoint.model, endpoint.price_provider):
        return None
    from genai_prices import Usage, calc_price

    usage = Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens, cache_read_tokens=cached_tokens or None)
    return calc_price(usage, model_ref=endpoint.model, provider_id=endpoint.price_provider).total_price
