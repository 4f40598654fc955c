"""How the workers of one host should share what they learn: the datagram sockets of `server/peers.py`,
or the Redis stream of `specapi.share` that replicas use. Measures, for each, the CPU a sequence costs
(sending and receiving, in this process; Redis's own from /proc) and how long it takes to arrive.

One publisher and `--listeners` listeners in this process (one event loop, as workers each have theirs:
the sum of their CPU is what a host pays). The publisher sends `--records` sequences of `--tokens` token
ids in bursts of `--burst` per turn of the loop (requests that finish together), one burst every
`--interval` seconds; each listener's arrival time is taken per sequence.

    python benchmarks/share_transport.py
    python benchmarks/share_transport.py --listeners 3 --records 3000

Needs `redis-server` (Debian: apt-get install -y redis-server). Loopback only.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from specapi.server.peers import Peers
from specapi.share import RedisShare


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _measure(make, args: argparse.Namespace) -> tuple[float, list[float], int]:  # type: ignore[no-untyped-def]
    """(CPU seconds of this process, arrival delays, records delivered) for one transport."""
    sent_at: dict[int, float] = {}
    delays: list[float] = []

    def deliver(scope: str, tokens: list[int]) -> None:
        delays.append(time.perf_counter() - sent_at[tokens[0]])

    publisher, listeners = await make(deliver, args.listeners)
    expected = args.records * args.listeners
    cpu = time.process_time()
    for start in range(0, args.records, args.burst):
        for n in range(start, min(start + args.burst, args.records)):
            sent_at[n] = time.perf_counter()
            publisher.publish("\nsim-target", [n] + [(n * 7 + i) % 100_000 for i in range(args.tokens - 1)])
        await asyncio.sleep(args.interval)
    deadline = time.monotonic() + 30
    while len(delays) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    cpu = time.process_time() - cpu
    for end in (publisher, *listeners):
        result = end.close()
        if asyncio.iscoroutine(result):
            await result
    return cpu, delays, len(delays)


async def _datagrams(deliver, listeners: int):  # type: ignore[no-untyped-def]
    directory = tempfile.mkdtemp(prefix="specapi-peers-")
    publisher = Peers(directory, lambda scope, tokens: None)
    ends = [Peers(directory, deliver) for _ in range(listeners)]
    for end in (publisher, *ends):
        end.start()
    return publisher, ends


def _redis_maker(url: str):  # type: ignore[no-untyped-def]
    async def make(deliver, listeners: int):  # type: ignore[no-untyped-def]
        prefix = f"bench-{os.urandom(4).hex()}"
        publisher = RedisShare(url, prefix=prefix)
        ends = [RedisShare(url, prefix=prefix, deliver=deliver) for _ in range(listeners)]
        for end in (publisher, *ends):
            await end.start()
        return publisher, ends

    return make


def _report(name: str, cpu: float, delays: list[float], delivered: int, expected: int, extra: float = 0.0) -> None:
    delays_ms = sorted(d * 1000 for d in delays) or [float("nan")]
    per_record = (cpu + extra) / max(1, delivered) * 1e6
    print(
        f"{name:<10} delivered {delivered}/{expected}  CPU {cpu:.3f} s here"
        + (f" + {extra:.3f} s redis-server" if extra else "")
        + f" = {per_record:.1f} µs per delivered sequence;  arrival p50 {statistics.median(delays_ms):.2f} ms, "
        f"p99 {delays_ms[int(0.99 * (len(delays_ms) - 1))]:.2f} ms, max {delays_ms[-1]:.2f} ms"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--listeners", type=int, default=1)
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--interval", type=float, default=0.005)
    args = parser.parse_args(argv)
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed")
    expected = args.records * args.listeners
    print(f"{args.records} sequences of {args.tokens} tokens, bursts of {args.burst} every {args.interval * 1000:.0f} ms, {args.listeners} listener(s)")
    cpu, delays, delivered = asyncio.run(_measure(_datagrams, args))
    _report("datagrams", cpu, delays, delivered, expected)
    port = _free_port()
    redis = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                             stdout=subprocess.DEVNULL)
    try:
        time.sleep(0.3)
        before = _cpu_s(redis.pid)
        cpu, delays, delivered = asyncio.run(_measure(_redis_maker(f"redis://127.0.0.1:{port}/0"), args))
        _report("redis", cpu, delays, delivered, expected, _cpu_s(redis.pid) - before)
    finally:
        redis.kill()
        redis.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
