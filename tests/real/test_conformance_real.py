"""Conformance on the real llama-server: specapi's response to a request is the target alone's.

The oracle is the same llama-server answering the same request through the plain SDK
(`openai.AsyncOpenAI`). Compared: text, finish_reason and usage, completions and chat, plain and
streamed, on each verification path llama-server serves (the default, token ids, prefill-fanout), with
a fixed draft length so that rounds run. The matrix (tests/conformance_matrix.py: every parameter of
the SDK's `create` and the llama.cpp extras) runs through the default client, a fixed draft length,
`token-ids` and `prefill-fanout`, greedy, plain and streamed. Penalties, which speculate here, are
checked against the server's own distributions too.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import openai
import pytest
import pytest_asyncio

from conformance_matrix import PER_CHOICE, ROWS, Row, request_args
from real_helpers import Server, ServerPair, greedy_text
from specapi import AsyncSpeculativeOpenAI
from test_conformance import Case, Observed, compare_with, observe

PROMPT = "def fibonacci(n):"
MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]
PATHS = ("auto", "token-ids", "prefill-fanout")
CHAT_PATHS = ("auto", "prefill-fanout")


async def _compare(
    pair: ServerPair, verification: str, chat: bool, stream: bool, args: dict[str, Any], *, ask_usage: bool = True
) -> tuple[Observed, Observed]:
    request = {**({"messages": MESSAGES} if chat else {"prompt": PROMPT}), **args}
    if stream and ask_usage:
        request["stream_options"] = {"include_usage": True}
    alone = openai.AsyncOpenAI(base_url=pair.target.base_url, api_key="sk-none", max_retries=0)
    client = AsyncSpeculativeOpenAI(
        target=pair.target.endpoint(), draft=pair.draft.endpoint(), verification=verification, policy="fixed", drafter="model", pipeline=False
    )
    try:
        expected = await observe(alone.chat.completions.create if chat else alone.completions.create, chat, stream, model=pair.target.model, **request)
        got = await observe(client.chat.completions.create if chat else client.completions.create, chat, stream, **request)
    finally:
        await client.close()
        await alone.close()
    return got, expected


def _stop_cases(text: str) -> list[Case]:
    """Stop strings that end the greedy text inside it (a piece from its middle, as a user would pick)."""
    middle = text[len(text) // 2 :].strip()
    assert len(middle) >= 4, text
    return [Case("stop-mid-text", {"max_tokens": 40, "temperature": 0, "stop": middle[:3]}), Case("max_tokens", {"max_tokens": 24, "temperature": 0})]


async def greedy_text_of(pair: ServerPair, chat: bool) -> str:
    """The target alone's greedy text for the module's request."""
    return await greedy_text(pair.target, chat, messages=MESSAGES, prompt=PROMPT, max_tokens=40)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("verification", PATHS)
async def test_completions_match_llama_server_alone(ls: ServerPair, verification: str, stream: bool) -> None:
    for case in _stop_cases(await greedy_text_of(ls, False)):
        got, expected = await _compare(ls, verification, False, stream, case.args)
        assert not got.differences(expected), case.name


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("verification", CHAT_PATHS)
async def test_chat_matches_llama_server_alone(ls: ServerPair, verification: str, stream: bool) -> None:
    for case in _stop_cases(await greedy_text_of(ls, True)):
        got, expected = await _compare(ls, verification, True, stream, case.args)
        assert not got.differences(expected), case.name


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_a_default_penalty_speculates_as_llama_server_alone(ls_penalised: Server, ls: ServerPair, chat: bool) -> None:
    """A server started with `--frequency-penalty 0.3` applies it to every request that sets none; it
    counts the prompt in it, so a verification call is penalised as the target alone is: speculated."""
    pair = ServerPair(ls_penalised, ls.draft)
    got, expected = await _compare(pair, "auto", chat, False, {"max_tokens": 40, "temperature": 0})
    assert not got.differences(expected)
    assert got.speculative.fallback_reason is None and sum(r.accepted for r in got.speculative.rounds) > 0


PENALTIES = [{"frequency_penalty": 0.5}, {"presence_penalty": 0.7}, {"extra_body": {"repeat_penalty": 1.3, "repeat_last_n": 16}}]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_penalties_speculate_and_answer_as_llama_server_alone(ls: ServerPair, chat: bool, stream: bool) -> None:
    """The caller's penalties, greedy, on each forced path: the target alone's text, and rounds that keep
    draft tokens (on this build a greedy request's text does not change with penalties: the sampled
    distributions are checked against the server below)."""
    for penalty in PENALTIES:
        for verification in ("token-ids", "prefill-fanout"):
            got, expected = await _compare(ls, verification, chat, stream, {"max_tokens": 24, "temperature": 0, **penalty})
            assert not got.differences(expected), (penalty, verification)
            stats = got.speculative
            assert stats.fallback_reason is None and sum(r.accepted for r in stats.rounds) > 0, (penalty, verification, stats.fallback_reason)


async def test_llama_server_penalises_a_call_on_its_own_output_as_it_penalised_that_output(ls: ServerPair) -> None:
    """What makes penalties exact on llama-server (docs/verification.md): one generation's distribution at
    position j + 1 (after its sampler chain: `post_sampling_probs`), and a one-token call whose prompt is
    the prompt and the first j generated tokens, are the same distribution; without the penalty they are
    not (the penalty counts the prompt: position 1 differs too)."""
    import httpx2

    root = ls.target.root
    async with httpx2.AsyncClient(timeout=60) as http:
        ids = (await http.post(root + "/tokenize", json={"content": PROMPT, "add_special": True})).json()["tokens"]
        common = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "n_probs": 8, "post_sampling_probs": True, "return_tokens": True}
        penalty = {"frequency_penalty": 1.5, "presence_penalty": 0.5, "repeat_penalty": 1.3}
        whole = (await http.post(root + "/completion", json={"prompt": ids, "n_predict": 8, "seed": 3, **common, **penalty})).json()
        tokens, entries = whole["tokens"], whole["completion_probabilities"]
        aligned = 0
        for j, entry in enumerate(entries):
            if j >= len(tokens) or entry.get("id") != tokens[j]:
                break  # an entry merging a character's tokens: positions no longer line up
            one = {"prompt": ids + tokens[:j], "n_predict": 1, "seed": 1, **common}
            with_penalty = (await http.post(root + "/completion", json={**one, **penalty})).json()["completion_probabilities"][0]
            without = (await http.post(root + "/completion", json=one)).json()["completion_probabilities"][0]
            assert _distribution(with_penalty) == _distribution(entry), j
            assert _distribution(without) != _distribution(entry), j
            aligned += 1
    assert aligned >= 4


def _distribution(entry: dict[str, Any]) -> dict[int, float]:
    return {t["id"]: round(t["prob"], 5) for t in entry["top_probs"]}


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("verification", ["auto", "token-ids", "prefill-fanout"])
async def test_a_stream_without_stream_options_ends_as_llama_servers(ls: ServerPair, verification: str, chat: bool) -> None:
    """llama-server ends a completions stream with the usage though nobody asked (on the chunk with the
    finish_reason), a chat stream without: specapi's stream ends the same way. (The probe learns which
    server it is; a completions path forced without probing, prefill-fanout, from the probe's GETs.)"""
    got, expected = await _compare(ls, verification, chat, True, {"max_tokens": 24, "temperature": 0}, ask_usage=False)
    assert (expected.usage is None) == chat  # what this llama-server does
    assert not got.differences(expected)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_the_context_end_as_llama_server_alone(ls: ServerPair, chat: bool, stream: bool) -> None:
    """A prompt near the end of the slot's context (1,024 tokens) and a max_tokens past it: llama-server
    alone writes up to the window and says "length" with the tokens it wrote; so does specapi, with the
    same count (not max_tokens). The probe learns the window from `/props`; a path forced without the
    probe (prefill-fanout on completions) learns it from the same GET."""
    long = "Speculative decoding " * 90  # about 990 tokens
    args = {"max_tokens": 200, "temperature": 0, **({"messages": [{"role": "user", "content": long}]} if chat else {"prompt": long})}
    for verification in ("auto", "prefill-fanout"):
        got, expected = await _compare(ls, verification, chat, stream, args)
        assert expected.finish_reasons == ("length",) and expected.usage is not None and expected.usage[1] < 200
        assert not got.differences(expected), verification


