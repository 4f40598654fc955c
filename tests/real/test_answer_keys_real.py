"""A speculated answer has the target alone's keys on the real llama-server (tests/test_answer_keys.py
does the same on the simulator): every level of a whole answer (usage.prompt_tokens_details,
system_fingerprint, timings), and the union of a stream's chunks, completions and chat, from the library
and from the proxy. The oracle is the same server answering the same request (raw HTTP, its JSON)."""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from keysets import key_differences, key_tree
from real_helpers import ServerPair, client_for
from specapi.server import BackgroundServer, ServerConfig, create_app

PROMPT = "def fibonacci(n):"
MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]


def _request(chat: bool, mode: str) -> dict[str, Any]:
    body: dict[str, Any] = {"messages": MESSAGES} if chat else {"prompt": PROMPT}
    body.update(max_tokens=24, temperature=0)
    if mode != "plain":
        body["stream"] = True
    if mode == "stream-usage":
        body["stream_options"] = {"include_usage": True}
    return body


def _chunks(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[5:]) for line in text.splitlines() if line.startswith("data:") and line[5:].strip() != "[DONE]"]


async def _alone(pair: ServerPair, chat: bool, body: dict[str, Any]) -> Any:
    async with httpx2.AsyncClient(base_url=pair.target.base_url, timeout=60) as http:
        response = await http.post("/chat/completions" if chat else "/completions", json={"model": pair.target.model, **body})
    assert response.status_code == 200, response.text
    return _chunks(response.text) if body.get("stream") else response.json()


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("mode", ["plain", "stream", "stream-usage"])
async def test_the_library_answer_has_llama_servers_keys(ls: ServerPair, chat: bool, mode: str) -> None:
    body = _request(chat, mode)
    expected = await _alone(ls, chat, body)
    async with client_for(ls, policy="fixed", num_speculative_tokens=4) as client:
        result = await (client.chat.completions if chat else client.completions).create(**body)
        if mode == "plain":
            got, stats = result.model_dump(mode="json", exclude_unset=True), result.speculative
        else:
            got = [chunk.model_dump(mode="json", exclude_unset=True) async for chunk in result]
            stats = result.speculative
    assert stats.speculated and stats.num_rounds > 0
    assert key_differences(key_tree(got), key_tree(expected)) == []


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("mode", ["plain", "stream-usage"])
async def test_the_proxys_answer_has_llama_servers_keys(ls: ServerPair, chat: bool, mode: str) -> None:
    body = _request(chat, mode)
    expected = await _alone(ls, chat, body)
    config = ServerConfig(
        target=ls.target.endpoint(), draft=ls.draft.endpoint(), num_speculative_tokens=4, client_options={"policy": "fixed"}, readiness_interval=3600.0
    )
    with BackgroundServer(create_app(config)) as proxy:
        async with httpx2.AsyncClient(base_url=proxy.url + "/v1", timeout=60) as http:
            response = await http.post("/chat/completions" if chat else "/completions", json=body)
    assert response.status_code == 200, response.text
    got = _chunks(response.text) if body.get("stream") else response.json()
    final = got[-1] if isinstance(got, list) else got
    assert final["speculative"]["speculated"]
    assert key_differences(key_tree(got), key_tree(expected)) == []
    usage = final["usage"] if "usage" in final else next(c["usage"] for c in got if c.get("usage"))
    assert isinstance(usage["prompt_tokens_details"]["cached_tokens"], int)
