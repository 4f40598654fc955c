"""Load test of `specapi serve`: N concurrent streaming requests through the proxy, all on loopback.

Starts the simulated provider (`specapi.sim`, target "sim-target" and draft "sim-draft", with a latency
profile) and the proxy (`specapi serve`, the real CLI) as two subprocesses on 127.0.0.1, then fires the
requests with the official openai SDK (or, with `--client raw`, aiohttp) and checks every output against the target's own greedy output
(asked of the simulator directly, once per prompt). Prints wall time, latency and time-to-first-token
percentiles, errors, mismatches, text chunks per response, the CPU seconds each process spent (the load
generator's own too: at 100 streams it can be what bounds the target alone), and the same load sent to the
target alone for comparison. Through the proxy, requests are also counted by what the policy (or anything
else) changed for them, with their latency (p50 and max): in one wave the slowest request sets the wall time.

    python benchmarks/proxy_load.py                  # 100 concurrent streams, "lan" latency, serve's default policy
    python benchmarks/proxy_load.py --concurrency 1,16,100             # each level, then the same load on the target alone
    python benchmarks/proxy_load.py --concurrency 100 --workers 2      # specapi serve --workers 2
    python benchmarks/proxy_load.py --requests 200 --concurrency 50 --latency hosted --max-tokens 96
    python benchmarks/proxy_load.py --relay-baseline                   # also through a proxy that does nothing
    python benchmarks/proxy_load.py --repeat 5                         # five cold runs, fresh processes each: every ratio, the median
    python benchmarks/proxy_load.py --client raw                       # a lean load generator instead of the openai SDK

With `--relay-baseline`, each level also runs through `byte_relay.py`, a proxy that forwards bytes and
does nothing else (in as many processes as `--workers`), on the same stack: the floor any proxy on the same CPUs sets (the proxy, the simulator
and the load generator share them), against which the speculative proxy's figure can also be read.

With `--client raw` the load generator reads the streams with aiohttp and orjson instead of the openai
SDK: a sixth of the SDK's CPU here, so that the target alone's arm is not bound by the load generator
(with the SDK, at 100 streams it spends about one CPU-second per second: one of the two cores). It shows
the proxy's own cost; the SDK default also checks that the SDK reads the proxy's streams.

With several levels, one proxy serves them all (as a long-running one would) and each level's summary ends
with the throughput ratio, proxy / target alone. Without --requests, a level of c streams sends
c * ceil(20 / c) requests (1: 20, 16: 32, 100: 100).

Bounded: at most --requests requests, --timeout seconds overall; loopback only. Exit code 1 if any request
failed or differed from the target's output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import httpx2
import openai
import orjson
import specapi

PROXY_KEY = "sk-bench-proxy"
UPSTREAM_KEY = "sk-bench-upstream"

PROMPTS = [
    "def __init__(self, *args, **kwargs):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Counter(dict):\n    '''Dict subclass for counting hashable items.\n",
    "    def __repr__(self):\n        return",
    "for i in range(len(items)):\n",
    "The with statement is used to wrap the execution of a block",
    "An object is hashable if it has a hash value which never changes",
    "Exceptions can be raised with the raise statement",
    "    if not isinstance(other, ",
    "try:\n    import _thread\nexcept ImportError:\n",
]


@dataclass
class Outcome:
    ok: bool
    latency_s: float
    ttft_s: float | None = None
    tokens: int = 0
    error: str | None = None
    exact: bool = True
    speculative: dict = field(default_factory=dict)
    chunks: int = 0  # chunks with text, as the client read them


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_healthy(url: str, process: subprocess.Popen, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{url} exited with {process.returncode}")
        with contextlib.suppress(httpx2.TransportError):
            if httpx2.get(url, timeout=2).status_code < 500:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def _wait_started(started: Callable[[], int], workers: int, process: subprocess.Popen, name: str, timeout: float = 60.0) -> None:
    """Until `started()` counts every worker of `process` as done with its startup: `/ready` is answered by
    whichever worker takes the connection, and a burst sent before the others are up would be shared
    with their startup."""
    deadline = time.monotonic() + timeout
    while started() < workers:
        if process.poll() is not None:
            raise RuntimeError(f"the {name} exited with {process.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{workers} {name} workers did not come up")
        time.sleep(0.1)


def _proxy_workers(url: str) -> int:
    """How many of the proxy's workers are done starting (`specapi_workers` in `/metrics`)."""
    with contextlib.suppress(httpx2.TransportError):
        for line in httpx2.get(url + "/metrics", timeout=2).text.splitlines():
            if line.startswith("specapi_workers "):
                return int(float(line.split()[1]))
    return 0


