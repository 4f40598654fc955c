"""Sampling stays exact when the logprob lists are truncated.

The toy server lists only its top 5 of 12 tokens here, so every list leaves mass unseen. A position the
lists cannot decide exactly goes to the target alone; a token outside the nucleus is never kept; the
caller's top_k is reproduced where the target draws its own tokens (fan-out) and otherwise makes the
target generate alone. Each output distribution is compared with the exact one by chi-square.
"""

from __future__ import annotations

import asyncio
from typing import Any

from specapi import AsyncSpeculativeOpenAI
from toyclient import InProcessToy, chisquare_p
from toyserver import DRAFT, TARGET

PROMPT, TOKENS, SAMPLES = "cafe", 3, 600


async def _sample(verification: str, **sampling: Any) -> tuple[dict[str, int], list]:  # type: ignore[type-arg]
    toy = InProcessToy("truncated", max_logprobs=5)
    async with AsyncSpeculativeOpenAI(
        target=toy.endpoint("target"), draft=toy.endpoint("draft"), drafter="model", policy="fixed", num_speculative_tokens=3,
        verification=verification,
    ) as client:
        responses = []
        for start in range(0, SAMPLES, 100):
            responses += await asyncio.gather(*(
                client.completions.create(prompt=PROMPT, max_tokens=TOKENS, seed=seed, **sampling)
                for seed in range(start, start + 100)))
    counts: dict[str, int] = {}
    for r in responses:
        counts[r.choices[0].text] = counts.get(r.choices[0].text, 0) + 1
    return counts, responses


def _kept(responses: list) -> int:  # type: ignore[type-arg]
    return sum(r.speculative.accepted_tokens for r in responses)


async def test_top_p_over_truncated_lists_keeps_the_targets_nucleus() -> None:
    counts, responses = await _sample("auto", temperature=1.0, top_p=0.8)
    exact = TARGET.sequence_probs(PROMPT, TOKENS, top_p=0.8)
    assert chisquare_p(counts, exact) > 1e-3  # also fails on any output outside the nucleus
    draft = DRAFT.sequence_probs(PROMPT, TOKENS, top_p=0.8)
    assert set(counts) - set(draft) or chisquare_p(counts, draft) < 1e-6, "indistinguishable from the draft's distribution"
    assert all(r.speculative.exact for r in responses)
    assert _kept(responses) > 0, "no draft token was ever decided from the lists"


async def test_tempered_top_p_over_truncated_lists() -> None:
    counts, responses = await _sample("auto", temperature=0.7, top_p=0.9)
    assert chisquare_p(counts, TARGET.sequence_probs(PROMPT, TOKENS, temperature=0.7, top_p=0.9)) > 1e-3
    assert all(r.speculative.exact for r in responses)


async def test_top_k_is_reproduced_where_the_target_draws_its_own_tokens() -> None:
    counts, responses = await _sample("prefill-fanout", temperature=1.0, extra_body={"top_k": 3})
    assert chisquare_p(counts, TARGET.sequence_probs(PROMPT, TOKENS, top_k=3)) > 1e-3
    assert all(r.speculative.speculated and r.speculative.exact for r in responses)
    assert _kept(responses) > 0


async def test_top_k_on_a_list_path_leaves_the_target_alone() -> None:
    counts, responses = await _sample("auto", temperature=1.0, extra_body={"top_k": 3})
    assert chisquare_p(counts, TARGET.sequence_probs(PROMPT, TOKENS, top_k=3)) > 1e-3
    assert not any(r.speculative.speculated for r in responses)
    assert "top_k" in responses[0].speculative.fallback_reason


async def test_a_temperature_near_zero_samples_without_error() -> None:
    toy = InProcessToy("cold", max_logprobs=5)
    async with AsyncSpeculativeOpenAI(target=toy.endpoint("target"), draft=toy.endpoint("draft"), policy="fixed") as client:
        resp = await client.completions.create(prompt=PROMPT, max_tokens=8, temperature=1e-3, seed=1)
    assert resp.choices[0].text == TARGET.greedy(PROMPT, 8)[0]
