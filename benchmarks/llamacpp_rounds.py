"""What one exact greedy round costs a real llama-server, by server configuration (issue 37).

llama-server has no prompt logprobs and no echo, so specapi verifies a greedy draft d1..dK on it as
K + 1 prompts `context + d1..dj` (j = 0..K), one token each, in one multi-prompt `/completion` request;
the server runs each prompt in a slot of its own, and slots share no KV cache. This script replays the
same rounds (the target's own greedy text as the truth, drafts that agree with it per token with
probability 0.77, the compute models' greedy agreement, from a fixed seed) against the compute-bound
target of `tests/real/make_models.py` under several server configurations, and reports from the
server's own `timings` and `--metrics`: prompt tokens evaluated per output token, `llama_decode` calls
per round and the verify call's wall time (median). Every round checks the server's pick at the first
mismatch against the truth. Before the rounds: one decode step, and what a batch of T new tokens costs
in one slot (`timings.prompt_ms`, median of 3).

Configurations: `--parallel 6` (a KV cache per slot), `--parallel 6 --kv-unified` (one pool, the
RAM prompt cache at its default), `--parallel 6 --kv-unified --cache-ram 0`, and llama-server's own
defaults (no `--parallel`: 4 slots, a unified pool, the RAM cache on); and, on the third, the rounds
sent as K + 1 concurrent single-prompt requests pinned to slots (`id_slot` = j), so slot j keeps
`context + d1..dj` from the round before.

    python benchmarks/llamacpp_rounds.py            # K = 4, 96 output tokens a configuration
    python benchmarks/llamacpp_rounds.py --k 2
"""

from __future__ import annotations

import argparse
import asyncio
import pathlib
import random
import statistics
import sys
import tempfile
import time
from typing import Any

import httpx2

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import real_llamacpp as bench  # noqa: E402

AGREEMENT = 0.77
CONFIGS = {
    "--parallel 6 (a KV cache per slot)": ["--parallel", "6"],
    "--parallel 6 --kv-unified (RAM prompt cache on)": ["--parallel", "6", "--kv-unified"],
    "--parallel 6 --kv-unified --cache-ram 0": ["--parallel", "6", "--kv-unified", "--cache-ram", "0"],
    "llama-server defaults (4 slots, unified, RAM cache on)": [],
}
PINNED = "--parallel 6 --kv-unified --cache-ram 0"
BATCHES = (1, 2, 5, 8, 16, 32)


def argv(model: pathlib.Path, flags: list[str]) -> list[str]:
    ctx = ["--ctx-size", "6144"] if flags else []
    return [str(bench.llama_server_binary()), "--model", str(model), "--host", "127.0.0.1", "--port", "{port}",
            "--threads", "1", "--threads-batch", "1", "--no-webui", "--metrics", *ctx, *flags]  # fmt: skip


async def replay(http: httpx2.AsyncClient, process: bench.Process, k: int, tokens: int, *, pinned: bool, batches: bool) -> dict[str, Any]:
    async def post(body: dict[str, Any]) -> Any:
        response = await http.post(process.root + "/completion", json={"temperature": 0, "cache_prompt": True, "return_tokens": True, **body})
        response.raise_for_status()
        return response.json()

    ids = (await http.post(process.root + "/tokenize", json={"content": bench.CODE_PROMPTS[1], "add_special": True})).json()["tokens"]
    generated = await post({"prompt": ids, "n_predict": tokens + k + 1})
    truth = ids + generated["tokens"]
    figures: dict[str, Any] = {"decode_ms": generated["timings"]["predicted_per_token_ms"]}
    if batches:
        base = len(ids) + 16
        for size in BATCHES:
            spent = []
            for _ in range(3):
                await post({"prompt": truth[:base], "n_predict": 1, "id_slot": 0})
                timings = (await post({"prompt": truth[: base + size], "n_predict": 1, "id_slot": 0}))["timings"]
                if timings["prompt_n"] == size:
                    spent.append(timings["prompt_ms"])
            figures[f"batch_{size}_ms"] = statistics.median(spent) if spent else None
    rng = random.Random(1)
    before = bench.server_counters(process)
    position, rounds, evaluated, calls = len(ids), 0, 0, []
    while position < len(ids) + tokens:
        draft = [t if rng.random() < AGREEMENT else t + 1 for t in truth[position : position + k]]
        prompts = [truth[:position] + draft[:j] for j in range(k + 1)]
        started = time.perf_counter()
        if pinned:
            results = await asyncio.gather(*(post({"prompt": p, "n_predict": 1, "id_slot": j}) for j, p in enumerate(prompts)))
        else:
            results = sorted(await post({"prompt": prompts, "n_predict": 1}), key=lambda r: r["index"])
        calls.append(1000 * (time.perf_counter() - started))
        evaluated += sum(r["timings"]["prompt_n"] for r in results)
        kept = next((j for j in range(k) if draft[j] != truth[position + j]), k)
        if results[kept]["tokens"][0] != truth[position + kept]:
            raise SystemExit(f"round {rounds}: the server's pick {results[kept]['tokens'][0]} is not the target's {truth[position + kept]}")
        position += kept + 1
        rounds += 1
    after = bench.server_counters(process)
    output = position - len(ids)
    figures.update(
        rounds=rounds,
        output_tokens=output,
        prompt_tokens_per_output=evaluated / output,
        metrics_prompt_tokens_per_output=(after["prompt_tokens_total"] - before["prompt_tokens_total"]) / output,
        decode_calls_per_round=(after["n_decode_total"] - before["n_decode_total"]) / rounds,
        verify_ms_median=statistics.median(calls),
    )
    return figures


async def run(args: argparse.Namespace) -> None:
    target, _ = bench.make_compute_models(args.models)
    logs = pathlib.Path(tempfile.mkdtemp(prefix="specapi-llamacpp-rounds-"))
    print(f"K = {args.k}, {args.tokens} output tokens a configuration, drafts agreeing {AGREEMENT:.0%} a token")
    async with httpx2.AsyncClient(timeout=300.0) as http:
        for index, (name, flags) in enumerate(CONFIGS.items()):
            process = bench.start_process(f"target-{index}", argv(target, flags), logs, "/health")
            try:
                modes = [False, True] if name == PINNED else [False]
                for pinned in modes:
                    f = await replay(http, process, args.k, args.tokens, pinned=pinned, batches=index == 0 and not pinned)
                    if "batch_1_ms" in f:
                        curve = ", ".join(f"{size}: {f[f'batch_{size}_ms']:.1f}" for size in BATCHES if f.get(f"batch_{size}_ms") is not None)
                        print(f"one decode step {f['decode_ms']:.2f} ms; T new tokens in one slot, prompt_ms: {curve}")
                    label = name + (", K + 1 requests pinned by id_slot" if pinned else ", one multi-prompt request")
                    print(
                        f"{label}\n    {f['rounds']} rounds, {f['output_tokens']} tokens: {f['prompt_tokens_per_output']:.2f} prompt tokens evaluated per output "
                        f"token (--metrics {f['metrics_prompt_tokens_per_output']:.2f}), {f['decode_calls_per_round']:.2f} llama_decode calls a round, "
                        f"verify call {f['verify_ms_median']:.1f} ms (median), decode step {f['decode_ms']:.2f} ms"
                    )
            finally:
                bench.stop_process(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=4, help="draft tokens a round (default 4)")
    parser.add_argument("--tokens", type=int, default=96, help="output tokens a configuration (default 96)")
    parser.add_argument("--models", help="where the compute models are (default: the cache of tests/real/make_models.py)")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
