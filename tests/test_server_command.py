"""`specapi serve`: settings from options and environment, exit codes, and a real run with SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx2
import pytest

from specapi.cli import cli_logic
from specapi.server.command import SettingsError, resolve_settings
from test_server_support import PROXY_KEY, REQUIRED, UPSTREAM_KEY, clean_environment, parse  # noqa: F401 (fixture)
from toyserver import TARGET, ToyServer

@pytest.fixture(autouse=True)
def _environment(clean_environment):
    """Every test here reads the command line alone."""


def test_options_give_a_config_with_defaults():
    settings = resolve_settings(parse(REQUIRED), {})
    config = settings.config
    assert (config.target.model, config.target.base_url, config.draft.model, config.draft.base_url) == ("big", "http://t/v1", "small", "http://d/v1")
    assert (settings.host, settings.port, config.num_speculative_tokens, config.api_key) == ("127.0.0.1", 8000, 4, None)
    assert (config.max_request_bytes, config.max_tokens_limit) == (1 << 20, None)


def test_environment_fills_in_and_options_win():
    environ = {
        "SPECAPI_TARGET_BASE_URL": "http://env-t/v1", "SPECAPI_TARGET_MODEL": "env-big", "SPECAPI_TARGET_API_KEY": "sk-t",
        "SPECAPI_DRAFT_BASE_URL": "http://env-d/v1", "SPECAPI_DRAFT_MODEL": "env-small", "SPECAPI_DRAFT_API_KEY": "sk-d",
        "SPECAPI_API_KEY": "sk-proxy", "SPECAPI_PORT": "9001", "SPECAPI_NUM_SPECULATIVE_TOKENS": "6", "SPECAPI_MAX_RETRIES": "0",
    }
    settings = resolve_settings(parse(["--target-model", "cli-big", "--port", "9002"]), environ)
    config = settings.config
    assert config.target.model == "cli-big" and config.target.base_url == "http://env-t/v1"
    assert (config.target.api_key, config.draft.api_key, config.api_key) == ("sk-t", "sk-d", "sk-proxy")
    assert (settings.port, config.num_speculative_tokens, config.target.max_retries) == (9002, 6, 0)


def test_missing_settings_are_all_named():
    with pytest.raises(SettingsError) as info:
        resolve_settings(parse(["--target-model", "big"]), {})
    message = str(info.value)
    for name in ("--target-base-url (or SPECAPI_TARGET_BASE_URL)", "--draft-base-url", "--draft-model"):
        assert name in message
    assert "--target-model" not in message


@pytest.mark.parametrize(
    "extra", [["--port", "http"], ["--port", "70000"], ["--num-speculative-tokens", "0"], ["--shutdown-timeout", "-1"], ["--max-retries", "-2"]]
)
def test_invalid_settings_are_refused(extra):
    with pytest.raises(SettingsError):
        resolve_settings(parse(REQUIRED + extra), {})


def test_invalid_values_are_shown_with_their_source():
    with pytest.raises(SettingsError) as info:
        resolve_settings(parse(REQUIRED), {"SPECAPI_PORT": "eighty"})
    assert "SPECAPI_PORT='eighty' is invalid" in str(info.value)


def test_cli_exits_2_with_a_clear_message_when_settings_are_missing(capsys):
    assert cli_logic(["serve", "--target-model", "big"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specapi serve: missing required settings:") and "SPECAPI_DRAFT_MODEL" in err


def test_cli_exits_2_for_an_unknown_policy(capsys):
    assert cli_logic(["serve", *REQUIRED, "--policy", "bogus"]) == 2
    assert "policy" in capsys.readouterr().err


def test_policy_drafter_and_verification_reach_the_client():
    settings = resolve_settings(parse(REQUIRED + ["--policy", "fixed", "--drafter", "model", "--no-pipeline"]), {"SPECAPI_VERIFICATION": "echo"})
    assert dict(settings.config.client_options) == {"policy": "fixed", "drafter": "model", "verification": "echo", "pipeline": False}
    piped = resolve_settings(parse(REQUIRED), {"SPECAPI_PIPELINE": "0"})
    assert piped.config.client_options["pipeline"] is False


def test_prompt_lookup_needs_no_draft_endpoint():
    settings = resolve_settings(parse(["--target-base-url", "http://t/v1", "--target-model", "big", "--drafter", "lookup"]), {})
    assert settings.config.draft is None and settings.config.client_options["drafter"] == "lookup"
    from specapi.server.app import create_app

    assert create_app(settings.config) is not None  # the proxy builds its client without a draft
    with pytest.raises(SettingsError, match="--draft-model"):
        resolve_settings(parse(["--target-base-url", "http://t/v1", "--target-model", "big", "--drafter", "model"]), {})


def test_choices_are_checked_and_named():
    with pytest.raises(SettingsError, match="must be one of adaptive, fixed"):
        resolve_settings(parse(REQUIRED + ["--policy", "sometimes"]), {})


def test_the_suffix_scope_comes_from_the_option_or_the_environment():
    assert resolve_settings(parse(REQUIRED), {}).config.suffix_scope == "model"
    settings = resolve_settings(parse(REQUIRED + ["--suffix-max-tokens", "1000"]), {"SPECAPI_SUFFIX_SCOPE": "api-key"})
    assert settings.config.suffix_scope == "api-key" and settings.config.suffix_max_tokens == 1000
    with pytest.raises(SettingsError) as info:
        resolve_settings(parse(REQUIRED + ["--suffix-scope", "everyone"]), {})
    assert "--suffix-scope='everyone' is invalid" in str(info.value)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.usefixtures("curl_installed")
def test_specapi_serve_runs_answers_curl_and_stops_cleanly_on_sigterm():
    with ToyServer(api_key=UPSTREAM_KEY) as srv:
        port = _free_port()
        env = {
            **os.environ,
            "SPECAPI_TARGET_BASE_URL": srv.base_url, "SPECAPI_TARGET_MODEL": "target",
            "SPECAPI_DRAFT_BASE_URL": srv.base_url, "SPECAPI_DRAFT_MODEL": "draft",
            "SPECAPI_TARGET_API_KEY": UPSTREAM_KEY, "SPECAPI_DRAFT_API_KEY": UPSTREAM_KEY,
            "SPECAPI_API_KEY": PROXY_KEY, "SPECAPI_PORT": str(port), "SPECAPI_LOG_LEVEL": "warning",
        }
        process = subprocess.Popen(
            [sys.executable, "-c", "from specapi.cli import cli; cli()", "serve", "--shutdown-timeout", "5"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 20
            while True:
                assert process.poll() is None, process.communicate()
                try:
                    if httpx2.get(url + "/health").status_code == 200:
                        break
                except httpx2.TransportError:
                    assert time.monotonic() < deadline, "specapi serve did not come up"
                    time.sleep(0.05)
            body = json.dumps({"model": "target", "prompt": "ab", "max_tokens": 10, "temperature": 0})
            result = subprocess.run(
                ["curl", "-s", "-S", "--max-time", "20", url + "/v1/completions", "-H", "Content-Type: application/json",
                 "-H", f"Authorization: Bearer {PROXY_KEY}", "-d", body],
                capture_output=True, text=True, timeout=30, check=True,
            )
            assert json.loads(result.stdout)["choices"][0]["text"] == TARGET.greedy("ab", 10)[0]
        finally:
            process.send_signal(signal.SIGTERM)
            _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0
    assert "specapi serve: target target @ " in stderr and UPSTREAM_KEY not in stderr and PROXY_KEY not in stderr


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_on_a_busy_port_exits_1_before_building_anything(monkeypatch, capsys, clean_environment, workers):
    import specapi.server.command as command

    def never(*args: object) -> None:
        raise AssertionError("start-up work began on a port that cannot be served")

    monkeypatch.setattr(command, "proxy_app", never)
    monkeypatch.setattr(command, "build_client", never)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli_logic(["serve", *REQUIRED, "--port", str(port), "--workers", workers]) == 1
    err = capsys.readouterr().err
    assert f"specapi serve: cannot listen on 127.0.0.1:{port}" in err and "--port" in err


def test_specapi_serve_on_a_busy_port_exits_1_and_never_calls_the_target():
    with ToyServer(api_key=UPSTREAM_KEY) as srv, socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = {
            **os.environ, "SPECAPI_TARGET_BASE_URL": srv.base_url, "SPECAPI_TARGET_MODEL": "target",
            "SPECAPI_TARGET_API_KEY": UPSTREAM_KEY, "SPECAPI_DRAFTER": "lookup", "SPECAPI_PORT": str(port),
        }
        result = subprocess.run(
            [sys.executable, "-c", "from specapi.cli import cli; cli()", "serve"], env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 1, result.stderr
        assert "Address already in use" in result.stderr
        assert srv.log == []  # no probe, no readiness check: it stopped before start-up


def test_specapi_simulate_on_a_busy_port_exits_1_before_building_its_models(monkeypatch, capsys):
    import specapi.sim.command as command

    monkeypatch.setattr(command, "run_server", lambda **kw: pytest.fail("the simulator started on a busy port"))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert cli_logic(["simulate", "--port", str(port)]) == 1
    assert f"specapi simulate: cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err


# ----------------------------------------------------------------------------- the start-up check


@pytest.fixture(scope="module")
def simulated_upstream():
    from specapi.server import BackgroundServer
    from specapi.sim import SimProvider
    from specapi.sim import create_app as create_sim_app

    with BackgroundServer(create_sim_app(SimProvider(capabilities="vllm", latency="instant", seed=0)), shutdown_timeout=1) as server:
        yield server.url + "/v1"


def _closed_port_url() -> str:
    return f"http://127.0.0.1:{_free_port()}/v1"  # bound for a moment, then closed: connections are refused


@pytest.mark.parametrize(
    ("target", "draft", "expected"),
    [
        ("sim", ("sim", "sim-draft-typo"), "specapi serve: draft endpoint sim-draft-typo @ {sim}: the model 'sim-draft-typo' is not served there (HTTP 404"),
        ("sim", ("dead", "sim-draft"), "specapi serve: draft endpoint sim-draft @ {dead} is unreachable"),
        ("dead", ("sim", "sim-draft"), "specapi serve: target endpoint sim-target @ {dead} is unreachable"),
    ],
    ids=["wrong-draft-model", "dead-draft", "dead-target"],
)
def test_serve_refuses_to_start_when_an_endpoint_fails_its_check(monkeypatch, capsys, simulated_upstream, target, draft, expected):
    import specapi.server.command as command

    monkeypatch.setattr(command, "serve", lambda *args: pytest.fail("the proxy started although an endpoint failed its check"))
    urls = {"sim": simulated_upstream, "dead": _closed_port_url()}
    argv = ["serve", "--target-base-url", urls[target], "--target-model", "sim-target",
            "--draft-base-url", urls[draft[0]], "--draft-model", draft[1], "--port", "0", "--max-retries", "0"]
    assert cli_logic(argv) == 1
    err = capsys.readouterr().err
    assert expected.format(**urls) in err, err
    assert "not started: correct the settings above, or start with --allow-degraded" in err


@pytest.mark.usefixtures("curl_installed")
def test_serve_with_allow_degraded_serves_with_the_target_alone_and_says_so(simulated_upstream):
    port = _free_port()
    argv = ["serve", "--target-base-url", simulated_upstream, "--target-model", "sim-target", "--draft-base-url", simulated_upstream,
            "--draft-model", "sim-draft-typo", "--port", str(port), "--allow-degraded", "--shutdown-timeout", "5", "--policy", "fixed", "--drafter", "model"]
    env = {**os.environ, "SPECAPI_LOG_LEVEL": "warning"}
    process = subprocess.Popen([sys.executable, "-c", "from specapi.cli import cli; cli()", *argv], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert process.poll() is None, process.communicate()
            try:
                ready = httpx2.get(url + "/ready")
                if ready.json().get("status") != "starting":
                    break
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline, "specapi serve did not come up"
            time.sleep(0.05)
        assert ready.status_code == 200 and ready.json()["status"] == "degraded"
        roles = ready.json()["roles"]
        assert roles["target"] == {"status": "ok"} and roles["draft"]["status"] == "failing"
        assert "the model 'sim-draft-typo' is not served there" in roles["draft"]["reason"]
        body = {"model": "sim-target", "prompt": "def fibonacci(n):", "max_tokens": 8, "temperature": 0}
        for _ in range(3):
            reply = httpx2.post(url + "/v1/completions", json=body, timeout=30)
            assert reply.status_code == 200 and reply.headers["x-specapi-fallback-reason"].startswith("draft failed")
        metrics = httpx2.get(url + "/metrics").text
    finally:
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=20)
    assert process.returncode == 0
    assert "specapi serve: draft endpoint sim-draft-typo @ " in stderr and "starting anyway (--allow-degraded)" in stderr
    # Said when the check behind /ready finds it, and once by the library for all the requests' failures.
    assert stderr.count("logged once per endpoint and failure") == 1, stderr
    assert stderr.count("the proxy serves with the target alone (no speculation from the draft)") == 1, stderr
    from test_server_support import metric

    assert metric(metrics, "specapi_fallbacks_total", reason="draft_failed") == 3
