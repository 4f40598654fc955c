"""Capability profiles: each server flavour accepts and refuses what the real one does."""

import dataclasses

import pytest

from specapi.sim import CAPABILITY_PROFILES, SimProvider, get_capabilities
from specapi.sim.corpus import encode_text, token_str
from specapi.sim.latency import RecordingSleep

PROMPT = "def area(width, height):\n    return"


def make(profile):
    return SimProvider(capabilities=profile, latency="instant", sleep=RecordingSleep())


async def post(provider, path, body):
    response = await provider.handle("POST", path, body)
    return response.status, response.json


def completion(**extra):
    return {"model": "sim-target", "prompt": PROMPT, "max_tokens": 3, "temperature": 0, **extra}


def chat(messages, **extra):
    return {"model": "sim-target", "messages": messages, "max_tokens": 4, "temperature": 0, **extra}


USER = [{"role": "user", "content": "Compute an area."}]


def test_profiles_are_plain_dataclasses():
    vllm = get_capabilities("vllm")
    custom = dataclasses.replace(vllm, name="strict", completions_echo=False)
    assert custom.completions_echo is False and vllm.completions_echo is True
    assert set(CAPABILITY_PROFILES) >= {"vllm", "openai", "llamacpp"}
    with pytest.raises(KeyError):
        get_capabilities("mainframe")


# -- vLLM ---------------------------------------------------------------------------------------------


async def test_vllm_echo_gives_prompt_logprobs_with_offsets_from_the_prompt():
    status, body = await post(make("vllm"), "/v1/completions", completion(echo=True, logprobs=20))
    assert status == 200
    lp = body["choices"][0]["logprobs"]
    n_prompt = len(encode_text(PROMPT))
    assert len(lp["tokens"]) == n_prompt + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert lp["text_offset"][:2] == [0, len(lp["tokens"][0])]
    assert lp["text_offset"][n_prompt] == len(PROMPT)
    assert body["choices"][0]["text"].startswith(PROMPT)


async def test_vllm_offsets_without_echo_start_at_zero_and_include_the_chosen_token():
    _, body = await post(make("vllm"), "/v1/completions", completion(logprobs=0, temperature=1, seed=3))
    lp = body["choices"][0]["logprobs"]
    assert lp["text_offset"][0] == 0
    for token, top in zip(lp["tokens"], lp["top_logprobs"]):
        assert list(top) == [token]


async def test_vllm_logprobs_all_and_cap():
    provider = make("vllm")
    status, body = await post(provider, "/v1/completions", completion(max_tokens=1, logprobs=-1))
    assert status == 200
    assert len(body["choices"][0]["logprobs"]["top_logprobs"][0]) > 1000
    assert (await post(provider, "/v1/completions", completion(logprobs=21)))[0] == 400


async def test_vllm_max_tokens_zero_with_echo_only():
    provider = make("vllm")
    status, body = await post(provider, "/v1/completions", completion(max_tokens=0, echo=True, logprobs=1))
    assert status == 200 and body["choices"][0]["text"] == PROMPT
    assert (await post(provider, "/v1/completions", completion(max_tokens=0)))[0] == 400


async def test_vllm_prompt_logprobs_raw_form():
    status, body = await post(make("vllm"), "/v1/completions", completion(prompt_logprobs=2))
    assert status == 200
    raw = body["choices"][0]["prompt_logprobs"]
    ids = encode_text(PROMPT)
    assert raw[0] is None and len(raw) == len(ids)
    for token_id, position in zip(ids[1:], raw[1:]):
        assert str(token_id) in position
        actual = position[str(token_id)]
        assert set(actual) == {"logprob", "rank", "decoded_token"}
        assert actual["decoded_token"] == token_str(token_id)
        ranked = sorted(position.values(), key=lambda e: e["rank"])
        assert ranked[0]["rank"] == 1
        assert len(position) in (2, 3)
        if actual["rank"] > 2:
            assert len(position) == 3


