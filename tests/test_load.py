"""`specapi.core.load.LoadCurve` and the load-aware decisions of `AdaptiveDraftLength`, on a simulated
latency-vs-concurrency curve: no clocks, no HTTP (the curve is fed the samples a client would record)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from specapi.core.load import LoadCurve, current_request
from specapi.parts.policy import LOAD_DRAFT_LENGTH, LOAD_STREAM_FASTER, LOAD_TARGET_ALONE, TARGET_ALONE, AdaptiveDraftLength, Decision, PolicyState
from specapi.core.stats import RoundRecord, SpeculativeStats

REMAINING = 200


def curve_from(latency_at, loads: range, *, in_flight: int) -> LoadCurve:
    """A curve that saw calls at each load in `loads` take `latency_at(load)`, now `in_flight` requests."""
    curve = LoadCurve()
    for load in loads:
        for _ in range(5):
            curve.add(load, latency_at(load))
    for request_id in range(1, in_flight + 1):
        curve.enter(request_id)
    return curve


def test_the_curve_measures_the_slope_of_latency_in_requests_in_flight():
    curve = curve_from(lambda c: 0.030 + 0.004 * c, range(1, 17), in_flight=8)
    assert curve.slope == pytest.approx(0.004)
    assert curve.inflation() == pytest.approx((0.030 + 0.004 * 8) / (0.030 + 0.004))
    assert curve.cost_to_others(rank=1) == 0.0  # the first request in flight has nobody ahead of it
    assert curve.cost_to_others(rank=5) == pytest.approx(4 * 0.004)


def test_one_load_seen_means_no_slope_and_no_cost():
    curve = curve_from(lambda c: 0.05, range(1, 2), in_flight=1)
    assert curve.slope is None and curve.inflation() == 1.0 and curve.cost_to_others(rank=3) == 0.0


def test_requests_rank_in_start_order_and_leave_cleanly():
    curve = LoadCurve()
    for request_id in (3, 7, 9):
        curve.enter(request_id)
    assert [curve.rank(r) for r in (3, 7, 9)] == [1, 2, 3]
    curve.leave(3)
    assert curve.requests == 2 and curve.rank(9) == 2
    curve.leave(3)  # twice is harmless
    assert curve.requests == 2
    assert curve.rank(None) == 2  # unknown: the last place


def learnt_lan_policy() -> AdaptiveDraftLength:
    """A policy that has seen LAN-like rounds at one stream (draft 4 ms + 4 ms/token, verify 31 ms,
    acceptance 0.8) and measured the target (30 ms + 25 ms/token) on a request's last tokens."""
    policy = AdaptiveDraftLength()
    policy.start_request()
    rng = random.Random(7)
    for i in range(40):
        k = (4, 6, 3)[i % 3]
        accepted = 0
        while accepted < k and rng.random() < 0.8:
            accepted += 1
        policy.observe(RoundRecord(drafted=k, accepted=accepted, emitted=accepted + 1, draft_latency_s=0.004 + 0.004 * k,
                                   verify_latency_s=0.031, drafter="draft-model", accepted_by_position=tuple(j < accepted for j in range(k))))
    policy.observe_plain(8, 0.03 + 0.025 * 8)
    return policy


def decision(
    policy: AdaptiveDraftLength, curve: LoadCurve | None, request_id: int, rounds_so_far: int = 0, *, free: bool = False,
    queue_delay_s: float = 0.0,
) -> Decision:
    """What `policy` decides for a round of request `request_id` with `curve` as the load."""
    policy.watch_load(curve, curve)
    token = current_request.set(request_id)
    try:
        state = PolicyState(remaining_tokens=REMAINING, rounds_so_far=rounds_so_far, last_drafter="suffix" if free else "", queue_delay_s=queue_delay_s)
        return policy.choose(state)
    finally:
        current_request.reset(token)


def decide(*args: Any, **kwargs: Any) -> tuple[int, str | None]:
    """`decision`'s length and load reason."""
    chosen = decision(*args, **kwargs)
    return chosen.length, chosen.load_reason


