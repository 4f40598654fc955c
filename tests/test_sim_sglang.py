"""The simulator's SGLang dialect (`capabilities="sglang"`): native `/generate` with `input_ids` (batched
too), `return_logprob`, `logprob_start_len` and the radix cache, `/get_model_info`, and SGLang's OpenAI
endpoints, against the shapes in tests/fixtures/sglang/ (from SGLang's source)."""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx2
import pytest

from shapes import assert_same_shape, fixture
from simserver import ServerThread
from specapi.sim import EOS_TOKEN_ID, LATENCY_PROFILES, SimProvider, create_app, decode_text, encode_text

MODEL = "sim-target"


async def post(provider: SimProvider, path: str, body: Any = None, method: str = "POST") -> Any:
    response = await provider.handle(method, path, body)
    assert response.status == 200, response.json
    return response.json


@pytest.fixture
def provider() -> SimProvider:
    return SimProvider(capabilities="sglang", latency="instant", seed=1)


@pytest.mark.parametrize("name", ["generate_input_ids", "generate_batch", "generate_text_stop", "get_model_info"])
async def test_native_answers_have_sglangs_shape(provider, name):
    documented = fixture("sglang", name)
    request = documented["request"]
    if name == "generate_text_stop":  # a generation that ends on end-of-text, as the documented one does
        answer = await _until_eos(provider)
    else:
        answer = await post(provider, request["path"], request["body"], request["method"])
    assert_same_shape(answer, documented["response"])


async def _until_eos(provider: SimProvider) -> Any:
    """A /generate answer that ended on end-of-text (searched over seeds: the simulator's text is its own)."""
    for seed in range(200):
        # The end of a script, where the simulated target ends its text now and then (1–2% within 24 tokens).
        answer = await post(provider, "/generate", {"text": 'if __name__ == "__main__":\n    test()\n', "sampling_params": {
            "max_new_tokens": 24, "temperature": 1.0, "sampling_seed": seed}})
        if answer["meta_info"]["finish_reason"]["type"] == "stop":
            assert answer["meta_info"]["finish_reason"]["matched"] == EOS_TOKEN_ID == answer["output_ids"][-1]
            return answer
    raise AssertionError("no generation ended on end-of-text")


async def test_openai_completions_have_sglangs_shape(provider):
    documented = fixture("sglang", "completions_echo_logprobs")
    body = {**documented["request"]["body"], "model": MODEL}
    answer = await post(provider, "/v1/completions", body)
    assert_same_shape(answer["choices"][0]["logprobs"], documented["response"]["choices"][0]["logprobs"],
                      data_keyed=frozenset({"top_logprobs"}))
    assert set(answer["choices"][0]) == set(documented["response"]["choices"][0])
    assert set(answer["choices"][0]["logprobs"]["text_offset"]) == {-1}
    assert answer["choices"][0]["logprobs"]["token_logprobs"][0] is None
    refused = await provider.handle("POST", "/v1/completions", {**body, "max_tokens": 0})
    assert refused.status == 400


async def test_chat_continues_a_final_message(provider):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "def add"}]
    answer = await post(provider, "/v1/chat/completions", {"model": MODEL, "messages": messages, "max_tokens": 3,
                                                           "temperature": 0, "continue_final_message": True,
                                                           "add_generation_prompt": False})
    assert answer["choices"][0]["message"]["content"]


async def test_input_ids_score_and_generate_as_their_text(provider):
    text = "def read_lines(path):\n    with open(path) as handle:\n"
    body = {"sampling_params": {"max_new_tokens": 5, "temperature": 0}, "return_logprob": True, "logprob_start_len": 0,
            "top_logprobs_num": 3}
    by_text = await post(provider, "/generate", {**body, "text": text})
    by_ids = await post(provider, "/generate", {**body, "input_ids": encode_text(text)})
    assert by_ids["text"] == by_text["text"] and by_ids["output_ids"] == by_text["output_ids"]
    for key in ("input_token_logprobs", "output_token_logprobs", "input_top_logprobs", "output_top_logprobs"):
        assert by_ids["meta_info"][key] == by_text["meta_info"][key], key
    assert decode_text(by_ids["output_ids"]) == by_ids["text"]


async def test_batch_answers_as_each_prompt_alone(provider):
    prompts = [encode_text("import os\n"), encode_text("class Stack:\n    def"), encode_text("for i in range(")]
    body = {"sampling_params": {"max_new_tokens": 4, "temperature": 0}, "return_logprob": True, "top_logprobs_num": 2}
    together = await post(provider, "/generate", {**body, "input_ids": prompts})
    assert isinstance(together, list) and len(together) == 3
    for prompt, result in zip(prompts, together):
        alone = await post(provider, "/generate", {**body, "input_ids": prompt})
        assert result["text"] == alone["text"] and result["output_ids"] == alone["output_ids"]
        for key in ("input_token_logprobs", "output_token_logprobs", "output_top_logprobs", "prompt_tokens"):
            assert result["meta_info"][key] == alone["meta_info"][key], key
    texts = await post(provider, "/generate", {**body, "text": ["import os\n", "for i in range("]})
    assert [r["output_ids"] for r in texts] == [together[0]["output_ids"], together[2]["output_ids"]]


