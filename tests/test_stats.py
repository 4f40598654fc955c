"""`specapi.core.stats`: records that add up, cost as Decimal, and the derived statistics."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest

from specapi import RoleUsage, RoundRecord, SpeculativeStats


def usage(**kw) -> RoleUsage:
    return RoleUsage(**kw)


def test_role_usage_adds_field_by_field():
    a = usage(requests=2, prompt_tokens=100, completion_tokens=5, cached_tokens=64, latency_s=0.5, cost_usd=Decimal("0.001"), failed_requests=1)
    b = usage(requests=3, prompt_tokens=50, completion_tokens=7, cached_tokens=0, latency_s=0.25, cost_usd=Decimal("0.002"))
    total = a + b
    assert total == RoleUsage(
        requests=5, prompt_tokens=150, completion_tokens=12, cached_tokens=64, latency_s=0.75, cost_usd=Decimal("0.003"), failed_requests=1
    )
    assert total.total_tokens == 162


def test_role_usage_sums_with_builtin_sum():
    parts = [usage(requests=1, prompt_tokens=i, cost_usd=Decimal("0.1")) for i in range(4)]
    total = sum(parts)
    assert total.requests == 4 and total.prompt_tokens == 6
    assert total.cost_usd == Decimal("0.4")  # exact in Decimal, unlike 0.1 + 0.1 + 0.1 + 0.1 in float


def test_unknown_cost_propagates_as_none():
    known, unknown = usage(cost_usd=Decimal("1.5")), usage(cost_usd=None)
    assert (known + unknown).cost_usd is None
    assert (unknown + known).cost_usd is None
    assert sum([known, known, unknown]).cost_usd is None
    assert SpeculativeStats(draft=unknown, target=known).cost_usd is None
    assert SpeculativeStats(draft=known, target=known).cost_usd == Decimal("3.0")


def test_role_usage_does_not_add_other_types():
    with pytest.raises(TypeError):
        usage() + 1  # noqa: B018
    with pytest.raises(TypeError):
        sum([usage()], 5)


def test_default_usage_costs_zero_not_unknown():
    assert RoleUsage().cost_usd == Decimal(0)


def _stats() -> SpeculativeStats:
    rounds = (
        RoundRecord(drafted=4, accepted=4, emitted=5, accepted_by_position=(True, True, True, True)),
        RoundRecord(drafted=4, accepted=1, emitted=2, accepted_by_position=(True, False, False, False)),
        RoundRecord(drafted=2, accepted=0, emitted=1, accepted_by_position=(False, False)),
    )
    return SpeculativeStats(
        rounds=rounds,
        draft=usage(requests=3, cost_usd=Decimal("0.0001")),
        target=usage(requests=4, prompt_tokens=300, completion_tokens=4, cost_usd=Decimal("0.002")),
        generated_tokens=10,
        wall_s=1.25,
        ttft_s=0.3,
    )


def test_derived_statistics():
    s = _stats()
    assert s.num_rounds == 3
    assert s.drafted_tokens == 10 and s.accepted_tokens == 5
    assert s.acceptance_rate == pytest.approx(0.5)
    assert s.mean_accepted_length == pytest.approx(5 / 3)
    assert s.tokens_per_target_call == pytest.approx(10 / 4)
    assert s.acceptance_by_position() == pytest.approx([2 / 3, 1 / 3, 1 / 2, 1 / 2])
    assert s.cost_usd == Decimal("0.0021")


def test_statistics_of_nothing_are_zero_not_errors():
    s = SpeculativeStats()
    assert (s.acceptance_rate, s.mean_accepted_length, s.tokens_per_target_call) == (0.0, 0.0, 0.0)
    assert s.acceptance_by_position() == []


def test_to_dict_is_json_serialisable_and_keeps_cost_exact():
    s = _stats()
    d = json.loads(json.dumps(s.to_dict()))
    assert d["num_rounds"] == 3 and d["drafted_tokens"] == 10 and d["accepted_tokens"] == 5
    assert d["acceptance_rate"] == pytest.approx(0.5)
    assert Decimal(d["cost_usd"]) == Decimal("0.0021")
    assert Decimal(d["target"]["cost_usd"]) == Decimal("0.002")
    assert d["target"]["requests"] == 4 and d["draft"]["requests"] == 3
    unknown = json.loads(json.dumps(s.with_(draft=usage(cost_usd=None), ttft_s=None).to_dict()))
    assert unknown["cost_usd"] is None and unknown["draft"]["cost_usd"] is None and unknown["ttft_s"] is None


def test_stats_are_immutable_and_with_returns_a_copy():
    s = _stats()
    t = s.with_(speculated=False, fallback_reason="why")
    assert (s.speculated, t.speculated, t.fallback_reason) == (True, False, "why")
    with pytest.raises(AttributeError):
        s.exact = False  # type: ignore[misc]


def test_repr_is_short_and_names_the_figures():
    s = _stats().with_(rounds=_stats().rounds * 40)  # many rounds: the repr does not grow with them
    text = repr(s)
    assert len(text) < 250
    assert "num_rounds=120" in text and "acceptance_rate=0.50" in text and "cost_usd='0.0021'" in text


def test_summary_is_one_line_with_tokens_rounds_acceptance_exactness_path_and_cost_per_role():
    line = _stats().summary()
    assert "\n" not in line
    for part in ("10 tokens", "3 rounds", "5/10", "50%", "exact", "path echo", "draft $0.0001", "target $0.002"):
        assert part in line, part
    unknown = _stats().with_(draft=usage(cost_usd=None), exact=False, exact_reason="top-k lists cover 99%").summary()
    assert "draft unknown" in unknown and "not exact (top-k lists cover 99%)" in unknown
    alone = SpeculativeStats(speculated=False, fallback_reason="tools", generated_tokens=4, verification="none").summary()
    assert "target alone (tools)" in alone


def test_to_dict_uses_the_attribute_names_and_can_carry_the_rounds():
    s = _stats()
    d = json.loads(json.dumps(s.to_dict(rounds=True)))
    for name in ("num_rounds", "drafted_tokens", "accepted_tokens", "acceptance_rate", "mean_accepted_length", "generated_tokens",
                 "tokens_per_target_call", "wall_s", "ttft_s", "exact", "verification", "speculated"):
        assert d[name] == pytest.approx(getattr(s, name)), name
    assert [r["accepted"] for r in d["rounds"]] == [r.accepted for r in s.rounds]
    assert d["rounds"][0]["accepted_by_position"] == list(s.rounds[0].accepted_by_position)
    assert "rounds" not in s.to_dict()


def test_headers_are_the_dict_under_the_same_names():
    s = _stats()
    headers, d = s.to_headers(), s.to_dict()
    assert headers["x-specapi-num-rounds"] == str(d["num_rounds"])
    assert headers["x-specapi-target-cost-usd"] == d["target"]["cost_usd"] == "0.002"
    assert headers["x-specapi-speculated"] == "true"
    assert "x-specapi-fallback-reason" not in headers  # null: left out
