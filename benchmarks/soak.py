"""Soak test: many requests through `specapi serve` to `specapi simulate`, resident memory of both sampled.

Starts the simulator and the proxy as subprocesses on 127.0.0.1 (as `proxy_load.py` does), sends
--requests mixed requests (completions and chat, streamed and not; 1,000 distinct prompts, so caches fill
to their bounds) --concurrency at a time, and samples the resident memory (RSS, each process with its
children) of both every --sample-every seconds and at every tenth of the run. Memory is bounded if it is
flat after warm-up: the report gives each process's RSS at the end of warm-up (--warm-up, a fraction of
the requests), its maximum after it, and the growth between the two.

    python benchmarks/soak.py                          # 20,000 requests, 32 at a time, "instant" latency
    python benchmarks/soak.py --requests 2000 --workers 2

Exit code 1 if any request failed or if a process grew after warm-up by more than --max-growth-mb.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time

import httpx2
import openai

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from proxy_load import PROMPTS, PROXY_KEY, _free_port, _process, rss_mb, server_commands  # noqa: E402

VARIANTS = 100  # x 10 prompts = 1,000 distinct requests


def _prompt(i: int) -> str:
    return f"{PROMPTS[i % len(PROMPTS)]}# variant {(i // len(PROMPTS)) % VARIANTS}\n"


async def _one(client: openai.AsyncOpenAI, i: int, max_tokens: int) -> None:
    chat, stream = i % 2 == 1, (i // 2) % 2 == 1
    common = {"model": "sim-target", "max_tokens": max_tokens, "temperature": 0}
    if chat:
        call = client.chat.completions.create(messages=[{"role": "user", "content": _prompt(i)}], stream=stream, **common)
    else:
        call = client.completions.create(prompt=_prompt(i), stream=stream, **common)
    result = await call
    if stream:
        async for _ in result:
            pass


async def _load(url: str, args: argparse.Namespace, progress: list[int], errors: list[str]) -> float:
    limits = httpx2.Limits(max_connections=args.concurrency + 4, max_keepalive_connections=args.concurrency + 4)
    numbers = iter(range(args.requests))
    async with httpx2.AsyncClient(limits=limits, timeout=120) as http, \
            openai.AsyncOpenAI(base_url=url, api_key=PROXY_KEY, max_retries=0, http_client=http) as client:

        async def worker() -> None:
            for i in numbers:
                try:
                    await _one(client, i, args.max_tokens)
                except Exception as exc:  # counted and reported, not raised
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
                progress[0] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(args.concurrency)))
        return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--latency", default="instant", help="simulator latency profile (memory does not depend on it)")
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--drafter", default="auto")
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1, help="proxy processes (specapi serve --workers N)")
    parser.add_argument("--sample-every", type=float, default=5.0, help="seconds between RSS samples")
    parser.add_argument("--warm-up", type=float, default=0.25, help="fraction of the requests counted as warm-up")
    parser.add_argument("--max-growth-mb", type=float, default=20.0, help="growth after warm-up that fails the run")
    parser.add_argument("--json", action="store_true", help="also print the samples as JSON")
    args = parser.parse_args(argv)
    if not 1 <= args.requests <= 1_000_000 or not 1 <= args.concurrency <= 1_000:
        parser.error("--requests must be in 1..1000000 and --concurrency in 1..1000")

    sim_port, proxy_port = _free_port(), _free_port()
    sim_cmd, env, proxy_cmd, proxy_env = server_commands(args, sim_port, proxy_port)
    print(f"soak: {args.requests} mixed requests, {args.concurrency} at a time, max_tokens {args.max_tokens}, latency "
          f"'{args.latency}', policy {args.policy}, proxy workers {args.workers}; {os.cpu_count()} CPUs")
    samples: list[dict] = []
    progress, errors = [0], []
    with _process(sim_cmd, env, f"http://127.0.0.1:{sim_port}/v1/models", "simulator") as sim, \
            _process(proxy_cmd, proxy_env, f"http://127.0.0.1:{proxy_port}/ready", "proxy") as proxy:
        stop = threading.Event()
        started = time.perf_counter()

        def sample() -> None:
            samples.append({"t_s": round(time.perf_counter() - started, 1), "requests": progress[0],
                            "simulator_mb": round(rss_mb(sim) or 0, 1), "proxy_mb": round(rss_mb(proxy) or 0, 1)})

        def sampler() -> None:
            tenth, next_at = max(1, args.requests // 10), time.perf_counter()
            next_count = 0
            while not stop.is_set():
                if time.perf_counter() >= next_at or progress[0] >= next_count:
                    sample()
                    next_at = time.perf_counter() + args.sample_every
                    next_count = (progress[0] // tenth + 1) * tenth
                stop.wait(0.05)

        sample()
        thread = threading.Thread(target=sampler, daemon=True)
        thread.start()
        wall = asyncio.run(_load(f"http://127.0.0.1:{proxy_port}/v1", args, progress, errors))
        stop.set()
        thread.join()
        sample()

    print(f"\n{progress[0]} requests in {wall:.1f} s ({progress[0] / wall:.1f} req/s), {len(errors)} errors")
    for message in errors[:5]:
        print(f"  error: {message}")
    print(f"\n{'t (s)':>8} {'requests':>9} {'simulator MB':>13} {'proxy MB':>9}")
    tenth = max(1, args.requests // 10)
    shown = [s for i, s in enumerate(samples) if i in (0, len(samples) - 1) or s["requests"] % tenth < args.concurrency + 1]
    for s in shown:
        print(f"{s['t_s']:>8} {s['requests']:>9} {s['simulator_mb']:>13} {s['proxy_mb']:>9}")
    warm = args.warm_up * args.requests
    after = [s for s in samples if s["requests"] >= warm]
    before = [s for s in samples if s["requests"] < warm] or samples[:1]
    grown = False
    for name in ("simulator_mb", "proxy_mb"):
        at_warm, peak, last = before[-1][name], max(s[name] for s in after), after[-1][name]
        growth = peak - at_warm
        grown = grown or growth > args.max_growth_mb
        print(f"{name[:-3]}: {at_warm} MB after warm-up ({int(warm)} requests), at most {peak} MB after it, "
              f"{last} MB at the end: growth {growth:+.1f} MB")
    if args.json:
        print(json.dumps(samples))
    return 1 if errors or grown else 0


if __name__ == "__main__":
    sys.exit(main())