async def test_vllm_prompt_logprobs_refused_with_stream_and_on_other_servers():
    status, body = await post(make("vllm"), "/v1/completions", completion(prompt_logprobs=1, stream=True))
    assert status == 400 and body["error"]["param"] == "prompt_logprobs"
    assert (await post(make("llamacpp"), "/v1/completions", completion(prompt_logprobs=1)))[0] == 400


async def test_vllm_chat_prompt_logprobs_at_top_level():
    status, body = await post(make("vllm"), "/v1/chat/completions", chat(USER, prompt_logprobs=0))
    assert status == 200
    assert body["prompt_logprobs"][0] is None
    assert all(len(p) == 1 for p in body["prompt_logprobs"][1:])


async def test_vllm_continue_final_message():
    provider = make("vllm")
    messages = USER + [{"role": "assistant", "content": "def area(w, h):\n    return"}]
    status, body = await post(provider, "/v1/chat/completions", chat(
        messages, continue_final_message=True, add_generation_prompt=False))
    assert status == 200
    continued = body["choices"][0]["message"]["content"]
    prompt = "<|user|>\nCompute an area.\n<|assistant|>\ndef area(w, h):\n    return"
    _, plain = await post(provider, "/v1/completions", {"model": "sim-target", "prompt": prompt, "max_tokens": 4,
                                                         "temperature": 0})
    assert continued == plain["choices"][0]["text"]
    both = await post(provider, "/v1/chat/completions", chat(messages, continue_final_message=True))
    assert both[0] == 400
    not_assistant = await post(provider, "/v1/chat/completions", chat(
        USER, continue_final_message=True, add_generation_prompt=False))
    assert not_assistant[0] == 400


async def test_trailing_assistant_message_starts_a_new_turn_without_prefill():
    messages = USER + [{"role": "assistant", "content": "Sure."}]
    _, body = await post(make("vllm"), "/v1/chat/completions", chat(messages))
    assert body["usage"]["prompt_tokens"] == len(encode_text(
        "<|user|>\nCompute an area.\n<|assistant|>\nSure.\n<|assistant|>\n"))


# -- OpenAI -------------------------------------------------------------------------------------------


async def test_openai_refuses_echo_with_logprobs():
    status, body = await post(make("openai"), "/v1/completions", completion(echo=True, logprobs=1))
    assert status == 400
    assert body["error"]["code"] == "invalid_parameter_combination"
    assert "echo" in body["error"]["message"]
    ok, echoed = await post(make("openai"), "/v1/completions", completion(echo=True))
    assert ok == 200 and echoed["choices"][0]["text"].startswith(PROMPT)


async def test_openai_refuses_fields_outside_its_api_and_others_ignore_them():
    status, body = await post(make("openai"), "/v1/chat/completions", chat(
        USER, continue_final_message=True, add_generation_prompt=False))
    assert status == 400
    assert body["error"]["message"] == "Unrecognized request argument supplied: continue_final_message"
    assert (await post(make("openai"), "/v1/completions", completion(prompt_logprobs=1)))[0] == 400
    assert (await post(make("openai"), "/v1/completions", completion(user="u", presence_penalty=0)))[0] == 200
    assert (await post(make("llamacpp"), "/v1/chat/completions", chat(USER, repeat_penalty=1.0)))[0] == 200


async def test_openai_completion_logprobs_cap_and_offsets_from_prompt_start():
    provider = make("openai")
    assert (await post(provider, "/v1/completions", completion(logprobs=6)))[0] == 400
    _, body = await post(provider, "/v1/completions", completion(logprobs=5))
    lp = body["choices"][0]["logprobs"]
    assert lp["text_offset"][0] == len(PROMPT)
    assert all(len(top) == 5 for top in lp["top_logprobs"])


