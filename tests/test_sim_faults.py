"""Fault injection: each switch produces its failure, deterministically for a seed."""

import json

import httpx2
import openai
import pytest

from specapi.sim import Faults, SimProvider, SimTransport
from specapi.sim.faults import FaultInjector
from specapi.sim.latency import RecordingSleep

COMPLETION = {"model": "sim-target", "prompt": "def f(x):\n", "max_tokens": 4, "logprobs": 2, "temperature": 0}
CHAT = {"model": "sim-target", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "logprobs": True,
        "top_logprobs": 2}


def make(faults, latency="instant"):
    return SimProvider(capabilities="vllm", latency=latency, faults=faults, sleep=RecordingSleep())


async def test_fail_first_n_then_recover():
    provider = make(Faults(fail_first=2, fail_first_status=503))
    statuses = [(await provider.handle("POST", "/v1/completions", COMPLETION)).status for _ in range(4)]
    assert statuses == [503, 503, 200, 200]
    assert provider.usage["sim-target"].requests == 2
    assert provider.usage["sim-target"].errors == 2


@pytest.mark.parametrize("switch, status", [("error_rate", 500), ("unavailable_rate", 503), ("rate_limit_rate", 429)])
async def test_error_switches(switch, status):
    provider = make(Faults(**{switch: 1.0}, retry_after_s=2.5))
    response = await provider.handle("POST", "/v1/completions", COMPLETION)
    assert response.status == status
    assert set(response.json["error"]) == {"message", "type", "param", "code"}
    if status == 429:
        assert response.headers["retry-after"] == "3"
        assert response.headers["retry-after-ms"] == "2500"


async def test_rates_are_seeded_and_roughly_respected():
    def run(seed):
        injector = FaultInjector(Faults(error_rate=0.3, seed=seed))
        return [injector.plan(model="m", path="/completions").status for _ in range(400)]

    assert run(1) == run(1)
    assert run(1) != run(2)
    assert 0.2 < run(1).count(500) / 400 < 0.4


async def test_faults_can_target_one_model_or_path():
    provider = make(Faults(error_rate=1.0, model="sim-draft"))
    assert (await provider.handle("POST", "/v1/completions", COMPLETION)).status == 200
    assert (await provider.handle("POST", "/v1/completions", {**COMPLETION, "model": "sim-draft"})).status == 500
    by_path = make(Faults(error_rate=1.0, path="/chat/completions"))
    assert (await by_path.handle("POST", "/v1/completions", COMPLETION)).status == 200
    assert (await by_path.handle("POST", "/v1/chat/completions", CHAT)).status == 500


async def test_latency_spike():
    provider = make(Faults(spike_rate=1.0, spike_s=4.0))
    await provider.handle("POST", "/v1/completions", COMPLETION)
    assert provider.sleep.calls == [4.0]


async def test_truncated_json_body():
    provider = make(Faults(truncate_rate=1.0))
    response = await provider.handle("POST", "/v1/completions", COMPLETION)
    assert response.status == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(response.body)
    client = openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", max_retries=0,
                                http_client=httpx2.AsyncClient(transport=SimTransport(provider)))
    with pytest.raises(json.JSONDecodeError):
        await client.completions.create(**COMPLETION)
    await client.close()


async def test_truncated_stream_ends_inside_a_chunk_without_done():
    provider = make(Faults(truncate_rate=1.0))
    response = await provider.handle("POST", "/v1/completions", {**COMPLETION, "stream": True})
    raw = b"".join([chunk async for chunk in response.stream]).decode()
    assert "[DONE]" not in raw
    last = raw.split("\n\n")[-1]
    assert last.startswith("data: ")
    with pytest.raises(json.JSONDecodeError):
        json.loads(last[len("data: "):])


@pytest.mark.parametrize("path, body", [("/v1/completions", COMPLETION), ("/v1/chat/completions", CHAT)])
async def test_missing_logprobs(path, body):
    provider = make(Faults(drop_logprobs_rate=1.0))
    response = await provider.handle("POST", path, body)
    assert response.status == 200
    assert response.json["choices"][0]["logprobs"] is None


async def test_mismatched_completion_logprobs():
    provider = make(Faults(mismatch_logprobs_rate=1.0))
    lp = (await provider.handle("POST", "/v1/completions", COMPLETION)).json["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 4
    assert len(lp["top_logprobs"]) == 3 and len(lp["text_offset"]) == 3


async def test_mismatched_chat_logprobs():
    provider = make(Faults(mismatch_logprobs_rate=1.0))
    body = (await provider.handle("POST", "/v1/chat/completions", CHAT)).json
    assert body["usage"]["completion_tokens"] == 4
    assert len(body["choices"][0]["logprobs"]["content"]) == 3


async def test_streamed_chunks_lose_their_logprobs():
    provider = make(Faults(drop_logprobs_rate=1.0))
    response = await provider.handle("POST", "/v1/chat/completions", {**CHAT, "stream": True})
    raw = b"".join([chunk async for chunk in response.stream]).decode()
    chunks = [json.loads(b[6:]) for b in raw.split("\n\n") if b and b != "data: [DONE]"]
    assert all(c["choices"][0]["logprobs"] is None for c in chunks)


async def test_sdk_sees_the_injected_error_then_a_normal_answer():
    provider = make(Faults(fail_first=1, fail_first_status=500))
    client = openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", max_retries=0,
                                http_client=httpx2.AsyncClient(transport=SimTransport(provider)))
    with pytest.raises(openai.InternalServerError):
        await client.completions.create(**COMPLETION)
    result = await client.completions.create(**COMPLETION)
    assert result.usage.completion_tokens == 4
    assert [c.status for c in provider.calls] == [500, 200]
    await client.close()