#: Where the `specapi` this process imported lives. The servers start in it: `python -c` puts its working
#: directory first on `sys.path`, so started from a checkout they ran that checkout's code, even where
#: `PYTHONPATH` named another (a worktree under test) for the load generator.
_SPECAPI_HOME = os.path.dirname(os.path.dirname(os.path.abspath(specapi.__file__)))


@contextlib.contextmanager
def _process(args: list[str], env: dict[str, str], health_url: str, name: str) -> Iterator[subprocess.Popen]:
    """A server subprocess, logging to a temporary file (a pipe nobody reads would fill up and block it),
    running the same `specapi` as this process."""
    with tempfile.TemporaryFile("w+") as log:
        process = subprocess.Popen(args, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True, cwd=_SPECAPI_HOME)
        try:
            _wait_healthy(health_url, process)
            yield process
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.seek(0)
            lines = log.read().splitlines()
            problems = [line for line in lines if "Error" in line or "error" in line or "Exception" in line]
            if problems:
                print(f"  {name} log: {len(lines)} lines, {len(problems)} mentioning errors; last: {problems[-1][:160]}")


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_tree(pid: int) -> list[int]:
    """`pid` and its descendants (uvicorn's workers under `serve --workers N`); Linux only."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat(int(entry))) is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def _cpu_seconds(process: subprocess.Popen) -> float | None:
    """CPU time (user + system) a child process and its own children have used so far (Linux; None elsewhere)."""
    total = 0.0
    try:
        for pid in process_tree(process.pid):
            fields = _stat(pid)
            if fields is not None:
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    return total


def rss_mb(process: subprocess.Popen) -> float | None:
    """Resident memory of a child process and its descendants, in MB (Linux; None elsewhere)."""
    total = 0
    try:
        for pid in process_tree(process.pid):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
                total += next((int(line.split()[1]) for line in status if line.startswith("VmRSS:")), 0)
    except (OSError, ValueError):
        return None
    return total / 1024


def _requests(args: argparse.Namespace) -> list[tuple[str, str]]:
    kinds = ["completions", "chat"] if args.kind == "mixed" else [args.kind]
    return [(kinds[i % len(kinds)], PROMPTS[i % len(PROMPTS)]) for i in range(args.requests)]


async def _measured(chunks: AsyncIterator[tuple[str | None, dict | None]], expected: str | None) -> Outcome:
    """One request, read to its end: `chunks` sends it and yields each chunk's text and `speculative` field."""
    started = time.perf_counter()
    ttft = None
    parts: list[str] = []
    speculative: dict = {}
    count = 0
    try:
        async for piece, extra in chunks:
            if piece:
                ttft = ttft if ttft is not None else time.perf_counter() - started
                parts.append(piece)
                count += 1
            speculative = speculative if extra is None else extra
    except Exception as exc:  # counted and reported, not raised: a load test reports every failure
        return Outcome(ok=False, latency_s=time.perf_counter() - started, error=f"{type(exc).__name__}: {exc}")
    text = "".join(parts)
    return Outcome(
        ok=True, latency_s=time.perf_counter() - started, ttft_s=ttft, tokens=speculative.get("generated_tokens", 0),
        exact=expected is None or text == expected, speculative=speculative, chunks=count,
    )


async def _sdk_chunks(client: openai.AsyncOpenAI, model: str, kind: str, prompt: str,
                      args: argparse.Namespace) -> AsyncIterator[tuple[str | None, dict | None]]:
    if kind == "chat":
        stream = await client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens, temperature=0, stream=True
        )
    else:
        stream = await client.completions.create(model=model, prompt=prompt, max_tokens=args.max_tokens, temperature=0, stream=True)
    async for chunk in stream:
        piece = (chunk.choices[0].delta.content if kind == "chat" else chunk.choices[0].text) if chunk.choices else None
        yield piece, (chunk.model_extra or {}).get("speculative")


