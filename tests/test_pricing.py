"""`specapi.transport.pricing`: what a call cost, from the endpoint's prices, else genai-prices, else None."""

from __future__ import annotations

import json
from decimal import Decimal

import httpx2
import pytest
from genai_prices import Usage, calc_price

from specapi import AsyncSpeculativeOpenAI, Endpoint
from specapi.transport.pricing import call_cost


def test_endpoint_prices_bill_cached_tokens_at_the_cached_price():
    ep = Endpoint(model="my-model", input_price_per_mtok=2.5, output_price_per_mtok=10, cached_input_price_per_mtok="1.25")
    cost = call_cost(ep, prompt_tokens=1000, completion_tokens=200, cached_tokens=400)
    # 600 uncached * 2.5 + 400 cached * 1.25 + 200 out * 10, per million
    assert cost == Decimal("0.004")
    assert isinstance(cost, Decimal)


def test_cached_tokens_cost_the_input_price_when_no_cached_price_is_given():
    ep = Endpoint(model="my-model", input_price_per_mtok="3", output_price_per_mtok="15")
    assert call_cost(ep, prompt_tokens=1000, completion_tokens=0, cached_tokens=400) == Decimal("0.003")
    assert call_cost(ep, prompt_tokens=0, completion_tokens=1_000_000) == Decimal("15")


def test_endpoint_prices_override_genai_prices():
    ep = Endpoint(model="gpt-4o", price_provider="openai", input_price_per_mtok=1, output_price_per_mtok=1)
    assert call_cost(ep, prompt_tokens=500_000, completion_tokens=500_000) == Decimal("1")


@pytest.mark.parametrize(("prompt", "completion", "cached"), [(1000, 200, 0), (2048, 100, 1024), (1, 1, 0)])
def test_gpt_4o_is_priced_by_genai_prices(prompt, completion, cached):
    ep = Endpoint(model="gpt-4o", price_provider="openai")
    expected = calc_price(
        Usage(input_tokens=prompt, output_tokens=completion, cache_read_tokens=cached or None), model_ref="gpt-4o", provider_id="openai"
    ).total_price
    got = call_cost(ep, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
    assert got == expected and isinstance(got, Decimal)
    assert got > 0


def test_cached_tokens_are_cheaper_for_gpt_4o():
    ep = Endpoint(model="gpt-4o", price_provider="openai")
    full = call_cost(ep, prompt_tokens=2048, completion_tokens=0)
    cached = call_cost(ep, prompt_tokens=2048, completion_tokens=0, cached_tokens=1024)
    assert cached < full


def test_unknown_model_costs_none_not_a_guess():
    assert call_cost(Endpoint(model="toy-target-that-nobody-prices"), prompt_tokens=10, completion_tokens=1) is None


# ----------------------------------------------------------------------------- through a client


def _canned(usage: dict):
    seen: list[dict] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content))
        return httpx2.Response(
            200,
            json={
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 0,
                "model": "priced",
                "choices": [{"index": 0, "text": "hello", "logprobs": None, "finish_reason": "stop"}],
                "usage": usage,
            },
        )

    return handler, seen


async def test_response_cost_comes_from_the_provider_usage():
    handler, seen = _canned({"prompt_tokens": 1000, "completion_tokens": 200, "total_tokens": 1200, "prompt_tokens_details": {"cached_tokens": 400}})
    target = Endpoint(
        model="priced",
        base_url="http://priced.test/v1",
        api_key="x",
        input_price_per_mtok="2.5",
        output_price_per_mtok="10",
        cached_input_price_per_mtok="1.25",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
    )
    async with AsyncSpeculativeOpenAI(target=target, verification="none") as client:
        resp = await client.completions.create(prompt="hi", max_tokens=5, temperature=0)
    assert len(seen) == 1
    s = resp.speculative
    assert (s.target.prompt_tokens, s.target.completion_tokens, s.target.cached_tokens) == (1000, 200, 400)
    assert s.target.cost_usd == Decimal("0.004")
    assert s.cost_usd == Decimal("0.004")  # no draft was used: it costs zero, not unknown


async def test_unpriced_target_makes_the_total_cost_unknown():
    handler, _ = _canned({"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12})
    target = Endpoint(model="toy-unpriced", base_url="http://priced.test/v1", api_key="x", http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)))
    async with AsyncSpeculativeOpenAI(target=target, verification="none") as client:
        resp = await client.completions.create(prompt="hi", max_tokens=5, temperature=0)
    assert resp.speculative.target.cost_usd is None
    assert resp.speculative.cost_usd is None


async def test_a_response_without_usage_has_unknown_cost_not_zero():
    """A priced model answered but reported no usage: what it cost is unknown, and $0 would be a guess."""
    handler, _ = _canned(None)
    target = Endpoint(
        model="priced",
        base_url="http://priced.test/v1",
        api_key="x",
        input_price_per_mtok=5,
        output_price_per_mtok=15,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
    )
    async with AsyncSpeculativeOpenAI(target=target, verification="none") as client:
        resp = await client.completions.create(prompt="hi", max_tokens=5, temperature=0)
    assert resp.choices[0].text == "hello"
    assert resp.speculative.target.cost_usd is None, f"cost_usd={resp.speculative.target.cost_usd}"
