"""The bench's report: figures from hand-made measurements, the JSON shape, exactness, the writers."""

import dataclasses
import io
import json
import re
from decimal import Decimal

import pytest
from rich.console import Console

from specapi.bench.html import render_html, write_html
from specapi.bench.report import print_report
from specapi.bench.runner import Calibration, Sample, ScenarioRun
from specapi.bench.scenarios import BenchRequest, Scenario, SimSetup
from specapi.bench.summary import REQUIRED_KEYS, SIDE_KEYS, report, summarize
from specapi.core.stats import RoleUsage, RoundRecord, SpeculativeStats

REQUESTS = (BenchRequest(prompt="def f(a,", label="one"), BenchRequest(prompt="def g(b,", label="two"))
SCENARIO = Scenario(
    name="hand-made",
    description="hand-made measurements",
    requests=REQUESTS,
    sim=SimSetup(latency="lan"),
    client={"policy": "fixed", "num_speculative_tokens": 4, "drafter": "model", "pipeline": False},
    max_tokens=20,
    aim=1.5,
)


def _rounds(n: int) -> tuple[RoundRecord, ...]:
    # Alternate a full acceptance (5 tokens) and a rejection at position 2 (2 tokens).
    full = RoundRecord(drafted=4, accepted=4, emitted=5, draft_latency_s=0.020, verify_latency_s=0.035, drafter="draft-model", accepted_by_position=(True,) * 4)
    half = RoundRecord(
        drafted=4, accepted=1, emitted=2, draft_latency_s=0.020, verify_latency_s=0.035, drafter="draft-model", accepted_by_position=(True, False, False, False)
    )
    return tuple(full if i % 2 == 0 else half for i in range(n))


def _baseline(index: int, text: str, cost: str = "0.0002") -> Sample:
    # 20 tokens: first after 55 ms, then 25 ms each: 30 ms fixed + 25 ms per token.
    return Sample(
        index=index,
        side="baseline",
        text=text,
        wall_s=0.055 + 19 * 0.025,
        ttft_s=0.055,
        generated_tokens=20,
        target=RoleUsage(requests=1, prompt_tokens=10, completion_tokens=20, latency_s=0.53, cost_usd=Decimal(cost)),
    )


def _speculative(index: int, text: str) -> Sample:
    rounds = _rounds(6)  # 21 tokens' worth of rounds, 6 x 55 ms
    target = RoleUsage(requests=6, prompt_tokens=6 * 25, completion_tokens=6, latency_s=0.21, cost_usd=Decimal("0.0004"))
    draft = RoleUsage(requests=6, prompt_tokens=6 * 22, completion_tokens=24, latency_s=0.12, cost_usd=Decimal("0.0001"))
    stats = SpeculativeStats(rounds=rounds, target=target, draft=draft, generated_tokens=20, wall_s=0.33, ttft_s=0.06)
    return Sample(index=index, side="speculative", text=text, wall_s=0.33, ttft_s=0.06, generated_tokens=20, target=target, draft=draft, stats=stats)


def _run(spec_texts=("alpha", "beta")) -> ScenarioRun:
    return ScenarioRun(
        scenario=SCENARIO,
        baseline=[_baseline(0, "alpha"), _baseline(1, "beta")],
        speculative=[_speculative(0, spec_texts[0]), _speculative(1, spec_texts[1])],
        calibration=Calibration(short_s=0.008, long_s=0.068, short_tokens=1, long_tokens=16),
        target_label="target",
        draft_label="draft",
    )


def test_summary_has_the_stable_json_shape():
    data = report([_run()], mode="simulator", version="0")
    json.loads(json.dumps(data))  # JSON-ready: Decimal written as strings
    (s,) = data["scenarios"]
    for key in REQUIRED_KEYS:
        assert key in s, key
    for side in ("baseline", "speculative"):
        for key in SIDE_KEYS:
            assert key in s[side], (side, key)
        assert isinstance(s[side]["wall_s"], float) and isinstance(s[side]["requests"], int)
        assert isinstance(s[side]["cost_usd"], str)
    assert isinstance(s["speedup"], float) and isinstance(s["predicted_speedup"], float)
    assert isinstance(s["acceptance_by_position"], list) and isinstance(s["best_draft_length"], int)
    assert isinstance(s["exact_outputs"], bool) and isinstance(s["explanation"], str) and s["explanation"]
    assert s["name"] == "hand-made" and s["description"] == "hand-made measurements"