def test_at_one_request_in_flight_nothing_changes():
    unloaded = learnt_lan_policy()
    k_alone, reason_alone = decide(unloaded, None, 1)
    steep = curve_from(lambda c: 0.030 + 0.050 * c, range(1, 33), in_flight=1)  # a steep curve, but one request
    k_loaded, reason_loaded = decide(learnt_lan_policy(), steep, 1)
    assert k_alone > 0 and (k_loaded, reason_loaded) == (k_alone, reason_alone) and reason_alone is None


def test_a_flat_curve_changes_nothing_however_many_requests_are_in_flight():
    flat = curve_from(lambda c: 0.031, range(1, 33), in_flight=32)
    assert decide(learnt_lan_policy(), flat, 32) == decide(learnt_lan_policy(), None, 1)


def test_on_a_steep_curve_early_requests_speculate_and_later_ones_step_aside():
    """Latency grows by 6 ms per request in flight: the first requests in flight speculate, those
    that would slow the ones ahead of them more than they gain let the target generate alone."""
    steep = curve_from(lambda c: 0.031 + 0.006 * c, range(1, 33), in_flight=32)
    decisions = [decide(learnt_lan_policy(), steep, rank) for rank in range(1, 33)]
    ks = [k for k, _ in decisions]
    assert ks[0] > 0 and decisions[0][1] is None
    assert ks[-1] == 0 and decisions[-1][1] == LOAD_TARGET_ALONE
    first_alone = ks.index(0)
    assert all(k == 0 for k in ks[first_alone:]), "admission in start order: once one steps aside, later ones do too"
    assert all(reason == LOAD_TARGET_ALONE for _, reason in decisions[first_alone:])


def test_a_moderate_curve_changes_the_draft_length_and_says_so():
    moderate = curve_from(lambda c: 0.031 + 0.002 * c, range(1, 17), in_flight=16)
    k_unloaded, _ = decide(learnt_lan_policy(), None, 1)
    changed = [decide(learnt_lan_policy(), moderate, rank) for rank in range(2, 17)]
    assert any(k not in (0, k_unloaded) and reason == LOAD_DRAFT_LENGTH for k, reason in changed)


def test_a_request_admitted_before_the_curve_saw_the_load_steps_aside_once_it_has():
    """A burst: 32 requests start while the curve has only seen one request in flight, so all are
    admitted; once the burst's first calls have measured the steep curve, later ones step aside
    mid-request, earlier ones keep speculating. (A request already speculating steps aside only when
    predicted slower than the target alone by the policy's margin: 10 ms per request in flight puts
    the last one beyond it.)"""
    unmeasured = curve_from(lambda c: 0.031, range(1, 2), in_flight=32)
    assert all(decide(learnt_lan_policy(), unmeasured, rank)[0] > 0 for rank in (1, 16, 32))
    steep = curve_from(lambda c: 0.031 + 0.010 * c, range(1, 33), in_flight=32)
    assert decide(learnt_lan_policy(), steep, 32, rounds_so_far=3) == (0, LOAD_TARGET_ALONE)
    k, reason = decide(learnt_lan_policy(), steep, 1, rounds_so_far=3)
    assert k > 0 and reason is None


def test_a_request_drafting_free_keeps_going_once_started_under_load():
    """Drafts from the suffix index or the prompt cost no draft call, and the client's acceptance does
    not describe them: a request whose last round was free is judged at its start only."""
    steep = curve_from(lambda c: 0.031 + 0.006 * c, range(1, 33), in_flight=32)
    assert decide(learnt_lan_policy(), steep, 32, rounds_so_far=0, free=False) == (0, LOAD_TARGET_ALONE)
    k, reason = decide(learnt_lan_policy(), steep, 32, rounds_so_far=3, free=True)
    assert k > 0 and reason in (None, LOAD_DRAFT_LENGTH)


def test_stepping_aside_under_load_does_not_turn_speculation_off_for_later_requests():
    policy = learnt_lan_policy()
    steep = curve_from(lambda c: 0.031 + 0.006 * c, range(1, 33), in_flight=32)
    assert decide(policy, steep, 32)[0] == 0
    assert policy.start_request().mode == "speculate"
    assert decide(policy, None, 1)[0] > 0


