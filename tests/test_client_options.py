"""The openai SDK client's own options on the speculative clients: `AsyncSpeculativeOpenAI(timeout=,
max_retries=, default_headers=)` (and the sync twin's) reach both endpoints, as code written for
`AsyncOpenAI(...)` expects. Checked on the simulator's record of the requests it received, and against the
target's own answer."""

from __future__ import annotations

import asyncio
import json

import httpx2
import openai
import pytest

from simclient import target_alone
from specapi import AsyncSpeculativeOpenAI, ConfigurationError, Endpoint, SpeculativeOpenAI
from specapi.sim import SimProvider, SimTransport, simulated_endpoints

CODE = "def fibonacci(n):\n    if n < 2:\n        return n\n"


async def no_wait(seconds: float) -> None:
    pass


async def test_timeout_retries_and_headers_given_as_to_the_sdk_reach_both_endpoints() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    options = {"timeout": 600, "max_retries": 5, "default_headers": {"x-team": "search"}}
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", drafter="model", **options) as client:
        resp = await client.completions.create(prompt=CODE, max_tokens=20, temperature=0)
        assert (client.timeout, client.max_retries) == (600, 5)  # what libraries read from an SDK client
        assert (await client.models.list()).data
    assert resp.speculative.speculated and resp.speculative.draft.requests > 0
    for model in ("sim-target", "sim-draft"):
        calls = [call for call in provider.calls if call.model == model]
        assert calls and all(call.headers.get("x-team") == "search" for call in calls), model
    models_calls = [call for call in provider.calls if call.path.startswith("/v1/models")]
    assert models_calls and all(call.headers.get("x-team") == "search" for call in models_calls)
    expected, _ = await target_alone(provider, prompt=CODE, max_tokens=20)
    assert resp.choices[0].text == expected


async def test_an_endpoints_own_header_wins_over_the_clients_default() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    from dataclasses import replace

    draft = replace(draft, headers={"X-Team": "draft-team"})
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy="fixed", default_headers={"x-team": "all"}) as client:
        await client.completions.create(prompt=CODE, max_tokens=8, temperature=0)
    seen = {(call.model, call.headers.get("x-team")) for call in provider.calls if call.model}
    assert seen == {("sim-target", "all"), ("sim-draft", "draft-team")}


class _FirstPostFails(httpx2.AsyncBaseTransport):
    """The simulator behind a server whose first POST for each model answers 503 (a transient failure)."""

    def __init__(self, provider: SimProvider) -> None:
        self.inner = SimTransport(provider)
        self.failed: set[str] = set()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.method == "POST":
            model = json.loads(await request.aread()).get("model")
            if model not in self.failed:
                self.failed.add(model)
                return httpx2.Response(503, json={"error": {"message": "busy", "type": "server_error", "param": None, "code": None}})
        return await self.inner.handle_async_request(request)


async def test_max_retries_retries_each_endpoints_requests() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    transport = _FirstPostFails(provider)
    common = {"base_url": "http://sim/v1", "api_key": "sim", "max_retries": 0, "http_client": httpx2.AsyncClient(transport=transport)}
    target, draft = Endpoint(model="sim-target", **common), Endpoint(model="sim-draft", **common)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy="fixed", max_retries=1, sleep=no_wait) as client:
        resp = await client.completions.create(prompt=CODE, max_tokens=20, temperature=0)
    assert transport.failed == {"sim-target", "sim-draft"}  # each failed once, and was retried
    assert resp.speculative.speculated and resp.speculative.fallback_reason is None
    assert resp.speculative.draft.failed_requests == 1
    expected, _ = await target_alone(provider, prompt=CODE, max_tokens=20)
    assert resp.choices[0].text == expected


async def test_timeout_bounds_every_call() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)

    class Slow(httpx2.AsyncBaseTransport):
        async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
            await asyncio.sleep(5)
            return await SimTransport(provider).handle_async_request(request)

    target = Endpoint(model="sim-target", base_url="http://sim/v1", api_key="sim", max_retries=0, http_client=httpx2.AsyncClient(transport=Slow()))
    async with AsyncSpeculativeOpenAI(target=target, verification="none", timeout=0.05) as client:
        with pytest.raises(openai.APITimeoutError):
            await client.completions.create(prompt=CODE, max_tokens=4)
        with pytest.raises(openai.APITimeoutError):  # a copy keeps it
            await client.with_options(policy="fixed").completions.create(prompt=CODE, max_tokens=4)


def test_the_sync_client_takes_them_too() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    with SpeculativeOpenAI(target=target, draft=draft, drafter="model", timeout=120.0, max_retries=2, default_headers={"x-team": "s"}) as client:
        resp = client.completions.create(prompt=CODE, max_tokens=12, temperature=0)
        assert (client.timeout, client.max_retries) == (120.0, 2)
    assert resp.speculative.draft.requests > 0
    assert {call.headers.get("x-team") for call in provider.calls if call.model} == {"s"}


@pytest.mark.parametrize(
    "options",
    [{"timeout": -1}, {"timeout": "long"}, {"max_retries": -1}, {"max_retries": 1.5}, {"default_headers": {"x-n": 1}}],
)
def test_bad_sdk_options_are_refused_before_any_request(options) -> None:
    target, draft = simulated_endpoints(latency="instant")
    with pytest.raises(ConfigurationError):
        AsyncSpeculativeOpenAI(target=target, draft=draft, **options)