def test_summary_figures_add_up():
    s = summarize(_run())
    assert s["speedup"] == pytest.approx(0.53 / 0.33, abs=1e-3)
    assert s["baseline"]["cost_usd"] == "0.0004" and s["speculative"]["cost_usd"] == "0.0010"
    assert s["cost_ratio"] == pytest.approx(2.5)
    assert s["speculative"]["prompt_tokens"] == 2 * (150 + 132)
    assert s["speculative"]["by_role"]["draft"]["requests"] == 12
    assert s["acceptance_rate"] == pytest.approx((3 * 4 + 3 * 1) / 24)
    assert s["acceptance_by_position"] == pytest.approx([1.0, 0.5, 0.5, 0.5])
    assert s["conditional_acceptance"] == pytest.approx([1.0, 0.5, 1.0, 1.0])
    assert s["speculative"]["tokens_per_round"] == pytest.approx(3.5)
    model = s["latency_model"]
    assert model["target_per_token_s"] == pytest.approx(0.025) and model["target_fixed_s"] == pytest.approx(0.030)
    assert model["draft_per_token_s"] == pytest.approx(0.004) and model["draft_fixed_s"] == pytest.approx(0.004)
    assert model["verify_fixed_s"] == pytest.approx(0.035)
    # E(4) = 1 + 1 + .5 + .5 + .5 = 3.5 tokens per 55 ms round (+ half a round at the end); 20 tokens
    # alone take 530 ms.
    assert s["predicted_speedup"] == pytest.approx(0.530 / ((20 / 3.5 + 0.5) * 0.055), rel=1e-3)
    assert abs(s["prediction_gap"]) < 0.15
    assert s["exact_outputs"] is True and s["mismatches"] == []
    assert s["aim"] == {"speedup": 1.5, "below": False, "met": True}
    assert "faster than the target alone" in s["explanation"]


def test_rounds_with_and_without_a_draft_call_are_predicted_apart():
    """Model rounds (4 drafted, 3.5 tokens expected, 55 ms) and suffix rounds (16 drafted, every token
    kept, 35 ms: no draft call) are predicted each on its own length and acceptance and weighed by their
    share of the rounds, 4 to 2: 8 tokens per 48.3 ms round. One length and one table for both (the most
    common length, 4, and acceptance that lets the 16-token drafts look like the model's) predicted 3.4x."""
    free = RoundRecord(drafted=16, accepted=16, emitted=17, verify_latency_s=0.035, drafter="suffix", accepted_by_position=(True,) * 16)
    run = _run()
    run.speculative = [
        dataclasses.replace(sample, stats=dataclasses.replace(sample.stats, rounds=_rounds(4) + (free, free)))  # type: ignore[arg-type]
        for sample in run.speculative
    ]
    s = summarize(run)
    parts = {p["drafter"]: p for p in s["prediction_by_drafter"]}
    assert parts["model"]["draft_length"] == 4 and parts["model"]["expected_tokens_per_round"] == pytest.approx(3.5)
    assert parts["model"]["round_s"] == pytest.approx(0.055) and parts["model"]["share_of_rounds"] == pytest.approx(4 / 6, abs=1e-4)
    assert parts["free"]["draft_length"] == 16 and parts["free"]["expected_tokens_per_round"] == pytest.approx(17.0)
    assert parts["free"]["round_s"] == pytest.approx(0.035)
    per_round_tokens, per_round_s = (4 * 3.5 + 2 * 17) / 6, (4 * 0.055 + 2 * 0.035) / 6
    assert s["predicted_speedup"] == pytest.approx(0.530 / ((20 / per_round_tokens + 0.5) * per_round_s), rel=1e-3)
    assert "drafted without a call" in s["explanation"] and "by the draft model" in s["explanation"]
    # Rounds of one kind keep the single prediction and its sentence.
    assert summarize(_run())["prediction_by_drafter"] is None


def test_a_different_output_is_reported_loudly():
    s = summarize(_run(spec_texts=("alpha", "bets")))
    assert s["exact_outputs"] is False
    assert s["mismatches"][0]["request"] == 1 and s["mismatches"][0]["first_difference_at_char"] == 3
    assert "EXACTNESS FAILURE" in s["explanation"]
    console = Console(record=True, width=200, file=io.StringIO())
    print_report(report([_run(spec_texts=("alpha", "bets"))], mode="simulator", version="0"), console)
    text = console.export_text()
    row = next(line for line in text.splitlines() if line.lstrip().startswith("hand-made"))
    assert row.rstrip().endswith("NO") and "EXACTNESS FAILURE" in " ".join(text.split())