def test_loaded_verify_calls_do_not_bend_the_targets_own_line():
    """Rounds observed at 16 requests in flight (every call 2x slower) are learnt as at one stream:
    the target's predicted speed stays what it measured alone."""
    policy = learnt_lan_policy()
    before = policy.predicted_target_rate(REMAINING)
    curve = curve_from(lambda c: 0.031 * (1 + (c - 1) / 15), range(1, 17), in_flight=16)
    policy.watch_load(curve, curve)
    for _ in range(30):
        policy.observe(RoundRecord(drafted=4, accepted=3, emitted=4, draft_latency_s=0.040, verify_latency_s=0.062,
                                   drafter="draft-model", accepted_by_position=(True, True, True, False)))
    assert policy.predicted_target_rate(REMAINING) == pytest.approx(before, rel=0.1)


def test_long_drafts_made_under_load_do_not_become_a_cost_per_drafted_token():
    """In a burst, requests whose text the suffix index knows draft 10 tokens, and do so when the load is
    highest, where every call is slow for a reason the curve cannot tell (all its samples at one load).
    Learnt as lines in the tokens of a call, that load read as a cost per verified token, and the one-token
    verify samples bent the target's own line (at 100 streams: 0.19 s to verify one token, 1.9 s for ten,
    and speculation judged slower than the target alone for every request in flight). Calls under load
    move the lines' levels only; the per-token costs stay those measured alone, and speculation stays on.
    The old rule (a slope from every sample) fails this test."""
    policy = learnt_lan_policy()
    verify_per_token = policy._verify.predict(6) - policy._verify.predict(5)
    target_rate = policy.predicted_target_rate(REMAINING)
    busy = curve_from(lambda c: 0.2, range(100, 101), in_flight=100)  # one load seen: no slope, no inflation
    policy.watch_load(busy, busy)
    for i in range(40):  # one-token rounds at 35 ms, ten-token rounds (the busiest moments) at 200 ms
        k = (1, 10)[i % 2]
        policy.observe(RoundRecord(drafted=k, accepted=k, emitted=k + 1, verify_latency_s=0.035 if k == 1 else 0.2,
                                   drafter="suffix", accepted_by_position=(True,) * k))
    assert policy._verify.predict(10) - policy._verify.predict(9) == pytest.approx(verify_per_token)
    assert policy._verify.predict(1) > 0.1  # the level follows the loaded calls
    assert policy.predicted_target_rate(REMAINING) < target_rate  # slower under load, not faster
    # The request drafting from the suffix index goes on at full length, and speculation stays on.
    assert decide(policy, busy, 1, rounds_so_far=1, free=True) == (policy.free_max_length, None) and not policy._off
    # Alone again, calls of different lengths measure the per-token cost anew.
    alone = curve_from(lambda c: 0.031, range(1, 2), in_flight=1)
    policy.watch_load(alone, alone)
    for i in range(40):
        k = (2, 8)[i % 2]
        policy.observe(RoundRecord(drafted=k, accepted=k, emitted=k + 1, verify_latency_s=0.030 + 0.002 * k,
                                   drafter="draft-model", accepted_by_position=(True,) * k))
    assert policy._verify.predict(8) - policy._verify.predict(7) == pytest.approx(0.002, rel=0.5)  # (older samples fade)


def test_the_reason_is_a_typed_field_of_the_statistics_and_reaches_the_json_and_headers():
    stats = SpeculativeStats(load_reason=LOAD_TARGET_ALONE, speculated=False)
    assert stats.to_dict()["load_reason"] == LOAD_TARGET_ALONE
    assert stats.to_headers()["x-specapi-load-reason"].startswith("target alone under load")
    assert SpeculativeStats().to_dict()["load_reason"] is None


def test_a_burst_on_a_cold_policy_speculates_on_the_earliest_request_only_until_speculation_is_measured():
    """Nothing measured and 8 requests in flight: the first speculates (measuring speculation), the
    others let the target generate alone (measuring the target). Alone, a cold request speculates."""
    cold = AdaptiveDraftLength()
    cold.start_request()
    burst = curve_from(lambda c: 0.031, range(1, 2), in_flight=8)
    assert decide(cold, burst, 1) == (cold.start_length, None)
    assert all(decide(cold, burst, rank) == (0, LOAD_TARGET_ALONE) for rank in range(2, 9))
    alone = curve_from(lambda c: 0.031, range(1, 2), in_flight=1)
    assert decide(AdaptiveDraftLength(), alone, 1) == (AdaptiveDraftLength().start_length, None)
    # Once speculation is measured, the measured costs decide (a flat curve: speculate).
    measured = AdaptiveDraftLength()
    measured.start_request()
    for _ in range(8):
        measured.observe(RoundRecord(drafted=4, accepted=4, emitted=5, draft_latency_s=0.02, verify_latency_s=0.031,
                                     drafter="draft-model", accepted_by_position=(True,) * 4))
    measured.observe_plain(32, 0.03 + 0.025 * 32)
    k, reason = decide(measured, curve_from(lambda c: 0.031, range(1, 9), in_flight=8), 3)
    assert k > 0 and reason is None


