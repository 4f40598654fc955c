"""Draft-length policies: the expected-tokens arithmetic, `FixedDraftLength`, and the decisions of
`AdaptiveDraftLength` on synthetic measurements (no clocks involved), plus one end-to-end run."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

import specapi.parts.probe
from specapi import AsyncSpeculativeOpenAI, ConfigurationError
from specapi.parts.policy import RECHECK, TARGET_ALONE, AdaptiveDraftLength, Decision, FixedDraftLength, PolicyState
from specapi.parts.policy import expected_tokens_by_position as expected_tokens
from specapi.sim import SimProvider, simulated_endpoints
from specapi.core.stats import RoundRecord

REMAINING = 200


def state(rounds: int = 0) -> PolicyState:
    return PolicyState(remaining_tokens=REMAINING, rounds_so_far=rounds)


def rounds(rng: random.Random, n: int, *, acceptance: float, lengths: list[int], draft_s: tuple[float, float],
           verify_s: float) -> list[RoundRecord]:
    """`n` rounds: each draft position accepted with probability `acceptance` until the first rejection;
    draft calls cost fixed + per-token, verify calls a constant."""
    out = []
    for i in range(n):
        k = lengths[i % len(lengths)]
        accepted = 0
        while accepted < k and rng.random() < acceptance:
            accepted += 1
        out.append(RoundRecord(
            drafted=k,
            accepted=accepted,
            emitted=accepted + 1,
            draft_latency_s=draft_s[0] + draft_s[1] * k,
            verify_latency_s=verify_s,
            drafter="draft-model",
            accepted_by_position=tuple(j < accepted for j in range(k)),
        ))
    return out


# ----------------------------------------------------------------------------- the arithmetic


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.8, 0.95])
@pytest.mark.parametrize("k", [1, 2, 4, 10])
def test_expected_tokens_is_the_geometric_formula(alpha, k):
    assert expected_tokens([alpha] * k, k) == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))


def test_expected_tokens_by_position():
    assert expected_tokens([0.9, 0.5], 2) == pytest.approx(1 + 0.9 + 0.9 * 0.5)
    assert expected_tokens([0.9, 0.5], 4) == pytest.approx(1 + 0.9 + 0.45 + 0.225 + 0.1125)  # last rate repeats
    assert expected_tokens([1.0] * 3, 3) == 4  # every token accepted, plus the bonus token
    assert expected_tokens([0.7], 0) == 1  # no draft: the target's own token
    assert expected_tokens([], 5) == 1


# ----------------------------------------------------------------------------- fixed length


@pytest.mark.parametrize("bad", [0, -1, True, 2.5, "4", None])
def test_fixed_draft_length_rejects_anything_but_a_positive_integer(bad):
    with pytest.raises(ConfigurationError):
        FixedDraftLength(bad)
    target, _ = simulated_endpoints(provider=SimProvider(latency="instant"))
    with pytest.raises(ConfigurationError):
        AsyncSpeculativeOpenAI(target=target, num_speculative_tokens=bad, policy="fixed")


def test_fixed_draft_length_always_drafts_k():
    policy = FixedDraftLength(6)
    assert policy.start_request().mode != TARGET_ALONE
    policy.observe(RoundRecord(drafted=6, accepted=0, emitted=1, accepted_by_position=(False,) * 6))
    policy.observe_plain(100, 5.0)
    assert [policy.choose(state(i)).length for i in range(3)] == [6, 6, 6]


@pytest.mark.parametrize("options", [dict(start_length=0), dict(max_length=0), dict(start_length=5, max_length=4),
                                     dict(margin=0), dict(recheck_every=0), dict(free_max_length=0)])
def test_adaptive_policy_validates_its_options(options):
    with pytest.raises(ConfigurationError):
        AdaptiveDraftLength(**options)


def test_free_drafts_are_allowed_at_least_as_long_as_the_models():
    assert (AdaptiveDraftLength().free_max_length, AdaptiveDraftLength().max_length) == (32, 10)
    assert AdaptiveDraftLength(max_length=64).free_max_length == 64
    assert AdaptiveDraftLength(max_length=12, free_max_length=5).free_max_length == 5  # as asked


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("free", [False, True])
def test_the_best_length_is_the_length_with_the_highest_predicted_rate(seed, free):
    """`best_length` carries the expected tokens from one length to the next: it picks what trying
    every length with `predicted_speculative_rate` picks, up to `free_max_length` for drafts without a
    call and `max_length` for the model, and short of the tokens that remain."""
    rng = random.Random(seed)
    policy = AdaptiveDraftLength(max_length=rng.randint(1, 12), free_max_length=rng.randint(1, 40), start_length=1)
    for record in rounds(rng, 12, acceptance=rng.uniform(0.2, 1.0), lengths=[2, 5, 9], draft_s=(0.004, 0.004), verify_s=0.03):
        policy.observe(record)
    acceptance = [rng.uniform(0.0, 1.0) for _ in range(rng.randint(1, 45))]
    remaining, load_s = rng.randint(1, 60), rng.choice([0.0, 0.01])
    longest = min(policy.free_max_length if free else policy.max_length, max(1, remaining - 1))
    rates = {k: policy.predicted_speculative_rate(k, load_s, acceptance, free=free) for k in range(1, longest + 1)}
    k, rate = policy.best_length(remaining, load_s, acceptance, free=free)
    assert rate == pytest.approx(max(rates.values())) and rates[k] == pytest.approx(rate)


# ----------------------------------------------------------------------------- adaptive length


def test_high_acceptance_and_a_cheap_draft_lengthen_drafts():
    policy = AdaptiveDraftLength(start_length=4, max_length=10)
    assert policy.start_request().mode != TARGET_ALONE
    assert policy.choose(state()).length == 4  # nothing measured yet
    for record in rounds(random.Random(1), 40, acceptance=0.97, lengths=[4, 6, 8, 10], draft_s=(0.002, 0.0005),
                         verify_s=0.02):
        policy.observe(record)
    assert policy.choose(state(40)).length >= 8


def test_low_acceptance_shortens_drafts():
    policy = AdaptiveDraftLength(start_length=4, max_length=10)
    policy.start_request()
    for record in rounds(random.Random(2), 40, acceptance=0.05, lengths=[4, 3, 2], draft_s=(0.002, 0.002),
                         verify_s=0.02):
        policy.observe(record)
    assert policy.choose(state(40)).length < 4


def test_draft_length_follows_acceptance_between_the_extremes():
    chosen = []
    for acceptance in (0.2, 0.6, 0.9):
        policy = AdaptiveDraftLength(start_length=4, max_length=10)
        policy.start_request()
        for record in rounds(random.Random(3), 60, acceptance=acceptance, lengths=[2, 4, 6, 8, 10],
                             draft_s=(0.002, 0.003), verify_s=0.02):
            policy.observe(record)
        chosen.append(policy.choose(state(60)).length)
    assert chosen == sorted(chosen) and chosen[0] < chosen[-1], chosen


HOSTED = dict(acceptance=0.7, lengths=[4, 3], draft_s=(0.35, 0.01), verify_s=0.36)
HOSTED_TARGET_PER_TOKEN = 0.012


def hosted_policy(recheck_every: int = 5) -> AdaptiveDraftLength:
    """A policy that has speculated through one request at hosted-like costs; the target wrote that
    request's last tokens alone, which measured its own speed (no request given up to it)."""
    policy = AdaptiveDraftLength(recheck_every=recheck_every)
    assert policy.start_request().mode != TARGET_ALONE  # request 1 speculates
    for record in rounds(random.Random(4), 12, **HOSTED):
        policy.observe(record)
        assert policy.choose(state()).length > 0, "without the target's own speed there is nothing to compare with"
    last = PolicyState(remaining_tokens=6, rounds_so_far=12)
    measuring = policy.choose(last)
    assert measuring.length == 0  # the target writes the last 6 tokens alone, to measure its speed
    assert "measure" in measuring.reason and measuring.load_reason is None
    policy.observe_plain(6, 0.35 + HOSTED_TARGET_PER_TOKEN * 6)
    return policy


