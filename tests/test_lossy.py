"""Lossy acceptance (opt-in): the threshold and typical rules on hand-computed cases, their divergence
measured against a server whose distributions are known, and `exact=False` on every lossy response."""

from __future__ import annotations

import math
import random

import pytest

from specapi import AsyncSpeculativeOpenAI, ConfigurationError
from specapi.core.acceptance import SamplingParams, decide_round
from specapi.core.alignment import ScoredToken
from specapi.core.lossy import AcceptanceRule, divergence, entropy, threshold_keeps, typical_floor, typical_keeps
from specapi.sim import simulated_endpoints
from toyclient import InProcessToy
from toyserver import TARGET, TOKENS, transform

LN = math.log


# -- the rules, by hand ---------------------------------------------------------------------------


def test_threshold_keeps_at_and_above_the_ratio() -> None:
    assert threshold_keeps(0.35, 0.5, 0.7)  # 0.35 / 0.5 = 0.70
    assert not threshold_keeps(0.34, 0.5, 0.7)  # 0.68
    assert threshold_keeps(0.9, 0.3, 0.7)  # ratios above 1 too
    assert threshold_keeps(0.01, 0.0, 0.7) and not threshold_keeps(0.0, 0.0, 0.7)


def test_entropy_counts_unseen_mass_as_one_outcome() -> None:
    assert entropy({"a": 1.0}) == 0.0
    assert entropy({"a": 0.5, "b": 0.5}) == pytest.approx(LN(2))
    assert entropy({"a": 0.5}) == pytest.approx(LN(2))  # 0.5 unseen: the lower bound
    assert entropy({t: 0.125 for t in "abcdefgh"}) == pytest.approx(LN(8))


def test_typical_floor_is_the_smaller_of_epsilon_and_delta_times_exp_minus_entropy() -> None:
    # Two even tokens: H = ln 2, 0.3 * 0.5 = 0.15 > 0.09, so the hard threshold 0.09 applies.
    assert typical_floor({"a": 0.5, "b": 0.5}, 0.09, 0.3) == pytest.approx(0.09)
    # Four tokens at 0.2, four at 0.05: H = 0.8 ln 5 + 0.2 ln 20 = 1.886697, 0.3 exp(-H) = 0.045472.
    flat = {**{t: 0.2 for t in "abcd"}, **{t: 0.05 for t in "efgh"}}
    assert typical_floor(flat, 0.09, 0.3) == pytest.approx(0.045472, abs=1e-6)
    assert typical_keeps(0.05, flat, 0.09, 0.3)  # above the entropy-lowered floor
    assert not typical_keeps(0.05, {"a": 0.95, "b": 0.05}, 0.09, 0.3)  # peaked: floor 0.09


def test_divergence_greedy_and_sampled() -> None:
    probs = {"x": 0.6, "y": 0.3, "z": 0.1}
    logprobs = {t: LN(p) for t, p in probs.items()}
    assert divergence("x", probs, logprobs, greedy=True) == (False, 0.0)
    certain, gap = divergence("y", probs, logprobs, greedy=True)
    assert certain and gap == pytest.approx(LN(2))
    # Sampled: only a token with probability 0 (outside the nucleus) is certainly rejected.
    assert divergence("y", probs, logprobs, greedy=False)[0] is False
    assert divergence("z", {"x": 0.6 / 0.9, "y": 0.3 / 0.9}, logprobs, greedy=False) == (True, pytest.approx(LN(6)))


def test_rule_validation() -> None:
    with pytest.raises(ValueError, match="acceptance must be one of"):
        AcceptanceRule(mode="loose")
    with pytest.raises(ValueError, match="acceptance_threshold must be a number >= 0"):
        AcceptanceRule(mode="threshold", threshold=-1)
    with pytest.raises(ValueError, match="typical_delta must be"):
        AcceptanceRule(mode="typical", delta="0.3")
    with pytest.raises(ValueError, match="epsilon and delta"):
        AcceptanceRule(mode="typical", epsilon=2.0)


# -- decide_round, by hand ------------------------------------------------------------------------


def _round(mode: str, **rule: float):  # type: ignore[no-untyped-def]
    # Position 0: the target prefers x (0.6); the draft proposed y (target 0.3, draft 0.4): p/q = 0.75.
    # Position 1: the target prefers z (0.9); the draft proposed w (target 0.05, draft 0.5): p/q = 0.1.
    positions = [
        ScoredToken("y", LN(0.3), {"x": LN(0.6), "y": LN(0.3)}),
        ScoredToken("w", LN(0.05), {"z": LN(0.9), "w": LN(0.05)}),
    ]
    draft = [ScoredToken("y", LN(0.4)), ScoredToken("w", LN(0.5))]
    params = SamplingParams(temperature=0.0, acceptance=AcceptanceRule(mode=mode, **rule))
    return decide_round(positions, 0, draft, params, random.Random(0))


def test_exact_greedy_round_replaces_the_first_non_argmax() -> None:
    decision = _round("exact")
    assert [e.token for e in decision.emitted] == ["x"]
    assert decision.accepted == 0 and decision.divergent == 0


