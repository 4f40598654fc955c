"""Latency arithmetic, prices, the prefix cache and the rate limiter."""

from decimal import Decimal

import numpy as np
import pytest

from specapi.sim.latency import (
    LATENCY_PROFILES,
    ManualClock,
    ModelTiming,
    Pricing,
    PrefixCache,
    RateLimiter,
    RecordingSleep,
    RequestTiming,
    get_latency_profile,
    jittered,
    request_timing,
)

TIMING = ModelTiming(rtt_s=0.01, ttft_base_s=0.1, prefill_tokens_per_s=1000.0, tpot_s=0.02)


def test_ttft_grows_with_uncached_prompt_tokens():
    short = request_timing(TIMING, prompt_tokens=100, completion_tokens=1)
    long = request_timing(TIMING, prompt_tokens=1100, completion_tokens=1)
    assert short.first_token_s == pytest.approx(0.01 + 0.1 + 0.1)
    assert long.first_token_s - short.first_token_s == pytest.approx(1.0)


def test_cached_prompt_tokens_are_not_prefilled():
    cold = request_timing(TIMING, prompt_tokens=1000, cached_tokens=0, completion_tokens=1)
    warm = request_timing(TIMING, prompt_tokens=1000, cached_tokens=900, completion_tokens=1)
    assert cold.first_token_s - warm.first_token_s == pytest.approx(0.9)


def test_each_further_output_token_costs_tpot():
    timing = request_timing(TIMING, prompt_tokens=0, completion_tokens=11)
    assert timing.gaps_s == pytest.approx((0.02,) * 10)
    assert timing.total_s == pytest.approx(0.11 + 0.2)
    assert request_timing(TIMING, prompt_tokens=0, completion_tokens=0).gaps_s == ()


def test_predicted_tokens_cost_a_prefill_token():
    flags = [False, True, True, False]
    timing = request_timing(TIMING, prompt_tokens=0, completion_tokens=4, predicted=flags)
    assert timing.gaps_s == pytest.approx((0.001, 0.001, 0.02))


def test_jitter_is_seeded_and_bounded():
    base = RequestTiming(1.0, (0.1,) * 50)
    a = jittered(base, 0.2, np.random.default_rng(3))
    b = jittered(base, 0.2, np.random.default_rng(3))
    assert a == b
    assert 0.8 <= a.first_token_s <= 1.2
    assert all(0.08 <= g <= 0.12 for g in a.gaps_s)
    assert len(set(a.gaps_s)) > 1
    assert jittered(base, 0.0, np.random.default_rng(3)) is base


def test_named_profiles():
    lan, hosted, instant = (LATENCY_PROFILES[n] for n in ("lan", "hosted", "instant"))
    assert lan.target.ttft_base_s == pytest.approx(0.030) and lan.target.tpot_s == pytest.approx(0.025)
    assert lan.draft.ttft_base_s == pytest.approx(0.004) and lan.draft.tpot_s == pytest.approx(0.004)
    assert lan.target.rtt_s <= 0.002
    assert hosted.target.rtt_s + hosted.target.ttft_base_s == pytest.approx(0.400)
    assert hosted.draft.rtt_s + hosted.draft.ttft_base_s == pytest.approx(0.300)
    assert hosted.target.tpot_s == pytest.approx(0.012) and hosted.draft.tpot_s == pytest.approx(0.008)
    assert hosted.target.pricing == Pricing(input=Decimal("2.50"), output=Decimal("10.00"), cached_input=Decimal("1.25"))
    assert hosted.draft.pricing.output == Decimal("0.60")
    assert request_timing(instant.target, prompt_tokens=5000, completion_tokens=500).total_s == 0.0
    assert get_latency_profile("lan") is lan
    with pytest.raises(KeyError):
        get_latency_profile("moon")


def test_profile_overrides_and_tiers():
    custom = LATENCY_PROFILES["lan"].with_overrides(**{"sim-draft-small": ModelTiming(tpot_s=0.001)})
    assert custom.timing_for("sim-draft-small", "draft").tpot_s == 0.001
    assert custom.timing_for("sim-draft", "draft") is custom.draft
    assert custom.timing_for("sim-target", "target") is custom.target


def test_pricing_cost_is_decimal_and_discounts_cached_tokens():
    price = LATENCY_PROFILES["hosted"].target.pricing
    cost = price.cost(prompt_tokens=1_000_000, cached_tokens=0, completion_tokens=100_000)
    assert cost == Decimal("3.50")
    cached = price.cost(prompt_tokens=1_000_000, cached_tokens=1_000_000, completion_tokens=0)
    assert cached == Decimal("1.25")


def test_prefix_cache_finds_the_longest_cached_prefix_in_blocks():
    cache = PrefixCache(block_tokens=4)
    first = list(range(20))
    assert cache.lookup(first) == 0
    cache.insert(first)
    assert cache.lookup(first) == 16  # never the last token: blocks of the first 19
    assert cache.lookup(first[:10] + [99] * 10) == 8
    assert cache.lookup([99] + first) == 0


def test_prefix_cache_threshold_and_off_switch():
    cache = PrefixCache(block_tokens=128, min_tokens=1024)
    tokens = list(range(1000))
    cache.insert(tokens)
    assert cache.lookup(tokens) == 0
    longer = list(range(1500))
    cache.insert(longer)
    assert cache.lookup(longer) == 1408
    off = PrefixCache(block_tokens=0)
    off.insert(tokens)
    assert off.lookup(tokens) == 0


def test_prefix_cache_evicts_least_recent_blocks():
    cache = PrefixCache(block_tokens=2, capacity=3)
    cache.insert([1, 2, 3, 4, 5, 6])
    cache.insert([7, 8, 9, 10])
    assert cache.lookup([1, 2, 3, 4, 5, 6, 0]) == 0
    assert cache.lookup([7, 8, 9, 10, 0]) == 4


def test_rate_limiter_window_and_concurrency():
    clock = ManualClock()
    limiter = RateLimiter(requests_per_s=2, max_concurrency=None, clock=clock)
    assert limiter.try_acquire() is None
    assert limiter.try_acquire() is None
    wait = limiter.try_acquire()
    assert wait == pytest.approx(1.0)
    clock.advance(1.0)
    assert limiter.try_acquire() is None
    bounded = RateLimiter(requests_per_s=None, max_concurrency=1, clock=clock)
    assert bounded.try_acquire() is None
    assert bounded.try_acquire() is not None
    bounded.release()
    assert bounded.try_acquire() is None


async def test_recording_sleep_records_and_advances_the_clock():
    clock = ManualClock(10.0)
    sleep = RecordingSleep(clock)
    await sleep(0.5)
    await sleep(0.25)
    assert sleep.calls == [0.5, 0.25]
    assert sleep.total == 0.75
    assert clock() == 10.75


def test_time_already_spent_comes_off_the_first_token_then_the_gaps_in_order():
    timing = RequestTiming(0.005, (0.004, 0.004, 0.004))
    assert timing.less(0.0) == timing
    assert timing.less(0.003).first_token_s == pytest.approx(0.002) and timing.less(0.003).gaps_s == timing.gaps_s
    later = timing.less(0.011)
    assert later.first_token_s == 0.0 and later.gaps_s == pytest.approx((0.0, 0.002, 0.004))
    assert later.total_s == pytest.approx(timing.total_s - 0.011)
    assert timing.less(1.0) == RequestTiming(0.0, (0.0, 0.0, 0.0))
