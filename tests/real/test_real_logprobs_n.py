"""`n` > 1 and the caller's logprobs on the real llama-server, greedy, against its own answers.

`n`: llama-server answers `n` choices itself (checked here); through specapi each choice is its own
speculative run, and every choice's text equals the server's. Its own `usage` for `n` > 1 holds the
counts of one of its tasks (which one varies between runs), so specapi bills as OpenAI and vLLM do: the
prompt once, every choice's tokens.

logprobs: llama-server lists one logprobs entry per character, not per token (a token that completes a
character carries the character's bytes, the tokens before it have no entry), and it verifies by
fan-out or token ids, whose picks carry no caller-sized lists: the target alone answers, with its own
logprobs, and the response says why.
"""

from __future__ import annotations

from typing import Any

import pytest

from real_helpers import ServerPair, client_for, oracle_post, oracle_stream

PROMPT = "def fibonacci(n):\n    if n < 2:\n        return n\n"
ZH_PROMPT = "你好，请介绍一下你自己。我是"
MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]


def _texts(data: Any) -> list[str]:
    return [c["message"]["content"] if "message" in c else c["text"] for c in sorted(data["choices"], key=lambda c: c["index"])]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_greedy_choices_equal_llama_servers_own(ls: ServerPair, chat: bool) -> None:
    request: dict[str, Any] = {"max_tokens": 40, "temperature": 0, "n": 2}
    request |= {"messages": MESSAGES} if chat else {"prompt": PROMPT}
    own = await oracle_post(ls.target, "/chat/completions" if chat else "/completions", request)
    assert len(own["choices"]) == 2  # llama-server serves n itself
    async with client_for(ls, policy="fixed", num_speculative_tokens=4) as client:
        create = client.chat.completions.create if chat else client.completions.create
        got = await create(**request)
    assert [c.index for c in got.choices] == [0, 1]
    assert _texts(got.model_dump()) == _texts(own)
    assert [c.finish_reason for c in got.choices] == [c["finish_reason"] for c in sorted(own["choices"], key=lambda c: c["index"])]
    s = got.speculative
    assert s.speculated and s.accepted_tokens > 0 and s.exact, s.fallback_reason
    # Billed as OpenAI and vLLM bill n: the prompt once, both choices' tokens.
    assert got.usage.prompt_tokens == own["usage"]["prompt_tokens"]
    assert got.usage.completion_tokens == s.generated_tokens


@pytest.mark.parametrize("prompt", [PROMPT, ZH_PROMPT], ids=["code", "zh"])
async def test_completions_logprobs_are_llama_servers_own_with_the_reason(ls: ServerPair, prompt: str) -> None:
    request = {"prompt": prompt, "max_tokens": 30, "temperature": 0, "logprobs": 2}
    own = await oracle_post(ls.target, "/completions", request)
    async with client_for(ls, policy="fixed", num_speculative_tokens=4) as client:
        got = await client.completions.create(**request)
    assert got.choices[0].text == own["choices"][0]["text"]
    assert got.choices[0].logprobs.model_dump(exclude_none=True) == _without_nulls(own["choices"][0]["logprobs"])
    s = got.speculative
    assert not s.speculated and s.fallback_reason is not None and s.fallback_reason.startswith("logprobs:"), s.fallback_reason


async def test_chat_logprobs_are_llama_servers_own_with_the_reason(ls: ServerPair) -> None:
    request = {"messages": [{"role": "user", "content": "你好，请介绍一下你自己。"}], "max_tokens": 30, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    own = await oracle_post(ls.target, "/chat/completions", request)
    async with client_for(ls, policy="fixed", num_speculative_tokens=4) as client:
        got = await client.chat.completions.create(**request)
    mine = got.choices[0].logprobs.content
    theirs = own["choices"][0]["logprobs"]["content"]
    assert [(c.token, c.bytes) for c in mine] == [(c["token"], c["bytes"]) for c in theirs]
    assert [c.logprob for c in mine] == pytest.approx([c["logprob"] for c in theirs], abs=1e-6)
    assert [[t.token for t in c.top_logprobs] for c in mine] == [[t["token"] for t in c["top_logprobs"]] for c in theirs]
    s = got.speculative
    assert not s.speculated and s.fallback_reason is not None and s.fallback_reason.startswith("logprobs:"), s.fallback_reason


async def test_streamed_chat_logprobs_are_llama_servers_own_as_they_come(ls: ServerPair) -> None:
    request = {"messages": [{"role": "user", "content": "你好，请介绍一下你自己。"}], "max_tokens": 30, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    own = [c for chunk in await oracle_stream(ls.target, "/chat/completions", request) for c in chunk.get("choices") or []]
    async with client_for(ls, policy="fixed", num_speculative_tokens=4) as client:
        stream = await client.chat.completions.create(stream=True, **request)
        mine = [c async for chunk in stream for c in chunk.choices]
    theirs_items = [item for c in own for item in ((c.get("logprobs") or {}).get("content") or [])]
    mine_items = [item.model_dump(exclude_none=True) for c in mine for item in (c.logprobs.content if c.logprobs else [])]
    assert "".join(c.delta.content or "" for c in mine) == "".join((c.get("delta") or {}).get("content") or "" for c in own)
    assert mine_items == _without_nulls(theirs_items)
    assert stream.speculative is not None and stream.speculative.fallback_reason.startswith("logprobs:")


def _without_nulls(value: Any) -> Any:
    """The JSON as the SDK's `model_dump(exclude_none=True)` gives it back."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value
