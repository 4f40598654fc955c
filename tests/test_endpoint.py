"""`specapi.Endpoint`: validated, immutable configuration, and what of it reaches the wire."""

from __future__ import annotations

import dataclasses
import json
import math
import random
from decimal import Decimal

import httpx2
import openai
import pytest
from specapi import AsyncSpeculativeOpenAI, ConfigurationError, Endpoint
from wireserver import WireReply, WireServer


@pytest.mark.parametrize(
    "options",
    [
        {"model": ""},
        {"model": None},
        {"model": "m", "timeout": 0},
        {"model": "m", "timeout": -1.5},
        {"model": "m", "max_retries": -1},
        {"model": "m", "max_logprobs": 0},
        {"model": "m", "logprobs_mode": "cooked"},
        {"model": "m", "input_price_per_mtok": -1},
        {"model": "m", "output_price_per_mtok": "two dollars"},
        {"model": "m", "cached_input_price_per_mtok": "-0.5"},
        {"model": "m", "client": object()},
    ],
)
def test_invalid_options_raise_configuration_error(options):
    with pytest.raises(ConfigurationError):
        Endpoint(**options)


@pytest.mark.parametrize("options", [{"timeout": "60"}, {"max_retries": "3"}, {"max_retries": 1.5}])
def test_wrongly_typed_options_raise_configuration_error_too(options):
    """ConfigurationError is documented as *the* error for bad arguments, not a stray TypeError."""
    with pytest.raises(ConfigurationError):
        Endpoint(model="m", **options)


def test_configuration_error_is_a_value_error():
    with pytest.raises(ValueError):
        Endpoint(model="m", timeout=0)


def test_prices_become_exact_decimals():
    ep = Endpoint(model="m", input_price_per_mtok=2.5, output_price_per_mtok=0.1, cached_input_price_per_mtok=Decimal("1.25"))
    assert ep.input_price_per_mtok == Decimal("2.5")
    assert ep.output_price_per_mtok == Decimal("0.1")  # from str(0.1), not the binary float
    assert ep.cached_input_price_per_mtok == Decimal("1.25")
    assert ep.has_prices
    assert not Endpoint(model="m", input_price_per_mtok=1).has_prices


def test_endpoint_is_immutable():
    ep = Endpoint(model="m")
    with pytest.raises(dataclasses.FrozenInstanceError):
        ep.model = "other"  # type: ignore[misc]


def test_endpoint_is_keyword_only():
    with pytest.raises(TypeError):
        Endpoint("m")  # type: ignore[misc]


def test_label_names_model_and_url(monkeypatch):
    assert Endpoint(model="m", base_url="http://gpu-box:8000/v1").label == "m @ http://gpu-box:8000/v1"
    assert Endpoint(model="m", base_url="http://x/v1", name="big one").label == "big one"
    monkeypatch.setenv("OPENAI_BASE_URL", "http://from-env:1/v1")
    assert Endpoint(model="m").label == "m @ http://from-env:1/v1"
    monkeypatch.delenv("OPENAI_BASE_URL")
    assert Endpoint(model="m").label == "m @ https://api.openai.com/v1"


async def test_label_uses_a_given_sdk_client_base_url():
    sdk = openai.AsyncOpenAI(base_url="http://sdk-host:9/v1", api_key="k")
    try:
        assert Endpoint(model="m", client=sdk).label == "m @ http://sdk-host:9/v1/"
    finally:
        await sdk.close()


async def test_built_sdk_client_does_not_retry_on_its_own():
    ep = Endpoint(model="m", base_url="http://x/v1", api_key="k", timeout=12.5, max_retries=5)
    sdk = ep.build_client()
    try:
        assert sdk.max_retries == 0  # specapi retries (and counts) every attempt itself
        assert sdk.timeout == 12.5
    finally:
        await sdk.close()


def _completion_json(text: str = "hi") -> dict:
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


