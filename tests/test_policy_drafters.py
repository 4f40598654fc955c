"""What the adaptive policy learns per drafter, and what it does with it: the draft model's acceptance
apart from the free drafters' (suffix index, prompt lookup), a request drafting free judged on its own
drafter's figures, pipelined drafts only where they are likely used under load, and a first round the
suffix index expects to continue drafted by the free drafters alone. Synthetic measurements, no clocks;
one end-to-end run on the simulator for the engine's side of pipelining."""

from __future__ import annotations

import random

import pytest

from specapi import AsyncSpeculativeOpenAI
from specapi.core.load import LoadCurve, current_request
from specapi.parts.policy import AdaptiveDraftLength, FixedDraftLength, PolicyState
from specapi.sim import SimProvider, simulated_endpoints
from specapi.core.stats import RoundRecord
from specapi.parts.free_gate import FreeDraftGate
from simclient import answer, target_alone

REMAINING = 200


pytestmark = pytest.mark.usefixtures("fresh_probe_cache")


def model_rounds(policy: AdaptiveDraftLength, n: int, acceptance: float, *, seed: int = 3) -> None:
    """`n` LAN-like rounds of the draft model (draft 4 ms + 4 ms/token, verify 31 ms)."""
    rng = random.Random(seed)
    for i in range(n):
        k = (4, 6, 3)[i % 3]
        accepted = 0
        while accepted < k and rng.random() < acceptance:
            accepted += 1
        policy.observe(RoundRecord(drafted=k, accepted=accepted, emitted=accepted + 1, draft_latency_s=0.004 + 0.004 * k,
                                   verify_latency_s=0.031, drafter="draft-model", accepted_by_position=tuple(j < accepted for j in range(k))))


def suffix_rounds(policy: AdaptiveDraftLength, n: int, k: int = 10) -> None:
    """`n` rounds of the suffix index repeating a known answer: every position accepted."""
    for _ in range(n):
        policy.observe(RoundRecord(drafted=k, accepted=k, emitted=k + 1, verify_latency_s=0.033, drafter="suffix",
                                   accepted_by_position=(True,) * k))


def measured(acceptance: float, per_token_s: float = 0.025) -> AdaptiveDraftLength:
    """A policy that has seen the draft model at `acceptance` and measured the target alone."""
    policy = AdaptiveDraftLength()
    policy.start_request()
    model_rounds(policy, 40, acceptance)
    policy.choose(PolicyState(remaining_tokens=8, rounds_so_far=40))
    policy.observe_plain(8, 0.03 + per_token_s * 8)
    return policy


def free_state(rounds: tuple[tuple[bool, ...], ...], drafter: str = "suffix") -> PolicyState:
    return PolicyState(REMAINING, len(rounds), last_drafter=drafter, last_drafter_rounds=rounds)


# ----------------------------------------------------------------------------- one table per drafter


def test_free_rounds_do_not_make_the_draft_models_drafts_look_better():
    """Seen at 100 streams: requests whose answer the suffix index knew had every position accepted, and
    requests on new text drafted 5–8 model tokens a round with 1–7 of 19–35 accepted, and lost. The
    model's figures are its own now."""
    policy = measured(0.5)
    before = policy.acceptance()
    suffix_rounds(policy, 60)
    assert policy.acceptance() == before
    assert min(policy.acceptance(drafter="suffix")) > 0.9 > max(before)
    # Had the same rounds counted as the model's (one table for all), it would draft longer.
    mixed = measured(0.5)
    for _ in range(60):
        mixed.observe(RoundRecord(drafted=10, accepted=10, emitted=11, verify_latency_s=0.033, drafter="draft-model",
                                  accepted_by_position=(True,) * 10))
    assert policy.choose(PolicyState(REMAINING, 0)).length < mixed.choose(PolicyState(REMAINING, 0)).length


def test_a_client_without_a_draft_model_learns_from_the_drafter_it_has():
    policy = AdaptiveDraftLength()
    policy.start_request()
    for _ in range(30):
        policy.observe(RoundRecord(drafted=4, accepted=1, emitted=2, verify_latency_s=0.03, drafter="prompt-lookup",
                                   accepted_by_position=(True, False, False, False)))
    assert policy.acceptance() == policy.acceptance(drafter="prompt-lookup")
    assert policy.acceptance()[0] > 0.9 and policy.acceptance()[1] < 0.1


