"""Conformance on the real llama-server: specapi's response to a request is the target alone's.

The oracle is the same llama-server answering the same request through the plain SDK
(`openai.AsyncOpenAI`). Compared: text, finish_reason and usage, completions and chat, plain and
streamed, on each verification path llama-server serves (the default, token ids, prefill-fanout), with
a fixed draft length so that rounds run. To cover another parameter, add a `Case`.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from real_helpers import Server, ServerPair
from specapi import AsyncSpeculativeOpenAI
from test_conformance import Case, Observed, observe

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


async def _greedy_text(pair: ServerPair, chat: bool) -> str:
    alone = openai.AsyncOpenAI(base_url=pair.target.base_url, api_key="sk-none", max_retries=0)
    try:
        if chat:
            response = await alone.chat.completions.create(model=pair.target.model, messages=MESSAGES, max_tokens=40, temperature=0)
            return response.choices[0].message.content or ""
        return (await alone.completions.create(model=pair.target.model, prompt=PROMPT, max_tokens=40, temperature=0)).choices[0].text
    finally:
        await alone.close()


def _stop_cases(text: str) -> list[Case]:
    """Stop strings that end the greedy text inside it (a piece from its middle, as a user would pick)."""
    middle = text[len(text) // 2 :].strip()
    assert len(middle) >= 4, text
    return [Case("stop-mid-text", {"max_tokens": 40, "temperature": 0, "stop": middle[:3]}), Case("max_tokens", {"max_tokens": 24, "temperature": 0})]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("verification", PATHS)
async def test_completions_match_llama_server_alone(ls: ServerPair, verification: str, stream: bool) -> None:
    for case in _stop_cases(await _greedy_text(ls, False)):
        got, expected = await _compare(ls, verification, False, stream, case.args)
        assert not got.differences(expected), case.name


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("verification", CHAT_PATHS)
async def test_chat_matches_llama_server_alone(ls: ServerPair, verification: str, stream: bool) -> None:
    for case in _stop_cases(await _greedy_text(ls, True)):
        got, expected = await _compare(ls, verification, True, stream, case.args)
        assert not got.differences(expected), case.name


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_a_default_penalty_keeps_the_target_alone(ls_penalised: Server, ls: ServerPair, chat: bool) -> None:
    """A server started with `--frequency-penalty 0.3` applies it to every request that sets none: its
    text is not what verification scores, so the target alone answers, and says why."""
    pair = ServerPair(ls_penalised, ls.draft)
    got, expected = await _compare(pair, "auto", chat, False, {"max_tokens": 40, "temperature": 0})
    assert not got.differences(expected)
    client = AsyncSpeculativeOpenAI(target=ls_penalised.endpoint(), draft=ls.draft.endpoint(), policy="fixed", drafter="model")
    try:
        if chat:
            response = await client.chat.completions.create(messages=MESSAGES, max_tokens=40, temperature=0)
        else:
            response = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0)
    finally:
        await client.close()
    assert not response.speculative.rounds
    assert "frequency_penalty 0.3" in (response.speculative.fallback_reason or "")


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("verification", ["auto", "token-ids"])
async def test_a_stream_without_stream_options_ends_as_llama_servers(ls: ServerPair, verification: str, chat: bool) -> None:
    """llama-server ends a completions stream with the usage though nobody asked (on the chunk with the
    finish_reason), a chat stream without: specapi's stream ends the same way. (The probe learns which
    server it is: a completions path forced without probing, such as prefill-fanout, does not know.)"""
    got, expected = await _compare(ls, verification, chat, True, {"max_tokens": 24, "temperature": 0}, ask_usage=False)
    assert (expected.usage is None) == chat  # what this llama-server does
    assert not got.differences(expected)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_the_context_end_as_llama_server_alone(ls: ServerPair, chat: bool, stream: bool) -> None:
    """A prompt near the end of the slot's context (1,024 tokens) and a max_tokens past it: llama-server
    alone writes up to the window and says "length" with the tokens it wrote; so does specapi, with the
    same count (not max_tokens). The probe learns the window from `/props`."""
    long = "Speculative decoding " * 90  # about 990 tokens
    args = {"max_tokens": 200, "temperature": 0, **({"messages": [{"role": "user", "content": long}]} if chat else {"prompt": long})}
    got, expected = await _compare(ls, "auto", chat, stream, args)
    assert expected.finish_reasons == ("length",) and expected.usage is not None and expected.usage[1] < 200
    assert not got.differences(expected)


@pytest.mark.parametrize("prompt", ["short", "near-the-window"])
async def test_completions_without_max_tokens_as_llama_server_alone(ls: ServerPair, prompt: str) -> None:
    """No max_tokens: llama-server's own default (n_predict -1) runs to the end of text or of the context,
    where OpenAI's would stop at 16; specapi leaves it to the server on every round."""
    text = PROMPT if prompt == "short" else "Speculative decoding " * 90
    for verification in ("auto", "token-ids"):
        got, expected = await _compare(ls, verification, False, False, {"prompt": text, "temperature": 0})
        assert expected.usage is not None and expected.usage[1] > 16
        assert not got.differences(expected)
