"""The SDK-shaped surface: `create`'s parameters are the SDK's own, `with_raw_response` gives the final
target call's headers plus `x-specapi-*`, `client.models` reaches the target, `extra_headers`,
`extra_query` and `timeout` do what the SDK's do. Runs on the in-process simulator."""

from __future__ import annotations

import inspect
import itertools
import json
from dataclasses import replace
from typing import get_type_hints

import httpx2
import openai
import pytest
from openai.resources.chat.completions import AsyncCompletions as SDKChatCompletions
from openai.resources.completions import AsyncCompletions as SDKCompletions

from simclient import target_alone
from specapi import AsyncSpeculativeOpenAI, Endpoint, SpeculativeOpenAI, TargetError
from specapi.sim import SimProvider, SimTransport, simulated_endpoints

PROMPT = "def area(radius):\n"
MESSAGES = [{"role": "user", "content": "Write a function that returns the area of a circle."}]


class Recording(httpx2.AsyncBaseTransport):
    """The simulator behind a transport that numbers every response (`x-call`) and records requests."""

    def __init__(self, provider: SimProvider) -> None:
        self._inner = SimTransport(provider)
        self._count = itertools.count(1)
        self.requests: list[httpx2.Request] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        response = await self._inner.handle_async_request(request)
        response.headers["x-call"] = str(next(self._count))
        return response


def _endpoints(provider: SimProvider, transport: Recording) -> tuple[Endpoint, Endpoint]:
    """The simulated pair, with the target's requests going through `transport` (the draft's do not)."""
    target, draft = simulated_endpoints(provider=provider)
    return replace(target, http_client=httpx2.AsyncClient(transport=transport)), draft


@pytest.fixture
def provider() -> SimProvider:
    return SimProvider(capabilities="vllm", latency="instant", seed=0)


@pytest.mark.parametrize(
    "ours, theirs",
    [
        (lambda c: c.completions.create, SDKCompletions.create),
        (lambda c: c.chat.completions.create, SDKChatCompletions.create),
    ],
)
def test_create_takes_the_sdks_parameters_by_name_keyword_only(provider, ours, theirs):
    target, draft = simulated_endpoints(provider=provider)
    for client in (AsyncSpeculativeOpenAI(target=target, draft=draft), SpeculativeOpenAI(target=target, draft=draft)):
        signature = inspect.signature(ours(client))
        sdk = inspect.signature(theirs)
        extensions = {"prediction"} if "prompt" in signature.parameters else set()  # Predicted Outputs on completions too
        assert set(signature.parameters) == (set(sdk.parameters) - {"self"}) | extensions
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in signature.parameters.values())
        assert not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in signature.parameters.values())
        assert signature.parameters["model"].default is None  # the target's model unless named
        hints = get_type_hints(ours(client))
        assert hints["temperature"] == get_type_hints(theirs)["temperature"]


async def test_with_raw_response_gives_the_final_target_calls_headers_and_the_statistics(provider):
    transport = Recording(provider)
    target, draft = _endpoints(provider, transport)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        raw = await client.completions.with_raw_response.create(prompt=PROMPT, max_tokens=30, temperature=0)
        resp = raw.parse()
        calls = len(transport.requests)
        chat_raw = await client.chat.completions.with_raw_response.create(messages=MESSAGES, max_tokens=20, temperature=0)
    assert resp.speculative.speculated and resp.speculative.num_rounds > 0
    assert raw.headers["x-call"] == str(calls)  # the last call made (all of them were the target's)
    assert raw.status_code == 200 and raw.http_response is not None
    assert raw.headers["x-specapi-num-rounds"] == str(resp.speculative.num_rounds)
    assert raw.headers["x-specapi-verification"] == resp.speculative.verification
    assert raw.headers["x-specapi-target-requests"] == str(resp.speculative.target.requests)
    assert resp.choices[0].text == (await target_alone(provider, prompt=PROMPT, max_tokens=30))[0]
    assert chat_raw.parse().choices[0].message.content and "x-specapi-accepted-tokens" in chat_raw.headers