def test_threshold_keeps_a_likely_enough_token_and_counts_its_divergence() -> None:
    decision = _round("threshold", threshold=0.7)
    assert [e.token for e in decision.emitted] == ["y", "z"]  # y kept (0.75 >= 0.7), w not: argmax z
    assert decision.accepted == 1 and decision.divergent == 1
    assert decision.logprob_gap == pytest.approx(LN(2))


def test_threshold_above_the_ratio_behaves_like_exact() -> None:
    assert [e.token for e in _round("threshold", threshold=0.8).emitted] == ["x"]


def test_typical_keeps_by_target_probability_alone() -> None:
    # Position 0: H of {0.6, 0.3, unseen 0.1} = 0.8979, floor min(0.09, 0.3 * 0.4074) = 0.09 < 0.3: keep y.
    # Position 1: H of {0.9, 0.05, unseen 0.05} = 0.3944, floor 0.09 > 0.05: w is not kept.
    decision = _round("typical")
    assert [e.token for e in decision.emitted] == ["y", "z"]
    assert decision.divergent == 1


# -- against a server with known distributions ----------------------------------------------------

PROMPT = "cafe"


def _expected_divergence(text: str, temperature: float, top_p: float = 1.0) -> tuple[int, float, float]:
    """Walk the output with the toy target's own tables. Neither an exact round nor a target step ever
    emits a token outside the target's choice (greedy: its argmax; sampled: probability above 0 at the
    request's settings), so every such token is a draft token the lossy rule kept: their number, the
    summed raw gap of those tokens, and the summed gap of all tokens (argmax tokens add 0)."""
    divergent, gap_divergent, gap_all = 0, 0.0, 0.0
    for index, token in enumerate(text):
        context = PROMPT + text[:index]
        probs = TARGET.next_probs(context)
        gap = LN(max(probs.values())) - LN(probs[token])
        if temperature == 0:
            certain = token != TARGET.argmax(context)
        else:
            certain = transform([probs[t] for t in TOKENS], temperature, top_p)[TOKENS.index(token)] == 0.0
        divergent += certain
        gap_divergent += gap if certain else 0.0
        gap_all += gap
    return divergent, gap_divergent, gap_all


async def test_greedy_divergence_matches_the_targets_own_argmax() -> None:
    toy = InProcessToy("lossy-greedy")
    async with AsyncSpeculativeOpenAI(
        target=toy.endpoint("target"), draft=toy.endpoint("draft"), drafter="model", policy="fixed",
        num_speculative_tokens=4, acceptance="threshold", acceptance_threshold=0.0, pipeline=False,
    ) as client:
        total = 0
        for prompt_seed in range(6):
            resp = await client.completions.create(prompt=PROMPT, max_tokens=16, temperature=0, seed=prompt_seed)
            s = resp.speculative
            text = resp.choices[0].text
            divergent, gap, _ = _expected_divergence(text, 0.0)
            assert s.accepted_tokens > 0
            assert s.divergent_tokens == divergent
            assert s.logprob_gap == pytest.approx(gap, abs=1e-4)  # greedy: only non-argmax tokens have a gap
            assert s.mean_logprob_gap == pytest.approx(gap / s.generated_tokens, abs=1e-5)
            assert s.exact is False and s.acceptance == "threshold"
            total += divergent
    assert total > 0, "threshold 0 keeps every draft token: some must differ from the target's argmax"


async def test_sampled_divergence_counts_tokens_outside_the_nucleus() -> None:
    toy = InProcessToy("lossy-nucleus")
    async with AsyncSpeculativeOpenAI(
        target=toy.endpoint("target"), draft=toy.endpoint("draft"), drafter="model", policy="fixed",
        num_speculative_tokens=3, acceptance="threshold", acceptance_threshold=0.0, pipeline=False,
    ) as client:
        total = 0
        for seed in range(12):
            resp = await client.completions.create(prompt=PROMPT, max_tokens=9, temperature=1.0, top_p=0.5, seed=seed)
            s = resp.speculative
            divergent, gap_divergent, gap_all = _expected_divergence(resp.choices[0].text, 1.0, 0.5)
            assert s.divergent_tokens == divergent
            # The gap covers the kept draft tokens: at least the divergent ones, at most all tokens.
            assert gap_divergent - 1e-4 <= s.logprob_gap <= gap_all + 1e-4
            total += divergent
    assert total > 0, "a draft sampled without the target's nucleus leaves it sometimes"


async def test_exact_mode_measures_no_divergence_and_stays_exact() -> None:
    toy = InProcessToy("lossy-off")
    async with AsyncSpeculativeOpenAI(target=toy.endpoint("target"), draft=toy.endpoint("draft"), drafter="model", policy="fixed") as client:
        resp = await client.completions.create(prompt=PROMPT, max_tokens=12, temperature=0)
    s = resp.speculative
    assert s.exact and s.acceptance == "exact" and s.divergent_tokens == 0 and s.logprob_gap == 0.0
    assert resp.choices[0].text == TARGET.greedy(PROMPT, 12)[0]


