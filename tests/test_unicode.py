"""Random Unicode text on every simulator profile and verification path: nothing crashes, and the
output is the target's own or says why not (`exact=False` with a reason).

The oracle is the simulated target called directly with the openai SDK for the same request. Text is
bytes until a character is whole, so Chinese, Japanese, emoji and combining marks are ordinary input.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simclient import answer, target_alone
from specapi import AsyncSpeculativeOpenAI
from specapi.sim import SimProvider, simulated_endpoints

#: Scripts and characters that split into several byte-level tokens, plus the ASCII the models know.
ALPHABET = (
    list("中文测试漢字かな交じり文龘靐齉。、，！？「」")
    + list("日本語のテキストですカタカナ")
    + ["😀", "🚀", "👍🏽", "🇯🇵", "é", "e\u0301", "n\u0303", "a\u0308", "Ω", "ß", "ø", "\u200b", "\u3000"]
    + list("abcdefxyz_() :=.,\n\t ")
    + ["def ", "return ", "self.", "    ", "import ", "# ", "\n    "]
)
texts = st.lists(st.sampled_from(ALPHABET), min_size=1, max_size=14).map("".join)

#: (profile, verification): every path the profiles offer.
PATHS = [
    ("vllm", "auto"),  # echo for completions, prompt-logprobs for chat
    ("vllm", "prefill-fanout"),
    ("llamacpp", "auto"),  # prefill fan-out
    ("openai", "auto"),  # predicted outputs (chat), prefix match (completions)
    ("vllm", "prefix-match"),
]


async def _speculative(profile: str, verification: str, text: str, max_tokens: int, chat: bool, stream: bool):  # type: ignore[no-untyped-def]
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, verification=verification, policy="fixed", num_speculative_tokens=3) as client:
        if chat:
            messages = [{"role": "user", "content": text}]
            request = dict(messages=messages, max_tokens=max_tokens, temperature=0)
            resource = client.chat.completions
        else:
            request = dict(prompt=text, max_tokens=max_tokens, temperature=0)
            resource = client.completions
        if stream:
            pieces, stats = [], None
            async for chunk in await resource.create(**request, stream=True):
                for choice in chunk.choices:
                    piece = choice.delta.content if chat else choice.text
                    pieces.append(piece or "")
                stats = getattr(chunk, "speculative", None) or stats
            text_out = "".join(pieces)
        else:
            resp = await resource.create(**request)
            text_out, stats = answer(resp)[0], resp.speculative
    expected = await target_alone(
        provider, prompt=None if chat else text, messages=[{"role": "user", "content": text}] if chat else None, max_tokens=max_tokens
    )
    return text_out, expected[0], stats


def _check(text_out: str, expected: str, stats) -> bool:  # type: ignore[no-untyped-def]
    """Equal to the target's own text, or flagged with a reason; True when equal."""
    assert stats is not None, "the response carries no statistics"
    if text_out == expected:
        return True
    assert not stats.exact and stats.exact_reason, (
        f"silently different: {text_out!r} != target's {expected!r} (exact={stats.exact}, verification={stats.verification})"
    )
    return False


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("profile,verification", PATHS, ids=[f"{p}-{v}" for p, v in PATHS])
@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, max_tokens=st.integers(min_value=1, max_value=12))
def test_random_unicode_is_the_targets_text_or_flagged(profile: str, verification: str, chat: bool, stream: bool, text: str, max_tokens: int) -> None:
    out, expected, stats = asyncio.run(_speculative(profile, verification, text, max_tokens, chat, stream))
    _check(out, expected, stats)


def test_most_unicode_responses_are_exact() -> None:
    """Flagging is the exception: at least 95% of random CJK/emoji requests equal the target's text."""
    rng = random.Random(2026)
    cases = []
    for index in range(60):
        profile, verification = PATHS[index % len(PATHS)]
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(2, 16)))
        cases.append((profile, verification, text, rng.randint(1, 16), index % 2 == 1, index % 3 == 0))

    async def run_all() -> list[bool]:
        results = []
        for profile, verification, text, max_tokens, chat, stream in cases:
            out, expected, stats = await _speculative(profile, verification, text, max_tokens, chat, stream)
            results.append(_check(out, expected, stats))
        return results

    results = asyncio.run(run_all())
    assert sum(results) / len(results) >= 0.95, f"only {sum(results)} of {len(results)} exact"


@pytest.mark.parametrize(
    "profile,prompt,max_tokens",
    [("vllm", "漢字かな交じり文、" * 3, 3), ("llamacpp", "中文测试，龘靐齉。" * 6, 10), ("vllm", "中文测试，龘靐齉。" * 6, 10)],
)
async def test_issue_repros_for_cjk_prompts(profile: str, prompt: str, max_tokens: int) -> None:
    """The two prompts that crashed (UnicodeDecodeError) or returned other text with exact=True."""
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        resp = await client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=0)
    expected, _ = await target_alone(provider, prompt=prompt, max_tokens=max_tokens)
    assert resp.choices[0].text == expected
    assert resp.speculative.exact


@pytest.mark.parametrize(("verification", "path"), [("echo", "echo"), ("auto", "token-ids")])
async def test_cjk_responses_do_not_switch_echo_verification_off(verification: str, path: str) -> None:
    """A bonus token holding part of a character is an ordinary token, not a malformed response (echo;
    and the scored token-id prompt, whose entries show such a token as U+FFFD)."""
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy="fixed", verification=verification) as client:
        for prompt in ["漢字かな交じり文、" * 3, "中文测试，龘靐齉。" * 4, "日本語のテキストです。" * 3, "表示中文字符串"]:
            await client.completions.create(prompt=prompt, max_tokens=6, temperature=0)
        resp = await client.completions.create(prompt="def fib(n):\n", max_tokens=20, temperature=0)
    assert resp.speculative.verification == path
    assert resp.speculative.speculated and resp.speculative.fallback_reason is None