async def _raw_chunks(session: aiohttp.ClientSession, base_url: str, api_key: str, model: str, kind: str, prompt: str,
                      args: argparse.Namespace) -> AsyncIterator[tuple[str | None, dict | None]]:
    """The same request without the SDK: its SSE lines read with aiohttp and parsed with orjson."""
    body: dict = {"model": model, "max_tokens": args.max_tokens, "temperature": 0, "stream": True}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    headers = {"authorization": f"Bearer {api_key}", "content-type": "application/json"}
    async with session.post(f"{base_url}/{'chat/completions' if kind == 'chat' else 'completions'}",
                            data=orjson.dumps(body), headers=headers) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {(await response.text())[:200]}")
        async for line in response.content:
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                continue  # read on to the end of the body, so that the connection goes back to the pool
            chunk = orjson.loads(data)
            if "error" in chunk:
                raise RuntimeError(f"error event: {chunk['error']}")
            choices = chunk.get("choices") or []
            piece = ((choices[0].get("delta") or {}).get("content") if kind == "chat" else choices[0].get("text")) if choices else None
            yield piece, chunk.get("speculative")


async def _load(base_url: str, api_key: str, model: str, work: list[tuple[str, str]], args: argparse.Namespace,
                expected: dict[tuple[str, str], str] | None) -> tuple[float, list[Outcome]]:
    gate = asyncio.Semaphore(args.concurrency)
    async with contextlib.AsyncExitStack() as stack:
        if args.client == "raw":
            session = await stack.enter_async_context(aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=args.concurrency + 10), timeout=aiohttp.ClientTimeout(total=args.timeout)))

            def one(kind: str, prompt: str, want: str | None) -> Awaitable[Outcome]:
                return _measured(_raw_chunks(session, base_url, api_key, model, kind, prompt, args), want)
        else:
            limits = httpx2.Limits(max_connections=args.concurrency + 10, max_keepalive_connections=args.concurrency + 10)
            http = await stack.enter_async_context(httpx2.AsyncClient(limits=limits, timeout=args.timeout))
            client = await stack.enter_async_context(openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, http_client=http))

            def one(kind: str, prompt: str, want: str | None) -> Awaitable[Outcome]:
                return _measured(_sdk_chunks(client, model, kind, prompt, args), want)

        async def run(kind: str, prompt: str) -> Outcome:
            async with gate:
                return await one(kind, prompt, expected.get((kind, prompt)) if expected else None)

        started = time.perf_counter()
        tasks = [asyncio.ensure_future(run(k, p)) for k, p in work]
        _, pending = await asyncio.wait(tasks, timeout=args.timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - started
        timed_out = Outcome(ok=False, latency_s=wall, error=f"not finished within --timeout {args.timeout:g} s")
        return wall, [timed_out if t in pending else t.result() for t in tasks]


async def _references(base_url: str, work: list[tuple[str, str]], args: argparse.Namespace) -> dict[tuple[str, str], str]:
    """The target's own greedy output for each distinct request, asked of the simulator directly."""
    expected: dict[tuple[str, str], str] = {}
    async with openai.AsyncOpenAI(base_url=base_url, api_key=UPSTREAM_KEY, max_retries=0) as sim:
        for kind, prompt in sorted(set(work)):
            if kind == "chat":
                r = await sim.chat.completions.create(model="sim-target", messages=[{"role": "user", "content": prompt}], max_tokens=args.max_tokens, temperature=0)
                expected[(kind, prompt)] = r.choices[0].message.content or ""
            else:
                r = await sim.completions.create(model="sim-target", prompt=prompt, max_tokens=args.max_tokens, temperature=0)
                expected[(kind, prompt)] = r.choices[0].text
    return expected


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def _report(title: str, wall: float, outcomes: list[Outcome]) -> dict:
    ok = [o for o in outcomes if o.ok]
    latencies = [o.latency_s for o in ok]
    ttfts = [o.ttft_s for o in ok if o.ttft_s is not None]
    tokens = sum(o.tokens for o in ok)
    summary = {
        "requests": len(outcomes),
        "errors": len(outcomes) - len(ok),
        "mismatches": sum(not o.exact for o in ok),
        "wall_s": round(wall, 3),
        "requests_per_s": round(len(ok) / wall, 2) if wall else None,
        "latency_p50_s": round(_pct(latencies, 0.50), 3),
        "latency_p95_s": round(_pct(latencies, 0.95), 3),
        "latency_max_s": round(max(latencies), 3) if latencies else None,
        "ttft_p50_s": round(_pct(ttfts, 0.50), 3),
        "ttft_p95_s": round(_pct(ttfts, 0.95), 3),
        "text_chunks_per_response": round(statistics.mean(o.chunks for o in ok), 1) if ok else None,
    }
    with_stats = [o for o in ok if o.speculative]
    spec = [o.speculative for o in with_stats]
    if spec:
        drafted = sum(s.get("drafted_tokens", 0) for s in spec)
        accepted = sum(s.get("accepted_tokens", 0) for s in spec)
        summary["generated_tokens"] = tokens
        summary["speculated_requests"] = sum(bool(s.get("speculated")) for s in spec)
        summary["acceptance_rate"] = round(accepted / drafted, 3) if drafted else 0.0
        summary["target_requests_per_response"] = round(statistics.mean(s["target"]["requests"] for s in spec), 2)
        by_reason: dict[str, list[float]] = {}
        for o in with_stats:
            key = (o.speculative.get("load_reason") or o.speculative.get("fallback_reason") or "-")[:60]
            by_reason.setdefault(key, []).append(o.latency_s)
        summary["reasons"] = {key: len(values) for key, values in by_reason.items()}  # what the load (else anything) changed, per request
        # In one wave the slowest request sets the wall time: which requests were the slow ones.
        summary["latency_p50_max_s_by_reason"] = {
            key: [round(_pct(values, 0.50), 3), round(max(values), 3)] for key, values in by_reason.items()
        }
    print(f"\n== {title}")
    width = max(map(len, summary))
    for key, value in summary.items():
        print(f"  {key:<{width}}  {value}")
    for o in [o for o in outcomes if not o.ok][:5]:
        print(f"  error: {o.error}")
    return summary


def _arm(title: str, base_url: str, api_key: str, work: list[tuple[str, str]], args: argparse.Namespace,
         expected: dict[tuple[str, str], str], processes: dict[str, subprocess.Popen]) -> dict:
    """One load run against `base_url`, reported, with the CPU seconds each of `processes` spent on it."""
    # This process reads every stream: a full pass of its garbage collector during a burst (passes of 41-43 ms
    # were logged in it, over what earlier arms left) delays whichever arm it falls in. Collected now, and
    # what is left frozen, so that every arm starts with the same nearly empty heap.
    gc.collect()
    gc.freeze()
    before = {name: _cpu_seconds(process) for name, process in processes.items()}
    own = time.process_time()
    wall, outcomes = asyncio.run(_load(base_url + "/v1", api_key, "sim-target", work, args, expected))
    own = time.process_time() - own
    summary = _report(title, wall, outcomes)
    after = {name: _cpu_seconds(process) for name, process in processes.items()}
    spent = {name: round(after[name] - before[name], 2) for name in processes if before[name] is not None and after[name] is not None}
    spent["load generator"] = round(own, 2)  # this process: the openai SDK (or --client raw) reading every stream
    summary.update({f"cpu_s_{name.replace(' ', '_')}": value for name, value in spent.items()})
    print("  CPU seconds during the run: " + ", ".join(f"{name} {value}" for name, value in spent.items()))
    return summary


def _compare(summary: dict, key: str, level: int, label: str, direct: dict, arm: dict | None = None) -> None:
    """`arm`'s throughput (the proxy's, `summary`, by default) over the target alone's, kept in `summary[key]`."""
    arm = summary if arm is None else arm
    if arm["requests_per_s"] and direct["requests_per_s"]:
        summary[key] = round(arm["requests_per_s"] / direct["requests_per_s"], 3)
        print(f"  => {level} concurrent: {label} {arm['requests_per_s']} req/s, target alone {direct['requests_per_s']} req/s: "
              f"{summary[key]:.3f}x the target alone's throughput")


def _levels(text: str) -> list[int]:
    levels = [int(part) for part in text.split(",") if part.strip()]
    if not levels or not all(1 <= level <= 1_000 for level in levels):
        raise argparse.ArgumentTypeError("concurrency levels must be integers in 1..1000, e.g. 1,16,100")
    return levels


def server_commands(args: argparse.Namespace, sim_port: int, proxy_port: int) -> tuple[list[str], dict[str, str], list[str], dict[str, str]]:
    """The simulator's and the proxy's command lines and environments (`specapi serve`, the real CLI)."""
    sim_url = f"http://127.0.0.1:{sim_port}"
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    sim_cmd = [sys.executable, "-c",
               f"from specapi.sim import run_server; run_server(host='127.0.0.1', port={sim_port}, latency={args.latency!r}, log_level='warning')"]
    proxy_env = {
        **env,
        "SPECAPI_TARGET_BASE_URL": sim_url + "/v1", "SPECAPI_TARGET_MODEL": "sim-target", "SPECAPI_TARGET_API_KEY": UPSTREAM_KEY,
        "SPECAPI_DRAFT_BASE_URL": sim_url + "/v1", "SPECAPI_DRAFT_MODEL": "sim-draft", "SPECAPI_DRAFT_API_KEY": UPSTREAM_KEY,
        "SPECAPI_API_KEY": PROXY_KEY, "SPECAPI_HOST": "127.0.0.1", "SPECAPI_PORT": str(proxy_port),
        "SPECAPI_NUM_SPECULATIVE_TOKENS": str(args.num_speculative_tokens), "SPECAPI_POLICY": args.policy, "SPECAPI_DRAFTER": args.drafter,
        "SPECAPI_LOG_LEVEL": "warning", "SPECAPI_WORKERS": str(args.workers),
    }
    proxy_cmd = [sys.executable, "-c", "from specapi.cli import cli; cli()", "serve"]
    return sim_cmd, env, proxy_cmd, proxy_env


def build_parser() -> argparse.ArgumentParser:
    """The command line (`proxy_waves.py` builds its runs with it too)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=None, help="requests per level (default: c * ceil(20 / c))")
    parser.add_argument("--concurrency", type=_levels, default=[100], help="concurrent streams, or several levels: 1,16,100")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--kind", choices=["completions", "chat", "mixed"], default="mixed")
    parser.add_argument("--latency", default="lan", help="simulator latency profile: lan, hosted, instant")
    parser.add_argument("--policy", default="adaptive", help="the proxy's draft-length policy: adaptive (serve's default) or fixed (speculate every round)")
    parser.add_argument("--drafter", default="auto", help="the proxy's drafter: auto (suffix index, prompt lookup or the draft model, per round), model, lookup, suffix")
    parser.add_argument("--num-speculative-tokens", type=int, default=4)
    parser.add_argument("--workers", type=int, default=1, help="proxy processes (specapi serve --workers N)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds for each whole load run")
    parser.add_argument("--no-direct", action="store_true", help="skip the target-alone comparison runs")
    parser.add_argument("--relay-baseline", action="store_true", help="also run each level through a proxy that only forwards bytes (byte_relay.py)")
    parser.add_argument("--client", choices=["openai", "raw"], default="openai",
                        help="the load generator: the openai SDK (default; it also checks that the SDK reads the proxy's streams), or "
                             "raw: aiohttp and orjson, a sixth of the SDK's CPU here, so that it does not bound the target alone")
    parser.add_argument("--json", action="store_true", help="also print the summaries as JSON")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run everything this many times, each with fresh processes (a cold proxy), and end with every ratio and their median")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.requests is not None and not 1 <= args.requests <= 10_000:
        parser.error("--requests must be in 1..10000")
    if not 1 <= args.workers <= 16:
        parser.error("--workers must be in 1..16")
    if args.relay_baseline and args.no_direct:
        parser.error("--relay-baseline is compared with the target alone: drop --no-direct")
    if not 1 <= args.repeat <= 20:
        parser.error("--repeat must be in 1..20")
    runs = []
    failed = False
    for repeat in range(args.repeat):
        if args.repeat > 1:
            print(f"\n######## run {repeat + 1} of {args.repeat}")
        summaries, run_failed = _run(args)
        runs.append(summaries)
        failed = failed or run_failed
    if args.repeat > 1 and not args.no_direct:
        print(f"\n== throughput, proxy / target alone, in each of {args.repeat} runs (fresh processes each)")
        for level in args.concurrency:
            ratios = [run[f"proxy@{level}"].get("throughput_vs_target_alone") for run in runs]
            ratios = [r for r in ratios if r is not None]
            relay = [run[f"proxy@{level}"].get("relay_vs_target_alone") for run in runs]
            relay = [r for r in relay if r is not None]
            floor = f"; byte relay {', '.join(f'{r:.3f}x' for r in relay)}" if relay else ""
            median = f"median {statistics.median(ratios):.3f}x: " if ratios else ""
            print(f"  {level:>4} concurrent: {median}{', '.join(f'{r:.3f}x' for r in ratios)}{floor}")
    if args.json:
        print(json.dumps(runs[0] if args.repeat == 1 else runs, indent=2))
    return 1 if failed else 0


def _run(args: argparse.Namespace) -> tuple[dict[str, dict], bool]:
    """One whole run: fresh simulator, proxy (and byte relay), every level; the summaries and whether any
    request failed or differed from the target's output."""
    sim_port, proxy_port = _free_port(), _free_port()
    sim_url, proxy_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{proxy_port}"
    sim_cmd, env, proxy_cmd, proxy_env = server_commands(args, sim_port, proxy_port)
    print(f"streaming requests ({args.kind}), concurrency {','.join(map(str, args.concurrency))}, max_tokens {args.max_tokens}, "
          f"simulator latency '{args.latency}', policy {args.policy}, drafter {args.drafter}, k={args.num_speculative_tokens}, "
          f"proxy workers {args.workers}; {os.cpu_count()} CPUs, all on 127.0.0.1")

    summaries: dict[str, dict] = {}
    failed = False
    relay_port = _free_port()
    relay_url = f"http://127.0.0.1:{relay_port}"
    relay_started = tempfile.mkdtemp()  # each relay worker writes a file here once it serves
    relay_cmd = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "byte_relay.py"),
                 "--upstream", sim_url + "/v1", "--port", str(relay_port), "--api-key", UPSTREAM_KEY,
                 "--workers", str(args.workers), "--started-dir", relay_started]
    with contextlib.ExitStack() as cleanup, \
            _process(sim_cmd, env, sim_url + "/v1/models", "simulator") as sim, \
            _process(proxy_cmd, proxy_env, proxy_url + "/ready", "proxy") as proxy, \
            (_process(relay_cmd, env, relay_url + "/ready", "byte relay") if args.relay_baseline else contextlib.nullcontext()) as relay:
        cleanup.callback(shutil.rmtree, relay_started, ignore_errors=True)
        _wait_started(lambda: _proxy_workers(proxy_url), args.workers, proxy, "proxy")
        if relay is not None:
            _wait_started(lambda: len(os.listdir(relay_started)), args.workers, relay, "byte relay")
        for level in args.concurrency:
            level_args = argparse.Namespace(**{**vars(args), "concurrency": level})
            level_args.requests = args.requests or level * -(-20 // level)
            work = _requests(level_args)
            expected = asyncio.run(_references(sim_url + "/v1", work, level_args))
            # A few requests first, as a long-running proxy would have served (the capability probe is done at startup).
            warm_up = argparse.Namespace(**{**vars(level_args), "concurrency": 2 * args.workers})
            asyncio.run(_load(proxy_url + "/v1", PROXY_KEY, "sim-target", work[: 4 * args.workers], warm_up, expected))
            title = f"{level} concurrent, {level_args.requests} requests"
            summary = summaries[f"proxy@{level}"] = _arm(
                f"{title}: through the speculative proxy", proxy_url, PROXY_KEY, work, level_args, expected, {"simulator": sim, "proxy": proxy}
            )
            metrics = httpx2.get(proxy_url + "/metrics").text
            in_flight = [line for line in metrics.splitlines() if line.startswith("specapi_in_flight_requests ")]
            print(f"  proxy metrics after the run: {in_flight[0] if in_flight else '?'}")
            failed = failed or bool(summary["errors"] or summary["mismatches"])
            if args.no_direct:
                continue
            direct = summaries[f"direct@{level}"] = _arm(
                f"{title}: target alone (same load, straight to the simulator)", sim_url, UPSTREAM_KEY, work, level_args, expected, {"simulator": sim}
            )
            _compare(summary, "throughput_vs_target_alone", level, "proxy", direct)
            if relay is not None:
                relayed = summaries[f"relay@{level}"] = _arm(
                    f"{title}: through a proxy that only forwards bytes", relay_url, PROXY_KEY, work, level_args, expected,
                    {"simulator": sim, "byte relay": relay},
                )
                failed = failed or bool(relayed["errors"] or relayed["mismatches"])
                _compare(summary, "relay_vs_target_alone", level, "byte relay", direct, relayed)
    if len(args.concurrency) > 1 and not args.no_direct:
        print("\n== throughput, proxy / target alone")
        for level in args.concurrency:
            summary = summaries[f"proxy@{level}"]
            relayed = summaries.get(f"relay@{level}")
            floor = f"; byte relay {summary.get('relay_vs_target_alone', '?')}x ({relayed['wall_s']} s)" if relayed else ""
            print(f"  {level:>4} concurrent: {summary.get('throughput_vs_target_alone', '?')}x  "
                  f"(proxy {summary['wall_s']} s, target alone {summaries[f'direct@{level}']['wall_s']} s{floor})")
    return summaries, failed


if __name__ == "__main__":
    sys.exit(main())