# -- every lossy response says so -----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["threshold", "typical"])
async def test_every_lossy_response_says_exact_false(mode: str) -> None:
    target, draft = simulated_endpoints(profile="vllm", latency="instant")
    prompt = "def add(a, b):\n    return"
    messages = [{"role": "user", "content": "解释一下 Transformer 的注意力机制，用类比说明"}]
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy="fixed", acceptance=mode) as client:
        responses = [
            await client.completions.create(prompt=prompt, max_tokens=12, temperature=0),
            await client.completions.create(prompt=prompt, max_tokens=12, temperature=0.7, seed=1),
            await client.chat.completions.create(messages=messages, max_tokens=12, temperature=0.7, seed=2),
        ]
        stream = await client.completions.create(prompt=prompt, max_tokens=12, temperature=0, stream=True)
        chunks = [chunk async for chunk in stream]
    stats = [r.speculative for r in responses] + [stream.speculative]
    assert chunks
    for s in stats:
        assert s.acceptance == mode and s.exact is False and mode in (s.exact_reason or "")
        assert s.to_dict()["acceptance"] == mode and s.to_headers()["x-specapi-exact"] == "false"
    assert responses[2].speculative.verification == "prompt-logprobs"


async def test_paths_without_a_target_distribution_decide_exactly_and_say_why() -> None:
    toy = InProcessToy("lossy-fanout")
    async with AsyncSpeculativeOpenAI(
        target=toy.endpoint("target"), draft=toy.endpoint("draft"), drafter="model", policy="fixed",
        verification="prefill-fanout", acceptance="threshold", acceptance_threshold=0.0,
    ) as client:
        resp = await client.completions.create(prompt=PROMPT, max_tokens=12, temperature=0)
    s = resp.speculative
    assert s.verification == "prefill-fanout" and s.speculated
    assert s.acceptance == "exact" and s.exact and "prefill-fanout" in (s.acceptance_note or "")
    assert resp.choices[0].text == TARGET.greedy(PROMPT, 12)[0]

    target, draft = simulated_endpoints(profile="openai", latency="instant")
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, acceptance="typical") as client:
        chat = await client.chat.completions.create(messages=[{"role": "user", "content": "你好"}], max_tokens=10, temperature=0)
    assert chat.speculative.acceptance == "exact"
    assert chat.speculative.exact and "predicted-outputs" in (chat.speculative.acceptance_note or "")


def test_bad_acceptance_arguments_fail_before_any_request() -> None:
    toy = InProcessToy("lossy-bad")
    with pytest.raises(ConfigurationError, match="acceptance must be one of"):
        AsyncSpeculativeOpenAI(target=toy.endpoint("target"), acceptance="approximate")
    with pytest.raises(ConfigurationError, match="threshold"):
        AsyncSpeculativeOpenAI(target=toy.endpoint("target"), acceptance="threshold", acceptance_threshold=float("nan"))
    assert toy.toy.log == []


@pytest.mark.parametrize(("mode", "listed"), [("exact", 1), ("threshold", 1), ("typical", 20)])
async def test_only_the_typical_rule_asks_for_the_whole_list_when_greedy(mode: str, listed: int) -> None:
    toy = InProcessToy(f"lossy-lists-{mode}")
    async with AsyncSpeculativeOpenAI(
        target=toy.endpoint("target"), draft=toy.endpoint("draft"), drafter="model", policy="fixed", acceptance=mode,
    ) as client:
        await client.completions.create(prompt=PROMPT, max_tokens=8, temperature=0)
    # The verification calls (the capability probe sends its own, with other prompts).
    verifications = [r.body for r in toy.toy.log if r.model == "target" and r.body.get("echo") and r.body["prompt"].startswith(PROMPT)]
    assert verifications and {body["logprobs"] for body in verifications} == {listed}


async def test_with_options_and_the_sync_client_take_the_rule() -> None:
    from specapi import SpeculativeOpenAI

    toy = InProcessToy("lossy-options")
    async with AsyncSpeculativeOpenAI(target=toy.endpoint("target"), draft=toy.endpoint("draft"), drafter="model", policy="fixed") as client:
        loose = client.with_options(acceptance="threshold", acceptance_threshold=0.0)
        lossy = await loose.completions.create(prompt=PROMPT, max_tokens=8, temperature=0)
        exact = await client.completions.create(prompt=PROMPT, max_tokens=8, temperature=0)
    assert (lossy.speculative.exact, lossy.speculative.acceptance) == (False, "threshold")
    assert (exact.speculative.exact, exact.speculative.acceptance) == (True, "exact")
    sync_toy = InProcessToy("lossy-sync")
    sync = SpeculativeOpenAI(target=sync_toy.endpoint("target"), draft=sync_toy.endpoint("draft"), drafter="model", acceptance="typical")
    try:
        resp = sync.completions.create(prompt=PROMPT, max_tokens=8, temperature=0)
    finally:
        sync.close()
    assert resp.speculative.exact is False and resp.speculative.acceptance == "typical"