def test_a_slope_the_samples_cannot_tell_from_jitter_costs_nothing():
    """Calls at one and two requests in flight that differ by chance (a few ms of jitter) give a least-
    squares slope of milliseconds per request; charged to 15 requests ahead it would send requests to
    the target alone for nothing. The certain slope (less two standard errors) is zero there, and on a
    clean steep curve it is the slope itself."""
    rng = random.Random(3)
    noisy = LoadCurve()
    for _ in range(40):
        noisy.add(1, 0.038 + rng.uniform(-0.004, 0.004))
    for _ in range(3):
        noisy.add(2, 0.038 + rng.uniform(-0.004, 0.004))
    noisy.add(2, 0.045)
    for request_id in range(1, 17):
        noisy.enter(request_id)
    assert noisy.slope is not None and noisy.slope > 0.0005
    assert noisy.certain_slope == 0.0 and noisy.cost_to_others(rank=16) == 0.0
    clean = curve_from(lambda c: 0.031 + 0.004 * c, range(1, 17), in_flight=16)
    assert clean.certain_slope == pytest.approx(clean.slope) == pytest.approx(0.004)


class _RecordsItsRequest:
    """Drafts two tokens every round and records which request the client says each round is for."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: list[int | None] = []

    def start_request(self) -> str:
        return "speculate"

    def choose(self, state: PolicyState) -> int:
        self.seen.append(current_request.get())
        return 2

    def observe(self, record: RoundRecord) -> None:
        pass

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        pass


async def test_a_stream_read_on_by_another_task_still_names_its_request():
    """The proxy reads a stream's first chunk in one task and the rest in another (the response's); the
    policy must still know which request a round is for, or it ranks the request last in flight."""
    import asyncio

    from specapi import AsyncSpeculativeOpenAI
    from specapi.sim import SimProvider, simulated_endpoints

    target, draft = simulated_endpoints(provider=SimProvider(capabilities="vllm", latency="instant", seed=0))
    policy = _RecordsItsRequest()
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy=policy) as client:
        stream = await client.completions.create(
            model=target.model, prompt="def add(a, b):\n", max_tokens=24, temperature=0, stream=True
        )
        chunks = stream.__aiter__()

        async def first() -> object:
            return await chunks.__anext__()

        async def rest() -> list[object]:
            return [chunk async for chunk in chunks]

        assert await asyncio.create_task(first()) is not None
        assert await asyncio.create_task(rest())
    assert len(policy.seen) >= 3, policy.seen
    assert None not in policy.seen and len(set(policy.seen)) == 1, policy.seen


def test_the_first_request_in_flight_is_never_sent_aside_for_load_even_inside_the_band():
    """Within the margin's band (speculation predicted faster, but by less than the margin) a fresh
    request speculates on the verdict; with no request ahead of it, no load rule may send it aside."""
    policy = learnt_lan_policy()
    rate = policy.best_length(REMAINING)[1]
    baseline = policy.predicted_target_rate(REMAINING)
    assert baseline is not None and rate > baseline
    policy.margin = 1.5 * rate / baseline  # the verdict keeps speculation on; admission's upper edge is above it
    steep = curve_from(lambda c: 0.030 + 0.050 * c, range(1, 33), in_flight=1)
    k, reason = decide(policy, steep, 1)
    assert k > 0 and reason is None


def test_a_busy_event_loop_at_a_first_round_sends_the_request_to_the_target_alone():
    """A burst's first rounds start before any call has come back, so the curve is flat; the client's
    own queue is not. A draft call and a verify call each wait their turn again (the target alone's
    stream once): with a 40 ms wait the LAN rounds lose, with 2 ms they win. The earliest request in
    flight keeps measuring speculation, later rounds are left to the curve, and the verdict stays on."""
    policy = learnt_lan_policy()
    flat = curve_from(lambda c: 0.031, range(1, 3), in_flight=100)
    assert decide(policy, flat, 50)[0] > 0
    assert decide(policy, flat, 50, queue_delay_s=0.002)[0] > 0
    busy = decision(policy, flat, 50, queue_delay_s=0.040)
    assert (busy.length, busy.load_reason) == (0, LOAD_TARGET_ALONE)
    assert "event loop was busy" in busy.reason and "40.0 ms" in busy.reason
    assert decide(policy, flat, 1, queue_delay_s=0.040)[0] > 0  # nobody ahead: it measures for the others
    assert decide(policy, flat, 50, rounds_so_far=3, queue_delay_s=0.040)[0] > 0  # the first round only
    assert decide(policy, flat, 50)[0] > 0  # stepping aside did not turn speculation off


def test_a_few_warm_up_calls_at_one_and_two_requests_do_not_read_as_a_burst_forty_times_slower():
    """A proxy's warm-up (4 requests, 2 at a time) leaves a line drawn through calls at one and two
    requests in flight: its slope is their jitter. Extrapolated to a cold burst's 100 requests it read
    as calls 40 times slower, and the wait for the event loop, divided by that, no longer counted: in
    some runs of `proxy_load.py` a third of the burst drafted from the model and the wave took 1.45 s
    against the target alone's 0.94 s. The inflation follows the certain slope, and goes no further
    out than the loads the samples saw."""
    rng = random.Random(3)
    warm = LoadCurve()
    for _ in range(15):
        for load in (1, 2):
            warm.add(load, 0.030 + 0.010 * load + rng.uniform(0.0, 0.040))
    for request_id in range(1, 101):
        warm.enter(request_id)
    assert warm.slope > 0.005 and warm.certain_slope == 0.0  # read at 100 requests: 10x
    assert warm.inflation() == 1.0
    policy = learnt_lan_policy()
    assert decide(policy, warm, 50, queue_delay_s=0.040) == (0, LOAD_TARGET_ALONE)
    steep = curve_from(lambda c: 0.030 + 0.010 * c, range(1, 3), in_flight=100)  # certain, seen at 1 and 2 only
    assert steep.inflation() == pytest.approx((0.030 + 0.010 * 2) / (0.030 + 0.010))
    wide = curve_from(lambda c: 0.030 + 0.010 * c, range(1, 101), in_flight=100)  # seen up to 100: read there
    assert wide.inflation() == pytest.approx((0.030 + 0.010 * 100) / (0.030 + 0.010))


def test_free_drafts_are_judged_with_the_wait_and_the_load_counted_when_asked():
    """Rounds without a draft call wait for the loop once each (their verify call); the target alone
    waits once in all. Expected to continue 8 tokens a round, they pay even after a 40 ms wait; one
    token a round does not, though it did with nothing counted."""
    policy = learnt_lan_policy()
    policy.watch_load(curve_from(lambda c: 0.031, range(1, 101), in_flight=100), None)  # flat up to 100 in flight
    assert policy.free_drafts_pay(8.0, 10, 64, queue_delay_s=0.040) is True
    assert policy.free_drafts_pay(1.0, 10, 64) is True
    assert policy.free_drafts_pay(1.0, 10, 64, queue_delay_s=0.040) is False
    assert AdaptiveDraftLength().free_drafts_pay(8.0, 10, 64, queue_delay_s=0.0) is None  # nothing measured


def test_free_drafts_in_a_burst_beyond_the_loads_measured_wait_for_the_earliest_requests_to_measure_it():
    """A warm-up at one and two requests in flight, then a burst of 100 on a flat curve: the suffix index
    knows the answers, and free drafts would pay with the load counted as the curve reads it (no cost
    to the others). Only the requests placed within twice the load the curve measured are admitted;
    the rest are not judged (None: the target writes them alone). Once calls at 100 in flight came
    back, the whole burst is judged on the curve again."""
    from specapi.parts.policy import load_measured

    policy = learnt_lan_policy()
    warm = curve_from(lambda c: 0.031, range(1, 3), in_flight=100)
    assert warm.most_seen == 2
    policy.watch_load(warm, warm)
    verdicts = {}
    for rank in (1, 2, 4, 5, 50, 100):
        token = current_request.set(rank)
        try:
            verdicts[rank] = policy.free_drafts_pay(8.0, 10, 64, queue_delay_s=0.040)
        finally:
            current_request.reset(token)
    assert verdicts == {1: True, 2: True, 4: True, 5: None, 50: None, 100: None}
    assert [load_measured(warm, rank) for rank in (1, 4, 5)] == [True, True, False]
    token = current_request.set(100)
    try:
        assert policy.free_drafts_pay(8.0, 10, 64) is True  # not judged under load (no wait given): as before
        seen = curve_from(lambda c: 0.031, range(1, 101), in_flight=100)
        assert seen.most_seen == 100 and load_measured(seen, 100)
        policy.watch_load(seen, seen)
        assert policy.free_drafts_pay(8.0, 10, 64, queue_delay_s=0.040) is True
    finally:
        current_request.reset(token)
    assert LoadCurve().most_seen == 1


class _RecordsQueueDelay(_RecordsItsRequest):
    watches_queue = True  # asks the engine for the queue's wait (`AdaptiveDraftLength` does)

    def __init__(self) -> None:
        super().__init__()
        self.states: list[PolicyState] = []

    def choose(self, state: PolicyState) -> int:
        self.states.append(state)
        return 2


async def test_the_client_measures_its_queue_before_a_first_round_only_with_other_requests_in_flight():
    """Alone, a request's rounds see no wait (nothing measured, nothing added). Started together with
    others while 5 ms of work waits on the event loop at every turn, the first rounds are told how long
    a step waited; later rounds are not."""
    import asyncio
    import time

    from specapi import AsyncSpeculativeOpenAI
    from specapi.sim import SimProvider, simulated_endpoints

    target, draft = simulated_endpoints(provider=SimProvider(capabilities="vllm", latency="instant", seed=0))
    policy = _RecordsQueueDelay()
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy=policy) as client:

        async def one(prompt: str) -> None:
            await client.completions.create(model=target.model, prompt=prompt, max_tokens=12, temperature=0)

        await one("def add(a, b):\n")
        assert policy.states and all(s.queue_delay_s == 0.0 for s in policy.states)
        policy.states.clear()

        loop = asyncio.get_running_loop()
        busy = [True]

        def hog() -> None:  # 5 ms of work waiting on the loop at every turn, until the requests are done
            until = time.perf_counter() + 0.005
            while time.perf_counter() < until:
                pass
            if busy[0]:
                loop.call_soon(hog)

        loop.call_soon(hog)
        try:
            await asyncio.gather(*(one(p) for p in ("def add(a, b):\n", "import os\n", "class A:\n", "for i in x:\n")))
        finally:
            busy[0] = False
    first = [s for s in policy.states if s.rounds_so_far == 0]
    later = [s for s in policy.states if s.rounds_so_far > 0]
    assert len(first) == 4 and later
    assert max(s.queue_delay_s for s in first) >= 0.0045, [s.queue_delay_s for s in first]
    assert all(s.queue_delay_s == 0.0 for s in later)


def test_the_pace_of_streams_is_the_running_mean_of_the_gaps_between_their_tokens():
    curve = LoadCurve()
    for _ in range(LoadCurve.PACE_MIN_GAPS - 1):
        curve.pace(0.025)
    assert curve.stream_pace is None  # too few gaps to read
    curve.pace(0.025)
    assert curve.stream_pace == pytest.approx(0.025)
    for _ in range(400):  # streams slow down: the pace follows
        curve.pace(0.100)
    assert curve.stream_pace == pytest.approx(0.100, rel=0.01)


def _burst_curve(*, stream_pace: float | None) -> LoadCurve:
    """100 requests in flight on a server whose calls are about 6.7 times slower than alone (31 ms at
    one request, 221 ms at 100), with its streams' tokens coming `stream_pace` apart."""
    curve = curve_from(lambda c: 0.031 + 0.0019 * c, range(1, 101), in_flight=100)
    for _ in range(LoadCurve.PACE_MIN_GAPS if stream_pace is not None else 0):
        curve.pace(stream_pace)
    return curve