def test_the_target_is_measured_on_the_last_tokens_of_the_first_request_not_on_a_request_of_its_own():
    policy = hosted_policy()
    assert policy.predicted_target_rate(REMAINING) == pytest.approx(REMAINING / (0.35 + HOSTED_TARGET_PER_TOKEN * REMAINING), rel=0.1)
    lan = AdaptiveDraftLength()
    lan.start_request()
    for record in rounds(random.Random(5), 12, acceptance=0.8, lengths=[4, 3], draft_s=(0.004, 0.004), verify_s=0.031):
        lan.observe(record)
    lan.choose(PolicyState(remaining_tokens=8, rounds_so_far=12)).length
    lan.observe_plain(8, 0.03 + 0.025 * 8)
    assert lan.start_request().mode != TARGET_ALONE  # request 2 is not given up to measurement


@pytest.mark.parametrize(("per_token_s", "speculates_next"), [(0.0025, False), (0.2, True)])
def test_the_first_request_measures_the_target_on_its_rest_after_two_rounds(per_token_s, speculates_next):
    """A fresh client: the first request's second round measures speculation (the first also opens
    connections); the target writes that request's rest alone, which measures the target. A target
    faster alone (real vLLM's 5 M target on this CPU: 2.5 ms a token, a round 31 ms) is then sent
    requests alone from the second request on, after two rounds rather than a whole request of them;
    a slow one (612 M: 200 ms a token) goes on speculating."""
    policy = AdaptiveDraftLength()
    assert policy.start_request().mode != TARGET_ALONE
    verify_s = 0.031 if per_token_s < 0.01 else 0.68
    records = rounds(random.Random(7), 2, acceptance=0.8, lengths=[4], draft_s=(0.005, 0.002), verify_s=verify_s)
    remaining = 32
    for done, record in enumerate(records):
        assert policy.choose(PolicyState(remaining_tokens=remaining, rounds_so_far=done)).length == 4
        policy.observe(record)
        remaining -= record.emitted
    measuring = policy.choose(PolicyState(remaining_tokens=remaining, rounds_so_far=2))
    assert measuring.length == 0 and "measure" in measuring.reason
    policy.observe_plain(remaining, 0.007 + per_token_s * remaining)
    started = policy.start_request()
    assert (started.mode != TARGET_ALONE) == speculates_next, started
    # One request measures: another one's early rounds do not hand their rest over again.
    if speculates_next:
        assert policy.choose(PolicyState(remaining_tokens=32, rounds_so_far=2)).length > 0


