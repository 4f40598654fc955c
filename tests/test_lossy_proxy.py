"""`specapi serve` and lossy acceptance: refused unless the proxy is started with an explicit flag;
with it, every response says `exact: false` and carries its measured divergence."""

from __future__ import annotations


import openai
import pytest

from specapi import ConfigurationError
from specapi.cli import cli_logic
from specapi.server.command import SettingsError, resolve_settings
from test_server_support import PROXY_KEY, REQUIRED, UPSTREAM_KEY, clean_environment, make_config, no_sleep, parse, running_proxy  # noqa: F401 (fixture)
from toyserver import ToyServer

@pytest.fixture(autouse=True)
def _environment(clean_environment):
    """Every test here reads the command line alone."""


@pytest.mark.parametrize("mode", ["threshold", "typical"])
def test_lossy_acceptance_is_refused_without_the_flag(mode, capsys):
    with pytest.raises(SettingsError, match="--allow-lossy-acceptance"):
        resolve_settings(parse(REQUIRED + ["--acceptance", mode]), {})
    with pytest.raises(SettingsError, match="--allow-lossy-acceptance"):
        resolve_settings(parse(REQUIRED), {"SPECAPI_ACCEPTANCE": mode})
    assert cli_logic(["serve", *REQUIRED, "--acceptance", mode]) == 2
    assert "lossy" in capsys.readouterr().err


def test_the_flag_lets_the_rule_and_its_parameters_reach_the_client():
    settings = resolve_settings(parse(REQUIRED + ["--acceptance", "threshold", "--acceptance-threshold", "0.5", "--allow-lossy-acceptance"]), {})
    options = settings.config.client_options
    assert (options["acceptance"], options["acceptance_threshold"]) == ("threshold", 0.5)
    typical = resolve_settings(parse(REQUIRED), {"SPECAPI_ACCEPTANCE": "typical", "SPECAPI_TYPICAL_DELTA": "0.2", "SPECAPI_ALLOW_LOSSY_ACCEPTANCE": "1"})
    assert (typical.config.client_options["acceptance"], typical.config.client_options["typical_delta"]) == ("typical", 0.2)
    exact = resolve_settings(parse(REQUIRED), {})
    assert "acceptance" not in exact.config.client_options  # the default proxy is unchanged
    with pytest.raises(SettingsError, match="typical-epsilon"):
        resolve_settings(parse(REQUIRED + ["--typical-epsilon", "2"]), {})


def test_a_programmatic_config_refuses_it_too():
    with ToyServer(api_key=UPSTREAM_KEY) as srv:
        with pytest.raises(ConfigurationError, match="allow_lossy_acceptance"):
            make_config(srv, client_options={"acceptance": "threshold"})


def test_a_lossy_proxy_says_exact_false_on_every_response():
    options = {"policy": "fixed", "sleep": no_sleep, "drafter": "model", "acceptance": "threshold", "acceptance_threshold": 0.0}
    with ToyServer(api_key=UPSTREAM_KEY) as srv, running_proxy(srv, client_options=options, allow_lossy_acceptance=True) as proxy:
        with openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as sdk:
            raw = sdk.completions.with_raw_response.create(model="target", prompt="cafe", max_tokens=16, temperature=0)
            chat = sdk.chat.completions.create(model="target", messages=[{"role": "user", "content": "ab"}], max_tokens=8, temperature=0)
            stream = sdk.completions.create(model="target", prompt="cafe", max_tokens=8, temperature=0, stream=True)
            last = list(stream)[-1]
    stats = raw.parse().model_extra["speculative"]
    assert stats["exact"] is False and stats["acceptance"] == "threshold" and raw.headers["x-specapi-exact"] == "false"
    assert int(raw.headers["x-specapi-divergent-tokens"]) == stats["divergent_tokens"] >= 0
    assert chat.model_extra["speculative"]["exact"] is False
    assert last.model_extra["speculative"]["exact"] is False


def test_a_request_cannot_ask_for_lossy_acceptance():
    with ToyServer(api_key=UPSTREAM_KEY) as srv, running_proxy(srv) as proxy:
        probed = len(srv.log)  # the proxy's startup probe
        with openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as sdk:
            with pytest.raises(openai.BadRequestError, match="allow-lossy-acceptance") as info:
                sdk.completions.create(model="target", prompt="ab", max_tokens=4, extra_body={"acceptance": "threshold"})
        assert info.value.body["param"] == "acceptance"
        assert not [r for r in srv.log[probed:] if r.path.endswith("/completions")], "nothing was sent upstream"
