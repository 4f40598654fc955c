"""Pipelined drafting: the next round's draft is requested while the current one is verified.

Prefetched drafts are used when the guess (every draft token kept) held, and the output is the target's
either way; nothing keeps running after a call returns; `pipeline=False` never prefetches.
"""

from __future__ import annotations

import asyncio

import pytest

from specapi import AsyncSpeculativeOpenAI
from specapi.sim import LatencyProfile, ModelTiming, SimProvider, simulated_endpoints
from toyclient import InProcessToy, chisquare_p, sample_texts
from simclient import target_alone, answer
from toyserver import DRAFT, TARGET

COMPLETION_PROMPTS = ["def fibonacci(n):\n", "import os\nimport sys\n\n", "class Stack:\n    def __init__(self):\n"]
CHAT_PROMPTS = ["Write a Python function that returns the sum of a list.", "List three colours."]
PIPELINED = "+pipelined"


pytestmark = pytest.mark.usefixtures("fresh_probe_cache")






def pipelined_rounds(resp) -> int:
    return sum(r.drafter.endswith(PIPELINED) for r in resp.speculative.rounds)


async def run_all(provider, client, max_tokens: int = 40) -> list:
    """Every prompt through `client`, each checked against the target alone; the responses."""
    responses = []
    for prompt in COMPLETION_PROMPTS:
        resp = await client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=0)
        assert answer(resp) == await target_alone(provider, prompt=prompt, max_tokens=max_tokens), prompt
        responses.append(resp)
    for prompt in CHAT_PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        resp = await client.chat.completions.create(messages=messages, max_tokens=max_tokens, temperature=0)
        assert answer(resp) == await target_alone(provider, messages=messages, max_tokens=max_tokens), prompt
        responses.append(resp)
    return responses


# ----------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("profile, drafter", [("vllm", "model"), ("vllm", "auto"), ("llamacpp", "auto")])
async def test_pipelined_rounds_happen_and_greedy_output_is_the_targets(profile, drafter):
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter=drafter, policy="fixed", pipeline=True) as client:
        responses = await run_all(provider, client)
    assert all(r.speculative.speculated for r in responses)
    assert sum(map(pipelined_rounds, responses)) > 0, "no round used a prefetched draft"
    for resp in responses:
        for record in resp.speculative.rounds:
            assert 0 <= record.accepted <= record.drafted
            if record.drafter.endswith(PIPELINED):
                assert record.drafter.removesuffix(PIPELINED) == "draft-model"  # only model drafts are prefetched


@pytest.mark.parametrize("profile", ["vllm", "llamacpp"])
async def test_without_pipelining_no_round_is_prefetched(profile):
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy="fixed", pipeline=False) as client:
        responses = await run_all(provider, client)
    assert all(r.speculative.speculated for r in responses)
    assert sum(map(pipelined_rounds, responses)) == 0
    # without prefetching, one draft call per round; on the token-id path (llama.cpp completions) the
    # draft server also splits each draft into ids (one /tokenize per round, and once the tokenizer check)
    for resp in responses:
        s = resp.speculative
        per_round = 2 if s.verification == "token-ids" else 1
        assert per_round * s.num_rounds <= s.draft.requests <= per_round * s.num_rounds + (per_round - 1)
    drafts = [c for c in provider.calls if c.model == "sim-draft" and c.path != "/tokenize"]
    assert len(drafts) == sum(r.speculative.num_rounds for r in responses)


class FreeSized:
    """A policy that sizes every round for free drafts (32 tokens) while the draft model's own length is 10."""

    name = "free-sized"
    max_length = 10
    free_max_length = 32

    def start_request(self) -> str:
        return "speculate"

    def choose(self, state) -> int:  # type: ignore[no-untyped-def]
        return 32

    def observe(self, record) -> None:  # type: ignore[no-untyped-def]
        pass

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        pass


async def test_a_round_sized_for_free_drafts_drafts_and_prefetches_no_more_than_the_models_length():
    """The draft model wins rounds sized for free drafts (nothing else proposes): it is asked for its
    own length, and the next round's prefetch for one more, not for the round's 32 (33)."""
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="auto", policy=FreeSized(), pipeline=True) as client:
        responses = await run_all(provider, client)
    assert sum(map(pipelined_rounds, responses)) > 0, "no round used a prefetched draft"
    asked = [c.body["max_tokens"] for c in provider.calls if c.model == "sim-draft" and "max_tokens" in c.body]
    assert asked and max(asked) == 11
    assert all(r.drafted <= 11 for resp in responses for r in resp.speculative.rounds if r.drafter.startswith("draft-model"))