async def test_openai_chat_top_logprobs_up_to_20():
    provider = make("openai")
    status, body = await post(provider, "/v1/chat/completions", chat(USER, logprobs=True, top_logprobs=20))
    assert status == 200
    assert all(len(i["top_logprobs"]) == 20 for i in body["choices"][0]["logprobs"]["content"])
    _, no_top = await post(provider, "/v1/chat/completions", chat(USER, logprobs=True))
    assert all(i["top_logprobs"] == [] for i in no_top["choices"][0]["logprobs"]["content"])


async def test_openai_predicted_outputs_count_accepted_and_rejected_tokens():
    provider = make("openai")
    _, plain = await post(provider, "/v1/chat/completions", chat(USER, max_tokens=12))
    output = plain["choices"][0]["message"]["content"]
    prediction = output[: len(output) // 2] + " something else entirely"
    status, body = await post(provider, "/v1/chat/completions", chat(
        USER, max_tokens=12, prediction={"type": "content", "content": prediction}))
    assert status == 200
    assert body["choices"][0]["message"]["content"] == output  # the prediction never changes the output
    details = body["usage"]["completion_tokens_details"]
    accepted, rejected = details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]
    assert accepted > 0 and rejected > 0
    assert accepted + rejected == len(encode_text(prediction))
    assert body["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"] + rejected
    assert provider.usage["sim-target"].completion_tokens == 12 + 12 + rejected


async def test_openai_predicted_outputs_are_faster_when_accepted():
    sleep = RecordingSleep()
    provider = SimProvider(capabilities="openai", latency="lan", sleep=sleep)
    _, plain = await post(provider, "/v1/chat/completions", chat(USER, max_tokens=30))
    output = plain["choices"][0]["message"]["content"]
    await post(provider, "/v1/chat/completions", chat(USER, max_tokens=30,
                                                       prediction={"type": "content", "content": output}))
    assert sleep.calls[1] < sleep.calls[0] / 3


@pytest.mark.parametrize(
    "extra", [{"logprobs": True}, {"n": 2}, {"max_completion_tokens": 5}, {"presence_penalty": 0.5}]
)
async def test_openai_predicted_outputs_refusals(extra):
    body = chat(USER, prediction={"type": "content", "content": "x"}, **extra)
    if "max_completion_tokens" in extra:
        body.pop("max_tokens")
    status, payload = await post(make("openai"), "/v1/chat/completions", body)
    assert status == 400 and payload["error"]["param"] == "prediction"


async def test_prediction_is_ignored_where_unsupported():
    status, body = await post(make("vllm"), "/v1/chat/completions", chat(
        USER, prediction={"type": "content", "content": "x"}))
    assert status == 200 and body["usage"]["completion_tokens_details"] is None  # vLLM serializes it, null


# -- llama.cpp ----------------------------------------------------------------------------------------


async def test_llamacpp_refuses_echo():
    status, body = await post(make("llamacpp"), "/v1/completions", completion(echo=True))
    assert status == 400 and body["error"]["message"] == "Only no echo is supported"


async def test_llamacpp_completion_logprobs_come_in_chat_shape():
    status, body = await post(make("llamacpp"), "/v1/completions", completion(logprobs=2))
    assert status == 200
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 3 and all(len(i["top_logprobs"]) == 2 for i in content)


async def test_llamacpp_chat_top_logprobs_default_20():
    _, body = await post(make("llamacpp"), "/v1/chat/completions", chat(USER, logprobs=True))
    assert all(len(i["top_logprobs"]) == 20 for i in body["choices"][0]["logprobs"]["content"])


async def test_llamacpp_prefill_continues_and_returns_the_prefix():
    provider = make("llamacpp")
    prefix = "def area(w, h):\n    return"
    status, body = await post(provider, "/v1/chat/completions", chat(USER + [{"role": "assistant", "content": prefix}]))
    assert status == 200
    content = body["choices"][0]["message"]["content"]
    assert content.startswith(prefix)
    vllm = make("vllm")
    _, continued = await post(vllm, "/v1/chat/completions", chat(
        USER + [{"role": "assistant", "content": prefix}], continue_final_message=True, add_generation_prompt=False))
    assert content == prefix + continued["choices"][0]["message"]["content"]