def test_under_load_a_stream_that_keeps_its_pace_takes_the_rest_from_rounds_of_calls_that_queue():
    """A server that queues new requests (each call waits 6.7 times as long as alone) while the streams
    it is writing keep their pace (25 ms a token, as alone): a round of calls pays the queue twice, the
    target alone's stream once, for its first token. Even the earliest request in flight, which costs
    nobody ahead of it anything, is faster with the target alone, and says why. Where the streams slow
    down as much as the calls, nothing changes: the rounds and the stream are compared as at one request."""
    steady = _burst_curve(stream_pace=0.025)
    policy = learnt_lan_policy()
    alone = policy.predicted_target_rate(REMAINING)
    assert policy.predicted_target_rate_now(REMAINING) == alone  # no curve: as at one request
    policy.watch_load(steady, steady)
    alone_now = policy.predicted_target_rate_now(REMAINING)
    assert alone is not None and alone_now is not None and alone_now > 3 * alone
    assert decide(learnt_lan_policy(), steady, 1) == (0, LOAD_STREAM_FASTER)
    assert decide(learnt_lan_policy(), steady, 1, rounds_so_far=3) == (0, LOAD_STREAM_FASTER)  # admitted, too
    policy = learnt_lan_policy()
    assert "stream writes faster" in decision(policy, steady, 1).reason and not policy._off  # a word on this load, not a verdict

    slowed = _burst_curve(stream_pace=0.025 * steady.inflation())  # the streams slowed down like the calls
    k, reason = decide(learnt_lan_policy(), slowed, 1)
    assert k > 0 and reason is None
    unmeasured = _burst_curve(stream_pace=None)  # no stream measured yet: as before
    assert decide(learnt_lan_policy(), unmeasured, 1) == decide(learnt_lan_policy(), slowed, 1)
    one = curve_from(lambda c: 0.031 + 0.0019 * c, range(1, 101), in_flight=1)  # one request: nothing changes
    for _ in range(LoadCurve.PACE_MIN_GAPS):
        one.pace(0.025)
    assert decide(learnt_lan_policy(), one, 1) == decide(learnt_lan_policy(), None, 1)


