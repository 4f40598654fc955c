"""The parameters of `create`, declared once (`specapi.dialects.openai_params`) for the async and the
sync client: a misspelt or missing argument is a `TypeError` before any request, as for any Python
function, and the arguments keep the SDK's order (the first one verification cannot reproduce is the
one a fallback names, whatever order the caller wrote them in). Runs on the in-process simulator."""

from __future__ import annotations

from dataclasses import replace

import httpx2
import pytest

from specapi import AsyncSpeculativeOpenAI, SpeculativeOpenAI
from specapi.sim import SimProvider, SimTransport, simulated_endpoints

MESSAGES = [{"role": "user", "content": "Écris une fonction qui renvoie 猫 🐈."}]


class Counting(httpx2.AsyncBaseTransport):
    """The simulator behind a transport that records the paths it was asked for."""

    def __init__(self, provider: SimProvider) -> None:
        self._inner = SimTransport(provider)
        self.paths: list[str] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.paths.append(request.url.path)
        return await self._inner.handle_async_request(request)


def _endpoints(transport: Counting, provider: SimProvider):  # type: ignore[no-untyped-def]
    target, draft = simulated_endpoints(provider=provider)
    return replace(target, http_client=httpx2.AsyncClient(transport=transport)), draft


@pytest.fixture
def provider() -> SimProvider:
    return SimProvider(capabilities="vllm", latency="instant", seed=0)


async def test_a_misspelt_or_missing_argument_is_a_type_error_before_any_request(provider):
    transport = Counting(provider)
    target, draft = _endpoints(transport, provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        with pytest.raises(TypeError, match="temprature"):
            await client.completions.create(prompt="def f():", temprature=0)  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="messages"):
            await client.chat.completions.create(max_tokens=4)  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="messages"):
            await client.chat.completions.parse(max_tokens=4)  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="stream_option"):
            await client.chat.completions.with_raw_response.create(messages=MESSAGES, stream_option={})
    assert transport.paths == []


def test_the_sync_client_refuses_them_too(provider):
    target, draft = simulated_endpoints(provider=provider)
    with SpeculativeOpenAI(target=target, draft=draft) as client:
        with pytest.raises(TypeError, match="temprature"):
            client.chat.completions.create(messages=MESSAGES, temprature=0)  # type: ignore[call-overload]
        with pytest.raises(TypeError, match="prompt"):
            client.completions.create(max_tokens=4)  # type: ignore[call-overload]
        resp = client.chat.completions.create(messages=MESSAGES, max_tokens=8, temperature=0)
    assert resp.speculative.speculated and resp.choices[0].message.content


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_a_fallback_names_the_first_unverifiable_argument_in_the_sdks_order(provider, sync):
    target, draft = simulated_endpoints(provider=provider)
    # Written tools first; the SDK's order has response_format before tools.
    arguments = dict(messages=MESSAGES, max_tokens=8, tools=[], response_format={"type": "text"})
    if sync:
        with SpeculativeOpenAI(target=target, draft=draft) as client:
            resp = client.chat.completions.create(**arguments)  # type: ignore[call-overload]
    else:
        async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
            resp = await client.chat.completions.create(**arguments)  # type: ignore[call-overload]
    assert not resp.speculative.speculated
    assert resp.speculative.fallback_reason == "argument 'response_format' is not reproduced by verification"
