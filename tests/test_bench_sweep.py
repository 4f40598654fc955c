"""`specapi bench --draft-lengths`: a sweep of draft lengths in one run, on the simulator without latency."""

import json
import re

import pytest

from specapi.bench.scenarios import get_scenario, quick
from specapi.bench.sweep import DEFAULT_POLICY, expand, parse_lengths
from specapi.cli import cli_logic


def test_a_sweep_runs_each_length_and_the_default_policy_against_the_target_alone(tmp_path, capsys):
    path = tmp_path / "bench.json"
    code = cli_logic(
        ["bench", "--quick", "--scenario", "lan-code", "--requests", "2", "--max-tokens", "10", "--draft-lengths", "1,3", "--table", "--json", str(path)]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    data = json.loads(path.read_text())
    assert data["mode"].endswith("draft lengths 1, 3")
    by_name = {s["name"]: s for s in data["scenarios"]}
    assert list(by_name) == ["lan-code default policy", "lan-code k=1", "lan-code k=3"]
    assert by_name["lan-code default policy"]["settings"]["policy"] == "adaptive"
    for k in (1, 3):
        s = by_name[f"lan-code k={k}"]
        assert s["settings"]["policy"] == "fixed" and s["settings"]["num_speculative_tokens"] == k
        assert s["variant"] == {"scenario": "lan-code", "draft_length": k}
        drafted = [r["drafted_tokens"] / r["num_rounds"] for r in s["requests"] if r["num_rounds"]]
        assert drafted and max(drafted) <= k  # the length was really applied
    assert max(r["drafted_tokens"] / max(1, r["num_rounds"]) for r in by_name["lan-code k=3"]["requests"]) > 1
    for s in data["scenarios"]:  # every variant measured against the target alone, exactly
        assert s["baseline"]["requests"] == 2 and s["speculative"]["requests"] == 2
        assert s["exact_outputs"] is True, s["mismatches"]
        assert s["aim"] is None
    (sweep,) = data["draft_length_sweep"]
    assert sweep["scenario"] == "lan-code"
    assert [r["setting"] for r in sweep["rows"]] == [DEFAULT_POLICY, "k=1", "k=3"]
    for row in sweep["rows"]:
        assert row["speedup"] == by_name[row["scenario"]]["speedup"]
        assert row["wall_s"] == by_name[row["scenario"]]["speculative"]["wall_s"]
    baselines = sorted(s["baseline"]["wall_s"] for s in data["scenarios"])
    assert sweep["target_alone_wall_s"] == pytest.approx(baselines[1])  # the median of the three
    fixed = [r for r in sweep["rows"] if r["draft_length"]]
    assert sweep["best_draft_length"] == max(fixed, key=lambda r: r["speedup"])["draft_length"]
    # One table, a row per setting under the target alone's.
    start = out.index("draft lengths (each against the target alone")
    table = out[start : out.index("* the fastest fixed draft length", start)]
    found = re.findall(r"(target alone|default policy|k=\d( \*)?)\s+\d+\.\d{3}\s+(\d+\.\d\d)x", table)
    best = f"k={sweep['best_draft_length']} *"
    assert [f[0] for f in found] == ["target alone", "default policy", *(best if f"k={k}" in best else f"k={k}" for k in (1, 3))]
    assert [float(f[2]) for f in found[1:]] == [round(r["speedup"], 2) for r in sweep["rows"]]


def test_without_a_sweep_the_report_has_none(tmp_path):
    path = tmp_path / "bench.json"
    assert cli_logic(["bench", "--quick", "--scenario", "lookup-edit", "--requests", "1", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert "draft_length_sweep" not in data and data["scenarios"][0]["variant"] is None


def test_the_variants_keep_the_scenario_but_the_policy_and_length():
    scenario = quick(get_scenario("lan-code"))
    default, two = expand(scenario, [2])
    assert "policy" not in default.client and "num_speculative_tokens" not in default.client
    assert two.client == {**scenario.client, "policy": "fixed", "num_speculative_tokens": 2}
    for variant in (default, two):
        assert (variant.requests, variant.sim, variant.max_tokens, variant.use_draft) == (scenario.requests, scenario.sim, scenario.max_tokens, scenario.use_draft)
        assert variant.description.startswith(scenario.description)


@pytest.mark.parametrize("text, lengths", [("2,4,6", (2, 4, 6)), (" 8 , 1", (8, 1)), ("32", (32,))])
def test_draft_lengths_parse(text, lengths):
    assert parse_lengths(text) == lengths


@pytest.mark.parametrize("text, said", [("2,2", "twice"), ("0,3", "from 1 to 32"), ("33", "from 1 to 32"), ("a", "whole numbers"), ("2,,3", "commas"), ("", "commas")])
def test_bad_draft_lengths_are_refused(text, said):
    with pytest.raises(ValueError, match=said):
        parse_lengths(text)


@pytest.mark.parametrize("extra", [["--policy", "fixed"], ["--num-speculative-tokens", "3"]])
def test_a_sweep_with_its_own_policy_or_length_is_a_usage_error(extra, capsys):
    assert cli_logic(["bench", "--quick", "--draft-lengths", "2,4", *extra]) == 2
    assert "leave out --policy and --num-speculative-tokens" in capsys.readouterr().err


def test_bad_draft_lengths_on_the_command_line_exit_2_before_running(capsys):
    assert cli_logic(["bench", "--quick", "--draft-lengths", "2,2"]) == 2
    captured = capsys.readouterr()
    assert "--draft-lengths" in captured.err and "twice" in captured.err and captured.out == ""