def test_a_long_request_is_not_handed_to_the_target_alone_to_measure_it():
    """The rest measured early is at most 256 tokens: a longer request keeps speculating (its last
    tokens, or the third request, measure the target)."""
    policy = AdaptiveDraftLength()
    policy.start_request()
    for record in rounds(random.Random(8), 2, acceptance=0.8, lengths=[4], draft_s=(0.005, 0.002), verify_s=0.031):
        policy.observe(record)
    assert policy.choose(PolicyState(remaining_tokens=1000, rounds_so_far=2)).length > 0
    assert policy.choose(PolicyState(remaining_tokens=200, rounds_so_far=2)).length == 0


def test_hosted_costs_turn_speculation_off_once_the_target_is_measured():
    policy = hosted_policy()
    started = policy.start_request()
    assert started.mode == TARGET_ALONE  # request 2 already knows: judged when the target was measured
    assert "slower" in started.reason
    assert policy.predicted_target_rate(REMAINING) > max(policy.predicted_speculative_rate(k) for k in range(1, 11))


def test_lan_costs_keep_speculating_once_the_target_is_measured():
    policy = AdaptiveDraftLength()
    policy.start_request()
    for record in rounds(random.Random(5), 12, acceptance=0.8, lengths=[4, 3], draft_s=(0.004, 0.004), verify_s=0.031):
        policy.observe(record)
    assert policy.choose(PolicyState(remaining_tokens=8, rounds_so_far=12)).length == 0  # the last 8 tokens measure the target
    policy.observe_plain(8, 0.03 + 0.025 * 8)
    assert policy.start_request().mode != TARGET_ALONE
    assert policy.choose(state()).length > 0


def test_a_request_with_no_end_in_sight_measures_the_target_on_its_rest_from_the_third_request_on():
    policy = AdaptiveDraftLength()
    unbounded = PolicyState(remaining_tokens=1 << 20, rounds_so_far=4)
    for request in range(1, 4):
        policy.start_request()
        for record in rounds(random.Random(request), 6, acceptance=0.8, lengths=[4], draft_s=(0.004, 0.004), verify_s=0.031):
            policy.observe(record)
        chosen = policy.choose(unbounded).length
        assert (chosen == 0) == (request == 3), (request, chosen)
    policy.start_request()
    assert policy.choose(unbounded).length > 0  # one request measures at a time, until a plain step reports


