"""Each dialect builds the body its server takes and reads the answers its server gives: the native
token-id dialects, and the OpenAI formats every request body specapi sends is built in.

The answers are recorded shapes: llama.cpp's from the real `llama-server` (tests/real/record_shapes.py),
vLLM's and SGLang's written from their sources (tests/fixtures/*/README.md). Requests are caught with
respx, so what is asserted is what went over the wire.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import pytest
import httpx2
import respx

from specapi import Endpoint, MalformedResponseError
from specapi.transport._calls import Meter, RoleClient
from specapi.dialects import LlamaCppDialect, SglangDialect, VllmDialect, native_dialect

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
ROOT = "http://gpu-box:8080"


def recorded(family: str, name: str) -> Any:
    return json.loads((FIXTURES / family / f"{name}.json").read_text())["response"]


def role() -> tuple[RoleClient, Meter]:
    # respx patches httpx2, so the role is given an httpx2 client (its default transport is aiohttp).
    endpoint = Endpoint(base_url=ROOT + "/v1", model="m", api_key="k", max_retries=0, http_client=httpx2.AsyncClient())
    return RoleClient("target", endpoint), Meter(endpoint)


def sent(route: respx.Route) -> dict[str, Any]:
    return json.loads(route.calls.last.request.content)


def test_native_dialects_by_server_name() -> None:
    assert isinstance(native_dialect("llama-server"), LlamaCppDialect)
    assert isinstance(native_dialect("vllm"), VllmDialect)
    assert isinstance(native_dialect("sglang"), SglangDialect)
    assert native_dialect("llama-cpp-python") is None and native_dialect(None) is None


# -- llama.cpp ------------------------------------------------------------------------------------


async def test_llamacpp_tokenize_keeps_the_bytes_of_partial_pieces() -> None:
    client, meter = role()
    with respx.mock(base_url=ROOT) as router:
        route = router.post("/tokenize").respond(200, json=recorded("llamacpp", "tokenize_with_pieces"))
        pieces = await LlamaCppDialect().tokenize(client, "今天天气 def", meter, special=False)
    assert sent(route)["content"] == "今天天气 def" and sent(route)["with_pieces"] is True and sent(route)["add_special"] is False
    assert b"".join(data for _, data in pieces) == "今天天气 def".encode()
    assert pieces[0] == (285, b"\xe4\xbb") and pieces[-1] == (438, b" def")
    assert meter.requests == 1 and meter.prompt_tokens == 0  # tokenizing bills nothing


async def test_llamacpp_scores_every_prompt_in_one_multi_prompt_request() -> None:
    client, meter = role()
    answer = recorded("llamacpp", "completion_multi")
    ids_only = [r for r in answer if isinstance(r, dict)][:2]
    shuffled = list(reversed(ids_only))  # results carry their index; order on the wire is not relied on
    with respx.mock(base_url=ROOT) as router:
        route = router.post("/completion").respond(200, json=shuffled)
        picks = await LlamaCppDialect().next_tokens(client, [[1, 2], [1, 2, 3]], {"temperature": 0, "seed": 7, "max_tokens": 9}, meter, options={})
    body = sent(route)
    assert body["prompt"] == [[1, 2], [1, 2, 3]] and body["n_predict"] == 1 and body["return_tokens"] and body["cache_prompt"]
    assert body["seed"] == 7 and body["temperature"] == 0 and "max_tokens" not in body
    by_index = sorted(ids_only, key=lambda r: r["index"])
    assert [p.id for p in picks] == [r["tokens"][0] for r in by_index]
    assert [p.data for p in picks] == [bytes(r["completion_probabilities"][0]["bytes"]) for r in by_index]
    assert [p.prompt_tokens for p in picks] == [r["tokens_evaluated"] for r in by_index]
    assert meter.prompt_tokens == sum(r["tokens_evaluated"] for r in ids_only)


async def test_llamacpp_pick_of_a_partial_character_has_an_id_but_no_bytes_and_eos_ends() -> None:
    client, meter = role()
    partial = {"index": 0, "content": "", "tokens": [266], "stop": True, "stop_type": "limit", "tokens_predicted": 1, "tokens_evaluated": 5}
    eos = {"index": 1, "content": "", "tokens": [660], "stop": True, "stop_type": "eos", "tokens_predicted": 1, "tokens_evaluated": 6,
           "completion_probabilities": [{"id": 660, "token": "", "bytes": [], "logprob": -0.1, "top_logprobs": []}]}  # fmt: skip
    with respx.mock(base_url=ROOT) as router:
        router.post("/completion").respond(200, json=[partial, eos])
        picks = await LlamaCppDialect().next_tokens(client, [[1], [1, 2]], {"temperature": 0}, meter, options={})
    assert (picks[0].id, picks[0].data, picks[0].end) == (266, None, False)
    assert picks[1].end and picks[1].uncounted == 1


async def test_llamacpp_generate_reads_content_and_ids_without_the_end_of_text_token() -> None:
    client, meter = role()
    answer = recorded("llamacpp", "completion_eos")
    with respx.mock(base_url=ROOT) as router:
        route = router.post("/completion").respond(200, json=answer)
        generated = await LlamaCppDialect().generate(client, [5, 6], {"temperature": 0}, None, ["\n\n"], meter, options={})
    body = sent(route)
    assert body["prompt"] == [5, 6] and body["n_predict"] == -1 and body["stop"] == ["\n\n"]
    assert generated.data == answer["content"].encode() and generated.finish_reason == "stop"
    assert list(generated.ids or ()) == answer["tokens"][:-1]  # the end-of-text token is no text
    assert generated.completion_tokens == answer["tokens_predicted"] and generated.prompt_tokens == answer["tokens_evaluated"]


async def test_llamacpp_generate_at_the_limit_inside_a_character_renders_it_as_the_server_does() -> None:
    client, meter = role()
    answer = recorded("llamacpp", "completion_cjk")
    with respx.mock(base_url=ROOT) as router:
        router.post("/completion").respond(200, json=answer)
        generated = await LlamaCppDialect().generate(client, [5], {"temperature": 0}, 4, None, meter, options={})
    assert generated.finish_reason == "length" and generated.data.decode().endswith("\ufffd")
    assert generated.data == answer["content"].encode() and len(generated.ids or ()) == 4


#: Recorded from llama-server (b1-0c1e570, the tiny target, `n_probs: 1`): greedy steps on ids whose last token,
#: [143, 227, 129], ends one character and begins the next ("こ" is e3 81 93, "と" e3 81 a8).
_STARTS_INSIDE = {
    "content": "\ufffdとて", "tokens": [403, 545, 166], "stop_type": "limit", "tokens_predicted": 3, "tokens_evaluated": 5,
    "completion_probabilities": [{"id": 166, "token": "\ufffdとて", "bytes": [147, 227, 129, 168, 227, 129, 166], "logprob": -0.78, "top_logprobs": []}],
}
_ENDS_INSIDE = {
    "content": "\ufffdとて\ufffd", "tokens": [403, 545, 166, 395], "stop_type": "limit", "tokens_predicted": 4, "tokens_evaluated": 5,
    "completion_probabilities": [{"id": 166, "token": "\ufffdとて", "bytes": [147, 227, 129, 168, 227, 129, 166], "logprob": -0.78, "top_logprobs": []}],
}


async def test_llamacpp_generate_from_inside_a_character_gives_the_bytes_that_finish_it() -> None:
    # `content` shows the first byte (0x93, finishing "こ") as U+FFFD; the listed run has it.
    client, meter = role()
    with respx.mock(base_url=ROOT) as router:
        route = router.post("/completion").respond(200, json=_STARTS_INSIDE)
        generated = await LlamaCppDialect().generate(client, [257, 341, 563, 536, 366], {"temperature": 0}, 3, None, meter, options={})
    assert sent(route)["n_probs"] == 1
    assert generated.data == bytes([147]) + "とて".encode() and generated.ids == (403, 545, 166) and generated.held_back == 0


async def test_llamacpp_generate_that_text_goes_on_from_leaves_out_an_unfinished_last_character() -> None:
    client, meter = role()
    with respx.mock(base_url=ROOT) as router:
        router.post("/completion").respond(200, json=_ENDS_INSIDE)
        going_on = await LlamaCppDialect().generate(client, [366], {"temperature": 0}, 4, None, meter, options={}, whole_characters=True)
        last = await LlamaCppDialect().generate(client, [366], {"temperature": 0}, 4, None, meter, options={})
    assert going_on.data == bytes([147]) + "とて".encode() and going_on.ids == (403, 545, 166)
    assert (going_on.completion_tokens, going_on.held_back, going_on.finish_reason) == (3, 1, "length")
    # The caller's limit ends the text: the server's rendering is the answer, U+FFFD and all.
    assert last.data.endswith("\ufffd".encode()) and last.ids == (403, 545, 166, 395) and last.held_back == 0


async def test_llamacpp_streamed_generate_collects_the_streams_text_and_bill() -> None:
    client, meter = role()
    chunks = [
        {"index": 0, "content": "每一", "tokens": [128], "stop": False, "tokens_predicted": 3, "tokens_evaluated": 6},
        {"index": 0, "content": "", "tokens": [], "stop": True, "stop_type": "limit", "tokens_predicted": 4, "tokens_evaluated": 6},
    ]
    stream = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    with respx.mock(base_url=ROOT) as router:
        route = router.post("/completion").respond(200, text=stream, headers={"content-type": "text/event-stream"})
        generated = await LlamaCppDialect().generate(client, [1, 2], {"temperature": 0}, 4, None, meter, options={}, stream=True)
    assert sent(route)["stream"] is True
    assert generated.data == "每一".encode() and generated.ids is None and generated.finish_reason == "length"
    assert meter.prompt_tokens == 6 and meter.completion_tokens == 4


async def test_llamacpp_unreadable_answer_names_the_role_and_endpoint() -> None:
    client, meter = role()
    with respx.mock(base_url=ROOT) as router:
        router.post("/completion").respond(200, json=[{"index": 0, "content": "x"}, {"index": 1, "content": "y"}])
        with pytest.raises(MalformedResponseError) as caught:
            await LlamaCppDialect().next_tokens(client, [[1], [1, 2]], {}, meter, options={})
    assert "target" in str(caught.value) and "gpu-box" in str(caught.value) and "/completion" in str(caught.value)


# -- vLLM -----------------------------------------------------------------------------------------


async def test_vllm_token_id_batch_is_one_request_with_ids_back() -> None:
    client, meter = role()
    answer = recorded("vllm", "completions_batch")
    for choice in answer["choices"]:  # as asked: return_token_ids
        choice["token_ids"] = [100 + choice["index"]]
    with respx.mock(base_url=ROOT + "/v1") as router:
        route = router.post("/completions").respond(200, json=answer)
        picks = await VllmDialect().next_tokens(client, [[755, 16178], [755, 16178, 1471]], {"temperature": 0}, meter, options={})
    body = sent(route)
    assert body["prompt"] == [[755, 16178], [755, 16178, 1471]] and body["max_tokens"] == 1 and body["return_token_ids"] is True
    assert body["model"] == "m"
    assert [p.id for p in picks] == [100, 101]
    assert [p.data for p in picks] == [c["text"].encode() for c in answer["choices"]]
    assert [p.prompt_tokens for p in picks] == [None, None]  # no prompt_token_ids in this answer: unknown


async def test_vllm_generate_and_tokenize() -> None:
    client, meter = role()
    answer = recorded("vllm", "completions_token_ids")
    with respx.mock(base_url=ROOT) as router:
        gen = router.post("/v1/completions").respond(200, json=answer)
        tok = router.post("/tokenize").respond(200, json=recorded("vllm", "tokenize"))
        generated = await VllmDialect().generate(client, [755, 16178, 1471], {"temperature": 0}, 2, None, meter, options={})
        pieces = await VllmDialect().tokenize(client, "def fib(n", meter, special=False)
    assert sent(gen)["prompt"] == [755, 16178, 1471] and sent(gen)["max_tokens"] == 2
    assert generated.ids == (1680, 198) and generated.data == b"):\n" and generated.finish_reason == "length"
    assert sent(tok) == {"model": "m", "prompt": "def fib(n", "add_special_tokens": False}
    assert [i for i, _ in pieces] == [755, 16178, 1471]


async def test_vllm_sampled_drafts_read_each_position_with_its_listed_ids() -> None:
    client, meter = role()
    with respx.mock(base_url=ROOT + "/v1") as router:
        route = router.post("/completions").respond(200, json=recorded("vllm", "completions_sampled_n"))
        chains = await VllmDialect().sampled_drafts(client, [755, 16178, 1471], 3, {"temperature": 0.7}, 2, 2, meter, options={})
    body = sent(route)
    assert body == {"model": "m", "prompt": [755, 16178, 1471], "max_tokens": 3, "n": 2, "logprobs": 2, "temperature": 0.7,
                    "return_tokens_as_token_ids": True}
    assert [[s.id for s in chain] for chain in chains] == [[1680, 2064, 262], [1680, 128001]]
    second = chains[0][1]
    # The sampled id (outside the two likeliest) is listed with them, at its own log-probability.
    assert second.logprob == -2.9957 and dict(second.listed) == {198: -0.2201, 25: -1.8971, 2064: -2.9957}
    # Choices that do not line up (fewer log-probabilities than tokens) are unreadable, naming the role.
    broken = recorded("vllm", "completions_sampled_n")
    broken["choices"][0]["logprobs"]["token_logprobs"] = [-0.0312]
    with respx.mock(base_url=ROOT + "/v1") as router:
        router.post("/completions").respond(200, json=broken)
        with pytest.raises(MalformedResponseError, match="target"):
            await VllmDialect().sampled_drafts(client, [755], 3, {"temperature": 0.7}, 2, 2, meter, options={})


# -- SGLang ---------------------------------------------------------------------------------------


async def test_sglang_batch_uses_the_radix_cache_and_names_the_seed_its_way() -> None:
    client, meter = role()
    answer = recorded("sglang", "generate_batch")
    with respx.mock(base_url=ROOT) as router:
        route = router.post("/generate").respond(200, json=answer)
        picks = await SglangDialect().next_tokens(client, [[755, 16178], [755, 16178, 1471]], {"temperature": 0.7, "seed": 3}, meter, options={})
    body = sent(route)
    assert body["input_ids"] == [[755, 16178], [755, 16178, 1471]]
    assert body["sampling_params"] == {"temperature": 0.7, "sampling_seed": 3, "max_new_tokens": 1}
    assert "return_logprob" not in body  # with it, logprob_start_len decides how much of the cache is read
    assert [p.id for p in picks] == [1471, 1680] and [p.data for p in picks] == [b"(n", b"):"]
    assert meter.prompt_tokens == 5 and meter.completion_tokens == 2


async def test_sglang_tokenizes_through_generate_without_the_tokens_it_adds() -> None:
    client, meter = role()

    def answer(request: Any) -> Any:
        text = json.loads(request.content)["text"]
        ids = [1] + [ord(c) for c in text]  # the server adds 1 (BOS) to every text
        items = [[None, i, None if i == 1 else chr(i)] for i in ids]
        return respx.MockResponse(200, json={"text": "", "output_ids": [], "meta_info": {
            "prompt_tokens": len(ids), "completion_tokens": 0, "finish_reason": {"type": "length", "length": 0},
            "input_token_logprobs": items}})  # fmt: skip

    with respx.mock(base_url=ROOT) as router:
        route = router.post("/generate").mock(side_effect=answer)
        plain = await SglangDialect().tokenize(client, "xy", meter, special=False)
        special = await SglangDialect().tokenize(client, "xy", meter, special=True)
    assert plain == [(ord("x"), b"x"), (ord("y"), b"y")] and [i for i, _ in special] == [1, ord("x"), ord("y")]
    body = json.loads(route.calls[0].request.content)
    assert body["sampling_params"] == {"max_new_tokens": 0} and body["logprob_start_len"] == 0


async def test_sglang_generate_reads_meta_info() -> None:
    client, meter = role()
    answer = recorded("sglang", "generate_input_ids")
    with respx.mock(base_url=ROOT) as router:
        router.post("/generate").respond(200, json=answer)
        generated = await SglangDialect().generate(client, [755, 16178, 1471], {"temperature": 0}, 2, None, meter, options={})
    assert generated.ids == (1680, 198) and generated.data == b"):\n"
    assert generated.finish_reason == "length" and generated.prompt_tokens == 3 and generated.completion_tokens == 2


# -- OpenAI formats: every body specapi sends, built from typed inputs ---------------------------------
#
# The bodies below are asserted whole and in key order (the bytes on the wire), against the spellings
# of providers.md and docs/verification.md: completions take `logprobs` as the list length and `echo`;
# chat takes `logprobs: true` + `top_logprobs` (up to 20); vLLM and SGLang continue a final assistant
# message with `continue_final_message: true` + `add_generation_prompt: false`, llama-server by itself;
# vLLM scores a prompt with `prompt_logprobs` and names its tokens with `return_token_ids`.

from specapi.core.acceptance import SamplingParams  # noqa: E402
from specapi.core.context import Context  # noqa: E402
from specapi.dialects.base import reading  # noqa: E402
from specapi.dialects.logprobs import WireError  # noqa: E402
from specapi.dialects.openai import (  # noqa: E402
    CONTINUE_FINAL_MESSAGE,
    OPENAI_LIST_CAP,
    TRAILING,
    DraftShape,
    Prefill,
    chat_request,
    completion_request,
    generation_request,
    next_token_request,
    sampling_fields,
    shorter_lists,
)
from specapi.dialects.vllm import prompt_scores_probe, prompt_scores_request, read_prompt_scores, scores_prompt  # noqa: E402

PROMPT = "中文 😀 e\u0301 "
MESSAGES = ({"role": "user", "content": "Say 中文 😀"},)


def sampled(**extras: Any) -> Context:
    return Context(prompt=PROMPT, accepted="日本", sampling=SamplingParams(temperature=0.7, top_p=0.9), extras=extras)


def chat(accepted: str = "", **sampling: Any) -> Context:
    return Context(messages=MESSAGES, accepted=accepted, sampling=SamplingParams(**sampling))


def ordered(body: dict[str, Any]) -> list[tuple[str, Any]]:
    return list(body.items())


def test_sampling_fields_give_the_target_every_extra_and_the_draft_only_temperature_top_p_seed() -> None:
    context = sampled(top_k=40, repeat_penalty=1.0)
    assert ordered(sampling_fields(context, 7)) == [("top_k", 40), ("repeat_penalty", 1.0), ("temperature", 0.7), ("top_p", 0.9), ("seed", 7)]
    assert ordered(sampling_fields(context, None, target=False)) == [("temperature", 0.7), ("top_p", 0.9)]
    point_mass = Context(prompt=PROMPT, sampling=SamplingParams(temperature=0.7, top_p=0.9, point_mass_draft=True))
    assert sampling_fields(point_mass, 3, target=False) == {"temperature": 0.0, "seed": 3}  # the draft's most likely tokens
    assert sampling_fields(Context(prompt=PROMPT), None) == {"temperature": 1.0}  # top_p 1 is not sent


def test_echo_verification_body_scores_prompt_and_draft_in_one_completions_request() -> None:
    context = sampled()
    path, body = completion_request(context.completion_prompt("語😀"), 1, sampling_fields(context, 11), top_k=20, echo=True)
    assert path == "/completions"
    assert ordered(body) == [
        ("prompt", PROMPT + "日本語😀"), ("echo", True), ("logprobs", 20), ("max_tokens", 1),
        ("temperature", 0.7), ("top_p", 0.9), ("seed", 11),
    ]  # fmt: skip


def test_generation_bodies_for_completions_and_for_chat_by_prefill_style() -> None:
    path, body = generation_request(sampled(), 16, 5, ["\n\n"])
    assert path == "/completions"
    assert ordered(body) == [("temperature", 0.7), ("top_p", 0.9), ("seed", 5), ("max_tokens", 16), ("stop", ["\n\n"]), ("prompt", PROMPT + "日本")]
    # vLLM / SGLang: the flags continue the assistant's text; no limit sent when the caller set none.
    path, body = generation_request(chat("中", temperature=0.0), None, None, None, Prefill())
    assert path == "/chat/completions"
    assert ordered(body) == [
        ("temperature", 0.0),
        ("messages", [*MESSAGES, {"role": "assistant", "content": "中"}]),
        (CONTINUE_FINAL_MESSAGE, True),
        ("add_generation_prompt", False),
    ]
    # llama-server continues a final assistant message by itself: no flags.
    _, body = generation_request(chat("中", temperature=0.0), 4, None, None, Prefill(style=TRAILING, echoes_prefix=True))
    assert CONTINUE_FINAL_MESSAGE not in body and "add_generation_prompt" not in body
    # Nothing accepted yet: a fresh assistant turn, no flags whatever the style.
    assert CONTINUE_FINAL_MESSAGE not in generation_request(chat(temperature=0.0), 4, None, None)[1]


def test_generation_asks_logprobs_to_count_tokens_and_the_bill_at_a_streams_end() -> None:
    _, body = generation_request(sampled(), 8, None, None, count_tokens=True, stream_usage=True)
    assert body["logprobs"] == 1 and body["stream_options"] == {"include_usage": True} and "echo" not in body
    _, body = generation_request(chat("x", temperature=0.5), 8, None, None, count_tokens=True)
    assert (body["logprobs"], "top_logprobs" in body, "stream_options" in body) == (True, False, False)


def test_next_token_bodies_cap_lists_where_each_format_caps_them() -> None:
    path, body = next_token_request(sampled(), "語", 20, 3)
    assert path == "/completions"
    assert ordered(body) == [("max_tokens", 1), ("temperature", 0.7), ("top_p", 0.9), ("seed", 3), ("prompt", PROMPT + "日本語"), ("logprobs", 5)]
    path, body = next_token_request(chat("日", temperature=0.0), "本", 50, None)
    assert path == "/chat/completions"
    assert ordered(body) == [
        ("max_tokens", 1), ("temperature", 0.0),
        ("messages", [*MESSAGES, {"role": "assistant", "content": "日本"}]),
        (CONTINUE_FINAL_MESSAGE, True), ("add_generation_prompt", False),
        ("logprobs", True), ("top_logprobs", 20),
    ]  # fmt: skip


def test_vllm_prompt_scores_body_and_reading_its_answer() -> None:
    context = chat("日", temperature=0.8, top_p=0.95)
    path, body = prompt_scores_request(context, "本😀", 8, 21)
    assert path == "/chat/completions"
    assert ordered(body) == [
        ("messages", [*MESSAGES, {"role": "assistant", "content": "日本😀"}]),
        ("max_tokens", 1), ("logprobs", True), ("top_logprobs", 8), ("prompt_logprobs", 8), ("return_token_ids", True),
        ("temperature", 0.8), ("top_p", 0.95), ("seed", 21),
        (CONTINUE_FINAL_MESSAGE, True), ("add_generation_prompt", False),
    ]  # fmt: skip
    # Nothing to continue (no accepted text, no draft): a fresh assistant turn, no flags.
    assert CONTINUE_FINAL_MESSAGE not in prompt_scores_request(chat(), "", 1, None)[1]
    answer = {
        "choices": [{"index": 0, "message": {"content": "!"}, "logprobs": {"content": [{"token": "!", "logprob": -0.5, "top_logprobs": []}]}}],
        "prompt_logprobs": [None, {"7": {"logprob": -1.0, "rank": 1, "decoded_token": "日"}, "9": {"logprob": -2.0, "rank": 2, "decoded_token": "月"}}],
        "prompt_token_ids": [1, 7],
    }
    scored, generated, choice = read_prompt_scores(answer)
    assert [(t.text, t.logprob, t.top) for t in scored] == [("", None, None), ("日", -1.0, {"月": -2.0})]
    assert [t.text for t in generated] == ["!"] and choice is answer["choices"][0]
    assert scores_prompt(answer) and not scores_prompt({**answer, "prompt_token_ids": [1]}) and not scores_prompt(None)
    with pytest.raises(WireError):
        read_prompt_scores({**answer, "prompt_token_ids": None})


def test_probe_bodies() -> None:
    assert completion_request("a b", 1, {"temperature": 0}, top_k=5) == ("/completions", {"prompt": "a b", "logprobs": 5, "max_tokens": 1, "temperature": 0})
    path, body = chat_request(MESSAGES, 2, {"temperature": 0}, prediction="a b")
    assert (path, ordered(body)) == (
        "/chat/completions",
        [("messages", list(MESSAGES)), ("max_tokens", 2), ("temperature", 0), ("prediction", {"type": "content", "content": "a b"})],
    )
    assert ordered(chat_request(MESSAGES, 1, {"temperature": 0}, top_k=20)[1])[2:] == [("logprobs", True), ("top_logprobs", 20), ("temperature", 0)]
    _, body = prompt_scores_probe(MESSAGES)
    assert ordered(body)[1:] == [
        ("max_tokens", 1), ("temperature", 0), (CONTINUE_FINAL_MESSAGE, True), ("add_generation_prompt", False),
        ("prompt_logprobs", 1), ("return_token_ids", True),
    ]  # fmt: skip


def test_draft_shape_learns_from_refusals_what_the_draft_endpoint_takes() -> None:
    context = sampled()
    shape = DraftShape()
    form, body = shape.request(context, 8, 20, 4)
    assert form.path == "/completions"
    assert ordered(body) == [("prompt", PROMPT + "日本"), ("logprobs", 20), ("max_tokens", 8), ("temperature", 0.7), ("top_p", 0.9), ("seed", 4)]
    # A completions refusal (a chat-only model): chat from then on, the prompt as the assistant's text.
    chat_only = shape.after_refusal(form, refused_shape=False, not_served=True)
    assert chat_only == DraftShape(completions=False)
    form, body = chat_only.request(context, 8, 20, 4)
    assert form.path == "/chat/completions"
    assert ordered(body) == [
        ("messages", [{"role": "assistant", "content": PROMPT + "日本"}]),
        (CONTINUE_FINAL_MESSAGE, True), ("add_generation_prompt", False),
        ("logprobs", True), ("top_logprobs", 20),
        ("max_tokens", 8), ("temperature", 0.7), ("top_p", 0.9), ("seed", 4),
    ]  # fmt: skip
    # The flags refused: the endpoint continues by itself; refused again: nothing left to try.
    trailing = chat_only.after_refusal(form, refused_shape=True, not_served=False)
    assert trailing == DraftShape(completions=False, prefill=Prefill(style=TRAILING))
    assert CONTINUE_FINAL_MESSAGE not in trailing.request(context, 8, 20, 4)[1]
    assert trailing.after_refusal(form, refused_shape=True, not_served=False) is None
    # Lists longer than OpenAI's cap are shortened once; lists within it are left alone.
    assert shorter_lists(form, body) == {**body, "top_logprobs": OPENAI_LIST_CAP}
    assert shorter_lists(form, {**body, "top_logprobs": 5}) is None


async def test_reading_maps_every_unreadable_answer_to_the_roles_malformed_error() -> None:
    client, _ = role()
    for exc in (KeyError("choices"), IndexError("list index"), TypeError("not a string"), WireError("arrays disagree"), AttributeError("get")):
        with pytest.raises(MalformedResponseError) as caught:
            with reading(client, "echo"):
                raise exc
        assert caught.value.role == "target" and "gpu-box:8080" in str(caught.value) and "echo response is unreadable" in str(caught.value)
        assert caught.value.__cause__ is exc
    with pytest.raises(RuntimeError):  # not about the answer: not a malformed response
        with reading(client, "echo"):
            raise RuntimeError("bug")


def test_generation_with_a_prediction_sends_it_as_predicted_outputs_and_an_empty_one_not_at_all() -> None:
    path, body = generation_request(chat(temperature=0.0), 32, None, None, prediction="def 函数():")
    assert path == "/chat/completions"
    assert ordered(body)[-1] == ("prediction", {"type": "content", "content": "def 函数():"})
    assert "prediction" not in generation_request(chat(temperature=0.0), 32, None, None, prediction="")[1]


async def test_vllm_pick_of_a_token_inside_a_character_has_unknown_bytes() -> None:
    """vLLM renders a generated token that holds part of a character as "" and holds its bytes back from
    the text (seen on the real server): the pick's bytes are unknown, not empty."""
    client, meter = role()
    answer = recorded("vllm", "completions_token_ids")
    choice = answer["choices"][0]
    choice.update(text="", token_ids=[3635], logprobs={"text_offset": [0], "token_logprobs": [-0.5], "tokens": [""], "top_logprobs": [{"": -0.5}]})
    with respx.mock(base_url=ROOT + "/v1") as router:
        router.post("/completions").respond(200, json=answer)
        (pick,) = await VllmDialect().next_tokens(client, [[755, 16178]], {"temperature": 0}, meter, options={})
    assert pick.id == 3635 and pick.data is None and not pick.end


