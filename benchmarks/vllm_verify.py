#!/usr/bin/env python3
"""What checking a draft costs on a running vLLM server, by shape: time, and what the server computed.

    python benchmarks/vllm_verify.py http://127.0.0.1:PORT MODEL [--contexts 100,300] [-k 4] [--repeats 3]

First, uncached prompts of a few lengths (`--prefill`), one token each: what computing t tokens in one
forward pass costs beside one. Then for each context length N (random token ids, sent once first so that the prefix cache holds them), and
draft length K, each shape is timed (the fastest of `--repeats`, wall clock, one request at a time) and
counted by the server itself (`/metrics`: `vllm:prompt_tokens_total` minus `vllm:prompt_tokens_cached_total`
= prompt tokens computed; `vllm:request_success_total` = engine requests):

- decode step: (`max_tokens` 33 - `max_tokens` 1) / 32 on the cached context;
- plain: the cached context, `max_tokens` 1 (what the target alone pays per request beside its steps);
- picks: K + 1 token-id prompts `context + d1..dj` in one request, one token each (the token-id path);
- scored: one prompt `context + d1..dK` with `prompt_logprobs: 1`, one token (one pass, no cache read);
- echo: the same as text with `echo` + `logprobs: 1` (the echo path).

Each draft is new ids (nothing of it cached). The block size and whether prefix caching is on come from
`vllm:cache_config_info`. On a shared machine other work only adds to a timing: run it when quiet.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from typing import Any

import httpx2


def counters(http: httpx2.Client) -> dict[str, float]:
    text = http.get("/metrics").text
    found = {}
    for name in ("prompt_tokens_total", "prompt_tokens_cached_total", "request_success_total", "generation_tokens_total"):
        found[name] = sum(float(m.group(1)) for m in re.finditer(rf"^vllm:{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
    return found


def cache_config(http: httpx2.Client) -> dict[str, str]:
    line = re.search(r"^vllm:cache_config_info\{([^}]*)\}", http.get("/metrics").text, re.M)
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line.group(1))) if line else {}
    return {k: labels[k] for k in ("block_size", "enable_prefix_caching") if k in labels}


def measure(http: httpx2.Client, model: str, body: dict[str, Any], repeats: int, fresh: Any) -> dict[str, float]:
    """The fastest of `repeats` timings of `body` (built anew by `fresh(body)` each time), with the
    server's counts of the last one."""
    best = float("inf")
    for _ in range(repeats):
        sent = fresh(body)
        before = counters(http)
        started = time.perf_counter()
        response = http.post("/v1/completions", json={"model": model, "temperature": 0, **sent})
        elapsed = time.perf_counter() - started
        after = counters(http)
        assert response.status_code == 200, response.text[:300]
        best = min(best, elapsed)
    grew = {k: after[k] - before[k] for k in after}
    return {
        "ms": round(1000 * best, 1),
        "computed": grew["prompt_tokens_total"] - grew["prompt_tokens_cached_total"],
        "cached": grew["prompt_tokens_cached_total"],
        "engine_requests": grew["request_success_total"],
    }


def run(root: str, model: str, contexts: list[int], k: int, repeats: int, prefill: list[int]) -> dict[str, Any]:
    rng = random.Random(0)

    def ids(n: int) -> list[int]:
        return [rng.randrange(300, 3000) for _ in range(n)]

    results: dict[str, Any] = {}
    with httpx2.Client(base_url=root, timeout=600.0) as http:
        results["cache"] = cache_config(http)
        fresh = {}
        for t in prefill:
            fresh[t] = measure(http, model, {"max_tokens": 1}, repeats, lambda b, t=t: {**b, "prompt": ids(t)})["ms"]
        results["prefill_ms"] = fresh
        print(f"uncached prompts, ms by length: {json.dumps(fresh)}", flush=True)
        for n in contexts:
            context = ids(n)
            http.post("/v1/completions", json={"model": model, "prompt": context, "max_tokens": 1})  # cached from now on
            same = lambda body: body  # noqa: E731
            one = measure(http, model, {"prompt": context, "max_tokens": 1, "ignore_eos": True}, repeats, same)
            many = measure(http, model, {"prompt": context, "max_tokens": 33, "ignore_eos": True}, repeats, same)
            row = {"decode_ms": round((many["ms"] - one["ms"]) / 32, 1), "plain": one}
            row["picks"] = measure(http, model, {"max_tokens": 1}, repeats, lambda b: {**b, "prompt": [context + d[:j] for d in [ids(k)] for j in range(k + 1)]})
            row["scored"] = measure(http, model, {"max_tokens": 1, "prompt_logprobs": 1}, repeats, lambda b: {**b, "prompt": context + ids(k)})
            text = http.post("/detokenize", json={"model": model, "tokens": context}).json()["prompt"]
            row["echo"] = measure(http, model, {"max_tokens": 1, "echo": True, "logprobs": 1}, repeats, lambda b: {**b, "prompt": text + " x" * k})
            results[f"N={n}"] = row
            print(f"N={n}: {json.dumps(row)}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root")
    parser.add_argument("model")
    parser.add_argument("--contexts", default="100,300")
    parser.add_argument("-k", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--prefill", default="1,4,8,16,32,64", help="lengths of uncached prompts timed first (the cost of computing t tokens at once)")
    parser.add_argument("--json")
    args = parser.parse_args()
    results = run(args.root, args.model, [int(n) for n in args.contexts.split(",")], args.k, args.repeats, [int(t) for t in args.prefill.split(",") if t])
    print(json.dumps(results["cache"]))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
