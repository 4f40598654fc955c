"""`specapi bench` run in-process on the simulator without latency (`--quick`), and its runner."""

import dataclasses
import importlib
import json
import re

import pytest

from specapi.bench import command
from specapi.bench.runner import run_scenario
from specapi.bench.html import render_html
from specapi.bench.scenarios import _AGENT_TASKS, DEFAULT_SCENARIOS, SCENARIOS, get_scenario, load_prompts, quick
from specapi.bench.summary import REQUIRED_KEYS, SIDE_KEYS, report, summarize
from specapi.cli import cli_logic
from specapi.sim import Faults, SimProvider, simulated_endpoints


def test_quick_bench_writes_json_and_html(tmp_path, capsys):
    json_path, html_path = tmp_path / "bench.json", tmp_path / "bench.html"
    code = cli_logic(["bench", "--quick", "--json", str(json_path), "--html", str(html_path)])
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(json_path.read_text())
    assert [s["name"] for s in data["scenarios"]] == list(DEFAULT_SCENARIOS)
    for s in data["scenarios"]:
        assert set(REQUIRED_KEYS) <= set(s)
        assert set(SIDE_KEYS) <= set(s["baseline"]) and set(SIDE_KEYS) <= set(s["speculative"])
        assert s["exact_outputs"] is True, s["mismatches"]
        assert s["baseline"]["requests"] == 2 and s["speculative"]["requests"] == 2
        assert s["speculative"]["generated_tokens"] == s["baseline"]["generated_tokens"]
    by_name = {s["name"]: s for s in data["scenarios"]}
    assert by_name["lan-code"]["speculative"]["num_rounds"] > 0
    assert by_name["lookup-edit"]["speculative"]["by_role"]["draft"]["requests"] == 0  # no draft model
    assert by_name["lookup-edit"]["acceptance_rate"] > 0.9
    html = html_path.read_text()
    assert html.count("<svg") == 1 + len(DEFAULT_SCENARIOS)
    for name in DEFAULT_SCENARIOS:
        assert name in out


def test_scenario_choice_and_overrides(tmp_path, capsys):
    path = tmp_path / "bench.json"
    code = cli_logic(
        ["bench", "--quick", "--scenario", "lan-code", "--requests", "3", "--max-tokens", "6", "--num-speculative-tokens", "2", "--json", str(path)]
    )
    assert code == 0
    (s,) = json.loads(path.read_text())["scenarios"]
    assert s["settings"]["num_speculative_tokens"] == 2 and s["settings"]["max_tokens"] == 6
    assert s["baseline"]["requests"] == 3
    assert max(r["drafted_tokens"] / max(1, r["num_rounds"]) for r in s["requests"]) <= 2
    assert all(r["generated_tokens"] <= 6 for r in s["requests"])
    # The scenario's own words stay, and say what the command line changed.
    assert s["description"].startswith(get_scenario("lan-code").description)
    assert s["description"].endswith("(run with --num-speculative-tokens 2, --max-tokens 6, --requests 3)")


def test_a_scenario_run_as_defined_keeps_its_description(tmp_path):
    path = tmp_path / "bench.json"
    assert cli_logic(["bench", "--quick", "--scenario", "lan-code", "--temperature", "0", "--json", str(path)]) == 0
    (s,) = json.loads(path.read_text())["scenarios"]
    assert s["description"] == get_scenario("lan-code").description  # temperature 0 is lan-code's own


def test_prompts_file_and_real_endpoint_options(tmp_path, monkeypatch, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        '{"prompt": "def fnmatch(name, pat):"}\n\n{"messages": [{"role": "user", "content": "Say hi"}]}\n', encoding="utf-8"
    )
    seen = {}

    def fake_endpoints(args, scenario, repetition=0):  # the real-endpoint path, served by the simulator
        seen["target"] = (args.target_base_url, args.target_model)
        assert scenario.sim is None
        return simulated_endpoints(profile="vllm", latency="instant")

    monkeypatch.setattr(command, "_endpoints", fake_endpoints)
    path = tmp_path / "bench.json"
    argv = ["bench", "--target-base-url", "http://gpu:8000/v1", "--target-model", "big", "--draft-base-url", "http://gpu:8001/v1", "--draft-model", "small"]
    argv += ["--prompts", str(prompts), "--max-tokens", "8", "--temperature", "0", "--policy", "fixed", "--json", str(path)]
    assert cli_logic(argv) == 0
    assert seen["target"] == ("http://gpu:8000/v1", "big")
    data = json.loads(path.read_text())
    assert data["mode"] == "endpoints"
    (s,) = data["scenarios"]
    assert s["settings"]["policy"] == "fixed" and s["settings"]["requests"] == 2
    assert [r["label"] for r in s["requests"]] == ["def fnmatch(name, pat):", "Say hi"]