async def test_vllm_pick_after_a_prompt_ending_inside_a_character_never_takes_the_text() -> None:
    """After a token-id prompt that ends inside a character, vLLM's text starts with the prompt's own text
    again (seen on the real server: "Python 是一种…" came back inside the answer); the token's own rendering
    holds no whole character, so the pick's bytes are unknown, never the text."""
    client, meter = role()
    answer = recorded("vllm", "completions_token_ids")
    choice = answer["choices"][0]
    choice.update(text="Python 是一种解释型语言。稇", token_ids=[3635],
                  logprobs={"text_offset": [0], "token_logprobs": [-0.5], "tokens": ["\ufffd稇"], "top_logprobs": [{"\ufffd稇": -0.5}]})
    with respx.mock(base_url=ROOT + "/v1") as router:
        router.post("/completions").respond(200, json=answer)
        (pick,) = await VllmDialect().next_tokens(client, [[755, 16178]], {"temperature": 0}, meter, options={})
    assert pick.id == 3635 and pick.data is None and not pick.end


async def test_vllm_pick_of_a_special_token_writes_nothing() -> None:
    """A special token other than the end (generated mid-text) is listed by its name but left out of the
    text by vLLM (skip_special_tokens, seen on the real server): the pick writes nothing."""
    client, meter = role()
    answer = recorded("vllm", "completions_token_ids")
    answer["choices"][0].update(text="", token_ids=[0], logprobs={"text_offset": [0], "token_logprobs": [-0.5], "tokens": ["<|endoftext|>"], "top_logprobs": [{"<|endoftext|>": -0.5}]})
    with respx.mock(base_url=ROOT + "/v1") as router:
        router.post("/completions").respond(200, json=answer)
        (pick,) = await VllmDialect().next_tokens(client, [[755, 16178]], {"temperature": 0}, meter, options={})
    assert pick.id == 0 and pick.data == b"" and not pick.end