async def test_endpoint_options_reach_the_wire(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    async with WireServer(lambda request: WireReply(body=_completion_json())) as server:
        target = Endpoint(model="big", base_url=server.base_url, headers={"X-Team": "infra"}, extra_body={"repeat_penalty": 1.0})
        async with AsyncSpeculativeOpenAI(target=target, verification="none") as client:
            resp = await client.completions.create(prompt="hey", max_tokens=3, temperature=0)
    assert resp.choices[0].text == "hi"
    request = server.requests[-1]
    assert request.method == "POST" and request.path == "/v1/completions"
    assert request.headers["authorization"] == "Bearer EMPTY"  # local servers need no key
    assert request.headers["x-team"] == "infra"
    assert request.headers["content-type"] == "application/json"
    body = request.json()
    assert body["model"] == "big" and body["prompt"] == "hey" and body["repeat_penalty"] == 1.0


async def test_api_key_comes_from_the_environment_by_default(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    async with WireServer(lambda request: WireReply(body=_completion_json())) as server:
        async with AsyncSpeculativeOpenAI(target=Endpoint(model="big", base_url=server.base_url), verification="none") as client:
            await client.completions.create(prompt="hey", max_tokens=3, temperature=0)
    assert server.requests[-1].headers["authorization"] == "Bearer sk-env"


# ----------------------------------------------------------------------------- logprobs_mode of the draft


def _two_token_servers(draft_mode: str):
    """Canned target and draft over the tokens "a", "b" (plus "z" after them), at temperature 2.

    The target reports raw logprobs, p = {a: .5, b: .5} (so p at T=2 is the same). The draft samples
    from q_T = {a: .9, b: .1} and reports q_T itself ("processed") or the raw q with q_T = q^(1/2)
    renormalised ("raw"). Either way the first output token must follow p_T.
    """
    q_t = {"a": 0.9, "b": 0.1}
    if draft_mode == "processed":
        q_reported = q_t
    else:
        raw = {t: v**2 for t, v in q_t.items()}
        total = sum(raw.values())
        q_reported = {t: v / total for t, v in raw.items()}
    p = {"a": 0.5, "b": 0.5}
    rng = random.Random(2024)

    def completion(text, tokens, logprobs, tops, usage):
        return httpx2.Response(
            200,
            json={
                "id": "c",
                "object": "text_completion",
                "created": 0,
                "model": "m",
                "choices": [{"index": 0, "text": text, "finish_reason": "length", "logprobs": {"tokens": tokens, "token_logprobs": logprobs, "top_logprobs": tops}}],
                "usage": usage,
            },
        )

    def draft(request):
        body = json.loads(request.content)
        assert body["max_tokens"] == 1 and body["temperature"] == 2.0
        x = "a" if rng.random() < q_t["a"] else "b"
        top = {t: math.log(v) for t, v in q_reported.items()}
        return completion(x, [x], [top[x]], [top], {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2})

    def target(request):
        body = json.loads(request.content)
        prompt = body["prompt"]
        if body.get("echo"):
            top = {t: math.log(v) for t, v in p.items()}
            tokens = ["P", *prompt[1:], "z"]
            logprobs = [None] + [top[t] for t in prompt[1:]] + [0.0]
            tops = [None] + [top for _ in prompt[1:]] + [{"z": 0.0}]
            return completion(prompt + "z", tokens, logprobs, tops, {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1})
        return completion("z", ["z"], [0.0], [{"z": 0.0}], {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1})

    return target, draft


@pytest.mark.parametrize("draft_mode", ["raw", "processed"])
async def test_the_draft_endpoint_logprobs_mode_is_honoured(draft_mode):
    """q must be read in the draft's own logprobs_mode; reading processed values as raw applies the
    temperature twice and biases the output away from the target's distribution."""
    target_handler, draft_handler = _two_token_servers(draft_mode)
    target = Endpoint(model="m", base_url="http://t.test/v1", api_key="x", logprobs_mode="raw", http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(target_handler)))
    draft = Endpoint(model="d", base_url="http://d.test/v1", api_key="x", logprobs_mode=draft_mode, http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(draft_handler)))
    n = 1500
    firsts = []
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, verification="echo", policy="fixed", drafter="model", pipeline=False, num_speculative_tokens=1) as client:
        for seed in range(n):
            resp = await client.completions.create(prompt="P", max_tokens=2, temperature=2.0, seed=seed)
            firsts.append(resp.choices[0].text[:1])
            assert resp.speculative.speculated
    share_a = firsts.count("a") / n
    # p_T(a) = 0.5; reading q_T = {a: .9} as raw (q' = {a: .75}) gives 0.6. 4 standard errors = 0.052.
    assert abs(share_a - 0.5) < 0.052, f"P(a) = {share_a:.3f}, target's is 0.5 (draft logprobs_mode={draft_mode})"