# ----------------------------------------------------------------------------- nothing left running

# Real (short) waits, so that a prefetch is really in flight while the target verifies.
SLOW_DRAFT = LatencyProfile(name="slow-draft", target=ModelTiming(ttft_base_s=0.002), draft=ModelTiming(ttft_base_s=0.01))


class InFlight:
    """The provider's sleep: counts the simulated requests still waiting for their answer."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0

    async def sleep(self, seconds: float) -> None:
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await asyncio.sleep(seconds)
        finally:
            self.now -= 1


def others() -> set[asyncio.Task]:
    return {t for t in asyncio.all_tasks() if t is not asyncio.current_task()}


async def test_no_request_is_left_running_after_a_call_returns():
    inflight = InFlight()
    provider = SimProvider(capabilities="vllm", latency=SLOW_DRAFT, seed=0, sleep=inflight.sleep)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy="fixed", pipeline=True) as client:
        await client.completions.create(prompt="warm up", max_tokens=2, temperature=0)  # probing
        for prompt in COMPLETION_PROMPTS:
            start = len(provider.calls)
            resp = await client.completions.create(prompt=prompt, max_tokens=30, temperature=0)
            assert pipelined_rounds(resp) > 0
            # every draft request sent counts, the abandoned prefetches too
            assert resp.speculative.draft.requests == sum(c.model == "sim-draft" for c in provider.calls[start:])
            assert inflight.now == 0 and not others(), "a prefetch outlived the call"
            calls = len(provider.calls)
            await asyncio.sleep(0.05)
            assert len(provider.calls) == calls, "requests were sent after the call returned"
        # a stream closed early stops its prefetch too
        stream = await client.completions.create(prompt=COMPLETION_PROMPTS[0], max_tokens=60, temperature=0, stream=True)
        async for _ in stream:
            break
        await stream.close()
        assert inflight.now == 0 and not others()
        calls = len(provider.calls)
        await asyncio.sleep(0.05)
        assert len(provider.calls) == calls
    assert inflight.peak >= 1
    # at least one prefetch was abandoned mid-flight (the last round's guess), and it never completed
    abandoned = [c for c in provider.calls.for_model("sim-draft") if c.status == 0]
    assert abandoned, "the test never had a prefetch in flight when a call ended"


# ----------------------------------------------------------------------------- sampling


async def test_same_seed_same_sampled_output_with_pipelining():
    # The toy server's lists cover its whole vocabulary, so sampled rounds are decided from them
    # (on the simulator a list that leaves mass unseen hands each position to the target alone).
    toy = InProcessToy("seeded")
    async with AsyncSpeculativeOpenAI(target=toy.endpoint("target"), draft=toy.endpoint("draft"), drafter="model", policy="fixed",
                                      num_speculative_tokens=3, pipeline=True) as client:
        first = [await client.completions.create(prompt="cafe", max_tokens=12, temperature=0.7, seed=s)
                 for s in range(4)]
        again = [await client.completions.create(prompt="cafe", max_tokens=12, temperature=0.7, seed=s)
                 for s in range(4)]
    assert [answer(r) for r in first] == [answer(r) for r in again]
    assert len({answer(r) for r in first}) > 1  # the seed matters
    assert sum(map(pipelined_rounds, first)) > 0


SAMPLE_PROMPT, SAMPLE_TOKENS, SAMPLES = "cafe", 4, 600


async def test_pipelined_sampling_follows_the_targets_distribution():
    toy = InProcessToy("pipeline")
    async with AsyncSpeculativeOpenAI(target=toy.endpoint("target"), draft=toy.endpoint("draft"), drafter="model",
                                      policy="fixed", num_speculative_tokens=1, pipeline=True) as client:
        responses, counts = await sample_texts(client, SAMPLE_PROMPT, SAMPLE_TOKENS, SAMPLES)
    assert sum(map(pipelined_rounds, responses)) >= 40, "too few prefetched rounds to say anything about them"
    p_target = chisquare_p(counts, TARGET.sequence_probs(SAMPLE_PROMPT, SAMPLE_TOKENS))
    p_draft = chisquare_p(counts, DRAFT.sequence_probs(SAMPLE_PROMPT, SAMPLE_TOKENS))
    assert p_target > 1e-3, f"not the target's distribution (p={p_target:.3g})"
    assert p_draft < 1e-6, f"indistinguishable from the draft's distribution (p={p_draft:.3g})"