async def test_vllm_step_the_text_goes_on_from_leaves_out_the_tokens_of_an_unfinished_character() -> None:
    """vLLM holds an unfinished last character's bytes back from a completion's text (no U+FFFD there) and
    renders its tokens as "": such tokens are left out of a step the text goes on from, to be drawn again
    by the next step. Kept, the next step's prompt would end inside a character, and vLLM's text for such
    a prompt starts with the prompt's own text again. (The answer below is the real server's: the trained
    tiny target after "    \\n" and "れ".)"""
    client, meter = role()
    ids = [167, 167, 167, 106, 234, 239, 167, 167]
    rendered = ["", "", "", "", "樇", "", "", ""]
    answer = {
        "id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "text": "��樇", "finish_reason": "length", "token_ids": ids,
                     "logprobs": {"tokens": rendered, "token_logprobs": [-0.1] * 8, "top_logprobs": None, "text_offset": [0] * 8}}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13},
    }  # fmt: skip
    with respx.mock(base_url=ROOT + "/v1") as router:
        route = router.post("/completions").respond(200, json=answer)
        step = await VllmDialect().generate(client, [0, 262, 203, 704, 239], {"temperature": 0}, 8, None, meter, options={}, whole_characters=True)
        last = await VllmDialect().generate(client, [0, 262, 203, 704, 239], {"temperature": 0}, 8, None, meter, options={})
    first, second = (json.loads(call.request.content) for call in route.calls)
    assert first["logprobs"] == 0 and "logprobs" not in second  # the renderings tell which tokens are held back
    assert step.ids == (167, 167, 167, 106, 234) and step.data == "��樇".encode() and step.held_back == 3
    assert step.completion_tokens == 5 and step.finish_reason == "length"
    # The caller's last step ends as the server renders it: every token it generated.
    assert last.ids == tuple(ids) and last.completion_tokens == 8 and last.held_back == 0
