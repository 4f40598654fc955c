"""A speculated answer has the target alone's keys, at every level (usage details, vendor fields, each
choice's own), plain and streamed, completions and chat, from the library and from the proxy.

The oracle is the simulated target answering the same request directly (raw HTTP, its JSON as sent).
tests/real/test_answer_keys_real.py does the same on the real llama-server.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest

from keysets import key_differences, key_tree
from specapi import AsyncSpeculativeOpenAI
from specapi.server import BackgroundServer, ServerConfig, create_app
from specapi.sim import SimProvider, SimTransport, simulated_endpoints

PROMPT = "def fibonacci(n):"
MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]
PROFILES = ["vllm", "llamacpp", "sglang"]


def _request(chat: bool, stream: bool, usage: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": MESSAGES} if chat else {"prompt": PROMPT}
    body.update(max_tokens=24, temperature=0)
    if stream:
        body["stream"] = True
        if usage:
            body["stream_options"] = {"include_usage": True}
    return body


def _events(text: str) -> list[dict[str, Any]]:
    chunks = []
    for line in text.splitlines():
        if line.startswith("data:") and line[5:].strip() != "[DONE]":
            chunks.append(json.loads(line[5:]))
    return chunks


async def _alone(provider: SimProvider, chat: bool, body: dict[str, Any]) -> Any:
    """The simulated target's own answer as it sent it (a stream: its chunks)."""
    async with httpx2.AsyncClient(transport=SimTransport(provider), base_url="http://sim/v1") as http:
        response = await http.post("/chat/completions" if chat else "/completions", json={"model": "sim-target", **body})
    assert response.status_code == 200, response.text
    return _events(response.text) if body.get("stream") else response.json()


async def _library(provider: SimProvider, chat: bool, body: dict[str, Any]) -> tuple[Any, bool]:
    """specapi's answer as the SDK objects dump it (`exclude_unset`: what was built), and whether it speculated."""
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=3) as client:
        resource = client.chat.completions if chat else client.completions
        result = await resource.create(**body)
        if not body.get("stream"):
            return result.model_dump(mode="json", exclude_unset=True), result.speculative.speculated
        chunks = [chunk.model_dump(mode="json", exclude_unset=True) async for chunk in result]
        return chunks, result.speculative.speculated


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stream", ["plain", "stream", "stream-usage"])
async def test_the_speculated_answer_has_the_target_alones_keys(profile: str, chat: bool, stream: str) -> None:
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    body = _request(chat, stream != "plain", stream == "stream-usage")
    expected = await _alone(provider, chat, body)
    got, speculated = await _library(provider, chat, body)
    assert speculated
    assert key_differences(key_tree(got), key_tree(expected)) == []


async def test_usage_prompt_tokens_details_is_kept_with_the_targets_cached_count() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    body = _request(False, False, False)
    expected = await _alone(provider, False, body)
    assert expected["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    got, speculated = await _library(provider, False, body)
    assert speculated and got["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert {k: got["usage"][k] for k in ("prompt_tokens", "completion_tokens")} == {k: expected["usage"][k] for k in ("prompt_tokens", "completion_tokens")}


@pytest.fixture(scope="module")
def proxied() -> Iterator[tuple[SimProvider, httpx2.Client]]:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    config = ServerConfig(target=target, draft=draft, num_speculative_tokens=3, client_options={"policy": "fixed"}, readiness_interval=3600.0)
    with BackgroundServer(create_app(config)) as proxy, httpx2.Client(base_url=proxy.url + "/v1", timeout=30) as http:
        yield provider, http


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stream", ["plain", "stream", "stream-usage"])
async def test_the_proxys_speculated_answer_has_the_target_alones_keys(proxied: tuple[SimProvider, httpx2.Client], chat: bool, stream: str) -> None:
    provider, http = proxied
    body = _request(chat, stream != "plain", stream == "stream-usage")
    expected = await _alone(provider, chat, body)
    response = http.post("/chat/completions" if chat else "/completions", json=body)
    assert response.status_code == 200, response.text
    got = _events(response.text) if body.get("stream") else response.json()
    speculative = (got[-1] if isinstance(got, list) else got)["speculative"]
    assert speculative["speculated"], speculative
    assert key_differences(key_tree(got), key_tree(expected)) == []
    if not body.get("stream") or stream == "stream-usage":
        usage = (got[-1] if isinstance(got, list) else got)["usage"]
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
