"""Greedy chat through specapi equals llama-server's own chat reply, token for token.

llama-server has no echo and no prompt logprobs: specapi verifies chat by fan-out over assistant
prefill (K+1 one-token requests, each continuing a trailing assistant message) or over completions.
The oracle is llama-server answering the same messages itself. With a trailing assistant message,
llama-server continues it, and its own reply is what specapi must return.
"""

from __future__ import annotations

import pytest

from real_helpers import Answer, ServerPair, check_equal, oracle_text, speculate

USER_CODE = [{"role": "user", "content": "Write a function that adds two numbers."}]
USER_ZH = [{"role": "user", "content": "你好，请介绍一下你自己。"}]
CONVERSATIONS = {
    "code": USER_CODE,
    "zh": USER_ZH,
    "code-prefill": USER_CODE + [{"role": "assistant", "content": "def add(a, b):\n    return"}],
    "zh-prefill": USER_ZH + [{"role": "assistant", "content": "你好！我是"}],
    "ja-prefill": [
        {"role": "system", "content": "日本語で答えてください。"},
        {"role": "user", "content": "今日はどんな日ですか。"},
        {"role": "assistant", "content": "今日はいい"},
    ],
}


def check_speculated(answer: Answer, messages: list) -> None:  # type: ignore[type-arg]
    """A request that ends with an assistant message (prefill) goes to the target unchanged, by design
    (llama-server continues it and repeats the prefix in its reply); the others speculate."""
    stats = answer.stats
    if messages[-1]["role"] == "assistant":
        assert not stats.speculated and "prefill" in (stats.fallback_reason or ""), answer.describe()
        return
    assert stats.speculated, f"did not speculate: {answer.describe()}"
    assert stats.verification == "prefill-fanout", answer.describe()
    assert stats.accepted_tokens > 0, f"no draft token accepted: {answer.describe()}"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("name", list(CONVERSATIONS))
async def test_greedy_chat(ls: ServerPair, name: str, stream: bool) -> None:
    messages = CONVERSATIONS[name]
    expected = await oracle_text(ls.target, chat=True, stream=stream, messages=messages, max_tokens=48, temperature=0)
    answer = await speculate(ls, chat=True, stream=stream, messages=messages, max_tokens=48, temperature=0)
    check_equal(answer, expected, f"chat {name} stream={stream}")
    check_speculated(answer, messages)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
@pytest.mark.parametrize("name", ["code", "zh-prefill"])
async def test_greedy_chat_short(ls: ServerPair, name: str, max_tokens: int, stream: bool) -> None:
    messages = CONVERSATIONS[name]
    expected = await oracle_text(ls.target, chat=True, stream=stream, messages=messages, max_tokens=max_tokens, temperature=0)
    answer = await speculate(ls, chat=True, stream=stream, messages=messages, max_tokens=max_tokens, temperature=0)
    check_equal(answer, expected, f"chat {name} max_tokens={max_tokens} stream={stream}")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("name", ["code", "zh"])
async def test_greedy_chat_without_max_tokens(ls: ServerPair, name: str, stream: bool) -> None:
    """No max_tokens: the server generates until the model ends its turn (the tiny target's greedy
    reply ends with EOS after about a hundred tokens)."""
    messages = CONVERSATIONS[name]
    expected = await oracle_text(ls.target, chat=True, stream=stream, messages=messages, temperature=0)
    answer = await speculate(ls, chat=True, stream=stream, messages=messages, temperature=0)
    check_equal(answer, expected, f"chat {name} without max_tokens stream={stream}")
    assert answer.finish_reason == "stop", answer.describe()
    check_speculated(answer, messages)


@pytest.mark.parametrize("name", ["code-prefill", "zh-prefill"])
async def test_greedy_chat_explicit_neutral_penalty(ls: ServerPair, name: str) -> None:
    """The caller pins llama.cpp's repeat_penalty to 1.0: still speculated, still the server's own."""
    messages = CONVERSATIONS[name]
    expected = await oracle_text(ls.target, chat=True, stream=False, messages=messages, max_tokens=32, temperature=0, repeat_penalty=1.0)
    answer = await speculate(ls, chat=True, stream=False, messages=messages, max_tokens=32, temperature=0, extra_body={"repeat_penalty": 1.0})
    check_equal(answer, expected, f"chat {name} repeat_penalty=1.0")
    check_speculated(answer, messages)
