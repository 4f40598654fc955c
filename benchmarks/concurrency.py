"""Concurrency on one client: N speculative requests at once should take no more than 2x the time of one.

Runs on the simulator, on a latency-bound profile (``hosted`` latencies by default: ~0.4 s per call, so
that latency, not this machine's CPU, bounds the run; ``--latency lan`` shows the CPU-bound case), with one
``AsyncSpeculativeOpenAI`` shared by every request. By default the simulator is served in-process (no
sockets); its own CPU work (scoring every echoed token of every request) then shares the client's
single thread. ``--server`` runs it as separate processes instead (``specapi simulate`` on 127.0.0.1, free
ports), as real servers would be: one for the target's calls and one for the draft's (a deployment's target
and draft run on their own servers; ``--one-server`` sends both to one process), with the client's own HTTP
transport. The simulator's CPU (it computes every position of every call in Python, on top of the
latency it simulates) is then not the client's; on a 2-CPU machine it still competes for the CPUs.
Measures, after a warm-up request:

* the wall time of one request alone (the mean over the prompts, one after another);
* the wall time of N requests started together (prompts cycling), and their latency percentiles;
* every output against the target alone's greedy output (asked of the simulator through the SDK).

    python benchmarks/concurrency.py                       # 16 requests, hosted latency, fixed 5 tokens per round
    python benchmarks/concurrency.py --requests 32 --policy adaptive --drafter auto
    python benchmarks/concurrency.py --server               # target and draft simulators as separate HTTP processes
    python benchmarks/concurrency.py --server --latency lan --policy adaptive --drafter model   # issue 13's 16-request check

Bounded: --timeout seconds overall (default 120). Exit code 1 if the ratio exceeds --max-ratio (2.0),
an output differs from the target's, or a request fails.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx2

from specapi import AsyncSpeculativeOpenAI, Endpoint
from specapi.sim import simulated_endpoints

PROMPTS = [
    '    def __init__(self,\n                 width=70,\n                 initial_indent="",',
    'def fnmatch(name, pat):\n    """Test whether FILENAME matches PATTERN.',
    'def glob(pathname, *, root_dir=None, dir_fd=None, recursive=False,\n        include_hidden=False):\n    """Return a list of paths matching a pathname pattern.',
    'def abstractmethod(funcobj):\n    """A decorator indicating abstract methods.',
]
MORE_PROMPTS = [  # with --distinct: 16 different prompts, so no request repeats another's work
    'def capwords(s, sep=None):\n    """capwords(s [,sep]) -> string',
    'def split(s, comments=False, posix=True):\n    """Split the string *s* using shell-like syntax."""',
    'def insort_right(a, x, lo=0, hi=None, *, key=None):\n    """Insert item x in list a, and keep it sorted',
    '    def put(self, item, block=True, timeout=None):\n        \'\'\'Put an item into the queue.',
    '    def enter(self, delay, priority, action, argument=(), kwargs=_sentinel):\n        """A variant that specifies the time as a relative time.',
    'def contextmanager(func):\n    """@contextmanager decorator.',
    'def wraps(wrapped,\n          assigned = WRAPPER_ASSIGNMENTS,\n          updated = WRAPPER_UPDATES):\n    """Decorator factory to apply update_wrapper() to a wrapper function',
    'def py_encode_basestring_ascii(s):\n    """Return an ASCII-only JSON representation of a Python string',
    'class DictReader:\n    def __init__(self, f, fieldnames=None, restkey=None, restval=None,\n                 dialect="excel", *args, **kwds):',
    'def getopt(args, shortopts, longopts = []):\n    """getopt(args, options[, long_options]) -> opts, args',
    'def dedent(text):\n    """Remove any common leading whitespace from every line in `text`.',
    'def escape(pathname):\n    """Escape all special characters.',
]


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=16, help="requests started together (default 16)")
    parser.add_argument("--latency", default="hosted", choices=["lan", "hosted", "instant"])
    parser.add_argument("--profile", default="vllm", choices=["vllm", "openai", "llamacpp"])
    parser.add_argument("--max-tokens", type=int, default=60)
    parser.add_argument("--policy", default="fixed", choices=["fixed", "adaptive"])
    parser.add_argument("--drafter", default="model", choices=["model", "auto", "lookup"])
    parser.add_argument("--num-speculative-tokens", type=int, default=5)
    parser.add_argument("--max-ratio", type=float, default=2.0)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--server", action="store_true", help="run the simulator as separate HTTP processes (specapi simulate), one per role")
    parser.add_argument("--one-server", action="store_true", help="with --server: one simulator process for both roles")
    parser.add_argument(
        "--distinct", action="store_true",
        help="16 different prompts (not 4 cycling), and the requests together run before the ones alone, so the "
        "simulator has computed none of their positions before (it keeps the distributions it computed)",
    )
    return parser.parse_args()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_SIMULATOR_PIDS: list[int] = []


