#!/usr/bin/env python3
"""What one request costs on a real vLLM server: the figures the simulator's vLLM profile is calibrated on.

    python benchmarks/vllm_costs.py http://127.0.0.1:PORT [MODEL] [--repeats N]

The server is a running `vllm serve` (`python tests/real/vllm_setup.py PORT PORT2` starts the tiny pair).
Every figure is the fastest of N timings (wall clock, one request at a time, after a warm-up: on a shared
machine other work only ever adds to a timing, so the fastest is the closest to the server's own cost):

- empty: a 1-token prompt, `max_tokens` 1 (the per-request overhead);
- decode step: (`max_tokens` 257 - `max_tokens` 1) / 256 on the same cached prompt;
- prefill per token: (an uncached 1,500-token prompt - the same prompt cached) / 1,408 (a cached prompt still
  computes its last partial block of 128 tokens: 92 here);
- prompt logprobs: a 300-token prompt with `prompt_logprobs: 1` minus the same prompt uncached without;
- verify call: K + 1 = 5 token-id prompts in one request (a 300-token cached prefix and 0..4 more ids),
  `max_tokens` 1 each (the token-id path's round), and a 5-token scoring call (echo + logprobs on prefix + 5);
- n: `n` = 4 and `n` = 1, `max_tokens` 16, sampled.

Ratios to the decode step are printed too: tests/test_sim_calibration.py holds them, and checks the
simulator's "vllm-cpu" latency profile against them. Machines here are shared: run it on a quiet one.
"""

from __future__ import annotations

import argparse
import random
import time
from typing import Any

import httpx2


def _timed(http: httpx2.Client, body: dict[str, Any]) -> float:
    started = time.perf_counter()
    response = http.post("/v1/completions", json=body)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text[:300]
    return elapsed


def measure(root: str, model: str, repeats: int) -> dict[str, float]:
    rng = random.Random(0)
    with httpx2.Client(base_url=root, timeout=120.0) as http:
        vocab = http.post("/tokenize", json={"model": model, "prompt": "x"}).json()
        assert "tokens" in vocab

        def ids(n: int) -> list[int]:
            return [rng.randrange(10, 3000) for _ in range(n)]

        def fastest(make: Any) -> float:
            return min(make() for _ in range(repeats))

        base = {"model": model, "temperature": 0}
        for _ in range(3):  # warm-up
            _timed(http, {**base, "prompt": ids(8), "max_tokens": 4})
        empty = fastest(lambda: _timed(http, {**base, "prompt": ids(1), "max_tokens": 1}))
        cached = ids(300)
        one = fastest(lambda: _timed(http, {**base, "prompt": cached, "max_tokens": 1, "ignore_eos": True}))
        many = fastest(lambda: _timed(http, {**base, "prompt": cached, "max_tokens": 257, "ignore_eos": True}))
        decode = (many - one) / 256
        long_cached = ids(1500)
        _timed(http, {**base, "prompt": long_cached, "max_tokens": 1})
        fresh = fastest(lambda: _timed(http, {**base, "prompt": ids(1500), "max_tokens": 1}))
        again = fastest(lambda: _timed(http, {**base, "prompt": long_cached, "max_tokens": 1}))
        prefill = (fresh - again) / 1408  # the cached prompt still computes its last partial block (1,500 - 11 x 128 = 92)
        without = fastest(lambda: _timed(http, {**base, "prompt": ids(300), "max_tokens": 1}))
        with_scores = fastest(lambda: _timed(http, {**base, "prompt": ids(300), "max_tokens": 1, "prompt_logprobs": 1}))
        prefix = ids(300)
        _timed(http, {**base, "prompt": prefix, "max_tokens": 1})

        def verify() -> float:
            draft = ids(4)
            return _timed(http, {**base, "prompt": [prefix + draft[:j] for j in range(5)], "max_tokens": 1, "return_token_ids": True})

        verify_call = fastest(verify)
        scoring = fastest(lambda: _timed(http, {**base, "prompt": prefix + ids(5), "max_tokens": 1, "echo": True, "logprobs": 1}))
        sampled = {"model": model, "temperature": 1.0, "prompt": cached, "max_tokens": 16, "ignore_eos": True}
        n1 = fastest(lambda: _timed(http, sampled))
        n4 = fastest(lambda: _timed(http, {**sampled, "n": 4}))
    return {
        "empty_s": empty, "decode_step_s": decode, "prefill_per_token_s": prefill,
        "prompt_logprobs_extra_s": with_scores - without, "uncached_300_s": without,
        "verify_call_s": verify_call, "scoring_call_s": scoring, "n1_16_s": n1, "n4_16_s": n4,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root")
    parser.add_argument("model", nargs="?", default="tiny-target")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    figures = measure(args.root, args.model, args.repeats)
    for name, value in figures.items():
        print(f"{name:<26} {value * 1000:8.2f} ms")
    decode = figures["decode_step_s"]
    print(f"{'empty / decode step':<26} {figures['empty_s'] / decode:8.2f}")
    print(f"{'verify call / decode step':<26} {figures['verify_call_s'] / decode:8.2f}")
    print(f"{'scoring call / decode step':<26} {figures['scoring_call_s'] / decode:8.2f}")
    print(f"{'n=4 / n=1 (16 tokens)':<26} {figures['n4_16_s'] / figures['n1_16_s']:8.2f}")


if __name__ == "__main__":
    main()
