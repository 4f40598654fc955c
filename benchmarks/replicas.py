"""Replicas that learn together: an agentic workload spread round-robin over three `specapi serve`
replicas, with and without `--share` (a real `redis-server`), against one replica that sees all traffic.

Starts the simulated provider (`specapi simulate`, target "sim-target" and draft "sim-draft", "lan"
latency), then for each arm fresh `specapi serve` processes (the real CLI, default drafter and policy,
`--num-speculative-tokens 16`) on 127.0.0.1:

    one       one replica, every request
    apart     three replicas, request i to replica i % 3, each learning alone
    shared    the same three, `--share redis://...` (a fresh redis-server)

Each of `--agents` agents sends `--steps` requests one after the other (its next step after its last
answer; the agents run at once), the coding agent's steps of `specapi bench --scenario agentic`: the same
tool-call JSON and code come back every four steps around observations that change, so a replica that
did not see a task's earlier step has nothing to draft it from. Every answer is checked against the
target's own greedy output (asked of the simulator once per prompt), and the same requests sent to the
simulator straight give the target alone's time. Prints per arm: the requests' summed latency, speedup
(target alone / arm), accepted draft tokens, and the ratios the issue asks about (shared / one,
shared / apart). Exit code 1 if any request failed or differed from the target's output.

    python benchmarks/replicas.py                     # 2 agents x 12 steps
    python benchmarks/replicas.py --agents 3 --steps 16

Bounded and local: loopback only, `--timeout` seconds per request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx2

import specapi
from specapi.bench.scenarios import _agent_step

REPLICAS = 3
_SPECAPI_HOME = os.path.dirname(os.path.dirname(os.path.abspath(specapi.__file__)))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-c", "from specapi.cli import cli; cli()", *args]


@contextlib.contextmanager
def _processes(commands: list[list[str]], ready_urls: list[str], name: str) -> Iterator[None]:
    """Start `commands` together, wait until each answers at its URL with 200, stop them all at the end."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPECAPI_PEERS_DIR", "PROMETHEUS_MULTIPROC_DIR")}
    logs = [tempfile.TemporaryFile("w+") for _ in commands]
    processes = [
        subprocess.Popen(c, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True, cwd=_SPECAPI_HOME) for c, log in zip(commands, logs)
    ]
    try:
        deadline = time.monotonic() + 60
        for process, url in zip(processes, ready_urls):
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"the {name} exited with {process.returncode}")
                with contextlib.suppress(httpx2.TransportError):
                    if httpx2.get(url, timeout=2).status_code == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the {name} did not come up")
                time.sleep(0.05)
        yield
    finally:
        for process in processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process, log in zip(processes, logs):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            log.close()


@contextlib.contextmanager
def _redis() -> Iterator[str]:
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed (Debian: apt-get install -y redis-server)")
    port = _free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError):
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        process.kill()
        process.wait()


def _workload(agents: int, steps: int) -> list[list[str]]:
    """Per agent, its prompts in order (the agentic scenario's steps; each agent its own observations)."""
    plans = []
    for agent in range(agents):
        prompts = []
        for step in range(steps):
            instructions, observation, call = _agent_step(step)
            prompts.append(f"{instructions}\nAgent {agent + 1}. {observation}\nCall: {call}")
        plans.append(prompts)
    return plans


@dataclass
class Arm:
    name: str
    latency_s: float = 0.0
    requests: int = 0
    failed: int = 0
    mismatched: int = 0
    accepted: int = 0
    drafted: int = 0
    errors: list[str] = field(default_factory=list)