def test_bad_input_exits_2(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt here"}\n', encoding="utf-8")
    assert cli_logic(["bench", "--quick", "--prompts", str(bad)]) == 2
    assert "bad.jsonl:1" in capsys.readouterr().err
    assert cli_logic(["bench", "--quick", "--requests", "0"]) == 2
    with pytest.raises(ValueError, match="not JSON"):
        bad.write_text("{oops\n", encoding="utf-8")
        load_prompts(bad)


def test_list_names_every_scenario(capsys):
    assert cli_logic(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in SCENARIOS:
        assert name in out


async def test_runner_alternates_and_records_failures():
    provider = SimProvider(capabilities="vllm", latency="instant", faults=Faults(error_rate=1.0, model="sim-target"))
    target, draft = simulated_endpoints(provider=provider)
    target = dataclasses.replace(target, max_retries=0)
    scenario = dataclasses.replace(quick(get_scenario("lan-code")), warmup=0)
    run = await run_scenario(scenario, target, draft)
    assert [s.index for s in run.baseline] == [0, 1] and [s.index for s in run.speculative] == [0, 1]
    assert all(s.error for s in run.baseline + run.speculative)
    s = summarize(run)
    assert s["speedup"] is None and s["exact_outputs"] is False and len(s["errors"]) == 4


async def test_runner_order_alternates_between_sides():
    target, draft = simulated_endpoints(profile="vllm", latency="instant")
    order = []
    scenario = dataclasses.replace(quick(get_scenario("lan-code"), requests=3, max_tokens=4), warmup=1)
    run = await run_scenario(scenario, target, draft, progress=order.append)
    assert order == ["warm-up", "calibration", "target alone", "speculative", "speculative", "target alone", "target alone", "speculative"]
    assert run.calibration is not None and run.calibration.long_tokens > run.calibration.short_tokens
    assert len(run.warmup) == 1 and all(s.error is None for s in run.speculative)


@pytest.mark.parametrize("module", ["command", "explain", "html", "predict", "report", "runner", "scenarios", "summary"])
def test_modules_have_docstrings_and_real_exports(module):
    mod = importlib.import_module(f"specapi.bench.{module}")
    assert mod.__doc__ and len(mod.__doc__) > 40
    for name in mod.__all__:
        assert hasattr(mod, name), f"{module}.{name}"
    import specapi.bench

    for name in specapi.bench.__all__:
        assert hasattr(specapi.bench, name), name


@pytest.mark.parametrize("name", ["agentic", "agentic-hosted"])
async def test_the_agentic_scenario_warms_up_and_reports_the_speedup_after_it(name):
    scenario = quick(get_scenario(name), requests=8, max_tokens=40)
    # Without simulated latency the adaptive policy's measurements are noise: fix the draft length.
    scenario = dataclasses.replace(scenario, client={**scenario.client, "policy": "fixed", "num_speculative_tokens": 16})
    target, draft = simulated_endpoints(profile=scenario.sim.profile, latency="instant")
    run = await run_scenario(scenario, target, draft)
    s = summarize(run)
    assert s["exact_outputs"] is True and not s["errors"]
    warmed = s["after_warmup"]
    assert warmed["from_request"] == scenario.learning_requests == 4 and warmed["requests"] == 4
    assert warmed["baseline_cost_usd"] is not None  # money is reported after warm-up too
    first, later = s["requests"][: len(_AGENT_TASKS)], s["requests"][len(_AGENT_TASKS) :]
    # A task seen before is drafted by the suffix index; the first time it cannot be.
    assert not any("suffix" in r["drafters"] for r in first)
    assert all(r["drafters"].get("suffix") for r in later)
    html = render_html(report([run], mode="test", version="0"))
    assert name + ": speedup by request number as the client learns" in html
