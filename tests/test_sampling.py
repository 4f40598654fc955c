"""`specapi.core.sampling`: probabilities from top-k logprob lists, the acceptance rule and the residual.

The speculative-sampling identity is checked analytically over random small distributions: keeping a
draft token x ~ q with probability min(1, p/q) and otherwise resampling from residual(p, q) must give
exactly p. `toyserver.transform` (the toy server's own sampler, written independently) is the oracle
for temperature and top_p.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from specapi.core.sampling import (
    COVERAGE_TOLERANCE,
    TokenDist,
    acceptance_probability,
    argmax_token,
    residual,
    sample_token,
)
from toyserver import transform

# Token names whose string order is their index order, so tie-breaking "by token" and "by id" agree.
NAMES = [f"t{i}" for i in range(8)]


@st.composite
def distributions(draw, min_size: int = 2, max_size: int = 6, allow_zero: bool = True, size: int | None = None):
    """A random probability vector over a small vocabulary (zeros allowed unless said otherwise)."""
    n = size if size is not None else draw(st.integers(min_size, max_size))
    low = 0.0 if allow_zero else 1e-3
    weights = draw(st.lists(st.floats(low, 1.0), min_size=n, max_size=n))
    total = math.fsum(weights)
    assume(total > 1e-6)
    return [w / total for w in weights]


def as_dist(probs: list[float]) -> TokenDist:
    return TokenDist(probs={NAMES[i]: p for i, p in enumerate(probs) if p > 0})


def as_logprobs(probs: list[float]) -> dict[str, float]:
    return {NAMES[i]: math.log(p) for i, p in enumerate(probs) if p > 0}


# ----------------------------------------------------------------------------- the exactness identity


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_accept_or_resample_from_residual_yields_exactly_p(data):
    n = data.draw(st.integers(2, 6))
    p = data.draw(distributions(size=n))
    q = data.draw(distributions(size=n))
    p_dist, q_dist = as_dist(p), as_dist(q)
    accept = [acceptance_probability(p[i], q[i]) for i in range(n)]
    rejected_mass = 1.0 - math.fsum(q[i] * accept[i] for i in range(n))
    r = residual(p_dist, q_dist)
    for i in range(n):
        produced = q[i] * accept[i] + rejected_mass * r.get(NAMES[i])
        assert produced == pytest.approx(p[i], abs=1e-9), (p, q, i)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_residual_is_a_distribution_on_where_p_exceeds_q(data):
    n = data.draw(st.integers(2, 6))
    p, q = data.draw(distributions(size=n)), data.draw(distributions(size=n))
    assume(math.fsum(max(0.0, p[i] - q[i]) for i in range(n)) > 1e-9)
    r = residual(as_dist(p), as_dist(q))
    assert math.fsum(r.probs.values()) == pytest.approx(1.0, abs=1e-12)
    assert all(v >= 0 for v in r.probs.values())
    for i in range(n):
        if p[i] <= q[i]:
            assert r.get(NAMES[i]) == 0.0


def test_residual_of_identical_distributions_falls_back_to_p():
    p = TokenDist(probs={"a": 0.3, "b": 0.7})
    assert residual(p, p).probs == p.probs


def test_residual_carries_the_larger_coverage_gap():
    p = TokenDist(probs={"a": 0.6, "b": 0.3}, gap=0.1)
    q = TokenDist(probs={"a": 0.9}, gap=0.02)
    r = residual(p, q)
    assert r.gap == pytest.approx(0.1)
    assert set(r.probs) == {"b"}  # only b has p > q


@pytest.mark.parametrize(
    ("p", "q", "expected"),
    [(0.2, 0.4, 0.5), (0.4, 0.2, 1.0), (0.3, 0.3, 1.0), (0.5, 0.0, 1.0), (0.0, 0.0, 0.0), (0.0, 0.7, 0.0)],
)
def test_acceptance_probability_is_min_one_p_over_q(p, q, expected):
    assert acceptance_probability(p, q) == pytest.approx(expected)


# ----------------------------------------------------------------------------- from_logprobs


@settings(max_examples=200, deadline=None)
@given(p=distributions(allow_zero=False), temperature=st.sampled_from([0.25, 0.5, 0.8, 1.0, 1.3, 2.0]))
def test_temperature_on_a_complete_list_is_p_to_the_one_over_t_renormalised(p, temperature):
    dist = TokenDist.from_logprobs(as_logprobs(p), temperature=temperature)
    weights = [x ** (1.0 / temperature) for x in p]
    total = math.fsum(weights)
    for i, w in enumerate(weights):
        assert dist.get(NAMES[i]) == pytest.approx(w / total, rel=1e-9, abs=1e-12)
    assert dist.gap == 0.0 and dist.exact


@settings(max_examples=200, deadline=None)
@given(
    p=distributions(allow_zero=False),
    temperature=st.sampled_from([0.5, 1.0, 1.5]),
    top_p=st.floats(0.05, 0.99),
)
def test_top_p_matches_an_independent_sampler(p, temperature, top_p):
    expected = transform(p, temperature, top_p)
    # Skip cases where a cumulative sum sits on top_p within rounding: both answers are then right.
    tempered = transform(p, temperature)
    cumulative = 0.0
    for x in sorted(tempered, reverse=True):
        cumulative += x
        assume(abs(cumulative - top_p) > 1e-9)
    dist = TokenDist.from_logprobs(as_logprobs(p), temperature=temperature, top_p=top_p)
    for i, want in enumerate(expected):
        assert dist.get(NAMES[i]) == pytest.approx(want, abs=1e-9), (p, temperature, top_p)
    assert dist.exact


def test_top_p_keeps_the_smallest_set_reaching_the_mass():
    lps = {"a": math.log(0.5), "b": math.log(0.3), "c": math.log(0.2)}
    assert TokenDist.from_logprobs(lps, top_p=0.5).probs == {"a": 1.0}
    two = TokenDist.from_logprobs(lps, top_p=0.6).probs
    assert two == pytest.approx({"a": 0.625, "b": 0.375})


def test_processed_logprobs_are_taken_as_they_are():
    lps = {"a": math.log(0.7), "b": math.log(0.3)}
    dist = TokenDist.from_logprobs(lps, temperature=0.5, raw=False)
    assert dist.probs == pytest.approx({"a": 0.7, "b": 0.3})
    raw = TokenDist.from_logprobs(lps, temperature=0.5, raw=True)
    assert raw.get("a") == pytest.approx(0.49 / 0.58)


def test_rounded_logprobs_summing_over_one_are_renormalised():
    dist = TokenDist.from_logprobs({"a": math.log(0.6004), "b": math.log(0.4003)})
    assert math.fsum(dist.probs.values()) == pytest.approx(1.0, abs=1e-12)
    assert dist.exact


def test_temperature_zero_is_refused():
    with pytest.raises(ValueError):
        TokenDist.from_logprobs({"a": 0.0}, temperature=0)


# ----------------------------------------------------------------------------- coverage gap


def test_gap_is_zero_when_the_list_covers_the_mass():
    dist = TokenDist.from_logprobs({"a": math.log(0.6), "b": math.log(0.4)})
    assert dist.gap == 0.0 and dist.exact


def test_gap_reports_the_mass_a_short_list_leaves_out():
    dist = TokenDist.from_logprobs({"a": math.log(0.6), "b": math.log(0.3)})
    assert dist.gap == pytest.approx(0.1)
    assert not dist.exact
    assert dist.probs == pytest.approx({"a": 0.6, "b": 0.3})  # listed values are exact at T=1


def test_clamped_floor_values_are_ignored():
    lps = {"a": math.log(0.6), "b": math.log(0.4), "c": -9999.0, "d": None, "e": float("nan")}
    dist = TokenDist.from_logprobs(lps)
    assert set(dist.probs) == {"a", "b"}
    assert dist.gap == 0.0


def test_an_empty_or_all_clamped_list_is_all_gap():
    assert TokenDist.from_logprobs({}).gap == 1.0
    assert TokenDist.from_logprobs({"a": -9999.0}).gap == 1.0


def test_gap_vanishes_when_top_p_cuts_below_the_listed_tokens():
    # 0.6 + 0.3 listed, 0.1 unseen: top_p 0.5 is reached by "a" alone, so unseen tokens cannot matter.
    dist = TokenDist.from_logprobs({"a": math.log(0.6), "b": math.log(0.3)}, top_p=0.5)
    assert dist.probs == {"a": 1.0}
    assert dist.gap == 0.0


def _tempered_unseen_share(full: list[float], k: int, temperature: float) -> float:
    weights = sorted((x ** (1.0 / temperature) for x in full), reverse=True)
    return math.fsum(weights[k:]) / math.fsum(weights)


@settings(max_examples=300, deadline=None)
@given(
    full=distributions(min_size=3, max_size=8, allow_zero=False),
    k=st.integers(1, 7),
    temperature=st.sampled_from([0.3, 0.6, 1.0]),
)
def test_gap_bounds_the_unseen_mass_at_temperatures_up_to_one(full, k, temperature):
    assume(k < len(full))
    ranked = sorted(full, reverse=True)
    listed = {NAMES[i]: math.log(ranked[i]) for i in range(k)}  # a server's top-k list
    dist = TokenDist.from_logprobs(listed, temperature=temperature)
    assert dist.gap >= _tempered_unseen_share(ranked, k, temperature) - 1e-9


def test_gap_bounds_the_unseen_mass_above_temperature_one():
    """At T > 1 unseen mass spread over many small tokens gains weight; `gap` must still bound it."""
    ranked = [0.5, 0.4] + [0.01] * 10  # top-2 listed; 0.1 spread over 10 unlisted tokens
    listed = {"a": math.log(0.5), "b": math.log(0.4)}
    dist = TokenDist.from_logprobs(listed, temperature=2.0)
    true_share = _tempered_unseen_share(ranked, 2, 2.0)  # ~0.43
    assert dist.gap >= true_share, f"gap {dist.gap:.3f} understates the unseen share {true_share:.3f}"


def test_top_p_above_temperature_one_does_not_claim_a_wrong_exact_result():
    """Same list as above: the true T=2, top_p=0.4 nucleus keeps a and b; {"a": 1.0} may not be called exact."""
    ranked = [0.5, 0.4] + [0.01] * 10
    listed = {"a": math.log(0.5), "b": math.log(0.4)}
    cut = TokenDist.from_logprobs(listed, temperature=2.0, top_p=0.4)
    true_nucleus = transform(ranked, 2.0, 0.4)
    assert true_nucleus[1] > 0.4  # the true nucleus holds b
    assert not cut.exact or cut.get("b") == pytest.approx(true_nucleus[1], abs=1e-9), cut


# ----------------------------------------------------------------------------- argmax and sampling


def test_argmax_prefers_the_given_token_on_ties_only():
    tie = {"a": -0.69, "b": -0.69, "c": -3.0}
    assert argmax_token(tie, prefer="b") == "b"
    assert argmax_token(tie, prefer="a") == "a"
    assert argmax_token(tie, prefer="c") in {"a", "b"}
    assert argmax_token({"a": -0.1, "b": -2.0}, prefer="b") == "a"


def test_argmax_ignores_clamped_and_missing_values():
    assert argmax_token({"a": -9999.0, "b": -5.0, "c": None}) == "b"
    assert argmax_token({}) is None
    assert argmax_token({"a": -9999.0}) is None


def test_sample_token_is_reproducible_under_a_seed_and_independent_of_dict_order():
    dist = TokenDist(probs={"a": 0.2, "b": 0.5, "c": 0.3})
    shuffled = TokenDist(probs={"c": 0.3, "a": 0.2, "b": 0.5})
    draws = [sample_token(dist, random.Random(7)) for _ in range(3)]
    assert len(set(draws)) == 1
    seq1 = [sample_token(dist, rng) for rng in [random.Random(11)] for _ in range(200)]
    rng2 = random.Random(11)
    seq2 = [sample_token(shuffled, rng2) for _ in range(200)]
    assert seq1 == seq2
    assert len(set(seq1)) == 3


def test_sample_token_follows_the_distribution_and_renormalises():
    rng = random.Random(3)
    dist = TokenDist(probs={"a": 0.1, "b": 0.3})  # sums to 0.4: sampling renormalises over known tokens
    n = 20_000
    counts = {"a": 0, "b": 0}
    for _ in range(n):
        counts[sample_token(dist, rng)] += 1
    assert counts["a"] / n == pytest.approx(0.25, abs=0.015)


def test_sample_token_refuses_an_empty_distribution():
    with pytest.raises(ValueError):
        sample_token(TokenDist(probs={}), random.Random(0))


def test_coverage_tolerance_is_small():
    # A gap below the tolerance counts as exact; it must be far below any mass that matters.
    assert 0 < COVERAGE_TOLERANCE <= 1e-3
    assert TokenDist(probs={"a": 1.0}, gap=COVERAGE_TOLERANCE / 2).exact
    assert not TokenDist(probs={"a": 1.0}, gap=COVERAGE_TOLERANCE * 2).exact
