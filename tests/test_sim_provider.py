"""SimProvider.handle: response shapes, generation semantics, streaming, latency, records and counters."""

import json

import pytest

from specapi.sim import SimProvider
from specapi.sim.corpus import decode_text, encode_text
from specapi.sim.latency import LATENCY_PROFILES, ManualClock, ModelTiming, RecordingSleep

CODE_PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n    parser = "


@pytest.fixture
def sleep():
    return RecordingSleep()


@pytest.fixture
def provider(sleep):
    return SimProvider(capabilities="vllm", latency="instant", sleep=sleep)


async def post(provider, path, body):
    response = await provider.handle("POST", path, body)
    return response.status, response.json


async def read_stream(response):
    events = []
    async for chunk in response.stream:
        events.append(chunk)
    raw = b"".join(events).decode()
    assert raw.endswith("data: [DONE]\n\n")
    datas = [block[len("data: "):] for block in raw.split("\n\n") if block]
    return [json.loads(d) for d in datas[:-1]]


async def test_completion_shape(provider):
    status, body = await post(provider, "/v1/completions", {"model": "sim-target", "prompt": CODE_PROMPT,
                                                             "max_tokens": 7, "temperature": 0, "logprobs": 3})
    assert status == 200
    assert body["object"] == "text_completion"
    assert body["model"] == "sim-target"
    assert body["id"].startswith("cmpl-")
    (choice,) = body["choices"]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == 7
    assert "".join(lp["tokens"]) == choice["text"]
    assert all(3 <= len(top) <= 4 for top in lp["top_logprobs"])
    assert lp["text_offset"][0] == 0  # vLLM: offsets start at the returned text
    usage = body["usage"]
    assert usage["prompt_tokens"] == len(encode_text(CODE_PROMPT))
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == usage["prompt_tokens"] + 7
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}


async def test_greedy_is_the_top_logprob_and_deterministic(provider):
    body = {"model": "sim-target", "prompt": CODE_PROMPT, "max_tokens": 10, "temperature": 0, "logprobs": 1}
    _, a = await post(provider, "/v1/completions", body)
    _, b = await post(provider, "/v1/completions", body)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    lp = a["choices"][0]["logprobs"]
    for token, top in zip(lp["tokens"], lp["top_logprobs"]):
        assert max(top, key=top.get) == token


async def test_greedy_one_call_equals_token_by_token(provider):
    prompt = encode_text(CODE_PROMPT)
    _, whole = await post(provider, "/v1/completions", {"model": "sim-target", "prompt": prompt,
                                                         "max_tokens": 12, "temperature": 0})
    context = list(prompt)
    for _ in range(12):
        _, step = await post(provider, "/v1/completions", {"model": "sim-target", "prompt": context,
                                                            "max_tokens": 1, "temperature": 0, "logprobs": 0})
        context += encode_text(step["choices"][0]["text"])
    assert decode_text(context[len(prompt):]) == whole["choices"][0]["text"]


async def test_echo_logprobs_match_generated_logprobs(provider):
    _, gen = await post(provider, "/v1/completions", {"model": "sim-target", "prompt": CODE_PROMPT,
                                                       "max_tokens": 8, "temperature": 1, "seed": 4, "logprobs": 2})
    generated = gen["choices"][0]["logprobs"]
    full = CODE_PROMPT + gen["choices"][0]["text"]
    _, echo = await post(provider, "/v1/completions", {"model": "sim-target", "prompt": full, "max_tokens": 0,
                                                        "echo": True, "logprobs": 2})
    echoed = echo["choices"][0]["logprobs"]
    assert echo["choices"][0]["text"] == full
    assert echoed["token_logprobs"][0] is None and echoed["top_logprobs"][0] is None
    assert echoed["tokens"][-8:] == generated["tokens"]
    assert echoed["token_logprobs"][-8:] == generated["token_logprobs"]
    assert echoed["top_logprobs"][-8:] == generated["top_logprobs"]
    assert echoed["text_offset"][0] == 0
    assert echoed["text_offset"][-8] == len(CODE_PROMPT)
    assert echo["usage"]["completion_tokens"] == 0


