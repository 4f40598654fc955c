"""specapi inside LiteLLM's gateway (`specapi.integrations.litellm`): the real `litellm` proxy (its own
server process, `litellm --config ...`) with specapi as a custom provider, in front of the simulator.
The openai SDK through LiteLLM gets the target's own output (chat and completions, plain and streamed);
LiteLLM's spend record of each request has specapi's cost and the per-role figures; a model LiteLLM does
not know, one the target does not serve, and an upstream 429 reach the caller as LiteLLM reports errors."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx2
import openai
import pytest

from replicas import free_port
from simclient import target_alone
from simserver import ServerThread
from specapi.sim import Faults, SimProvider, create_app

FIXTURES = Path(__file__).parent / "fixtures"
MASTER_KEY = "sk-" + os.urandom(32).hex()  # LiteLLM's proxy refuses to start without a strong one
PRICES = {"input": Decimal("0.000001"), "output": Decimal("0.000002"), "draft_input": Decimal("0.0000001"), "draft_output": Decimal("0.0000002")}
MESSAGES = [{"role": "user", "content": "Tell me about Zürich, 東京 and 🙂 in one breath"}]
PROMPT = "Once upon a time, in 北京 and Köln,"


@pytest.fixture(scope="module")
def provider() -> SimProvider:
    return SimProvider(capabilities="vllm", latency="instant", seed=0)


def _config(sim: str, limited: str) -> str:
    deployment = f"""
      api_base: {sim}/v1
      api_key: os.environ/SIM_TARGET_KEY
      draft_model: sim-draft
      draft_api_key: os.environ/SIM_DRAFT_KEY
      input_cost_per_token: {PRICES['input']}
      output_cost_per_token: {PRICES['output']}
      draft_input_cost_per_token: {PRICES['draft_input']}
      draft_output_cost_per_token: {PRICES['draft_output']}
      max_retries: 0
      specapi_options: {{policy: fixed, num_speculative_tokens: 4}}"""
    return f"""
model_list:
  - model_name: fast
    litellm_params:
      model: specapi/sim-target{deployment}
  - model_name: missing
    litellm_params:
      model: specapi/no-such-model{deployment}
  - model_name: limited
    litellm_params:
      model: specapi/sim-target
      api_base: {limited}/v1
      draft_model: sim-draft
      max_retries: 0
litellm_settings:
  num_retries: 0
  custom_provider_map:
    - {{provider: specapi, custom_handler: specapi.integrations.litellm.handler}}
  callbacks: litellm_spend_log.spend_log
router_settings:
  num_retries: 0
"""


@pytest.fixture(scope="module")
def gateway(provider: SimProvider, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """LiteLLM's proxy, its config naming specapi's provider; (its URL, the spend log file)."""
    if shutil.which("litellm") is None and not Path(sys.executable).with_name("litellm").exists():
        pytest.fail("litellm's proxy is not installed (pip install 'litellm[proxy]'; the test extra has it)")
    directory = tmp_path_factory.mktemp("litellm")
    shutil.copy(FIXTURES / "litellm_spend_log.py", directory / "litellm_spend_log.py")
    spend_log = directory / "spend.jsonl"
    limited = SimProvider(capabilities="vllm", latency="instant", seed=0, faults=Faults(rate_limit_rate=1.0))
    with ServerThread(create_app(provider)) as sim, ServerThread(create_app(limited)) as limited_sim:
        (directory / "config.yaml").write_text(_config(sim.root, limited_sim.root), encoding="utf-8")
        port = free_port()
        env = {
            **os.environ, "LITELLM_MASTER_KEY": MASTER_KEY, "SPEND_LOG_PATH": str(spend_log),
            "SIM_TARGET_KEY": "sk-sim-target", "SIM_DRAFT_KEY": "sk-sim-draft",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # LiteLLM would fetch its price table from the network
        }
        litellm = str(Path(sys.executable).with_name("litellm"))
        with open(directory / "litellm.log", "w") as log:
            process = subprocess.Popen(
                [litellm, "--config", str(directory / "config.yaml"), "--host", "127.0.0.1", "--port", str(port), "--num_workers", "1"],
                env=env, stdout=log, stderr=subprocess.STDOUT, cwd=directory,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 90
            while True:
                assert process.poll() is None, (directory / "litellm.log").read_text()[-3000:]
                try:
                    if httpx2.get(url + "/health/liveliness", timeout=2).status_code == 200:
                        break
                except httpx2.TransportError:
                    pass
                assert time.monotonic() < deadline, "LiteLLM's proxy did not start"
                time.sleep(0.1)
            yield url, spend_log
        finally:
            process.terminate()
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def sdk(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=MASTER_KEY, max_retries=0, timeout=60)


def spend_records(log: Path, count: int) -> list[dict]:
    """The spend log's records, once `count` are there (LiteLLM writes them after the response)."""
    deadline = time.monotonic() + 10
    while True:
        lines = log.read_text(encoding="utf-8").splitlines() if log.exists() else []
        if len(lines) >= count:
            return [json.loads(line) for line in lines]
        assert time.monotonic() < deadline, f"{len(lines)} spend records, expected {count}"
        time.sleep(0.05)