def test_free_drafts_under_load_are_judged_against_the_stream_as_it_writes_now():
    """For the earliest request in flight (no cost to others): drafts from the suffix index with every
    token kept beat even the stream that keeps its pace; drafts with one token in two kept do not, once
    the calls queue and the streams do not (they did while the streams slowed down like the calls)."""
    policy = learnt_lan_policy()
    steady = _burst_curve(stream_pace=0.025)
    slowed = _burst_curve(stream_pace=0.025 * steady.inflation())
    token = current_request.set(1)
    try:
        policy.watch_load(steady, steady)
        assert policy.free_drafts_pay(10.0, 10, REMAINING, queue_delay_s=0.0) is True
        assert policy.free_drafts_pay(1.0, 10, REMAINING, queue_delay_s=0.0) is False
        policy.watch_load(slowed, slowed)
        assert policy.free_drafts_pay(1.0, 10, REMAINING, queue_delay_s=0.0) is True
    finally:
        current_request.reset(token)


class _TargetAlone(_RecordsItsRequest):
    """Hands every request to the target alone, and keeps the curve the client gives it."""

    def __init__(self) -> None:
        super().__init__()
        self.curve: LoadCurve | None = None

    def start_request(self) -> str:
        return TARGET_ALONE

    def watch_load(self, target: LoadCurve | None, draft: LoadCurve | None = None) -> None:
        self.curve = target