def _cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (Linux's /proc; None elsewhere)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _simulators_cpu_s() -> float | None:
    values = [_cpu_s(pid) for pid in _SIMULATOR_PIDS]
    return None if not values or None in values else sum(values)  # type: ignore[arg-type]


@contextlib.contextmanager
def _simulator_process(args: argparse.Namespace) -> Iterator[str]:
    """`specapi simulate` on a free loopback port; yields its base URL and stops it afterwards."""
    port = _free_port()
    command = [sys.executable, "-c", "from specapi.cli import cli; cli()", "simulate", "--port", str(port)]
    command += ["--profile", args.profile, "--latency", args.latency, "--log-level", "warning"]
    log = tempfile.TemporaryFile(mode="w+")
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=log)
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx2.get(f"{base_url}/models", timeout=1.0)
                break
            except httpx2.HTTPError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the simulator did not start") from None
                time.sleep(0.1)
        _SIMULATOR_PIDS.append(process.pid)
        yield base_url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.seek(0)
        text = log.read()
        log.close()
        count = text.count("Exception in ASGI application")
        if count:
            skip = ("Traceback", "ERROR", "During handling", "The above", "Exception in ASGI", "INFO", "WARNING")
            kinds = sorted({line.strip() for line in text.splitlines() if line and not line[0].isspace() and not line.startswith(skip)})
            print(f"note: the simulator server logged {count} exception(s) in its ASGI app: {', '.join(kinds[:3])}")


def _endpoints(args: argparse.Namespace, base_url: str | None, draft_url: str | None = None) -> tuple[Endpoint, Endpoint]:
    if base_url is None:
        return simulated_endpoints(profile=args.profile, latency=args.latency)
    # No http_client: the client's own lean transport (aiohttp), as a user gets it. (An injected
    # httpx2 client carries the calls through httpx2/httpcore2, about 3x the client CPU per call.)
    return tuple(  # type: ignore[return-value]
        Endpoint(model=m, base_url=url, api_key="sim", timeout=60.0, max_logprobs=20)
        for m, url in (("sim-target", base_url), ("sim-draft", draft_url or base_url))
    )


async def _one(client: AsyncSpeculativeOpenAI, prompt: str, max_tokens: int) -> tuple[float, str, object]:
    started = time.perf_counter()
    response = await client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=0)
    return time.perf_counter() - started, response.choices[0].text, response.speculative


