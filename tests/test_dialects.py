"""Each native dialect builds the body its server takes and reads the answers its server gives.

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
from specapi._calls import Meter, RoleClient
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