async def test_seeded_sampling_repeats_and_unseeded_varies(provider):
    body = {"model": "sim-draft", "prompt": "The", "max_tokens": 20, "temperature": 1.0, "seed": 123}
    _, a = await post(provider, "/v1/completions", body)
    _, b = await post(provider, "/v1/completions", body)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
    texts = set()
    for _ in range(4):
        _, c = await post(provider, "/v1/completions", {**body, "seed": None})
        texts.add(c["choices"][0]["text"])
    assert len(texts) > 1


async def test_stop_string_is_excluded(provider):
    body = {"model": "sim-target", "prompt": CODE_PROMPT, "max_tokens": 30, "temperature": 0}
    _, free = await post(provider, "/v1/completions", body)
    text = free["choices"][0]["text"]
    stop = text[4:7]
    _, cut = await post(provider, "/v1/completions", {**body, "stop": [stop, "zzzz"]})
    assert cut["choices"][0]["text"] == text[: text.index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


async def test_n_choices(provider):
    _, body = await post(provider, "/v1/completions", {"model": "sim-draft", "prompt": CODE_PROMPT,
                                                        "max_tokens": 3, "n": 3, "seed": 1, "logprobs": 0})
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert len({c["text"] for c in body["choices"]}) > 1
    # end-of-text is billed but not listed among the tokens
    billed = sum(len(c["logprobs"]["tokens"]) + (c["finish_reason"] == "stop") for c in body["choices"])
    assert body["usage"]["completion_tokens"] == billed


async def test_chat_shape(provider):
    status, body = await post(provider, "/v1/chat/completions", {
        "model": "sim-target", "messages": [{"role": "user", "content": "Write a parser."}],
        "max_completion_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2})
    assert status == 200
    assert body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["message"]["role"] == "assistant"
    items = choice["logprobs"]["content"]
    assert len(items) == 6
    assert "".join(i["token"] for i in items) == choice["message"]["content"]
    assert all(len(i["top_logprobs"]) == 2 for i in items)
    assert all(bytes(i["bytes"]).decode() == i["token"] for i in items)
    assert body["usage"]["prompt_tokens"] == len(encode_text("<|user|>\nWrite a parser.\n<|assistant|>\n"))


async def test_chat_logprobs_match_completion_of_the_template(provider):
    messages = [{"role": "system", "content": "Code only."}, {"role": "user", "content": "Sort a list."}]
    _, chat = await post(provider, "/v1/chat/completions", {"model": "sim-target", "messages": messages,
                                                             "max_tokens": 5, "temperature": 0, "logprobs": True})
    prompt = "<|system|>\nCode only.\n<|user|>\nSort a list.\n<|assistant|>\n"
    _, comp = await post(provider, "/v1/completions", {"model": "sim-target", "prompt": prompt, "max_tokens": 5,
                                                        "temperature": 0, "logprobs": 0})
    assert chat["choices"][0]["message"]["content"] == comp["choices"][0]["text"]
    assert [i["logprob"] for i in chat["choices"][0]["logprobs"]["content"]] == \
        comp["choices"][0]["logprobs"]["token_logprobs"]


async def test_models_endpoint(provider):
    response = await provider.handle("GET", "/v1/models")
    assert response.status == 200
    ids = [m["id"] for m in response.json["data"]]
    assert {"sim-target", "sim-draft"} <= set(ids)
    one = await provider.handle("GET", "/v1/models/sim-draft")
    assert one.json["id"] == "sim-draft"


@pytest.mark.parametrize(
    "path, body, status, param",
    [
        ("/v1/completions", {"model": "gpt-9", "prompt": "x"}, 404, "model"),
        ("/v1/completions", {"prompt": "x"}, 400, "model"),
        ("/v1/completions", {"model": "sim-target", "prompt": "x", "temperature": 3}, 400, "temperature"),
        ("/v1/completions", {"model": "sim-target", "prompt": "x", "max_tokens": "ten"}, 400, "max_tokens"),
        ("/v1/completions", {"model": "sim-target", "prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
        ("/v1/completions", {"model": "sim-target", "prompt": "x", "logprobs": 21}, 400, "logprobs"),
        ("/v1/completions", {"model": "sim-target", "prompt": [1, 10**7]}, 400, "prompt"),
        ("/v1/completions", {"model": "sim-target", "prompt": [1] * 9000, "max_tokens": 1}, 400, "input_tokens"),
        ("/v1/completions", {"model": "sim-target", "prompt": [1] * 8192, "max_tokens": 1}, 400, "max_tokens"),
        ("/v1/completions", {"model": "sim-target", "prompt": "x", "stream_options": {"include_usage": True}},
         400, "stream_options"),
        ("/v1/chat/completions", {"model": "sim-target", "messages": []}, 400, "messages"),
        ("/v1/chat/completions", {"model": "sim-target", "messages": [{"role": "user", "content": "x"}],
                                  "top_logprobs": 3}, 400, "top_logprobs"),
        ("/v1/chat/completions", {"model": "sim-target", "messages": [{"role": "user", "content": "x"}],
                                  "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ],
)
async def test_errors_are_openai_shaped(provider, path, body, status, param):
    got, payload = await post(provider, path, body)
    assert got == status
    error = payload["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert provider.calls.last.status == status


async def test_max_tokens_past_the_context_end_is_cut_there_as_vllm_does(provider):
    """vLLM cuts a `max_tokens` past the window at the window (tests/real/test_real_vllm_facts.py); OpenAI refuses it."""
    body = {"model": "sim-target", "prompt": [1] * 8180, "max_tokens": 50, "temperature": 0}
    got, payload = await post(provider, "/v1/completions", body)
    assert got == 200 and payload["usage"]["completion_tokens"] <= 12
    assert payload["choices"][0]["finish_reason"] == "length" or payload["usage"]["completion_tokens"] < 12
    refused, error = await post(SimProvider(capabilities="openai", latency="instant"), "/v1/completions", body)
    assert refused == 400 and error["error"]["code"] == "context_length_exceeded"


async def test_unknown_path_and_bad_json(provider):
    assert (await provider.handle("POST", "/v1/embeddings", {})).status == 404
    bad = await provider.handle("POST", "/v1/completions", b"{not json")
    assert bad.status == 400
    assert (await provider.handle("GET", "/v1/completions")).status == 405


async def test_calls_and_counters_are_recorded(provider):
    await post(provider, "/v1/completions", {"model": "sim-target", "prompt": "abc", "max_tokens": 4})
    await post(provider, "/v1/chat/completions", {"model": "sim-draft", "messages": [{"role": "user", "content": "hi"}],
                                                   "max_tokens": 3})
    await post(provider, "/v1/completions", {"model": "nope", "prompt": "abc"})
    assert [c.status for c in provider.calls] == [200, 200, 404]
    assert provider.calls[0].body["prompt"] == "abc"
    assert provider.calls[0].usage["completion_tokens"] == 4
    assert len(provider.calls.to("/completions")) == 2
    assert provider.calls.for_model("sim-draft")[0].path == "/v1/chat/completions"
    target = provider.usage["sim-target"]
    assert (target.requests, target.prompt_tokens, target.completion_tokens) == (1, len(encode_text("abc")), 4)
    assert provider.usage["sim-draft"].completion_tokens == 3


async def test_completion_stream(provider):
    response = await provider.handle("POST", "/v1/completions", {
        "model": "sim-target", "prompt": CODE_PROMPT, "max_tokens": 5, "temperature": 0, "logprobs": 1,
        "stream": True, "stream_options": {"include_usage": True}})
    assert response.status == 200
    assert response.headers["content-type"] == "text/event-stream"
    chunks = await read_stream(response)
    token_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert len(token_chunks) == 5
    assert all(c["object"] == "text_completion" and c["usage"] is None for c in token_chunks)
    assert [c["choices"][0]["finish_reason"] for c in token_chunks] == [None] * 4 + ["length"]
    _, whole = await post(provider, "/v1/completions", {"model": "sim-target", "prompt": CODE_PROMPT,
                                                         "max_tokens": 5, "temperature": 0, "logprobs": 1})
    assert "".join(c["choices"][0]["text"] for c in token_chunks) == whole["choices"][0]["text"]
    streamed_lps = [c["choices"][0]["logprobs"]["token_logprobs"][0] for c in token_chunks]
    assert streamed_lps == whole["choices"][0]["logprobs"]["token_logprobs"]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 5


async def test_chat_stream(provider):
    response = await provider.handle("POST", "/v1/chat/completions", {
        "model": "sim-draft", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4,
        "temperature": 0, "logprobs": True, "stream": True})
    chunks = await read_stream(response)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks if c["choices"][0]["delta"].get("content")]
    assert len(content) <= 4
    assert all(len(c["choices"][0]["logprobs"]["content"]) == 1 for c in chunks[1:-1])
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert "usage" not in chunks[-1]


async def test_stream_bills_only_what_is_delivered(provider):
    response = await provider.handle("POST", "/v1/completions", {
        "model": "sim-draft", "prompt": "x", "max_tokens": 10, "stream": True})
    stream = response.stream
    await stream.__anext__()
    await stream.__anext__()
    await stream.aclose()
    assert provider.usage["sim-draft"].completion_tokens == 2
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_latency_is_slept_and_per_token_in_streams():
    sleep = RecordingSleep()
    provider = SimProvider(latency="lan", sleep=sleep)
    timing = LATENCY_PROFILES["lan"].target
    await provider.handle("POST", "/v1/completions", {"model": "sim-target", "prompt": "abc", "max_tokens": 10})
    (total,) = sleep.calls
    expected = timing.rtt_s + timing.ttft_base_s + 3 / timing.prefill_tokens_per_s + 9 * timing.tpot_s
    assert total == pytest.approx(expected, rel=timing.jitter + 1e-9)
    sleep.calls.clear()
    response = await provider.handle("POST", "/v1/completions", {"model": "sim-target", "prompt": "abc",
                                                                  "max_tokens": 10, "stream": True})
    await read_stream(response)
    assert len(sleep.calls) == 10
    assert sleep.calls[0] == pytest.approx(timing.rtt_s + timing.ttft_base_s, rel=0.1)
    assert all(g == pytest.approx(timing.tpot_s, rel=timing.jitter + 1e-9) for g in sleep.calls[1:])


async def test_compute_time_can_be_deducted_from_the_simulated_latency():
    timing = LATENCY_PROFILES["lan"].target
    body = {"model": "sim-target", "prompt": list(range(1000, 1400)), "max_tokens": 1, "echo": True, "logprobs": 5}
    exact, deducted = RecordingSleep(), RecordingSleep()
    await SimProvider(latency="lan", sleep=exact).handle("POST", "/v1/completions", body)
    await SimProvider(latency="lan", sleep=deducted, deduct_compute_time=True).handle(
        "POST", "/v1/completions", {**body, "prompt": list(range(2000, 2400))})
    expected = timing.rtt_s + timing.ttft_base_s + 400 / timing.prefill_tokens_per_s
    assert exact.calls[0] == pytest.approx(expected, rel=timing.jitter + 1e-9)
    assert deducted.calls == [] or deducted.calls[0] < expected * (1 - timing.jitter)


async def test_compute_longer_than_the_first_token_is_deducted_from_the_later_tokens_too():
    # Eight sampled chains of 40 tokens take the simulator far longer to compute than the draft's 5 ms to
    # first token: a server spends that time decoding, so the answer is not later for it.
    timing = LATENCY_PROFILES["lan"].draft
    body = {"model": "sim-draft", "prompt": list(range(1000, 1040)), "max_tokens": 40, "n": 8, "temperature": 1.0, "logprobs": 2}
    sleep = RecordingSleep()
    await SimProvider(latency="lan", sleep=sleep, deduct_compute_time=True).handle("POST", "/v1/completions", body)
    # Taken from the first token alone, the wait would still hold every later token's decoding step.
    assert len(sleep.calls) <= 1 and sum(sleep.calls) < 39 * timing.tpot_s * (1 - timing.jitter)


async def test_draft_is_faster_than_target_on_lan():
    sleep = RecordingSleep()
    provider = SimProvider(latency="lan", sleep=sleep)
    for model in ("sim-target", "sim-draft"):
        await provider.handle("POST", "/v1/completions", {"model": model, "prompt": "abc", "max_tokens": 20})
    target, draft = sleep.calls
    assert draft < target / 4


async def test_prefix_cache_is_reported_and_shortens_ttft():
    sleep = RecordingSleep()
    profile = LATENCY_PROFILES["lan"].with_overrides(**{"sim-target": ModelTiming(
        ttft_base_s=0.01, prefill_tokens_per_s=1000.0, tpot_s=0.01, cache_block_tokens=16)})
    provider = SimProvider(latency=profile, sleep=sleep)
    prompt = list(range(1000, 1400))
    body = {"model": "sim-target", "prompt": prompt, "max_tokens": 1}
    _, first = await post(provider, "/v1/completions", body)
    _, second = await post(provider, "/v1/completions", {**body, "prompt": prompt + [5, 6, 7]})
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] == 400
    assert sleep.calls[0] == pytest.approx(0.41)
    assert sleep.calls[1] == pytest.approx(0.013)
    assert provider.usage["sim-target"].cached_tokens == 400


async def test_prompt_logprobs_skip_the_cache_on_vllm():
    provider = SimProvider(latency="lan", sleep=RecordingSleep())
    prompt = list(range(1000, 1100))
    await post(provider, "/v1/completions", {"model": "sim-target", "prompt": prompt, "max_tokens": 1})
    _, echo = await post(provider, "/v1/completions", {"model": "sim-target", "prompt": prompt, "max_tokens": 1,
                                                        "echo": True, "logprobs": 1})
    _, plain = await post(provider, "/v1/completions", {"model": "sim-target", "prompt": prompt, "max_tokens": 1})
    assert echo["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] == 96


async def test_rate_limit_gives_429_with_retry_after():
    clock = ManualClock(100.0)
    profile = LATENCY_PROFILES["instant"].with_overrides(**{"sim-draft": ModelTiming(requests_per_s=2)})
    provider = SimProvider(latency=profile, sleep=RecordingSleep(), clock=clock)
    body = {"model": "sim-draft", "prompt": "x", "max_tokens": 1}
    statuses = [(await provider.handle("POST", "/v1/completions", body)) for _ in range(3)]
    assert [r.status for r in statuses] == [200, 200, 429]
    assert statuses[2].headers["retry-after"] == "1"
    assert statuses[2].json["error"]["code"] == "rate_limit_exceeded"
    clock.advance(1.0)
    assert (await provider.handle("POST", "/v1/completions", body)).status == 200
    assert provider.usage["sim-draft"].errors == 1


async def test_cost_uses_the_profile_prices():
    provider = SimProvider(latency="hosted", sleep=RecordingSleep())
    await post(provider, "/v1/completions", {"model": "sim-target", "prompt": list(range(1000, 1100)),
                                             "max_tokens": 10})
    from decimal import Decimal
    assert provider.cost("sim-target") == (100 * Decimal("2.50") + 10 * Decimal("10.00")) / 1_000_000
    assert provider.cost() == provider.cost("sim-target")