async def test_the_target_alones_streams_teach_the_curve_their_pace_without_their_first_token():
    """A simulated target that answers its first token after 200 ms and then one every 10 ms: the pace
    the client measures is the gaps after the first token (the first one's wait is a call's)."""
    from specapi import AsyncSpeculativeOpenAI
    from specapi.sim import SimProvider, simulated_endpoints
    from specapi.sim.latency import LatencyProfile, ModelTiming

    profile = LatencyProfile(name="paced", target=ModelTiming(ttft_base_s=0.2, tpot_s=0.010), draft=ModelTiming())
    target, draft = simulated_endpoints(provider=SimProvider(capabilities="vllm", latency=profile, seed=0))
    policy = _TargetAlone()
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy=policy) as client:
        stream = await client.completions.create(model=target.model, prompt="def add(a, b):\n", max_tokens=40, temperature=0, stream=True)
        text = "".join([chunk.choices[0].text async for chunk in stream])
        assert stream.speculative is not None and not stream.speculative.speculated
    assert text and policy.curve is not None
    pace = policy.curve.stream_pace
    assert pace is not None and 0.009 <= pace < 0.1, pace


class _FirstRoundsInTurn(_RecordsItsRequest):
    """Watches the queue; the first rounds, in the order requests reach them, speculate or not as `plan` says."""

    watches_queue = True

    def __init__(self, plan: list[int]) -> None:
        super().__init__()
        self.plan = list(plan)

    def choose(self, state: PolicyState) -> int:
        if state.rounds_so_far == 0:
            return self.plan.pop(0)
        return 2