def test_while_off_it_speculates_again_every_recheck_every_requests():
    policy = hosted_policy(recheck_every=5)
    speculating = [n for n in range(2, 21) if policy.start_request().mode != TARGET_ALONE]
    assert speculating == [5, 10, 15, 20]


def test_a_recheck_request_really_drafts_so_that_it_measures_again():
    """"while off, speculate on one request out of this many to re-measure": the re-check request must
    run at least one round, or nothing new is ever measured and speculation stays off for good."""
    policy = hosted_policy(recheck_every=5)
    assert [policy.start_request().mode for _ in range(3)] == [TARGET_ALONE] * 3  # requests 2 to 4 do not
    assert policy.start_request().mode == RECHECK  # request 5 re-checks
    assert policy.choose(PolicyState(remaining_tokens=60, rounds_so_far=0, recheck=True)).length > 0


# ----------------------------------------------------------------------------- end to end


async def test_a_default_client_says_why_whenever_it_did_not_speculate():
    specapi.parts.probe._CACHE.clear()
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    prompts = ["def fibonacci(n):\n", "import os\nimport sys\n\n", "class Stack:\n    def __init__(self):\n",
               "for i in range(10):\n", "The history of the", "def parse(text):\n"]
    try:
        async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
            stats = []
            for prompt in prompts:
                stats.append((await client.completions.create(prompt=prompt, max_tokens=30, temperature=0)).speculative)
                stats.append((await client.chat.completions.create(
                    messages=[{"role": "user", "content": prompt}], max_tokens=30, temperature=0)).speculative)
    finally:
        specapi.parts.probe._CACHE.clear()
    silent = [(i, s.verification) for i, s in enumerate(stats) if not s.speculated and not s.fallback_reason]
    assert not silent, f"responses that did not speculate and do not say why: {silent}"
    assert any(s.speculated for s in stats)
    for s in stats:
        assert s.speculated == (s.num_rounds > 0)
        assert (s.verification == "none") == (not s.speculated)
        assert math.isfinite(s.wall_s)


# ----------------------------------------------------------------------------- the free-draft gate


class _OffAtFirstRound:
    """A policy that starts a request speculating and turns it off at the first round."""

    name = "stub"
    load_reason: str | None = None  # what its decision says the load changed
    pays_under_load = False  # free rounds with the load counted (`queue_delay_s` given)

    def start_request(self) -> str:
        return "speculate"

    def choose(self, state: PolicyState) -> Decision:
        return Decision(0, load_reason=self.load_reason)

    def free_drafts_pay(self, expected: float, k: int, remaining: int, *, queue_delay_s: float | None = None) -> bool:
        return True if queue_delay_s is None else self.pays_under_load

    def observe(self, record: RoundRecord) -> None:
        pass

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        pass


def test_the_free_draft_gate_engages_when_the_first_rounds_choice_turns_speculation_off():
    from specapi.parts.free_gate import FreeDraftGate

    switched = []
    gate = FreeDraftGate(_OffAtFirstRound(), expected=8.0, free_drafters=lambda: switched.append(True), max_length=12, remaining=40)
    assert gate.start_request().mode == "speculate"
    assert gate.choose(PolicyState(remaining_tokens=40, rounds_so_far=0)).length == 12 and switched == [True]
    later = FreeDraftGate(_OffAtFirstRound(), expected=8.0, free_drafters=lambda: switched.append(False), max_length=12, remaining=40)
    later.start_request()
    assert later.choose(PolicyState(remaining_tokens=30, rounds_so_far=3)).length == 0  # mid-request: the target finishes
    stepped_aside = _OffAtFirstRound()
    stepped_aside.load_reason = "target alone under load"
    loaded = FreeDraftGate(stepped_aside, expected=8.0, free_drafters=lambda: switched.append(False), max_length=12, remaining=40)
    aside = loaded.choose(PolicyState(remaining_tokens=40, rounds_so_far=0))
    assert aside.length == 0  # free rounds would load the target too
    assert switched == [True] and aside.load_reason == "target alone under load"


