"""`n` > 1 speculates: each choice is its own speculative run (at once, on the prompt the target's cache
holds), choices indexed 0..n-1, usage billed as OpenAI and vLLM bill `n` (the prompt once, every
choice's tokens). Greedy choices all equal the target's greedy text; sampled ones are distributed as the
target's (the toy server's exact distributions); streamed choices interleave by index.
"""

from __future__ import annotations

from typing import Any

import httpx2
import openai
import pytest

from specapi import AsyncSpeculativeOpenAI, Endpoint
from specapi.sim import SimProvider, SimTransport, simulated_endpoints
from test_exactness import chisquare_against
from toyserver import DRAFT, TARGET, ToyServer

CODE = "def fibonacci(n):\n    if n < 2:\n        return n\n"
MESSAGES = [{"role": "user", "content": "中文测试，龘靐齉。" * 6}]


def _sim() -> tuple[SimProvider, openai.AsyncOpenAI]:
    # A server that takes several greedy choices and echo with logprobs (vLLM refuses `n` above 1 with
    # greedy sampling: test_client_requests.py shows specapi answers with its error).
    provider = SimProvider(capabilities="sglang", latency="instant", seed=0)
    sdk = openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", http_client=httpx2.AsyncClient(transport=SimTransport(provider)), max_retries=0)
    return provider, sdk


def _client(provider: SimProvider, **options: Any) -> AsyncSpeculativeOpenAI:
    target, draft = simulated_endpoints(provider=provider)
    return AsyncSpeculativeOpenAI(target=target, draft=draft, **{"policy": "fixed", "num_speculative_tokens": 4, **options})


def _texts(response: Any) -> list[str]:
    return [c.message.content if hasattr(c, "message") else c.text for c in response.choices]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_greedy_choices_all_equal_the_targets_and_usage_is_billed_as_the_target_bills(chat: bool) -> None:
    provider, sdk = _sim()
    async with _client(provider) as client, sdk:
        if chat:
            got = await client.chat.completions.create(messages=MESSAGES, max_tokens=30, temperature=0, n=3)
            own = await sdk.chat.completions.create(model="sim-target", messages=MESSAGES, max_tokens=30, temperature=0, n=3)
        else:
            got = await client.completions.create(prompt=CODE, max_tokens=30, temperature=0, n=3)
            own = await sdk.completions.create(model="sim-target", prompt=CODE, max_tokens=30, temperature=0, n=3)
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert _texts(got) == _texts(own)
    assert [c.finish_reason for c in got.choices] == [c.finish_reason for c in own.choices]
    assert (got.usage.prompt_tokens, got.usage.completion_tokens, got.usage.total_tokens) == (
        own.usage.prompt_tokens, own.usage.completion_tokens, own.usage.total_tokens,
    )  # fmt: skip
    s = got.speculative
    assert s.speculated and s.accepted_tokens > 0 and s.exact
    assert s.generated_tokens == got.usage.completion_tokens
    assert s.num_rounds >= 3  # the three choices' rounds together


async def test_choices_with_logprobs_each_equal_the_targets() -> None:
    provider, sdk = _sim()
    async with _client(provider, verification="echo") as client, sdk:
        got = await client.completions.create(prompt=CODE, max_tokens=20, temperature=0, n=2, logprobs=2)
        own = await sdk.completions.create(model="sim-target", prompt=CODE, max_tokens=20, temperature=0, n=2, logprobs=2)
    assert got.speculative.accepted_tokens > 0
    for mine, theirs in zip(got.choices, own.choices, strict=True):
        assert mine.logprobs.tokens == theirs.logprobs.tokens and mine.logprobs.text_offset == theirs.logprobs.text_offset
        assert mine.logprobs.token_logprobs == pytest.approx(theirs.logprobs.token_logprobs, abs=1e-9)


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_streamed_choices_interleave_by_index_as_the_sdk_expects(chat: bool) -> None:
    provider, sdk = _sim()
    options = {"max_tokens": 30, "temperature": 0, "n": 3, "stream": True, "stream_options": {"include_usage": True}}
    async with _client(provider) as client, sdk:
        if chat:
            stream = await client.chat.completions.create(messages=MESSAGES, **options)
            own = await sdk.chat.completions.create(model="sim-target", messages=MESSAGES, max_tokens=30, temperature=0, n=3)
        else:
            stream = await client.completions.create(prompt=CODE, **options)
            own = await sdk.completions.create(model="sim-target", prompt=CODE, max_tokens=30, temperature=0, n=3)
        texts: dict[int, str] = {}
        roles: dict[int, str | None] = {}
        finishes: dict[int, str] = {}
        usages = []
        async for chunk in stream:
            if chunk.usage is not None:
                usages.append(chunk.usage)
                assert chunk.choices == []
            for choice in chunk.choices:
                assert choice.index not in finishes  # nothing of a choice after its finish
                if chat:
                    roles.setdefault(choice.index, choice.delta.role)  # the first delta of each choice names the role
                    texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
                else:
                    texts[choice.index] = texts.get(choice.index, "") + choice.text
                if choice.finish_reason is not None:
                    finishes[choice.index] = choice.finish_reason
    assert [texts[i] for i in range(3)] == _texts(own)
    assert finishes == {i: c.finish_reason for i, c in enumerate(own.choices)}
    if chat:
        assert roles == {0: "assistant", 1: "assistant", 2: "assistant"}
    [usage] = usages
    assert (usage.prompt_tokens, usage.completion_tokens) == (own.usage.prompt_tokens, own.usage.completion_tokens)
    assert stream.speculative is not None and stream.speculative.accepted_tokens > 0


async def test_sampled_choices_follow_the_targets_distribution() -> None:
    """600 choices of 3 tokens from 30 requests of n=20, against the toy target's exact distribution."""
    with ToyServer() as srv:
        target = Endpoint(base_url=srv.base_url, model="target", api_key="x")
        draft = Endpoint(base_url=srv.base_url, model="draft", api_key="x")
        counts: dict[str, int] = {}
        accepted = 0
        async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=3) as client:
            for _ in range(30):
                response = await client.completions.create(prompt="cafe", max_tokens=3, temperature=1.0, n=20)
                assert [c.index for c in response.choices] == list(range(20))
                accepted += response.speculative.accepted_tokens
                for text in _texts(response):
                    counts[text] = counts.get(text, 0) + 1
    p_target = chisquare_against(counts, TARGET.sequence_probs("cafe", 3))
    p_draft = chisquare_against(counts, DRAFT.sequence_probs("cafe", 3))
    assert p_target > 1e-3, f"the choices are not distributed as the target's (p={p_target:.3g})"
    assert p_draft < 1e-6, f"the choices look like the draft's (p={p_draft:.3g})"
    assert accepted > 0


async def test_seeded_choices_repeat_and_differ_from_each_other() -> None:
    provider, _ = _sim()
    async with _client(provider) as client:
        first = await client.completions.create(prompt=CODE, max_tokens=8, temperature=1.0, n=6, seed=11)
        again = await client.completions.create(prompt=CODE, max_tokens=8, temperature=1.0, n=6, seed=11)
    assert _texts(first) == _texts(again)
    assert len(set(_texts(first))) > 1


@pytest.mark.parametrize("n", [0, 129, 1.5, True])
async def test_a_bad_n_fails_before_any_request(n: Any) -> None:
    provider, _ = _sim()
    async with _client(provider) as client:
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(prompt=CODE, max_tokens=5, temperature=0, n=n)
    assert [c for c in provider.calls if c.model == "sim-target" and c.body.get("prompt") == CODE] == []