def test_with_raw_response_on_the_sync_client_plain_and_streamed(provider):
    target, draft = simulated_endpoints(provider=provider)
    with SpeculativeOpenAI(target=target, draft=draft) as client:
        raw = client.chat.completions.with_raw_response.create(messages=MESSAGES, max_tokens=20, temperature=0)
        streamed = client.completions.with_raw_response.create(prompt=PROMPT, max_tokens=20, temperature=0, stream=True)
        text = "".join(chunk.choices[0].text for chunk in streamed.parse() if chunk.choices)
        plain = client.completions.create(prompt=PROMPT, max_tokens=20, temperature=0)
    assert raw.parse().speculative.exact and raw.headers["x-specapi-exact"] == "true"
    assert text == plain.choices[0].text
    assert not any(name.startswith("x-specapi-") for name in streamed.headers)  # known only at the stream's end


async def test_models_are_the_targets(provider):
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        page = await client.models.list()
        one = await client.models.retrieve("sim-target")
        with pytest.raises(openai.NotFoundError) as info:
            await client.models.retrieve("no-such-model")
    assert "sim-target" in [m.id for m in page.data] and one.id == "sim-target"
    assert isinstance(info.value, TargetError)
    target, draft = simulated_endpoints(provider=provider)  # the async client closed the first pair's connections
    with SpeculativeOpenAI(target=target, draft=draft) as sync:
        assert "sim-draft" in [m.id for m in sync.models.list()]


def _ids_prompt(content: bytes) -> bool:
    prompt = json.loads(content).get("prompt") if content.startswith(b"{") else None
    prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], list) else [prompt]
    return all(isinstance(p, list) and p and all(isinstance(i, int) for i in p) for p in prompts)


async def test_extra_headers_and_query_reach_every_upstream_request_while_speculating(provider):
    transport = Recording(provider)
    target, draft = _endpoints(provider, transport)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed") as client:
        resp = await client.completions.create(
            prompt=PROMPT, max_tokens=10, temperature=0, extra_headers={"x-tenant": "t1"}, extra_query={"trace": "1"}
        )
    # Not the probe's: the calls that carry the prompt, as text or (vLLM's token-id path) as its ids.
    sent = [r for r in transport.requests if r.method == "POST" and (PROMPT[:8] in r.content.decode() or _ids_prompt(r.content))]
    assert len(sent) > 1 and resp.speculative.speculated
    assert any(r.url.path.endswith("/completions") for r in sent), "no generation call was checked"
    for request in sent:
        assert request.headers["x-tenant"] == "t1" and request.url.params["trace"] == "1"
        assert "x-tenant" not in json.loads(request.content)


async def test_timeout_bounds_the_whole_call():
    provider = SimProvider(capabilities="vllm", latency="hosted", seed=0)  # real sleeps of ~0.3 s per call
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        with pytest.raises(openai.APITimeoutError) as info:
            await client.completions.create(prompt=PROMPT, max_tokens=30, temperature=0, timeout=0.05)
    assert isinstance(info.value, TargetError) and "timeout=0.05" in str(info.value)


async def test_messages_may_be_any_iterable(provider):
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        resp = await client.chat.completions.create(messages=iter(MESSAGES), max_tokens=10, temperature=0)
    assert resp.speculative.speculated and resp.choices[0].message.content


async def test_the_client_names_the_targets_base_url_as_the_sdk_does(provider):
    """Agent frameworks (openai-agents, pydantic-ai) read `client.base_url` of the client they are given."""
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        assert str(client.base_url).startswith("http://") and str(client.base_url).rstrip("/").endswith("/v1")
    sync = SpeculativeOpenAI(target=target, draft=draft)
    try:
        assert sync.base_url == client.base_url
    finally:
        sync.close()