def test_the_sdk_through_litellm_gets_the_targets_output_and_the_spend_log_records_it(gateway, provider):
    url, log = gateway
    client = sdk(url)
    before = len(spend_records(log, 0))
    raw = client.chat.completions.with_raw_response.create(model="fast", messages=MESSAGES, max_tokens=24, temperature=0)
    chat = raw.parse()
    text = client.completions.create(model="fast", prompt=PROMPT, max_tokens=24, temperature=0)
    chat_stream = client.chat.completions.create(model="fast", messages=MESSAGES, max_tokens=24, temperature=0, stream=True)
    streamed_chat = "".join(c.choices[0].delta.content or "" for c in chat_stream if c.choices)
    text_stream = client.completions.create(model="fast", prompt=PROMPT, max_tokens=24, temperature=0, stream=True)
    streamed_text = "".join(c.choices[0].text or "" for c in text_stream if c.choices)

    expected_chat, _ = asyncio.run(target_alone(provider, messages=MESSAGES, max_tokens=24))
    expected_text, _ = asyncio.run(target_alone(provider, prompt=PROMPT, max_tokens=24))
    assert chat.choices[0].message.content == streamed_chat == expected_chat
    assert text.choices[0].text == streamed_text == expected_text
    assert chat.usage.completion_tokens == 24 and chat.usage.prompt_tokens > 0

    records = spend_records(log, before + 4)[before:]
    assert [r["status"] for r in records] == ["success"] * 4
    assert [r["payload"]["call_type"] for r in records] == ["acompletion", "atext_completion", "acompletion", "atext_completion"]
    for record in records:
        payload = record["payload"]
        figures = payload["metadata"]["spend_logs_metadata"]["specapi"]
        target, draft = figures["target"], figures["draft"]
        assert payload["model"] == "specapi/sim-target" and payload["completion_tokens"] == 24
        assert figures["exact"] and figures["speculated"] and figures["num_rounds"] > 0
        # Repeated texts draft from the suffix index (no draft call): the draft's requests may be 0.
        assert target["requests"] >= figures["num_rounds"] and figures["drafted_tokens"] > 0
        # The cost LiteLLM records is specapi's: every call of both roles at the deployment's prices.
        cost = (target["prompt_tokens"] * PRICES["input"] + target["completion_tokens"] * PRICES["output"]
                + draft["prompt_tokens"] * PRICES["draft_input"] + draft["completion_tokens"] * PRICES["draft_output"])
        assert Decimal(figures["cost_usd"]) == cost == Decimal(target["cost_usd"]) + Decimal(draft["cost_usd"])
        if payload["call_type"] == "atext_completion" and not payload["stream"]:
            # LiteLLM's router prices a text completion's converted response itself: the response's own
            # usage at the deployment's prices (specapi's figures stay in the metadata above).
            alone = payload["prompt_tokens"] * PRICES["input"] + payload["completion_tokens"] * PRICES["output"]
            assert payload["response_cost"] == pytest.approx(float(alone)) and alone < cost
        else:
            assert payload["response_cost"] == pytest.approx(float(cost))
    assert records[0]["payload"]["metadata"]["spend_logs_metadata"]["specapi"]["draft"]["requests"] > 0  # new text: the draft model
    assert float(raw.headers["x-litellm-response-cost"]) == pytest.approx(records[0]["payload"]["response_cost"])


def test_errors_reach_the_caller_as_litellm_reports_them(gateway):
    url, log = gateway
    client = sdk(url)
    with pytest.raises(openai.BadRequestError, match="Invalid model name"):  # LiteLLM's own check
        client.chat.completions.create(model="no-such-deployment", messages=MESSAGES, max_tokens=4)
    with pytest.raises(openai.NotFoundError) as missing:  # the target does not serve the model
        client.chat.completions.create(model="missing", messages=MESSAGES, max_tokens=4)
    assert "no-such-model" in str(missing.value) and "target" in str(missing.value)
    with pytest.raises(openai.RateLimitError) as limited:  # the target answered 429
        client.chat.completions.create(model="limited", messages=MESSAGES, max_tokens=4)
    assert limited.value.status_code == 429
    with pytest.raises(openai.RateLimitError):
        list(client.chat.completions.create(model="limited", messages=MESSAGES, max_tokens=4, stream=True))
    failures = [r for r in spend_records(log, 0) if r["status"] == "failure"]
    assert {r["payload"]["model_group"] for r in failures} >= {"missing", "limited"}
