"""`specapi bench`'s repeated runs, percentiles, load modes, table mode, --check and piped progress, on the
simulator without latency (tiny scenarios: a few requests of a few tokens)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from specapi.bench import command
from specapi.bench.runner import Sample, ScenarioRun, run_scenario
from specapi.bench.scenarios import get_scenario, quick
from specapi.bench.spread import NO_SPECULATION, percentile, percentiles, poisson_arrivals, spread_of, verdict_class
from specapi.bench.summary import latency_percentiles, report, summarize
from specapi.cli import cli_logic
from specapi.sim import simulated_endpoints

TINY = ["--quick", "--scenario", "lan-code", "--requests", "2", "--max-tokens", "6"]


def _bench(tmp_path, *extra: str) -> tuple[int, dict]:
    path = tmp_path / "bench.json"
    code = cli_logic(["bench", *TINY, "--json", str(path), *extra])
    return code, json.loads(path.read_text())


# -- the arithmetic


def test_percentiles_interpolate_between_ranks():
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 50) == pytest.approx(50.5)
    assert percentile(values, 90) == pytest.approx(90.1)
    assert percentile(values, 99) == pytest.approx(99.01)
    assert percentile([3.0], 99) == 3.0 and percentile([], 50) is None
    assert percentiles([2.0, 1.0]) == {"p50": 1.5, "p90": pytest.approx(1.9), "p99": pytest.approx(1.99)}
    with pytest.raises(ValueError):
        percentile(values, 101)


def test_a_win_needs_every_run_above_one():
    assert verdict_class(spread_of([1.3, 1.4, 1.5])) == "win"
    assert verdict_class(spread_of([0.98, 1.4, 1.5])) == "even"  # the median wins, one run lost: not a win
    assert verdict_class(spread_of([0.5, 0.6, 1.01])) == "even"
    assert verdict_class(spread_of([0.5, 0.6, 0.7])) == "loss"
    assert verdict_class(1.08) == "win" and verdict_class(1.0) == "even" and verdict_class(None) is None
    assert verdict_class(spread_of([1.5, 1.6]), speculated=False) == NO_SPECULATION


def test_poisson_arrivals_are_seeded_and_have_the_rate():
    a = poisson_arrivals(2000, 50.0, seed=3)
    assert a == poisson_arrivals(2000, 50.0, seed=3) and a != poisson_arrivals(2000, 50.0, seed=4)
    assert a[0] == 0.0 and all(x < y for x, y in zip(a, a[1:]))
    assert 2000 / a[-1] == pytest.approx(50.0, rel=0.1)
    with pytest.raises(ValueError):
        poisson_arrivals(3, 0.0, seed=0)


def test_inter_token_latencies_are_the_gaps_between_chunks():
    fast = Sample(index=0, side="baseline", wall_s=0.5, ttft_s=0.1, generated_tokens=5, chunk_s=(0.1, 0.2, 0.3, 0.4, 0.5))
    slow = Sample(index=1, side="baseline", wall_s=1.2, ttft_s=0.3, generated_tokens=4, chunk_s=(0.3, 0.6, 0.9, 1.2))
    found = latency_percentiles([fast, slow, Sample(index=2, side="baseline", error="boom")])
    assert found["ttft_s"]["p50"] == pytest.approx(0.2) and found["ttft_s"]["p99"] == pytest.approx(0.298)
    assert found["itl_s"]["p50"] == pytest.approx(0.1) and found["itl_s"]["p99"] == pytest.approx(0.3)  # 4 gaps of 0.1, 3 of 0.3
    assert found["tpot_s"]["p50"] == pytest.approx(0.2)  # (0.4/4 + 0.9/3) / 2


# -- the command


def test_repeat_gives_median_spread_and_percentiles_over_every_run(tmp_path, capsys):
    code, data = _bench(tmp_path, "--repeat", "3")
    assert code == 0
    (s,) = data["scenarios"]
    figures = s["repeats"]["figures"]
    assert s["repeats"]["runs"] == 3 and len(figures["speedup"]["runs"]) == 3
    assert figures["speedup"]["min"] <= figures["speedup"]["median"] <= figures["speedup"]["max"]
    assert s["speedup"] == figures["speedup"]["median"]  # the median run's figures are shown
    assert s["verdict"] == verdict_class(spread_of(figures["speedup"]["runs"]))
    # Percentiles over the three runs' requests: two requests a run on each side.
    assert s["baseline"]["percentiles"]["ttft_s"]["p50"] is not None
    assert all(v is not None for v in s["speculative"]["percentiles"]["itl_s"].values())
    out = capsys.readouterr().out
    assert "median of 3 runs" in out and f"{figures['speedup']['min']:.2f}–{figures['speedup']['max']:.2f}" in out
    assert "Over 3 runs the speedup was" in out and "TTFT" in out and "ITL" in out


def test_table_mode_prints_the_tables_only(tmp_path, capsys):
    code, data = _bench(tmp_path, "--table")
    out = capsys.readouterr().out
    assert code == 0 and "lan-code" in out and "latency percentiles" in out
    assert data["scenarios"][0]["explanation"] not in " ".join(out.split())
    assert "Speculation was" not in out and "Every output was the target's own" not in out


def test_check_exits_1_when_an_expectation_is_missed(tmp_path, capsys, monkeypatch):
    real = command.build_scenarios

    def expecting(args):  # lan-code, expected to reach 50x: it will not
        return [dataclasses.replace(s, aim=50.0) for s in real(args)]

    monkeypatch.setattr(command, "build_scenarios", expecting)
    code, data = _bench(tmp_path)
    assert code == 0 and data["scenarios"][0]["aim"]["met"] is False  # reported, not failed, without --check
    code, _ = _bench(tmp_path, "--check")
    assert code == 1
    assert "missed the speedup they are expected to reach: lan-code" in capsys.readouterr().err

    def modest(args):  # expected to stay below 50x: met
        return [dataclasses.replace(s, aim=50.0, aim_below=True) for s in real(args)]

    monkeypatch.setattr(command, "build_scenarios", modest)
    assert _bench(tmp_path, "--check")[0] == 0


def test_request_rate_sends_both_sides_on_one_poisson_schedule(tmp_path):
    code, data = _bench(tmp_path, "--request-rate", "40", "--requests", "4", "--seed", "7")
    assert code == 0
    (s,) = data["scenarios"]
    assert s["settings"]["request_rate"] == 40.0 and s["exact_outputs"] is True
    assert s["baseline"]["requests"] == s["speculative"]["requests"] == 4
    # The schedule spans at least its last arrival on each side, and throughput is reported for both.
    last = poisson_arrivals(4, 40.0, seed=7)[-1]
    for side in ("baseline", "speculative"):
        assert s[side]["span_s"] >= last and s[side]["throughput_tokens_per_s"] > 0


async def test_concurrency_runs_requests_at_once_on_each_side():
    scenario = dataclasses.replace(quick(get_scenario("lan-code"), requests=4, max_tokens=4), concurrency=4, warmup=0)
    target, draft = simulated_endpoints(profile="vllm", latency="instant")
    order: list[str] = []
    run = await run_scenario(scenario, target, draft, progress=order.append)
    assert order == ["calibration", "target alone", "speculative"]  # one wave of four on each side
    assert sorted(s.index for s in run.speculative) == [0, 1, 2, 3] and all(s.error is None for s in run.speculative)


def test_the_proxy_path_measures_specapi_serve(tmp_path):
    code, data = _bench(tmp_path, "--via", "serve", "--concurrency", "2")
    assert code == 0
    (s,) = data["scenarios"]
    assert s["settings"]["via"] == "serve" and s["exact_outputs"] is True and not s["errors"]
    assert s["speculative"]["num_rounds"] > 0 and s["acceptance_rate"] is not None  # from the proxy's own statistics
    assert s["predicted_speedup"] is None  # no per-round records come back through the proxy: no prediction
    assert all(r["verification"] for r in s["requests"])


async def test_fresh_prompts_keep_what_the_index_learnt_from_drafting():
    # The agent scenario repeats each task: with the index shared, the repeats are drafted from it.
    base = dataclasses.replace(quick(get_scenario("agentic"), requests=6, max_tokens=24), client={"policy": "fixed", "num_speculative_tokens": 16})
    shared = summarize(await run_scenario(base, *simulated_endpoints(profile="vllm", latency="instant")))
    assert any(r["drafters"].get("suffix") for r in shared["requests"])
    fresh = summarize(await run_scenario(dataclasses.replace(base, fresh_prompts=True), *simulated_endpoints(profile="vllm", latency="instant")))
    assert not any(r["drafters"].get("suffix") for r in fresh["requests"])
    assert fresh["exact_outputs"] is True and fresh["repeated_prompts"] == 0


def test_repeated_prompts_are_counted_and_explained(tmp_path):
    code, data = _bench(tmp_path, "--drafter", "auto", "--requests", "3")  # two prompts for three requests, one warm-up
    (s,) = data["scenarios"]
    assert code == 0 and s["repeated_prompts"] == 2  # the warm-up's prompt, and the third request
    assert "--fresh-prompts" in s["explanation"]
    code, data = _bench(tmp_path, "--drafter", "auto", "--requests", "3", "--fresh-prompts")
    assert data["scenarios"][0]["repeated_prompts"] == 0 and "--fresh-prompts" not in data["scenarios"][0]["explanation"]


def test_a_scenario_that_never_speculated_is_no_speculation():
    run = ScenarioRun(scenario=quick(get_scenario("hosted-adaptive")))
    for i in range(2):
        run.baseline.append(Sample(index=i, side="baseline", text="x", wall_s=1.1, ttft_s=0.4, generated_tokens=3))
        run.speculative.append(Sample(index=i, side="speculative", text="x", wall_s=1.0, ttft_s=1.0, generated_tokens=3))
    s = report([run], mode="test", version="0")["scenarios"][0]
    assert s["speedup"] == pytest.approx(1.1) and s["verdict"] == NO_SPECULATION
    assert s["explanation"].startswith("No speculation")


@pytest.mark.parametrize(
    "argv",
    [
        ["--target-model", "big"],
        ["--target-model", "big", "--prompts", "PROMPTS"],
        ["--target-base-url", "http://127.0.0.1:9/v1", "--target-model", "big", "--draft-model", "small"],
    ],
)
def test_no_silent_run_against_openai(tmp_path, capsys, monkeypatch, argv):
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n', encoding="utf-8")
    called = []
    monkeypatch.setattr(command, "_run_all", lambda *a: called.append(a))
    assert cli_logic(["bench", *[str(prompts) if a == "PROMPTS" else a for a in argv]]) == 2
    err = capsys.readouterr().err
    assert "would go to OpenAI's API" in err and "https://api.openai.com/v1" in err and not called


def test_piped_progress_is_one_line_per_step(tmp_path):
    """Run as a user would with stderr to a pipe: lines arrive while it runs, one per step."""
    proc = subprocess.run(
        [sys.executable, "-c", "from specapi.cli import cli; cli()", "bench", *TINY, "--table"],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = [line.split("] ", 1)[1] for line in proc.stderr.splitlines() if line.startswith("[")]
    assert lines == [
        "lan-code: starting", "lan-code: warm-up", "lan-code: calibration",
        "lan-code: target alone", "lan-code: speculative", "lan-code: speculative", "lan-code: target alone",
    ]
    assert proc.stderr.splitlines()[-1].startswith("[6/6 ")
    assert "lan-code" in proc.stdout and "\x1b[" not in proc.stdout  # no colour codes into a pipe


def test_the_html_report_draws_each_verdict_in_its_own_colour():
    import re

    from specapi.bench.charts import BAD, EVEN, GOOD, NONE
    from specapi.bench.html import overview_svg, render_html

    from specapi.core.stats import RoleUsage

    never = ScenarioRun(scenario=quick(get_scenario("hosted-adaptive")))
    billed = RoleUsage(requests=1, prompt_tokens=5, completion_tokens=3)
    for i in range(2):
        never.baseline.append(Sample(index=i, side="baseline", text="x", wall_s=1.1, ttft_s=0.4, generated_tokens=3, target=billed))
        never.speculative.append(Sample(index=i, side="speculative", text="x", wall_s=1.0, ttft_s=1.0, generated_tokens=3, target=billed))
    data = report([never], mode="test", version="0")
    html = render_html(data)
    # The summary row of a scenario that never speculated: grey "no speculation", not a green win.
    row = re.search(r"<tr><td><a href='#hosted-adaptive'>.*?</tr>", html).group(0)
    assert '<td class="none">1.10x<br><small>no speculation</small></td>' in row and '<td class="good">' not in row
    # The legend: one swatch per verdict, four distinct colours, in the page and in the chart.
    swatches = re.findall(r"class=swatch style='background:(#[0-9a-f]{6})'", html)
    assert swatches == [GOOD, EVEN, BAD, NONE] and len(set(swatches)) == 4
    chart = overview_svg(data)
    for colour in (GOOD, EVEN, BAD, NONE):
        assert f"fill: {colour}" in chart, colour
    for words in ("achieved: win", "achieved: even", "achieved: loss", "achieved: no speculation", "predicted"):
        assert words in chart