def test_failed_requests_are_counted_not_fatal():
    run = _run()
    run.speculative[1] = Sample(index=1, side="speculative", wall_s=0.1, error="TargetError: HTTP 500")
    s = summarize(run)
    assert s["speculative"]["requests"] == 1 and s["speculative"]["failed"] == 1
    assert s["errors"] == ["TargetError: HTTP 500"]
    assert "failed" in s["explanation"]


def test_no_speculation_at_all_predicts_the_target_alone():
    run = _run()
    plain = SpeculativeStats(target=RoleUsage(requests=1), generated_tokens=20, fallback_reason="adaptive policy: off")
    run.speculative = [
        Sample(index=i, side="speculative", text=t, wall_s=0.53, ttft_s=0.05, generated_tokens=20, stats=plain) for i, t in ((0, "alpha"), (1, "beta"))
    ]
    s = summarize(run)
    assert s["predicted_speedup"] == 1.0 and s["acceptance_rate"] is None
    assert s["speculative"]["requests_served_by_target_alone"] == 2
    assert "adaptive policy: off" in s["explanation"]


def test_terminal_table_lists_every_scenario():
    console = Console(record=True, width=200, file=io.StringIO())
    print_report(report([_run()], mode="simulator", version="0"), console)
    text = console.export_text()
    assert "hand-made" in text and "1.61x" in text


def test_html_is_self_contained_with_embedded_plots(tmp_path):
    path = tmp_path / "bench.html"
    write_html(report([_run()], mode="simulator", version="0"), path)
    html = path.read_text(encoding="utf-8")
    assert html.count("<svg") == 2  # the overview and the scenario's four panels, as inline SVG
    assert "base64" not in html and "<img" not in html and "<script" not in html
    assert "hand-made" in html and "<table>" in html
    without_namespaces = re.sub(r'xmlns(:\w+)?="[^"]*"', "", html)
    assert "http://" not in without_namespaces and "https://" not in without_namespaces  # nothing to fetch
    assert len(html.encode()) < 400_000  # a lean page: text stays text in the SVG


def test_html_uses_one_colour_rule_and_units():
    from specapi.bench.html import speedup_class
    from specapi.bench.report import SPEEDUP_BAND

    assert [speedup_class(v) for v in (SPEEDUP_BAND[0], 1.0, SPEEDUP_BAND[1], 2.0, 0.5)] == ["bad", "even", "good", "good", "bad"]
    html = render_html(report([_run()], mode="simulator", version="0"))
    assert "target alone (s)" in html and "first token" in html and "seconds per request" in html
    assert "docs/performance.md" in html and "speculation.md" not in html.replace("docs/", "")
    assert ">aim<" not in html


def test_html_shows_mismatches():
    html = render_html(report([_run(spec_texts=("alpha", "bets"))], mode="simulator", version="0"))
    assert "differ from the target alone" in html and "class='explanation alarm'" in html


def test_draft_costs_come_from_rounds_when_the_draft_length_varies():
    rounds = tuple(
        RoundRecord(drafted=k, accepted=1, emitted=2, draft_latency_s=0.006 + 0.003 * k, verify_latency_s=0.035, drafter="draft-model", accepted_by_position=(True,) + (False,) * (k - 1))
        for k in (2, 4, 2, 4, 2, 4)
    )
    run = _run()
    stats = dataclasses.replace(run.speculative[0].stats, rounds=rounds)
    run.speculative = [dataclasses.replace(s, stats=stats) for s in run.speculative]
    run.calibration = Calibration(short_s=0.5, long_s=2.0, short_tokens=1, long_tokens=16)  # ignored: the rounds tell
    model = summarize(run)["latency_model"]
    assert model["draft_fixed_s"] == pytest.approx(0.006) and model["draft_per_token_s"] == pytest.approx(0.003)
    assert "least squares" in model["sources"]["draft"]


def test_cost_is_free_only_when_every_request_was_served_for_nothing():
    from specapi.bench.report import _cost, is_free

    served = {"requests": 8, "failed": 0, "cost_usd": "0"}
    scenario = {"cost_ratio": None, "baseline": served, "speculative": served}
    assert is_free(scenario) and _cost(scenario) == "free"  # a local server
    failed = {"requests": 0, "failed": 8, "cost_usd": "0"}
    for baseline, speculative in ((failed, failed), (served, failed), (failed, served), ({**served, "failed": 1}, served)):
        broken = {"cost_ratio": None, "baseline": baseline, "speculative": speculative}
        assert not is_free(broken) and _cost(broken) == "–"
    assert _cost({**scenario, "baseline": {**served, "cost_usd": None}}) == "–"  # unknown prices: unknown