async def test_logprob_start_len_leaves_its_own_position_unscored(provider):
    ids = encode_text("def add(a, b):\n    return a + b\n")
    start = len(ids) - 3
    answer = await post(provider, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1},
                                                "return_logprob": True, "logprob_start_len": start, "top_logprobs_num": 2})
    meta = answer["meta_info"]
    assert [entry[1] for entry in meta["input_token_logprobs"]] == ids[start:]
    assert meta["input_token_logprobs"][0][0] is None and meta["input_top_logprobs"][0] is None
    assert all(entry[0] is not None for entry in meta["input_token_logprobs"][1:])
    from_zero = await post(provider, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1},
                                                   "return_logprob": True, "logprob_start_len": 0})
    assert from_zero["meta_info"]["input_token_logprobs"][start + 1:] == meta["input_token_logprobs"][1:]
    default = await post(provider, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 1},
                                                 "return_logprob": True})
    assert default["meta_info"]["input_token_logprobs"] == [[None, ids[-1], None]]
    with_text = await post(provider, "/generate", {"input_ids": ids, "sampling_params": {"max_new_tokens": 2},
                                                   "return_logprob": True, "return_text_in_logprobs": True})
    assert decode_text(with_text["output_ids"]) == "".join(e[2] for e in with_text["meta_info"]["output_token_logprobs"])


async def test_logprob_start_len_0_bypasses_the_radix_cache_near_the_end_keeps_it():
    lan = LATENCY_PROFILES["lan"]
    steady = lan.with_overrides(**{MODEL: dataclasses.replace(lan.target, jitter=0.0)})
    provider = SimProvider(capabilities="sglang", latency=steady, seed=2)
    context = encode_text("def read_lines(path):\n    with open(path) as handle:\n        return list(handle)\n" * 8)
    grown = context + encode_text("\n\ndef")
    await post(provider, "/generate", {"input_ids": context, "sampling_params": {"max_new_tokens": 1}})
    for _ in range(2):
        scored = await post(provider, "/generate", {"input_ids": grown, "sampling_params": {"max_new_tokens": 1},
                                                    "return_logprob": True, "logprob_start_len": 0})
        assert scored["meta_info"]["cached_tokens"] == 0
    full = provider.calls.last.timing.first_token_s
    near_end = await post(provider, "/generate", {"input_ids": grown, "sampling_params": {"max_new_tokens": 1},
                                                  "return_logprob": True, "logprob_start_len": len(grown) - 4})
    cached = near_end["meta_info"]["cached_tokens"]
    assert 0 < cached <= len(grown) - 4
    assert provider.calls.last.timing.first_token_s < full
    echo = await post(provider, "/v1/completions", {"model": MODEL, "prompt": grown, "max_tokens": 1, "echo": True, "logprobs": 1})
    assert echo["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


async def test_seed_and_stop(provider):
    body = {"text": "for i in", "sampling_params": {"max_new_tokens": 8, "temperature": 1.0, "sampling_seed": 11}}
    first, again = await post(provider, "/generate", body), await post(provider, "/generate", body)
    assert first["output_ids"] == again["output_ids"]
    greedy = await post(provider, "/generate", {"text": "def add(a, b):\n", "sampling_params": {"max_new_tokens": 8, "temperature": 0}})
    word = greedy["text"].split()[0]
    stopped = await post(provider, "/generate", {"text": "def add(a, b):\n", "sampling_params": {
        "max_new_tokens": 8, "temperature": 0, "stop": [word]}})
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert word not in stopped["text"]


async def test_only_sglang_endpoints_answer(provider):
    info = await post(provider, "/get_model_info", method="GET")
    assert info["model_path"] == MODEL and info["is_generation"] is True
    assert await post(provider, "/model_info", method="GET") == info
    for path in ("/props", "/version"):
        assert (await provider.handle("GET", path)).status == 404
    assert (await provider.handle("POST", "/completion", {"prompt": "x"})).status == 404
    for other in ("vllm", "llamacpp", "openai"):
        assert (await SimProvider(capabilities=other).handle("GET", "/get_model_info")).status == 404
    refused = await provider.handle("POST", "/generate", {"text": "x", "input_ids": [1]})
    assert refused.status == 400


async def test_over_http():
    provider = SimProvider(capabilities="sglang", latency="instant", seed=4)
    with ServerThread(create_app(provider)) as server:
        async with httpx2.AsyncClient(base_url=server.root) as http:
            assert (await http.get("/get_model_info")).json()["is_generation"] is True
            ids = encode_text("def f(x):")
            body = {"input_ids": [ids, ids], "sampling_params": {"max_new_tokens": 2, "temperature": 0}, "return_logprob": True}
            answer = (await http.post("/generate", json=body)).json()
            assert [r["output_ids"] for r in answer] == [answer[0]["output_ids"]] * 2
            assert answer[0]["meta_info"]["output_token_logprobs"][0][1] == answer[0]["output_ids"][0]