async def test_under_load_a_first_round_lets_the_stream_decided_right_after_it_go_out_first():
    """Five streams started together, their first rounds chosen in turn: the earliest speculates (nothing
    queued ahead of it), then speculate, target alone, speculate, target alone. Each of the two later
    speculating rounds makes its first call after the stream of the request whose turn came right
    after its own has reached the server: the long jobs first, as a burst ends when its last stream
    does. (Without the extra turn, each round's first call went out before that stream.)"""
    import asyncio

    from simclient import target_alone
    from specapi import AsyncSpeculativeOpenAI
    from specapi.sim import SimProvider, simulated_endpoints

    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    policy = _FirstRoundsInTurn([3, 3, 0, 3, 0])
    prompts = ["def add(a, b):\n", "import os\n", "class A:\n", "for i in x:\n", "while True:\n"]
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy=policy) as client:

        async def one(prompt: str) -> str:
            stream = await client.completions.create(model=target.model, prompt=prompt, max_tokens=12, temperature=0, stream=True)
            return "".join([chunk.choices[0].text async for chunk in stream])

        texts = await asyncio.gather(*(one(p) for p in prompts))
    calls = [c for c in provider.calls if c.method == "POST"]
    # The requests' own streams (the client's probe streams a token of its own first).
    streams = [i for i, c in enumerate(calls) if c.model == "sim-target" and (c.body or {}).get("stream") and (c.body or {}).get("prompt") in prompts]
    first_draft: dict[str, int] = {}
    for i, c in enumerate(calls):
        if c.model == "sim-draft" and c.path.startswith("/v1/completions"):  # (not a /tokenize lookup)
            first_draft.setdefault(next(p for p in prompts if p in str(c.body.get("prompt"))), i)
    assert len(streams) >= 2 and len(first_draft) == 3
    earliest, *later = sorted(first_draft.values())
    assert earliest < min(streams)  # the earliest request in flight waits for nobody
    assert later[0] > streams[0] and later[1] > streams[1], (streams, first_draft)
    for prompt, text in zip(prompts, texts):
        assert text == (await target_alone(provider, prompt=prompt, max_tokens=12))[0]


def test_a_burst_on_a_policy_that_never_measured_the_target_starts_later_requests_with_the_target_alone():
    """Speculation measured (rounds seen), the target's own speed not (no plain step yet), 8 requests in
    flight on a steep curve: no load check can weigh the added calls, so the earliest request speculates
    and the later ones start with the target alone; a request already speculating goes on."""
    policy = AdaptiveDraftLength()
    policy.start_request()
    for _ in range(8):
        policy.observe(RoundRecord(drafted=4, accepted=3, emitted=4, draft_latency_s=0.02, verify_latency_s=0.031,
                                   drafter="draft-model", accepted_by_position=(True, True, True, False)))
    steep = curve_from(lambda c: 0.031 + 0.006 * c, range(1, 9), in_flight=8)
    k, reason = decide(policy, steep, 1)
    assert k > 0 and reason is None
    assert all(decide(policy, steep, rank) == (0, LOAD_TARGET_ALONE) for rank in range(2, 9))
    assert "not measured yet" in decision(policy, steep, 2).reason
    assert decide(policy, steep, 5, rounds_so_far=2)[0] > 0
    policy.observe_plain(32, 0.03 + 0.025 * 32)  # measured: from here the measured costs decide
    assert "not measured yet" not in decision(policy, steep, 2).reason