def test_a_request_sent_aside_for_load_drafts_free_where_free_rounds_pay_with_the_load_counted():
    """Stepped aside at the first round (the draft model's calls would cost too much now), a request the
    suffix index expects to continue drafts its first round free, if the policy judges free rounds to
    pay with the load counted; it then reports no load reason, since it speculated."""
    from specapi.parts.free_gate import FreeDraftGate

    switched: list[bool] = []
    stepped_aside = _OffAtFirstRound()
    stepped_aside.load_reason = "target alone under load"
    stepped_aside.pays_under_load = True
    gate = FreeDraftGate(stepped_aside, expected=8.0, free_drafters=lambda only=True: switched.append(only), max_length=12, remaining=40)
    free = gate.choose(PolicyState(remaining_tokens=40, rounds_so_far=0, queue_delay_s=0.03))
    assert free.length == 8
    assert switched == [True] and free.load_reason is None
    weak = FreeDraftGate(stepped_aside, expected=2.0, free_drafters=lambda only=True: switched.append(only), max_length=12, remaining=40)
    weak_choice = weak.choose(PolicyState(remaining_tokens=40, rounds_so_far=0, queue_delay_s=0.03))
    assert weak_choice.length == 0  # the index expects too little
    assert weak_choice.load_reason == "target alone under load"


def lan_policy_with_target(per_token_s: float) -> AdaptiveDraftLength:
    """LAN-like rounds at acceptance 0.8, then the target measured at `per_token_s` a token."""
    policy = AdaptiveDraftLength()
    policy.start_request()
    for record in rounds(random.Random(5), 12, acceptance=0.8, lengths=[4, 3], draft_s=(0.004, 0.004), verify_s=0.031):
        policy.observe(record)
    policy.choose(PolicyState(remaining_tokens=8, rounds_so_far=12)).length
    policy.observe_plain(8, 0.03 + per_token_s * 8)
    return policy


def target_speed_where_speculation_is(ratio: float, tokens: int) -> float:
    """The target's per-token time at which the policy predicts speculation `ratio` times as fast as
    the target alone over `tokens` (found by bisection on the policy's own predictions)."""
    low, high = 0.001, 0.2
    for _ in range(60):
        middle = (low + high) / 2
        policy = lan_policy_with_target(middle)
        if policy.best_length(tokens)[1] / policy.predicted_target_rate(tokens) > ratio:
            high = middle  # speculation too far ahead: a faster target
        else:
            low = middle
    return (low + high) / 2


def test_the_verdict_has_a_band_so_that_estimates_near_equality_do_not_flip_it():
    """Speculating, the policy stops only when predicted slower than the target alone by the margin;
    stopped, it starts again only when predicted faster by the margin."""
    judged = AdaptiveDraftLength._JUDGED_TOKENS  # what a measured target is first judged on
    kept = lan_policy_with_target(target_speed_where_speculation_is(1 / 1.03, judged))  # 3% slower
    assert kept.start_request().mode != TARGET_ALONE and kept.choose(state(5)).length > 0
    dropped = lan_policy_with_target(target_speed_where_speculation_is(1 / 1.10, judged))  # 10% slower
    started = dropped.start_request()
    assert started.mode == TARGET_ALONE and "slower" in started.reason

    # Off, a re-check 3% faster than the target alone does not turn it on again; 10% faster does.
    for ratio, back_on in ((1.03, False), (1.10, True)):
        policy = lan_policy_with_target(target_speed_where_speculation_is(1 / 1.10, judged))
        assert policy._off
        policy._target = lan_policy_with_target(target_speed_where_speculation_is(ratio, REMAINING))._target
        chosen = policy.choose(PolicyState(remaining_tokens=REMAINING, rounds_so_far=8, recheck=True)).length
        assert (chosen > 0) == back_on and policy._off != back_on


