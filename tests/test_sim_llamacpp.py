"""The simulator's llama-server native API (`capabilities="llamacpp"`) against the shapes recorded from
the real `llama-server` (tests/fixtures/llamacpp/, written by tests/real/record_shapes.py), and what the
answers mean: token-id prompts score like text, several prompts like one at a time, seeds, cache."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx2
import pytest

from shapes import assert_same_shape, fixture
from specapi.sim import LATENCY_PROFILES, SimProvider, SimTransport, encode_text
from specapi.sim.corpus import token_bytes

COMPLETIONS = [
    "completion_ids", "completion_multi", "completion_n_predict_0", "completion_greedy_text", "completion_seed",
    "completion_cjk", "completion_cjk_post_sampling", "completion_stop_word", "completion_eos",
]  # fmt: skip


def _sim_prompt(recorded: dict[str, Any], one: Any, index: int) -> Any:
    """The recorded prompt in the simulator's tokens: token ids become the simulator's ids of the same text."""
    if isinstance(one, str):
        return one
    results = recorded["response"] if isinstance(recorded["response"], list) else [recorded["response"]]
    return encode_text(results[index]["prompt"].removeprefix("<s>"))


def sim_body(recorded: dict[str, Any]) -> dict[str, Any]:
    body = dict(recorded["request"]["body"])
    prompt = body["prompt"]
    if isinstance(prompt, list) and any(isinstance(p, (str, list)) for p in prompt):
        body["prompt"] = [_sim_prompt(recorded, p, i) for i, p in enumerate(prompt)]
    else:
        body["prompt"] = _sim_prompt(recorded, prompt, 0)
    return body


async def post(provider: SimProvider, path: str, body: Any = None, method: str = "POST") -> Any:
    response = await provider.handle(method, path, body)
    assert response.status == 200, response.json
    return response.json


@pytest.fixture
def provider() -> SimProvider:
    return SimProvider(capabilities="llamacpp", latency="instant", seed=1)


@pytest.mark.parametrize("name", COMPLETIONS)
async def test_completion_has_the_recorded_shape(provider, name):
    recorded = fixture("llamacpp", name)
    answer = await post(provider, "/completion", sim_body(recorded))
    assert_same_shape(answer, recorded["response"])


@pytest.mark.parametrize("name", ["tokenize", "tokenize_add_special", "detokenize", "props"])
async def test_lookups_have_the_recorded_shape(provider, name):
    recorded = fixture("llamacpp", name)
    request = recorded["request"]
    answer = await post(provider, request["path"], request["body"], request["method"])
    assert_same_shape(answer, recorded["response"])


async def test_tokenize_with_pieces_gives_text_or_the_bytes_of_a_partial_character(provider):
    recorded = fixture("llamacpp", "tokenize_with_pieces")["response"]["tokens"]
    assert {type(t["piece"]) for t in recorded} == {str, list}  # what the real server sent
    text = "今天天气 def"
    answer = (await post(provider, "/tokenize", {"content": text, "with_pieces": True}))["tokens"]
    assert [t["id"] for t in answer] == encode_text(text)
    for entry in answer:
        raw = token_bytes(entry["id"])
        try:
            assert entry["piece"] == raw.decode("utf-8")
        except UnicodeDecodeError:
            assert entry["piece"] == list(raw)
    assert {type(t["piece"]) for t in answer} == {str, list}


async def test_only_llama_server_endpoints_answer():
    llamacpp = SimProvider(capabilities="llamacpp", latency="instant")
    assert (await llamacpp.handle("GET", "/props")).status == 200
    assert (await llamacpp.handle("GET", "/health")).json == {"status": "ok"}
    for path in ("/version", "/get_model_info"):
        assert (await llamacpp.handle("GET", path)).status == 404
    assert (await llamacpp.handle("POST", "/generate", {"text": "x"})).status == 404
    for other in ("vllm", "sglang", "openai"):
        provider = SimProvider(capabilities=other, latency="instant")
        assert (await provider.handle("GET", "/props")).status == 404
        assert (await provider.handle("POST", "/completion", {"prompt": "x"})).status == 404


async def test_props_reports_the_defaults_applied_to_requests(provider):
    params = (await post(provider, "/props", method="GET"))["default_generation_settings"]["params"]
    assert (params["temperature"], params["top_p"]) == (pytest.approx(0.8), pytest.approx(0.95))
    answer = await post(provider, "/completion", {"prompt": "def f", "n_predict": 1})
    assert answer["generation_settings"]["temperature"] == params["temperature"]


async def test_token_id_prompt_scores_and_generates_as_its_text(provider):
    text = "def read_lines(path):\n    with open(path"
    body = {"n_predict": 6, "n_probs": 3, "temperature": 0, "return_tokens": True}
    by_text = await post(provider, "/completion", {**body, "prompt": text})
    by_ids = await post(provider, "/completion", {**body, "prompt": encode_text(text)})
    assert by_ids["tokens"] == by_text["tokens"] and by_ids["content"] == by_text["content"]
    assert by_ids["completion_probabilities"] == by_text["completion_probabilities"]
    assert by_ids["tokens_evaluated"] == len(encode_text(text))


async def test_several_prompts_answer_as_each_alone_in_order(provider):
    prompts = ["def add(a, b):", encode_text("import os\n"), "class Stack:\n    def"]
    body = {"n_predict": 1, "n_probs": 2, "temperature": 0, "return_tokens": True, "cache_prompt": False}
    together = await post(provider, "/completion", {**body, "prompt": prompts})
    assert isinstance(together, list) and [r["index"] for r in together] == [0, 1, 2]
    for prompt, result in zip(prompts, together):
        alone = await post(provider, "/completion", {**body, "prompt": prompt})
        for key in ("content", "tokens", "tokens_predicted", "tokens_evaluated", "completion_probabilities", "prompt"):
            assert result[key] == alone[key], key
    assert len(provider.calls) == 4


async def test_mixed_ids_and_text_are_one_prompt(provider):
    ids = encode_text("def")
    answer = await post(provider, "/completion", {"prompt": [*ids, " add(a, b):"], "n_predict": 2, "temperature": 0})
    alone = await post(provider, "/completion", {"prompt": "def add(a, b):", "n_predict": 2, "temperature": 0})
    assert isinstance(answer, dict) and answer["content"] == alone["content"]


async def test_seed_gives_every_prompt_of_a_request_the_same_stream(provider):
    recorded = fixture("llamacpp", "seed_per_prompt")
    assert recorded["identical_prompts_same_tokens"] == recorded["trials"]  # what the real server did
    body = {"n_predict": 8, "temperature": 1.0, "return_tokens": True}
    differ = 0
    for seed in range(6):
        first, second = await post(provider, "/completion", {**body, "prompt": ["for i in", "for i in"], "seed": seed})
        assert first["tokens"] == second["tokens"]
        again = await post(provider, "/completion", {**body, "prompt": "for i in", "seed": seed})
        assert again["tokens"] == first["tokens"]
        differ += first["tokens"] != (await post(provider, "/completion", {**body, "prompt": "for i in", "seed": seed + 100}))["tokens"]
    assert differ > 0  # the seed matters: sampling at temperature 1 is not greedy


async def test_n_predict_0_still_generates_one_token(provider):
    recorded = fixture("llamacpp", "completion_n_predict_0")["response"]
    assert recorded["tokens_predicted"] == 1  # the real server
    answer = await post(provider, "/completion", {"prompt": "def f", "n_predict": 0, "return_tokens": True})
    assert answer["tokens_predicted"] == 1 and len(answer["tokens"]) == 1


async def test_probabilities_group_tokens_until_text_is_complete(provider):
    prompt = "def f():\n    # 计算"
    answer = await post(provider, "/completion", {"prompt": prompt, "n_predict": 6, "n_probs": 2, "temperature": 0,
                                                  "return_tokens": True})
    tokens, entries = answer["tokens"], answer["completion_probabilities"]
    raw = [token_bytes(t) for t in tokens]
    assert any(_partial(r) for r in raw), "this prompt no longer generates a partial character; pick another"
    assert b"".join(bytes(e["bytes"]) for e in entries) == b"".join(raw)[: sum(len(e["bytes"]) for e in entries)]
    assert len(entries) < len(tokens)
    for entry in entries:
        assert entry["token"] == bytes(entry["bytes"]).decode("utf-8")
        assert entry["id"] in tokens
        assert entry["top_logprobs"] and all(set(c) == {"id", "token", "bytes", "logprob"} for c in entry["top_logprobs"])


async def test_nothing_complete_means_no_probabilities_key(provider):
    answer = await post(provider, "/completion", {"prompt": "今天天气", "n_predict": 1, "n_probs": 2, "temperature": 0,
                                                  "return_tokens": True})
    assert _partial(token_bytes(answer["tokens"][0]))
    assert "completion_probabilities" not in answer
    assert answer["content"] == "\ufffd"


async def test_post_sampling_probs_of_a_greedy_request_have_one_candidate(provider):
    answer = await post(provider, "/completion", {"prompt": "def add(a, b):", "n_predict": 3, "n_probs": 4,
                                                  "temperature": 0, "post_sampling_probs": True})
    for entry in answer["completion_probabilities"]:
        assert entry["prob"] == 1.0 and [c["id"] for c in entry["top_probs"]] == [entry["id"]]
    sampled = await post(provider, "/completion", {"prompt": "def add(a, b):", "n_predict": 3, "n_probs": 4,
                                                   "temperature": 1.0, "seed": 3, "post_sampling_probs": True})
    for entry in sampled["completion_probabilities"]:
        probs = [c["prob"] for c in entry["top_probs"]]
        assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0 + 1e-9


async def test_cache_prompt_is_reported_in_timings_and_tokens_cached():
    timing = dataclasses.replace(LATENCY_PROFILES["lan"].target, jitter=0.0)
    provider = SimProvider(capabilities="llamacpp", latency=LATENCY_PROFILES["lan"].with_overrides(**{"sim-target": timing}))
    prompt = encode_text("def read_lines(path):\n    with open(path) as handle:\n        return handle.read()\n" * 4)
    first = await post(provider, "/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0})
    again = await post(provider, "/completion", {"prompt": prompt + encode_text("\n"), "n_predict": 1, "temperature": 0})
    fresh = await post(provider, "/completion", {"prompt": prompt + encode_text("\n"), "n_predict": 1, "temperature": 0,
                                                 "cache_prompt": False})
    assert first["timings"]["cache_n"] == 0 and first["timings"]["prompt_n"] == len(prompt)
    assert again["timings"]["cache_n"] > 0
    assert again["timings"]["cache_n"] + again["timings"]["prompt_n"] == len(prompt) + 1
    assert fresh["timings"]["cache_n"] == 0
    assert again["tokens_cached"] == len(prompt) + 1 + again["tokens_predicted"] - 1
    assert provider.calls[1].timing.first_token_s < provider.calls[2].timing.first_token_s


async def test_one_multi_prompt_call_costs_one_overhead():
    timing = dataclasses.replace(LATENCY_PROFILES["lan"].target, jitter=0.0)
    provider = SimProvider(capabilities="llamacpp", latency=LATENCY_PROFILES["lan"].with_overrides(**{"sim-target": timing}))
    prompts = [encode_text("x = 1\n" * n) for n in range(1, 5)]
    await post(provider, "/completion", {"prompt": prompts, "n_predict": 1, "temperature": 0, "cache_prompt": False})
    batch = provider.calls.last.timing.total_s
    singles = []
    for prompt in prompts:
        await post(provider, "/completion", {"prompt": prompt, "n_predict": 1, "temperature": 0, "cache_prompt": False})
        singles.append(provider.calls.last.timing.total_s)
    overhead = timing.rtt_s + timing.ttft_base_s
    assert batch == pytest.approx(overhead + sum(s - overhead for s in singles))
    assert batch < sum(singles)


async def test_over_the_in_process_transport():
    provider = SimProvider(capabilities="llamacpp", latency="instant")
    async with httpx2.AsyncClient(transport=SimTransport(provider), base_url="http://sim") as http:
        props = (await http.get("/props")).json()
        assert props["default_generation_settings"]["params"]["top_k"] == 40
        results = (await http.post("/completion", json={"prompt": ["a", [15339]], "n_predict": 1})).json()
        assert [r["index"] for r in results] == [0, 1]


def _partial(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


async def test_sampling_follows_llama_servers_chain(provider):
    prompt = "def add(a, b):\n"
    greedy = await post(provider, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 0, "return_tokens": True})
    for seed in range(3):  # top_k 1 leaves one candidate: greedy at any temperature
        top1 = await post(provider, "/completion", {"prompt": prompt, "n_predict": 8, "temperature": 1.5, "top_k": 1,
                                                    "seed": seed, "return_tokens": True})
        assert top1["tokens"] == greedy["tokens"]
    defaults = await post(provider, "/completion", {"prompt": prompt, "n_predict": 6, "n_probs": 100, "seed": 9,
                                                    "post_sampling_probs": True, "return_tokens": True})
    for entry in defaults["completion_probabilities"]:  # top_k 40, top_p 0.95, min_p 0.05, temperature 0.8
        probs = [c["prob"] for c in entry["top_probs"]]
        assert 1 <= len(probs) <= 40 and sum(probs) == pytest.approx(1.0)
        assert min(probs) >= 0.05 ** (1 / 0.8) * max(probs) * (1 - 1e-9)  # min_p on raw probs, then temperature
        assert entry["id"] in [c["id"] for c in entry["top_probs"]]  # the drawn token was a candidate


async def test_a_native_request_names_its_model(provider):
    assert (await post(provider, "/props?model=sim-draft", method="GET"))["model_alias"] == "sim-draft"
    assert (await post(provider, "/props", method="GET"))["model_alias"] == "sim-target"
    body = {"prompt": "def add(a, b):\n", "n_predict": 12, "temperature": 0, "return_tokens": True}
    draft = await post(provider, "/completion", {**body, "model": "sim-draft"})
    target = await post(provider, "/completion", body)
    assert draft["model"] == "sim-draft" and target["model"] == "sim-target"
    assert [c.model for c in provider.calls.to("/completion")] == ["sim-draft", "sim-target"]
    assert provider.usage["sim-draft"].requests == provider.usage["sim-target"].requests == 1


async def _streamed(provider: SimProvider, body: dict[str, Any]) -> list[dict[str, Any]]:
    import json

    async with httpx2.AsyncClient(transport=SimTransport(provider), base_url="http://sim") as http:
        response = await http.post("/completion", json={**body, "stream": True})
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: "):] for line in response.text.split("\n") if line.startswith("data: ")]
    assert "[DONE]" not in events  # the native stream ends with its stop chunk
    return [json.loads(e) for e in events]


async def test_a_stream_holds_back_an_unfinished_character_and_ends_with_the_whole_result(provider):
    # As the real server streams (llama-cpp-python 0.3.36's build): a token that leaves a character
    # unfinished sends no chunk; the token that completes it sends all the held text, listing itself only.
    prompt = "def f():\n    # 计算"
    body = {"prompt": prompt, "n_predict": 6, "temperature": 0, "return_tokens": True}
    plain = await post(provider, "/completion", body)
    chunks = await _streamed(provider, body)
    *parts, last = chunks
    assert last["stop"] is True and last["content"] == "" and last["tokens"] == []
    assert last["tokens_predicted"] == plain["tokens_predicted"] == len(plain["tokens"])
    assert all(not c["stop"] and c["id_slot"] == -1 for c in parts)
    raw = [token_bytes(t) for t in plain["tokens"]]
    assert any(_partial(r) for r in raw), "this prompt no longer generates a partial character; pick another"
    completing = [t for i, t in enumerate(plain["tokens"]) if not _partial(b"".join(raw[: i + 1]))]
    assert [c["tokens"] for c in parts] == [[t] for t in completing]
    assert len(parts) < len(plain["tokens"])
    text = "".join(c["content"] for c in parts)
    if _partial(b"".join(raw)):  # the end cuts a character: the stream leaves it out, where content shows U+FFFD
        assert plain["content"].endswith("\ufffd") and plain["content"].startswith(text) and len(text) < len(plain["content"])
    else:
        assert text == plain["content"]


async def test_a_stream_ending_inside_a_character_sends_only_the_result(provider):
    chunks = await _streamed(provider, {"prompt": "今天天气", "n_predict": 1, "temperature": 0, "return_tokens": True})
    assert len(chunks) == 1 and chunks[0]["stop"] is True and chunks[0]["content"] == ""


async def test_a_stream_of_several_prompts_is_refused(provider):
    response = await provider.handle("POST", "/completion", {"prompt": ["a", "b"], "stream": True})
    assert response.status == 400


@pytest.mark.parametrize("body", [b'{"prompt": "\\ud800x", "max_tokens": 2}', b'{"prompt": "\xff\xfe", "max_tokens": 2}', b'{"prompt": '])
async def test_a_body_llama_servers_json_parser_refuses_is_its_500_and_vllms_400(body: bytes) -> None:
    # Observed on llama-server b1-0c1e570: a lone surrogate escape, bytes that are not UTF-8, broken JSON: 500 "parse error".
    llamacpp = SimProvider(capabilities="llamacpp", latency="instant")
    answer = await llamacpp.handle("POST", "/v1/completions", body)
    assert answer.status == 500 and "parse_error" in answer.json["error"]["message"] and answer.json["error"]["type"] == "server_error"
    vllm = SimProvider(capabilities="vllm", latency="instant")
    assert (await vllm.handle("POST", "/v1/completions", body)).status == 400
    assert (await vllm.handle("POST", "/v1/completions", b'{"model": "sim-target", "prompt": "\\ud83d\\ude00", "max_tokens": 1}')).status == 200
