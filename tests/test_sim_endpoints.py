"""simulated_endpoints (specapi.Endpoint on the simulator) and the `specapi simulate` command."""

import argparse
from decimal import Decimal

from specapi.sim import SimProvider, simulated_endpoints
from specapi.sim import command
from specapi.sim.latency import RecordingSleep


async def test_simulated_endpoints_talk_to_one_provider():
    provider = SimProvider(capabilities="openai", latency="hosted", sleep=RecordingSleep())
    target, draft = simulated_endpoints(provider=provider)
    assert (target.model, draft.model) == ("sim-target", "sim-draft")
    assert target.input_price_per_mtok == Decimal("2.50") and draft.output_price_per_mtok == Decimal("0.60")
    assert target.max_logprobs == 5
    for endpoint in (target, draft):
        client = endpoint.build_client()
        result = await client.completions.create(model=endpoint.model, prompt="x", max_tokens=2)
        assert result.usage.completion_tokens == 2
        await client.close()
    assert [c.model for c in provider.calls] == ["sim-target", "sim-draft"]


def test_default_endpoints_describe_the_simulated_server():
    target, _ = simulated_endpoints(profile="vllm", latency="lan")
    assert target.max_logprobs == 20
    assert "vllm" in target.label and "lan" in target.label


def test_simulate_command_passes_its_options(monkeypatch):
    seen = {}
    monkeypatch.setattr(command, "run_server", lambda **kwargs: seen.update(kwargs))
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    args = parser.parse_args(["--port", "0", "--profile", "llamacpp", "--latency", "hosted", "--fail-first", "2"])
    assert command.run(args) == 0
    seen["sock"].close()
    assert seen["port"] > 0  # the port the system picked, bound before the models are built
    assert (seen["capabilities"], seen["latency"]) == ("llamacpp", "hosted")
    assert seen["faults"].fail_first == 2