@pytest.mark.parametrize("prompt", ["short", "near-the-window"])
async def test_completions_without_max_tokens_as_llama_server_alone(ls: ServerPair, prompt: str) -> None:
    """No max_tokens: llama-server's own default (n_predict -1) runs to the end of text or of the context,
    where OpenAI's would stop at 16; specapi leaves it to the server on every round."""
    text = PROMPT if prompt == "short" else "Speculative decoding " * 90
    for verification in ("auto", "token-ids", "prefill-fanout"):  # prefill-fanout: forced, without the probe
        got, expected = await _compare(ls, verification, False, False, {"prompt": text, "temperature": 0})
        assert expected.usage is not None and expected.usage[1] > 16
        assert not got.differences(expected)


# -- the matrix (tests/conformance_matrix.py): every parameter, greedy, on each path ---------------------

#: The clients the matrix runs each row through: the default client (auto verification, the adaptive
#: policy), a fixed draft length, and the two forced paths.
MATRIX_CLIENTS: dict[str, dict[str, Any]] = {
    "default": {},
    "fixed K": {"policy": "fixed", "num_speculative_tokens": 4},
    "token-ids": {"verification": "token-ids", "policy": "fixed"},
    "prefill-fanout": {"verification": "prefill-fanout", "policy": "fixed"},
}
MATRIX_LIMIT = 10


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def matrix(ls: ServerPair) -> Any:
    """The SDK's client, specapi's clients (shared by the rows: a client's setup costs more than a
    request to a tiny model), and what the rows' callables read (`conformance_matrix.request_args`)."""
    alone = openai.AsyncOpenAI(base_url=ls.target.base_url, api_key="sk-none", max_retries=0)
    clients = {name: AsyncSpeculativeOpenAI(target=ls.target.endpoint(), draft=ls.draft.endpoint(), **options) for name, options in MATRIX_CLIENTS.items()}
    known = {}
    for chat in (False, True):
        base = {"messages": MESSAGES} if chat else {"prompt": PROMPT}
        create = alone.chat.completions.create if chat else alone.completions.create
        response = await create(model=ls.target.model, max_tokens=MATRIX_LIMIT, temperature=0, **base)
        text = (response.choices[0].message.content or "") if chat else response.choices[0].text
        middle = text[len(text) // 2 :].strip()
        assert len(middle) >= 3, text
        known["chat" if chat else "completions"] = {"model": ls.target.model, **base, "stop_word": middle[:2]}
    yield alone, clients, known
    for client in clients.values():
        await client.close()
    await alone.close()


def _row_id(row: Row) -> str:
    return f"{row.resource}-{row.parameter}-{row.shown}"[:60]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("row", [r for r in ROWS if r.llama is not None], ids=_row_id)
async def test_the_matrix_on_llama_server(ls: ServerPair, matrix: Any, row: Row) -> None:
    """Each row, greedy, plain and streamed, through each client: the outcome the matrix shows. A row the
    client hands to the target alone from its arguments alone (before any path is chosen) is the same
    whichever the path: checked through the default client."""
    alone, clients, known = matrix
    outcome = row.llama
    assert outcome is not None
    chat = row.resource == "chat"
    base = {"messages": MESSAGES} if chat else {"prompt": PROMPT}
    request = request_args(row, {**base, "max_tokens": MATRIX_LIMIT, "temperature": 0}, known[row.resource])
    names = ["default"] if outcome.kind == "target alone" else list(MATRIX_CLIENTS)
    for stream in (mode == "stream" for mode in row.modes):
        for name in names:
            got, expected = await compare_with(clients[name], alone, ls.target.model, chat, stream, request)
            if outcome is PER_CHOICE:  # usage: the prompt once, every choice's tokens (greedy: the one-choice answer's)
                create = alone.chat.completions.create if chat else alone.completions.create
                one = (await observe(create, chat, False, **{"model": ls.target.model, **request, "n": 1})).usage
                assert one is not None and got.usage == (one[0], request["n"] * one[1]), (name, stream, got.usage, one)
                got = replace(got, usage=expected.usage)
            assert not got.differences(expected), (name, stream, got.differences(expected))
            if outcome.kind == "target alone":
                stats = got.speculative
                assert stats is not None and not stats.rounds and outcome.detail in (stats.fallback_reason or ""), (name, stream)


async def test_cache_prompt_off_speculates_as_llama_server_alone(ls: ServerPair) -> None:
    """`cache_prompt: false` leaves the text alone: it goes with every verification call, and speculates."""
    got, expected = await _compare(ls, "token-ids", False, False, {"max_tokens": 24, "temperature": 0, "extra_body": {"cache_prompt": False}})
    assert not got.differences(expected)
    assert got.speculative.fallback_reason is None and sum(r.accepted for r in got.speculative.rounds) > 0
