"""The `specapi` command as a user meets it: help, environment variables, stdout vs stderr, exit codes."""

from __future__ import annotations

import json

import pytest

from specapi.cli import build_parser, cli_logic
from specapi.core.cli_options import VERIFICATION_CHOICES
from specapi.parts.paths import VERIFICATIONS
from toyserver import ToyServer

SUBCOMMANDS = ["bench", "run", "probe", "serve", "simulate"]


def _subparser(name: str):  # type: ignore[no-untyped-def]
    parser = build_parser()
    [action] = [a for a in parser._actions if a.dest == "command"]
    return action.choices[name]


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_option_has_help_and_an_environment_variable(name):
    for action in _subparser(name)._actions:
        if action.dest in ("help", "prompt", "list", "scenario"):
            continue
        assert action.help, f"{name} {action.option_strings} has no help"
        assert "env SPECAPI_" in action.help, f"{name} {action.option_strings}: {action.help}"


@pytest.mark.parametrize("name", ["bench", "run", "serve"])
def test_speculation_options_are_the_same_everywhere(name):
    flags = {flag for action in _subparser(name)._actions for flag in action.option_strings}
    for flag in ("--drafter", "--pipeline", "--no-pipeline", "--policy", "--verification", "--num-speculative-tokens",
                 "--target-base-url", "--target-model", "--draft-base-url", "--draft-model"):
        assert flag in flags, f"{name} lacks {flag}"


def test_verification_choices_are_the_engines():
    assert VERIFICATION_CHOICES == tuple(VERIFICATIONS)