def test_a_requests_own_rounds_decide_its_draft_length():
    """Client-wide acceptance is high (0.95, on code, say); a request whose own drafts keep failing at
    the first positions (prose) drafts shorter, and finally lets the target write its rest alone,
    without turning speculation off for the client. One whose drafts all pass drafts long."""
    policy = AdaptiveDraftLength(max_length=10)
    policy.start_request()
    for record in rounds(random.Random(6), 40, acceptance=0.95, lengths=[4, 6, 8, 10], draft_s=(0.004, 0.004), verify_s=0.031):
        policy.observe(record)
    policy.choose(PolicyState(remaining_tokens=8, rounds_so_far=40)).length
    policy.observe_plain(8, 0.03 + 0.025 * 8)
    client_k = policy.choose(state(0)).length
    good = ((True,) * 8,) * 4
    failing = ((False,), (True, False), (False,), (False,))
    k_good = policy.choose(PolicyState(REMAINING, 4, accepted_by_position=good)).length
    k_failing = policy.choose(PolicyState(REMAINING, 4, accepted_by_position=failing)).length
    assert k_good >= client_k > k_failing
    hopeless = ((False,),) * 12
    given_up = policy.choose(PolicyState(REMAINING, 12, accepted_by_position=hopeless))
    assert given_up.length == 0 and "own acceptance" in given_up.reason and not policy._off
    assert policy.start_request().mode != TARGET_ALONE  # the next request speculates


def test_a_burst_of_rounds_does_not_make_the_policy_forget_the_targets_speed():
    """Every verify call is a one-token sample of the target's line and only plain steps are longer:
    hundreds of rounds (16 requests at once) must not erase the measured per-token cost, or the policy
    gives a request's whole rest to measuring it again."""
    policy = lan_policy_with_target(0.025)
    before = policy.predicted_target_rate(REMAINING)
    for _ in range(10):
        policy.start_request()
    for record in rounds(random.Random(8), 400, acceptance=0.8, lengths=[4, 3], draft_s=(0.004, 0.004), verify_s=0.031):
        policy.observe(record)
    assert policy.predicted_target_rate(REMAINING) == pytest.approx(before, rel=0.05)
    assert policy.choose(PolicyState(remaining_tokens=40, rounds_so_far=6)).length > 0  # not the rest for measuring


def test_greedy_and_sampled_traffic_each_get_their_own_draft_length():
    """One client, mixed traffic: greedy rounds keep nearly every draft token, sampled ones few. Each band
    is learnt apart, so each gets the draft length of its own acceptance; a band with no rounds yet reads
    the other's."""
    policy = AdaptiveDraftLength(start_length=4, max_length=10)
    policy.start_request()
    greedy = rounds(random.Random(1), 40, acceptance=0.97, lengths=[4, 6, 8, 10], draft_s=(0.002, 0.0005), verify_s=0.02)
    for record in greedy:
        policy.observe(record)
    cold_sampled = policy.choose(PolicyState(remaining_tokens=REMAINING, rounds_so_far=40, sampled=True)).length
    assert cold_sampled >= 8  # no sampled rounds yet: the greedy table speaks for it
    sampled = rounds(random.Random(2), 40, acceptance=0.05, lengths=[4, 3, 2], draft_s=(0.002, 0.0005), verify_s=0.02)
    for record in sampled:
        policy.observe(replace(record, sampled=True))
    assert policy.choose(PolicyState(remaining_tokens=REMAINING, rounds_so_far=40, sampled=True)).length < 4
    assert policy.choose(PolicyState(remaining_tokens=REMAINING, rounds_so_far=40, sampled=False)).length >= 8


def test_the_free_draft_gate_leaves_sampled_requests_to_the_policy():
    """The index knows the answer to this prompt (a greedy one): a greedy request is gated (free rounds
    where the policy would let the target write alone), a sampled one is not, since it keeps a free
    draft's token only with the target's probability of it (on real vLLM at T=0.7 a gated request's
    32 free tokens kept 2, for a verify call as long as 35 of the target's tokens)."""
    from specapi.core.acceptance import SamplingParams
    from specapi.core.context import Context
    from specapi.parts.free_gate import FreeDraftGate, gate_free_drafts
    from specapi.parts.suffix import SuffixIndex, learn

    prompt = "def read_lines(path):\n    "
    index = SuffixIndex()
    answer = 'with open(path) as handle:\n        return [line.rstrip("\\n") for line in handle]\n'
    learn(index, Context(prompt=prompt, sampling=SamplingParams(temperature=0.0)), answer)
    policy = AdaptiveDraftLength()
    for temperature, gated in ((0.0, True), (0.7, False)):
        context = Context(prompt=prompt, sampling=SamplingParams(temperature=temperature))
        _, chosen = gate_free_drafts(None, policy, context, index, 64)
        assert isinstance(chosen, FreeDraftGate) == gated, temperature
        if gated:
            assert chosen.expected >= chosen.min_tokens  # the index does expect to continue this text
