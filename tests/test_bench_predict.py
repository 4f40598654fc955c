"""The bench's arithmetic (specapi.bench.predict) on hand-made numbers."""

import math

import pytest

from specapi.bench.predict import (
    LatencyModel,
    best_draft_length,
    break_even_acceptance,
    conditional_acceptance,
    expected_tokens,
    expected_tokens_by_position,
    fit_line,
    predict,
    predicted_speedup,
    round_time,
    survival,
)
from specapi.parts.policy import expected_tokens_by_position as policy_expected_tokens

# A LAN-like pair: target 25 ms/token, draft call 4 ms + 4 ms/token, verify call 35 ms.
LAN = LatencyModel(
    target_fixed_s=0.030, target_per_token_s=0.025, draft_fixed_s=0.004, draft_per_token_s=0.004, verify_fixed_s=0.035
)
# A hosted-like pair: target 400 ms + 12 ms/token, draft call 300 ms + 8 ms/token, verify 400 ms.
HOSTED = LatencyModel(
    target_fixed_s=0.400, target_per_token_s=0.012, draft_fixed_s=0.300, draft_per_token_s=0.008, verify_fixed_s=0.400
)


def test_expected_tokens_closed_form():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.8, 4) == pytest.approx(1 + 0.8 + 0.64 + 0.512 + 0.4096)
    assert expected_tokens(0.5, 1) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        expected_tokens(1.2, 4)


def test_expected_tokens_by_position_matches_closed_form_and_policy():
    for alpha in (0.0, 0.3, 0.8, 0.95):
        for k in (1, 3, 7):
            assert expected_tokens_by_position([alpha] * k, k) == pytest.approx(expected_tokens(alpha, k))
    rates = [0.9, 0.7, 0.5]
    assert expected_tokens_by_position(rates, 3) == pytest.approx(1 + 0.9 + 0.63 + 0.315)
    assert expected_tokens_by_position(rates, 5) == pytest.approx(policy_expected_tokens(rates, 5))
    # Beyond the measured positions the last rate repeats.
    assert survival(rates, 5)[-1] == pytest.approx(0.9 * 0.7 * 0.5 * 0.5 * 0.5)
    assert expected_tokens_by_position([], 3) == 1.0


def test_conditional_acceptance_counts_only_rounds_that_reached_a_position():
    rounds = [
        (True, True, False),  # reached 3 positions
        (True, False, False),  # reached 2 (position 3 never judged)
        (False, False, False),  # reached 1
        (True, True, True),
    ]
    assert conditional_acceptance(rounds) == pytest.approx([3 / 4, 2 / 3, 1 / 2])
    assert conditional_acceptance([]) == []
    assert conditional_acceptance([(False,)]) == [0.0]


def test_fit_line_recovers_fixed_and_per_token_costs():
    xs = [1, 2, 4, 8]
    ys = [0.004 + 0.004 * x for x in xs]
    fixed, slope = fit_line(xs, ys)
    assert fixed == pytest.approx(0.004) and slope == pytest.approx(0.004)
    assert fit_line([4, 4, 4], [0.1, 0.2, 0.3]) is None
    assert fit_line([1], [1.0]) is None
    fixed, slope = fit_line([1, 2], [0.3, 0.1])  # a negative slope is noise: clamped
    assert slope == 0.0 and fixed == pytest.approx(0.2)


def test_predicted_speedup_on_hand_made_numbers():
    # E(4) at 0.8 = 3.3616; a round = 4 + 16 + 35 ms = 55 ms; 60 tokens alone = 30 + 1500 ms;
    # 60 / 3.3616 rounds, plus half a round lost at the end of the request.
    expected = 1.530 / ((60 / 3.3616 + 0.5) * 0.055)
    assert predicted_speedup(LAN, [0.8], 4, 60) == pytest.approx(expected)
    assert expected == pytest.approx(1.5160, abs=1e-3)
    # Hosted: a round costs ~0.73 s for ~3.4 tokens worth ~40 ms: far slower than the target alone.
    assert predicted_speedup(HOSTED, [0.8], 4, 16) < 0.3


def test_lookup_rounds_cost_only_the_verify_call():
    lookup = LatencyModel(target_fixed_s=0.0, target_per_token_s=0.025, draft_fixed_s=0.5, verify_fixed_s=0.035, draft_share=0.0)
    assert round_time(lookup, 10) == pytest.approx(0.035)
    assert predicted_speedup(lookup, [1.0], 10, 80) == pytest.approx(80 * 0.025 / ((80 / 11 + 0.5) * 0.035))


def test_pipelining_hides_the_draft_when_everything_is_accepted():
    sequential = round_time(LAN, 4, [1.0])
    pipelined = round_time(LAN, 4, [1.0], pipelined=True)
    assert sequential == pytest.approx(0.004 + 0.016 + 0.035)
    assert pipelined == pytest.approx(0.035)  # draft(5) = 24 ms < verify: fully overlapped
    # Nothing accepted: the prefetched draft is useless, the round costs what a sequential one does.
    assert round_time(LAN, 4, [0.0], pipelined=True) == pytest.approx(sequential)
    assert round_time(LAN, 4, [0.0], pipelined=True) > round_time(LAN, 4, [0.7], pipelined=True) > pipelined


def test_best_draft_length_trades_acceptance_against_draft_cost():
    k_high, s_high = best_draft_length(LAN, [0.95], 60)
    k_low, s_low = best_draft_length(LAN, [0.5], 60)
    assert k_high > k_low >= 1
    assert s_high > s_low
    assert s_high == pytest.approx(max(predicted_speedup(LAN, [0.95], k, 60) for k in range(1, 17)))


def test_break_even_acceptance():
    # Verify-only rounds costing two target tokens, no fixed target cost: over 1000 tokens the break-even
    # needs E(K) just above 2, i.e. acceptance just above 0.5 with 16 tokens per round (1 with one).
    model = LatencyModel(target_fixed_s=0.0, target_per_token_s=0.01, verify_fixed_s=0.02, draft_share=0.0)
    at_best = break_even_acceptance(model, 1000)
    assert 0.5 < at_best < 0.51
    assert predicted_speedup(model, [at_best], 16, 1000) == pytest.approx(1.0, abs=1e-3)
    assert break_even_acceptance(model, 1000, k=1) is None  # E(1) <= 2: never quite enough
    # Hosted: even a perfect draft cannot pay for two fixed-cost calls per round.
    assert break_even_acceptance(HOSTED, 16) is None
    # LAN: somewhere in between.
    lan = break_even_acceptance(LAN, 60)
    assert 0.3 < lan < 0.7
    assert predicted_speedup(LAN, [lan - 0.02], best_draft_length(LAN, [lan - 0.02], 60)[0], 60) < 1.0


def test_predict_bundles_the_figures():
    p = predict(LAN, [0.9, 0.8, 0.8], 4, 60)
    assert p.draft_length == 4
    assert p.expected_tokens == pytest.approx(expected_tokens_by_position([0.9, 0.8, 0.8], 4))
    assert p.speedup == pytest.approx(predicted_speedup(LAN, [0.9, 0.8, 0.8], 4, 60))
    assert p.best_speedup >= p.speedup
    assert p.extrapolated == (p.best_draft_length > 3)
    data = p.to_dict()
    assert data["draft_length"] == 4 and isinstance(data["break_even_acceptance"], float)
    assert not math.isnan(data["round_s"])
