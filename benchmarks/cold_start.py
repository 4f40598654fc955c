"""Cold start: a fresh default client's first requests against the target alone (LAN profile, greedy).

Each trial makes a new simulated provider (vLLM-like, "lan" latency: target 30 ms to first token then
25 ms per token, draft 4 ms + 4 ms per token) and a new `AsyncSpeculativeOpenAI(target=..., draft=...)`
with every option at its default (adaptive policy, drafter auto, pipelined drafting) that has probed
nothing (the process's cache of probed endpoints is emptied: as in a fresh process), then sends the
lan-adaptive scenario's three code prompts (60 tokens, temperature 0) one after another, streamed. Each
speculative request is paired with the same request to the target alone (streamed through the openai
SDK, as `specapi bench` times its baseline), in alternating order. The speedup of request i is the target
alone's time over the speculative time; the figures are the median over the trials, and every output
is checked against the target's own. The process loads the simulator's models once before the trials
(not charged to either arm).

Two servers, one after the other (`--server` picks one): "vllm", which answers the probe's optional
endpoints (`/version`, `/tokenize`, `/models` with `max_model_len`), and "bare", the same completions
and chat endpoints on a server that answers none of them (404 for `/props`, `/version`,
`/get_model_info`, `/tokenize`).

    python benchmarks/cold_start.py                 # 5 trials, 3 requests each, on both servers
    python benchmarks/cold_start.py --trials 9 --requests 5 --server bare

Exit code 1 if a request position's median speedup is under --min-speedup (1.6) on either server, or
an output differs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time

from specapi import AsyncSpeculativeOpenAI
from specapi.bench.runner import stream_target_alone
from specapi.bench.scenarios import get_scenario
from specapi.parts import probe
from specapi.sim import simulated_endpoints
from specapi.sim.profiles import CAPABILITY_PROFILES

#: The simulated servers: vLLM's, and one serving the same OpenAI endpoints and nothing else.
SERVERS = {
    "vllm": CAPABILITY_PROFILES["vllm"],
    "bare": dataclasses.replace(CAPABILITY_PROFILES["vllm"], name="bare", dialect="openai", token_id_extras=False),
}


async def _speculative(client: AsyncSpeculativeOpenAI, prompt: str, max_tokens: int) -> tuple[float, str, object]:
    started = time.perf_counter()
    stream = await client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True)
    pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    return time.perf_counter() - started, "".join(pieces), stream.speculative


async def _trial(server: str, seed: int, count: int) -> list[tuple[float, float, bool, str]]:
    scenario = get_scenario("lan-adaptive")
    probe._CACHE.clear()  # what an earlier trial's client probed: a fresh process knows nothing
    target, draft = simulated_endpoints(profile=SERVERS[server], latency="lan", seed=seed)
    sdk = target.build_client()
    results = []
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        for i in range(count):
            request = scenario.requests[i % len(scenario.requests)]
            if i % 2 == 0:
                alone = await stream_target_alone(sdk, target, request, scenario)
                wall, text, stats = await _speculative(client, request.prompt or "", scenario.max_tokens)
            else:
                wall, text, stats = await _speculative(client, request.prompt or "", scenario.max_tokens)
                alone = await stream_target_alone(sdk, target, request, scenario)
            note = f"{stats.num_rounds} rounds" if stats.speculated else f"target alone ({stats.fallback_reason})"  # type: ignore[attr-defined]
            results.append((alone.wall_s, wall, text == alone.text, note))
    await sdk.close()
    return results


async def _warm_up() -> None:
    """Load the simulator's models and the SDK's modules (the first request of a process pays for them)."""
    scenario = get_scenario("lan-adaptive")
    target, _ = simulated_endpoints(profile="vllm", latency="instant")
    sdk = target.build_client()
    await stream_target_alone(sdk, target, scenario.requests[0], scenario)
    await sdk.close()


async def _main(args: argparse.Namespace) -> int:
    await _warm_up()
    ok = True
    for server in [args.server] if args.server else list(SERVERS):
        ok &= await _server(server, args)
    return 0 if ok else 1


async def _server(server: str, args: argparse.Namespace) -> bool:
    trials = [await _trial(server, seed, args.requests) for seed in range(args.trials)]
    ok = True
    print(f"server {server}: fresh default client, LAN profile, greedy, 60 tokens; {args.trials} trials (median, then min..max)")
    for i in range(args.requests):
        speedups = [t[i][0] / t[i][1] for t in trials]
        alone = statistics.median(t[i][0] for t in trials)
        spec = statistics.median(t[i][1] for t in trials)
        same = all(t[i][2] for t in trials)
        median = statistics.median(speedups)
        ok &= same and median >= args.min_speedup
        notes = sorted({t[i][3] for t in trials})
        print(
            f"request {i + 1}: target alone {alone:.3f} s, speculative {spec:.3f} s -> {median:.2f}x "
            f"({min(speedups):.2f}..{max(speedups):.2f}x); outputs identical: {same}; {'; '.join(notes)[:160]}"
        )
    print("PASS" if ok else "FAIL", f"(each request's median at least {args.min_speedup}x)")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3)
    parser.add_argument("--min-speedup", type=float, default=1.6)
    parser.add_argument("--server", choices=sorted(SERVERS), default=None, help="one server only (default: both)")
    return asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
