"""The simulator's vLLM dialect (`capabilities="vllm"`): token-id and batched prompts on /v1/completions,
`return_token_ids`, `return_tokens_as_token_ids`, `/tokenize`, `/detokenize`, `/version`, against the
shapes in tests/fixtures/vllm/ (from vLLM's source), and the prefix cache that prompt logprobs skip."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import httpx2
import pytest

from shapes import assert_same_shape, fixture
from simserver import ServerThread
from specapi.sim import EOS_TOKEN_ID, LATENCY_PROFILES, SimProvider, create_app, decode_text, encode_text, render_chat, request_timing, token_str

DATA_KEYED = frozenset({"top_logprobs", "prompt_logprobs"})
MODEL = "sim-target"


async def post(provider: SimProvider, path: str, body: Any = None, method: str = "POST") -> Any:
    response = await provider.handle(method, path, body)
    assert response.status == 200, response.json
    return response.json


def steady_lan() -> Any:
    """The LAN profile without jitter, so timings can be compared exactly."""
    lan = LATENCY_PROFILES["lan"]
    return lan.with_overrides(**{MODEL: dataclasses.replace(lan.target, jitter=0.0)})


@pytest.fixture
def provider() -> SimProvider:
    return SimProvider(capabilities="vllm", latency="instant", seed=1)


@pytest.mark.parametrize("name", [
    "completions_token_ids", "completions_batch", "completions_tokens_as_token_ids", "completions_prompt_logprobs", "completions_sampled_n",
    "chat_token_ids", "tokenize", "detokenize", "version",
])  # fmt: skip
async def test_answers_have_vllms_shape(provider, name):
    documented = fixture("vllm", f"recorded/{name}")
    usage = documented["response"].get("usage")
    if usage is not None:  # the simulator is a server started with --enable-prompt-tokens-details (cached tokens billed)
        usage["prompt_tokens_details"] = {"cached_tokens": 0}
    request = documented["request"]
    body = {**request["body"], "model": MODEL} if request["body"] else None
    answer = await post(provider, request["path"], body, request["method"])
    keyed = DATA_KEYED - {"top_logprobs"} if name.startswith("chat") else DATA_KEYED  # chat's top lists hold objects
    assert_same_shape(answer, documented["response"], data_keyed=keyed)


async def test_token_id_prompt_scores_as_its_text(provider):
    text = "def read_lines(path):\n    with open(path) as handle:\n"
    body = {"model": MODEL, "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 3}
    by_text = (await post(provider, "/v1/completions", {**body, "prompt": text}))["choices"][0]
    by_ids = (await post(provider, "/v1/completions", {**body, "prompt": encode_text(text)}))["choices"][0]
    assert by_ids["text"] == by_text["text"]
    assert by_ids["logprobs"] == by_text["logprobs"]
    raw_text = (await post(provider, "/v1/completions", {"model": MODEL, "prompt": text, "max_tokens": 1, "prompt_logprobs": 2}))
    raw_ids = (await post(provider, "/v1/completions", {"model": MODEL, "prompt": encode_text(text), "max_tokens": 1, "prompt_logprobs": 2}))
    assert raw_ids["choices"][0]["prompt_logprobs"] == raw_text["choices"][0]["prompt_logprobs"]


async def test_batch_answers_as_each_prompt_alone_indexed_across_prompts(provider):
    prompts = [encode_text("import os\n"), "class Stack:\n    def", encode_text("for i in range(")]
    body = {"model": MODEL, "max_tokens": 5, "temperature": 0, "logprobs": 2, "return_token_ids": True}
    together = await post(provider, "/v1/completions", {**body, "prompt": prompts})
    assert [c["index"] for c in together["choices"]] == [0, 1, 2]
    total_prompt = 0
    for prompt, choice in zip(prompts, together["choices"]):
        alone = await post(provider, "/v1/completions", {**body, "prompt": prompt})
        assert {**alone["choices"][0], "index": choice["index"]} == choice
        total_prompt += alone["usage"]["prompt_tokens"]
    assert together["usage"]["prompt_tokens"] == total_prompt
    with_n = await post(provider, "/v1/completions", {**body, "prompt": prompts[:2], "n": 2, "temperature": 1.0, "seed": 5})
    assert [c["index"] for c in with_n["choices"]] == [0, 1, 2, 3]
    assert [c["prompt_token_ids"] for c in with_n["choices"]] == [prompts[0]] * 2 + [encode_text(prompts[1])] * 2


async def test_return_token_ids_gives_the_prompt_and_output_ids(provider):
    prompt = "def add(a, b):\n"
    answer = await post(provider, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0,
                                                      "return_token_ids": True})
    choice = answer["choices"][0]
    assert choice["prompt_token_ids"] == encode_text(prompt)
    assert decode_text(choice["token_ids"]) == choice["text"] and len(choice["token_ids"]) == 6
    plain = await post(provider, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 0})
    assert plain["choices"][0]["token_ids"] is None and plain["choices"][0]["prompt_token_ids"] is None
    chat = await post(provider, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                          "max_tokens": 3, "temperature": 0, "return_token_ids": True})
    assert chat["prompt_token_ids"] == encode_text(render_chat([{"role": "user", "content": "hi"}]))
    assert decode_text(chat["choices"][0]["token_ids"]) == chat["choices"][0]["message"]["content"]


async def test_tokens_as_token_ids_name_the_same_tokens(provider):
    body = {"model": MODEL, "prompt": "x = [1, 2", "max_tokens": 4, "temperature": 0, "logprobs": 2, "return_token_ids": True}
    named = (await post(provider, "/v1/completions", body))["choices"][0]
    as_ids = (await post(provider, "/v1/completions", {**body, "return_tokens_as_token_ids": True}))["choices"][0]
    assert as_ids["logprobs"]["tokens"] == [f"token_id:{t}" for t in named["token_ids"]]
    assert as_ids["logprobs"]["token_logprobs"] == named["logprobs"]["token_logprobs"]
    for top in as_ids["logprobs"]["top_logprobs"]:
        assert all(key.startswith("token_id:") and key[len("token_id:"):].isdigit() for key in top)
    chat = await post(provider, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                                                          "max_tokens": 2, "logprobs": True, "top_logprobs": 2,
                                                          "return_tokens_as_token_ids": True})
    assert all(item["token"].startswith("token_id:") for item in chat["choices"][0]["logprobs"]["content"])


async def test_tokenize_and_detokenize(provider):
    text = "def fib(n):\n    return n"
    tokens = await post(provider, "/tokenize", {"model": MODEL, "prompt": text, "return_token_strs": True})
    assert tokens["tokens"] == encode_text(text) and tokens["count"] == len(tokens["tokens"])
    assert "".join(tokens["token_strs"]) == text
    assert (await post(provider, "/detokenize", {"model": MODEL, "tokens": tokens["tokens"]})) == {"prompt": text}
    messages = [{"role": "user", "content": "hi"}]
    chat = await post(provider, "/tokenize", {"model": MODEL, "messages": messages})
    assert chat["tokens"] == encode_text(render_chat(messages))
    assert (await provider.handle("POST", "/tokenize", {"model": "nope", "prompt": "x"})).status == 404


async def test_only_vllm_endpoints_answer(provider):
    assert (await post(provider, "/version", method="GET"))["version"]
    for path in ("/props", "/get_model_info", "/health"):
        assert (await provider.handle("GET", path)).status == 404
    assert (await provider.handle("POST", "/completion", {"prompt": "x"})).status == 404
    assert (await provider.handle("POST", "/generate", {"text": "x"})).status == 404
    for other in ("sglang", "llamacpp", "openai"):
        assert (await SimProvider(capabilities=other).handle("GET", "/version")).status == 404


async def test_prompt_logprobs_skip_the_prefix_cache_and_one_token_calls_use_it():
    provider = SimProvider(capabilities="vllm", latency=steady_lan(), seed=2)
    timing = provider.latency.timing_for(MODEL, "target")
    context = encode_text("def read_lines(path):\n    with open(path) as handle:\n        return list(handle)\n" * 8)
    await post(provider, "/v1/completions", {"model": MODEL, "prompt": context, "max_tokens": 1, "temperature": 0})
    grown = context + encode_text("\n\ndef")
    echo = {"model": MODEL, "prompt": grown, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1}
    for _ in range(2):  # the same scoring request again: no cache read either time
        scored = await post(provider, "/v1/completions", echo)
        assert scored["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert provider.calls.last.timing == request_timing(timing, prompt_tokens=len(grown), completion_tokens=1)
    raw = await post(provider, "/v1/completions", {**echo, "echo": False, "logprobs": None, "prompt_logprobs": 1})
    assert raw["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    full = provider.calls.last.timing.first_token_s
    one = await post(provider, "/v1/completions", {"model": MODEL, "prompt": grown, "max_tokens": 1, "temperature": 0, "logprobs": 5})
    cached = one["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= len(context) - timing.cache_block_tokens and cached % timing.cache_block_tokens == 0
    assert provider.calls.last.timing == request_timing(timing, prompt_tokens=len(grown), cached_tokens=cached, completion_tokens=1)
    assert provider.calls.last.timing.first_token_s < full


async def test_a_batch_costs_one_overhead_and_each_prompts_prefill():
    provider = SimProvider(capabilities="vllm", latency=steady_lan(), seed=2)
    timing = provider.latency.timing_for(MODEL, "target")
    prompts = [encode_text(f"value_{n} = compute({n})\n" * 20) for n in range(4)]
    await post(provider, "/v1/completions", {"model": MODEL, "prompt": prompts, "max_tokens": 3, "temperature": 0})
    batch = provider.calls.last.timing
    assert batch == request_timing(timing, prompt_tokens=sum(map(len, prompts)), completion_tokens=3)
    singles = [request_timing(timing, prompt_tokens=len(p), completion_tokens=3).total_s for p in prompts]
    assert batch.total_s < sum(singles)


async def test_over_http():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=4)
    with ServerThread(create_app(provider)) as server:
        async with httpx2.AsyncClient(base_url=server.root) as http:
            assert (await http.get("/version")).json()["version"]
            ids = (await http.post("/tokenize", json={"model": MODEL, "prompt": "def f(x):"})).json()["tokens"]
            body = {"model": MODEL, "prompt": [ids, ids + encode_text(" return")], "max_tokens": 2, "temperature": 0,
                    "return_token_ids": True}
            answer = (await http.post("/v1/completions", json=body)).json()
            assert [c["prompt_token_ids"] for c in answer["choices"]] == body["prompt"]
            alone = await post(provider, "/v1/completions", {**body, "prompt": ids})
            assert answer["choices"][0]["token_ids"] == alone["choices"][0]["token_ids"]


async def test_a_streamed_batch_gives_each_prompts_text_under_its_index(provider):
    prompts = [encode_text("import os\n"), "class Stack:\n    def"]
    body = {"model": MODEL, "prompt": prompts, "max_tokens": 5, "temperature": 0.8, "seed": 3, "n": 2}  # vLLM refuses n > 1 greedy
    whole = await post(provider, "/v1/completions", body)
    response = await provider.handle("POST", "/v1/completions", {**body, "stream": True,
                                                                 "stream_options": {"include_usage": True}})
    assert response.status == 200
    raw = b"".join([chunk async for chunk in response.stream])
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
    texts: dict[int, str] = {}
    for event in events:
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    assert texts == {c["index"]: c["text"] for c in whole["choices"]}
    # the plain answer also lists completion_tokens_details (null), as vLLM does; the stream's last chunk does not
    assert events[-1]["usage"] == {k: v for k, v in whole["usage"].items() if k != "completion_tokens_details"}


async def test_echo_with_logprobs_also_answers_the_prompts_scores_as_prompt_logprobs(provider):
    """As the real server does (tests/real/test_real_vllm_facts.py): echo + logprobs: k fills the choice's
    `prompt_logprobs` as `prompt_logprobs: k` would."""
    body = {"model": MODEL, "prompt": "def add(a, b):\n", "max_tokens": 2, "temperature": 0}
    echoed = (await post(provider, "/v1/completions", {**body, "echo": True, "logprobs": 2}))["choices"][0]
    asked = (await post(provider, "/v1/completions", {**body, "prompt_logprobs": 2}))["choices"][0]
    assert echoed["prompt_logprobs"] == asked["prompt_logprobs"] and echoed["prompt_logprobs"][0] is None


async def test_scoring_the_prompt_and_more_sequences_cost_what_the_profile_says():
    timing = dataclasses.replace(LATENCY_PROFILES["lan"].target, jitter=0.0, prompt_logprobs_s=0.01, prompt_logprob_token_s=0.001,
                                 tpot_per_sequence_s=0.002, cache_block_tokens=0)
    provider = SimProvider(capabilities="vllm", latency=LATENCY_PROFILES["lan"].with_overrides(**{MODEL: timing}), seed=2)
    prompt = encode_text("def read_lines(path):\n")
    plain = await provider.handle("POST", "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0})
    scored = await provider.handle("POST", "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1})
    assert plain.status == scored.status == 200
    calls = provider.calls[-2:]
    assert calls[1].timing.total_s - calls[0].timing.total_s == pytest.approx(0.01 + 0.001 * len(prompt))
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 6, "temperature": 1.0, "seed": 1, "ignore_eos": True}
    one = await provider.handle("POST", "/v1/completions", body)
    four = await provider.handle("POST", "/v1/completions", {**body, "n": 4})
    first, second = provider.calls[-2:]
    steps = len(first.timing.gaps_s)
    assert one.status == four.status == 200 and steps == len(second.timing.gaps_s) > 0
    assert second.timing.total_s - first.timing.total_s == pytest.approx(3 * 0.002 * steps)


async def test_a_generation_ended_by_the_end_token_lists_it_in_its_logprobs(provider):
    """As real vLLM does (tests/real/test_real_vllm_facts.py): the end-of-text token stays in the logprobs and
    the bill (not in the text), plain and streamed, completions and chat; other profiles do not list it."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400, "temperature": 0, "logprobs": True}
    chat = await post(provider, "/v1/chat/completions", body)
    choice = chat["choices"][0]
    assert choice["finish_reason"] == "stop", "the simulated reply did not end by itself"
    items = choice["logprobs"]["content"]
    assert items[-1]["token"] == token_str(EOS_TOKEN_ID) and len(items) == chat["usage"]["completion_tokens"]
    assert token_str(EOS_TOKEN_ID) not in choice["message"]["content"]
    response = await provider.handle("POST", "/v1/chat/completions", {**body, "stream": True})
    raw = b"".join([chunk async for chunk in response.stream])
    events = [json.loads(line[6:]) for line in raw.decode().split("\n\n") if line.startswith("data: {")]
    streamed = [item for e in events for c in e["choices"] for item in ((c.get("logprobs") or {}).get("content") or [])]
    assert [i["token"] for i in streamed] == [i["token"] for i in items]
    completion = await post(provider, "/v1/completions", {"model": MODEL, "prompt": render_chat(body["messages"]), "max_tokens": 400, "temperature": 0, "logprobs": 1})
    assert completion["choices"][0]["logprobs"]["tokens"][-1] == token_str(EOS_TOKEN_ID)
    plain = await SimProvider(capabilities="openai", latency="instant", seed=1).handle("POST", "/v1/chat/completions", body)
    assert plain.json["choices"][0]["logprobs"]["content"][-1]["token"] != token_str(EOS_TOKEN_ID)