async def _main(args: argparse.Namespace, base_url: str | None, draft_url: str | None = None) -> int:
    target, draft = _endpoints(args, base_url, draft_url)
    client = AsyncSpeculativeOpenAI(
        target=target, draft=draft, policy=args.policy, drafter=args.drafter, num_speculative_tokens=args.num_speculative_tokens
    )
    sdk = target.build_client()
    pool = PROMPTS + MORE_PROMPTS if args.distinct else PROMPTS
    prompts = [pool[i % len(pool)] for i in range(args.requests)]
    alone = sorted(set(prompts), key=pool.index)
    try:
        references = {}
        for prompt in alone:  # the target's own greedy output, one call each
            response = await sdk.completions.create(model=target.model, prompt=prompt, max_tokens=args.max_tokens, temperature=0)
            references[prompt] = response.choices[0].text
        warm_up = 'def getdoc(object):\n    """Get the documentation string for an object.' if args.distinct else PROMPTS[0]
        await _one(client, warm_up, args.max_tokens)  # warm-up: probe, connections, policy

        async def together() -> tuple[float, float, float | None, list]:
            started, cpu, simulators = time.perf_counter(), time.process_time(), _simulators_cpu_s()
            results = await asyncio.gather(*(_one(client, p, args.max_tokens) for p in prompts), return_exceptions=True)
            after = _simulators_cpu_s()
            simulators_s = None if simulators is None or after is None else after - simulators
            return time.perf_counter() - started, time.process_time() - cpu, simulators_s, results

        if args.distinct:
            together_s, together_cpu_s, simulators_cpu_s, results = await together()
        single = [await _one(client, prompt, args.max_tokens) for prompt in alone]
        one_s = statistics.fmean(wall for wall, _, _ in single)
        if not args.distinct:
            together_s, together_cpu_s, simulators_cpu_s, results = await together()
    finally:
        await client.close()
        await sdk.close()
        for endpoint in (target, draft):
            if endpoint.http_client is not None:
                await endpoint.http_client.aclose()

    failures = [r for r in results if isinstance(r, BaseException)]
    ok = [(p, r) for p, r in zip(prompts, results) if not isinstance(r, BaseException)]
    mismatches = [i for i, (p, (_, text, _)) in enumerate(ok) if text != references[p]]
    single_mismatches = [i for i, (p, (_, text, _)) in enumerate(zip(alone, single)) if text != references[p]]
    latencies = sorted(wall for _, (wall, _, _) in ok)
    rounds = [stats.num_rounds for _, (_, _, stats) in ok]  # type: ignore[attr-defined]
    ratio = together_s / one_s
    where = "in-process" if base_url is None else f"separate process at {base_url}" + (f", draft at {draft_url}" if draft_url else "")
    print(f"simulator {where}; profile {args.profile}, latency {args.latency}, policy {args.policy}, drafter {args.drafter}, K {args.num_speculative_tokens}, {args.max_tokens} tokens")
    print(f"one request alone:       {one_s:.3f} s (mean of {len(alone)}, one after another" + (", after the requests together)" if args.distinct else ")"))
    print(f"{args.requests} requests together:   {together_s:.3f} s wall  -> ratio {ratio:.2f}x (limit {args.max_ratio:.1f}x)")
    whose = "client and simulator" if base_url is None else "client only"
    print(f"CPU of this process:     {together_cpu_s:.3f} s during the {args.requests} ({whose})")
    if simulators_cpu_s is not None:
        print(f"CPU of the simulators:   {simulators_cpu_s:.3f} s during the {args.requests} (their processes, on the same 2 CPUs)")
    if latencies:
        p50 = latencies[len(latencies) // 2]
        p95 = latencies[min(len(latencies) - 1, int(0.95 * len(latencies)))]
        print(f"per-request latency:     p50 {p50:.3f} s, p95 {p95:.3f} s, max {latencies[-1]:.3f} s; rounds per request {statistics.fmean(rounds):.1f}")
    reasons: dict[str, int] = {}
    for _, (_, _, stats) in ok:
        key = getattr(stats, "load_reason", None) or "none"
        reasons[key] = reasons.get(key, 0) + 1
    speculated = sum(1 for _, (_, _, stats) in ok if stats.speculated)  # type: ignore[attr-defined]
    print(f"speculated: {speculated}/{len(ok)}; load_reason: " + ", ".join(f"{n} x {r!r}" for r, n in sorted(reasons.items())))
    print(f"outputs identical to the target alone's: {len(ok) - len(mismatches)}/{len(ok)} together, {len(single) - len(single_mismatches)}/{len(single)} alone")
    print(f"failed requests: {len(failures)}" + (f" (first: {failures[0]!r})" if failures else ""))
    passed = ratio <= args.max_ratio and not mismatches and not single_mismatches and not failures
    print("PASS" if passed else "FAIL")
    return 0 if passed else 1


def main() -> int:
    args = _arguments()
    try:
        if not args.server:
            return asyncio.run(asyncio.wait_for(_main(args, None), timeout=args.timeout))
        with _simulator_process(args) as base_url, contextlib.ExitStack() as stack:
            draft_url = None if args.one_server else stack.enter_context(_simulator_process(args))
            return asyncio.run(asyncio.wait_for(_main(args, base_url, draft_url), timeout=args.timeout))
    except asyncio.TimeoutError:
        print(f"FAIL: did not finish within {args.timeout:.0f} s")
        return 1


if __name__ == "__main__":
    sys.exit(main())