def test_a_request_drafting_from_the_index_goes_on_whatever_the_verdict_on_the_draft_model():
    """Speculation with the draft model is off (its drafts lose), but a request whose suffix drafts all
    pass drafts full rounds: they cost a verify call only. The verdict stays what it was."""
    policy = measured(0.1)
    assert policy.choose(PolicyState(REMAINING, 4, accepted_by_position=((False,),) * 4)).length == 0 and policy._off
    suffix_rounds(policy, 10)
    assert policy.choose(free_state(((True,) * 10,) * 2)).length == policy.free_max_length > policy.max_length
    assert policy._off


def test_a_request_whose_free_drafts_fail_drafts_shorter_then_lets_the_target_finish():
    """The client's suffix drafts are good, but this request's are refused at the first token (the index
    continues another request's text): it drafts shorter at once, and after a few such rounds the target
    writes its rest alone, named in the reason."""
    policy = measured(0.7, per_token_s=0.02)  # a target whose tokens come faster than a verify call
    suffix_rounds(policy, 30)
    good = policy.choose(free_state(((True,) * 10,))).length
    once = policy.choose(free_state(((False,),))).length
    assert good == policy.free_max_length > once > 0
    last = policy.choose(free_state(((False,),) * 8))
    assert last.length == 0 and "suffix drafts" in last.reason and not policy._off


# ----------------------------------------------------------------------------- pipelined drafts


def with_requests_in_flight(policy: AdaptiveDraftLength, n: int) -> LoadCurve:
    curve = LoadCurve()
    for request_id in range(1, n + 1):
        curve.enter(request_id)
    policy.watch_load(curve, curve)
    return curve


@pytest.mark.parametrize("acceptance, pipelined_under_load", [(0.95, True), (0.5, False)])
def test_pipelined_drafts_are_made_under_load_only_where_they_are_likely_used(acceptance, pipelined_under_load):
    """A pipelined draft is used only if the whole draft is accepted, and under load its call slows the
    other requests used or not. The first request in flight always pipelines (nothing changes at one)."""
    policy = measured(acceptance)
    with_requests_in_flight(policy, 16)
    for request_id, expected in ((1, True), (9, pipelined_under_load)):
        token = current_request.set(request_id)
        try:
            assert policy.pipeline_pays(4) is expected
        finally:
            current_request.reset(token)


class _NoPipelining(FixedDraftLength):
    def pipeline_pays(self, k: int) -> bool:
        return False


async def test_the_engine_drafts_ahead_only_when_the_policy_says_it_pays():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy=_NoPipelining(4), pipeline=True) as client:
        prompt = "def fibonacci(n):\n"
        resp = await client.completions.create(prompt=prompt, max_tokens=40, temperature=0)
    assert answer(resp) == await target_alone(provider, prompt=prompt, max_tokens=40)
    s = resp.speculative
    assert s.num_rounds > 2 and not any(r.drafter.endswith("+pipelined") for r in s.rounds)
    # One draft generation a round: none made ahead (on vLLM's token-id path the draft server also
    # splits each draft's text into ids, /tokenize calls that generate nothing).
    drafted = [c for c in provider.calls if c.model == "sim-draft" and c.path.startswith("/v1/completions") and str(c.body.get("prompt")).startswith(prompt)]
    assert len(drafted) == s.num_rounds


# ----------------------------------------------------------------------------- the first round


class _Drafts:
    """An inner policy that always drafts `k` and records what it is told."""

    name = "stub"

    def __init__(self, k: int) -> None:
        self.k = k
        self.observed = 0

    def start_request(self) -> str:
        return "speculate"

    def choose(self, state: PolicyState) -> int:
        return self.k

    def observe(self, record: RoundRecord) -> None:
        self.observed += 1

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        pass


def test_a_first_round_the_index_expects_to_continue_is_drafted_free_and_as_long_as_expected():
    switches: list[bool] = []
    gate = FreeDraftGate(_Drafts(3), expected=8.2, free_drafters=lambda only=True: switches.append(only), max_length=12, remaining=40)
    assert gate.start_request().mode == "speculate"
    assert gate.choose(PolicyState(remaining_tokens=40, rounds_so_far=0)).length == 9 and switches == [True]
    gate.observe(RoundRecord(drafted=9, accepted=9, emitted=10, drafter="suffix", accepted_by_position=(True,) * 9))
    assert switches == [True, False]  # every drafter again: later rounds draft as the policy chooses
    assert gate.choose(PolicyState(remaining_tokens=30, rounds_so_far=1)).length == 3 and switches == [True, False]
    assert gate.inner.observed == 1

    unsure = FreeDraftGate(_Drafts(3), expected=2.0, free_drafters=lambda only=True: switches.append(only), max_length=12, remaining=40)
    assert unsure.choose(PolicyState(remaining_tokens=40, rounds_so_far=0)).length == 3 and switches == [True, False]
