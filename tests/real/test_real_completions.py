"""Greedy completions through specapi equal the real server's own completions, token for token.

Both server families: llama-cpp-python's server (verification by completions echo + logprobs) and
llama.cpp's llama-server (no echo: verification by fan-out of one-token completions). The oracle is the
same server answering the same request body itself. Prompts are code and Chinese/Japanese text: the
tiny models' byte-level BPE splits every CJK character into several tokens, so partial-UTF-8 tokens
occur in prompts, in drafts and in generated text.
"""

from __future__ import annotations

import pytest

from real_helpers import Answer, ServerPair, check_equal, oracle_text, speculate

CODE = [
    "def fibonacci(n):",
    "class Counter:\n    def increment(self",
    "for i in range(10):\n    print(",
]
CJK = [
    "今天天气很好，我们",
    "東京は日本の",
    "这个程序读取",
]
PROMPTS = CODE + CJK
IDS = ["code-fib", "code-class", "code-loop", "zh-weather", "ja-tokyo", "zh-program"]

#: How each family's target is verified when specapi chooses ("auto").
VERIFICATION = {"llama-cpp-python": "echo", "llama-server": "token-ids"}
NEUTRAL = {"repeat_penalty": 1.0}


@pytest.fixture(params=["llama-cpp-python", "llama-server"])
def pair(request: pytest.FixtureRequest) -> ServerPair:
    return request.getfixturevalue({"llama-cpp-python": "lcp", "llama-server": "ls"}[request.param])


def check_speculated(answer: Answer, pair: ServerPair, prompt: str) -> None:
    """Code prompts speculate and keep draft tokens. On CJK text this tiny byte-level model writes
    characters in pieces (and, on llama-server, bytes that are not UTF-8 at all): llama-cpp-python shows
    such pieces as "" with no bytes, and a text API cannot send them back, so specapi may take the
    target alone or write the answer again with it; then the response must say why."""
    stats = answer.stats
    if prompt in CJK:
        assert stats.speculated or stats.fallback_reason, f"no speculation and no reason: {answer.describe()}"
        return
    assert stats.speculated, f"did not speculate: {answer.describe()}"
    assert stats.verification == VERIFICATION[pair.family], answer.describe()
    assert stats.accepted_tokens > 0, f"no draft token accepted: {answer.describe()}"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("prompt", PROMPTS, ids=IDS)
async def test_greedy_completion(pair: ServerPair, prompt: str, stream: bool) -> None:
    expected = await oracle_text(pair.target, chat=False, stream=stream, prompt=prompt, max_tokens=40, temperature=0, **NEUTRAL)
    answer = await speculate(pair, chat=False, stream=stream, prompt=prompt, max_tokens=40, temperature=0, extra_body=NEUTRAL)
    check_equal(answer, expected, f"{pair.family} {prompt!r} stream={stream}")
    check_speculated(answer, pair, prompt)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 64])
@pytest.mark.parametrize("prompt", [CODE[0], CJK[0]], ids=["code", "zh"])
async def test_greedy_completion_lengths(pair: ServerPair, prompt: str, max_tokens: int, stream: bool) -> None:
    expected = await oracle_text(pair.target, chat=False, stream=stream, prompt=prompt, max_tokens=max_tokens, temperature=0, **NEUTRAL)
    answer = await speculate(pair, chat=False, stream=stream, prompt=prompt, max_tokens=max_tokens, temperature=0, extra_body=NEUTRAL)
    check_equal(answer, expected, f"{pair.family} {prompt!r} max_tokens={max_tokens} stream={stream}")
    if max_tokens >= 64:
        check_speculated(answer, pair, prompt)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("prompt", [CODE[0], CJK[2]], ids=["code", "zh"])
async def test_greedy_completion_server_defaults(pair: ServerPair, prompt: str, stream: bool) -> None:
    """No sampling extras from the caller: the server applies its own defaults (llama-cpp-python's
    repeat_penalty 1.1, llama-server's configured ones). The answer is still the server's own."""
    expected = await oracle_text(pair.target, chat=False, stream=stream, prompt=prompt, max_tokens=40, temperature=0)
    answer = await speculate(pair, chat=False, stream=stream, prompt=prompt, max_tokens=40, temperature=0)
    check_equal(answer, expected, f"{pair.family} {prompt!r} (server defaults) stream={stream}")


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("prompt", [CODE[1], CJK[1]], ids=["code", "ja"])
async def test_greedy_completion_repeat_penalty(pair: ServerPair, prompt: str, stream: bool) -> None:
    """A penalty the caller asks for: the server's own output with it, or specapi says it did not
    speculate / is not exact, and why. (On these prompts llama-server's greedy output changes with
    repeat_penalty 1.3: it counts the prompt's tokens too; llama-cpp-python's counts generated ones only.)"""
    penalty = {"repeat_penalty": 1.3}
    expected = await oracle_text(pair.target, chat=False, stream=stream, prompt=prompt, max_tokens=40, temperature=0, **penalty)
    answer = await speculate(pair, chat=False, stream=stream, prompt=prompt, max_tokens=40, temperature=0, extra_body=penalty)
    if not answer.stats.speculated:
        assert answer.stats.fallback_reason, answer.describe()
    check_equal(answer, expected, f"{pair.family} {prompt!r} repeat_penalty=1.3 stream={stream}")