async def _run(arm: Arm, urls: list[str], plans: list[list[str]], expected: dict[str, str], args: argparse.Namespace) -> None:
    """Every agent's steps in order, the agents at once; request number n (in sending order) to url n % len(urls)."""
    counter = iter(range(10**9))

    async def agent(http: httpx2.AsyncClient, prompts: list[str]) -> None:
        for prompt in prompts:
            url = urls[next(counter) % len(urls)]
            started = time.perf_counter()
            try:
                response = await http.post(
                    url + "/v1/completions",
                    json={"model": "sim-target", "prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0},
                    timeout=args.timeout,
                )
                response.raise_for_status()
                body = response.json()
            except Exception as exc:  # counted and shown: a benchmark reports failures, it does not stop at one
                arm.failed += 1
                arm.errors.append(f"{type(exc).__name__}: {exc}"[:200])
                continue
            arm.latency_s += time.perf_counter() - started
            arm.requests += 1
            text = body["choices"][0]["text"]
            if prompt in expected and text != expected[prompt]:
                arm.mismatched += 1
            expected.setdefault(prompt, text)
            stats = body.get("speculative") or {}
            arm.accepted += int(stats.get("accepted_tokens") or 0)
            arm.drafted += int(stats.get("drafted_tokens") or 0)

    async with httpx2.AsyncClient(limits=httpx2.Limits(max_connections=64)) as http:
        await asyncio.gather(*(agent(http, prompts) for prompts in plans))


def _serve(target: str, port: int, share: str | None) -> list[str]:
    return _cli(
        "serve", "--target-base-url", target, "--target-model", "sim-target", "--draft-base-url", target, "--draft-model", "sim-draft",
        "--num-speculative-tokens", "16", "--port", str(port), "--log-level", "warning", "--ready-interval", "1",
        *(["--share", share] if share else []),
    )


def _arm(name: str, target: str, replicas: int, share: str | None, plans: list[list[str]], expected: dict[str, str], args: argparse.Namespace) -> Arm:
    ports = [_free_port() for _ in range(replicas)]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    arm = Arm(name)
    with _processes([_serve(target, p, share) for p in ports], [u + "/ready" for u in urls], f"{name} replicas"):
        asyncio.run(_run(arm, urls, plans, expected, args))
    return arm


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=2)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--latency", default="lan", help="the simulator's latency profile")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    args = parser.parse_args(argv)
    plans = _workload(args.agents, args.steps)
    sim_port = _free_port()
    sim = f"http://127.0.0.1:{sim_port}"
    expected: dict[str, str] = {}
    simulate = _cli("simulate", "--port", str(sim_port), "--latency", args.latency, "--profile", "vllm", "--log-level", "warning")
    with _processes([simulate], [sim + "/v1/models"], "simulator"):
        alone = Arm("target alone")
        asyncio.run(_run(alone, [sim], plans, expected, args))  # the simulator straight: the oracle
        arms = [alone, _arm("one", sim + "/v1", 1, None, plans, expected, args), _arm("apart", sim + "/v1", REPLICAS, None, plans, expected, args)]
        with _redis() as url:
            arms.append(_arm("shared", sim + "/v1", REPLICAS, url, plans, expected, args))
    print(f"{args.agents} agents x {args.steps} steps, {args.max_tokens} tokens at most, {args.latency} latency; "
          f"requests round-robin over {REPLICAS} replicas (apart, shared)")
    print(f"{'arm':<14}{'requests':>9}{'failed':>8}{'differ':>8}{'latency s':>11}{'speedup':>9}{'accepted':>10}{'drafted':>9}")
    for arm in arms:
        speedup = alone.latency_s / arm.latency_s if arm.latency_s else float("nan")
        print(f"{arm.name:<14}{arm.requests:>9}{arm.failed:>8}{arm.mismatched:>8}{arm.latency_s:>11.2f}{speedup:>9.2f}{arm.accepted:>10}{arm.drafted:>9}")
        for error in arm.errors[:3]:
            print(f"    {error}")
    one, apart, shared = (next(a for a in arms if a.name == n) for n in ("one", "apart", "shared"))
    speed = {a.name: alone.latency_s / a.latency_s for a in (one, apart, shared) if a.latency_s}
    if len(speed) == 3:
        print(f"speedup shared / one: {speed['shared'] / speed['one']:.3f}   shared / apart: {speed['shared'] / speed['apart']:.3f}")
    bad = sum(a.failed + a.mismatched for a in arms)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