def test_run_prints_the_text_on_stdout_and_statistics_on_stderr(capsys):
    assert cli_logic(["run", "def fib(n):", "--max-tokens", "12", "--drafter", "model", "--no-pipeline"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() and "tokens" not in captured.out and "rounds" not in captured.out
    assert "12 tokens" in captured.err and "path token-ids" in captured.err  # the simulated vLLM: prompts go as token ids
    assert "None" not in captured.err and "cost draft $" in captured.err


def test_run_json_has_the_python_statistics_shape(capsys):
    assert cli_logic(["run", "def fib(n):", "--max-tokens", "12", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    stats = data["speculative"]
    assert stats["num_rounds"] == len(stats["rounds"]) and isinstance(stats["rounds"], list)
    assert stats["generated_tokens"] == 12 and data["text"]
    assert isinstance(stats["cost_usd"], str) and isinstance(stats["target"]["cost_usd"], str)  # money: a decimal string


def test_run_options_come_from_the_environment(monkeypatch, capsys):
    monkeypatch.setenv("SPECAPI_MAX_TOKENS", "5")
    monkeypatch.setenv("SPECAPI_JSON", "true")
    assert cli_logic(["run", "def fib(n):"]) == 0
    assert json.loads(capsys.readouterr().out)["speculative"]["generated_tokens"] == 5


def test_run_exit_codes(capsys):
    assert cli_logic(["run", "x", "--policy", "sometimes"]) == 2
    assert "must be one of adaptive, fixed" in capsys.readouterr().err
    assert cli_logic(["run", "x", "--target-base-url", "http://127.0.0.1:9/v1", "--target-model", "m", "--target-api-key", "k"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "target endpoint" in captured.err


def test_probe_fails_clearly_on_an_unknown_model_and_a_refused_key(capsys):
    with ToyServer(api_key="right") as srv:
        assert cli_logic(["probe", "--base-url", srv.base_url, "--model", "nope", "--api-key", "right"]) == 1
        captured = capsys.readouterr()
        assert captured.out == "" and "404" in captured.err and "check --model" in captured.err
        assert cli_logic(["probe", "--base-url", srv.base_url, "--model", "target", "--api-key", "wrong"]) == 1
        captured = capsys.readouterr()
        assert "401" in captured.err and "--api-key" in captured.err
    assert cli_logic(["probe", "--model", "x"]) == 2
    assert "--base-url" in capsys.readouterr().err


def test_bench_table_fits_80_columns_and_progress_stays_off_stdout(capsys):
    assert cli_logic(["bench", "--quick", "--scenario", "lan-code", "--scenario", "hosted-adaptive"]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "lan-code" in out and "hosted-adaptive" in out
    table = out.split("\n\n")[0] + out.split("\n\n")[1]
    assert "x " in table or "x\n" in table  # the speedups are whole, e.g. "0.21x", not cut off


def test_bench_against_an_unreachable_endpoint_says_the_comparison_failed(capsys):
    argv = ["bench", "--target-base-url", "http://127.0.0.1:9/v1", "--target-model", "m", "--target-api-key", "k",
            "--requests", "1", "--max-tokens", "4"]
    assert cli_logic(argv) == 1
    out = capsys.readouterr().out
    assert "The comparison failed: no request succeeded" in out
    assert "was could not" not in out and "Cost:" not in out
    assert "free" not in out  # nothing was served: that costs nothing, but it is no price


@pytest.mark.parametrize(
    "argv",
    [["bench", "--target-model", "gpt-4o-mini"], ["run", "--target-model", "gpt-4o-mini", "hi"],
     ["bench", "--target-base-url", "http://127.0.0.1:9/v1", "--target-model", "m", "--draft-model", "d"]],
    ids=["bench", "run", "bench-draft"],
)
def test_a_model_without_a_base_url_is_refused_rather_than_sent_to_openai(monkeypatch, capsys, argv):
    for name in ("OPENAI_BASE_URL", "SPECAPI_TARGET_BASE_URL", "SPECAPI_DRAFT_BASE_URL", "SPECAPI_ALLOW_HOSTED"):
        monkeypatch.delenv(name, raising=False)
    assert cli_logic(argv) == 2
    err = capsys.readouterr().err
    role = "draft" if "--draft-model" in argv else "target"
    assert f"without --{role}-base-url (or SPECAPI_{role.upper()}_BASE_URL): the {role}'s requests would go to OpenAI's API" in err
    assert "(https://api.openai.com/v1)" in err and "--allow-hosted" in err


def test_the_hosted_api_is_used_when_asked_for():
    from specapi.core.cli_options import UsageError, refuse_hosted

    values = {"target_model": "gpt-4o-mini", "target_base_url": None, "draft_model": None, "draft_base_url": None}
    with pytest.raises(UsageError):
        refuse_hosted(values, {})
    refuse_hosted({**values, "allow_hosted": True}, {})
    refuse_hosted(values, {"OPENAI_BASE_URL": "https://api.openai.com/v1"})  # named: a choice, not a default
    refuse_hosted({**values, "target_base_url": "http://localhost:8000/v1"}, {})


def test_probe_on_a_dead_port_says_the_url_is_not_reachable_and_what_to_check(capsys):
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    assert cli_logic(["probe", "--base-url", url, "--model", "m"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"specapi probe: {url} is not reachable (")
    assert "is the server running, and is --base-url right (scheme, host, port, and the /v1 path)?" in err
    assert "Connection error." not in err


def test_bench_speculation_options_reach_the_scenario(tmp_path, capsys):
    path = tmp_path / "bench.json"
    argv = ["bench", "--quick", "--scenario", "lan-code", "--drafter", "lookup", "--no-pipeline", "--verification", "echo", "--json", str(path)]
    assert cli_logic(argv) == 0
    assert "JSON report" in capsys.readouterr().err
    (s,) = json.loads(path.read_text())["scenarios"]
    assert s["speculative"]["by_role"]["draft"]["requests"] == 0  # prompt lookup: no draft model
    for request in s["requests"]:
        stats = request["speculative"]
        assert stats["num_rounds"] == request["num_rounds"] and stats["draft"]["requests"] == 0


def test_simulate_prints_its_base_url_models_and_the_run_and_serve_lines(monkeypatch, capsys):
    import specapi.sim.command as command

    started = {}
    monkeypatch.setattr(command, "run_server", lambda **kw: started.update(kw))
    assert cli_logic(["simulate", "--port", "0", "--profile", "llamacpp"]) == 0  # 0: a free port, shown
    started["sock"].close()
    port = started["port"]
    err = capsys.readouterr().err
    base_url = f"http://127.0.0.1:{port}/v1"
    assert port > 0 and base_url in err and "sim-target" in err and "sim-draft" in err
    assert started["capabilities"] == "llamacpp"
    endpoints = f"--target-base-url {base_url} --target-model sim-target --draft-base-url {base_url} --draft-model sim-draft"
    assert f"specapi run {endpoints}" in err and f"specapi serve {endpoints}  # then http://127.0.0.1:8000/v1" in err


def test_simulate_and_serve_default_to_different_ports():
    from specapi.server.command import OPTIONS as SERVE
    from specapi.sim.command import OPTIONS as SIMULATE, banner

    [serve_port] = [o.default for o in SERVE if o.dest == "port"]
    [simulate_port] = [o.default for o in SIMULATE if o.dest == "port"]
    assert (serve_port, simulate_port) == (8000, 8001)
    # A simulator moved onto the proxy's port suggests a proxy line on another one.
    assert "--port 8001  # then http://127.0.0.1:8001/v1" in banner("127.0.0.1", 8000, profile="vllm", latency="lan")
