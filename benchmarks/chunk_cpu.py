"""CPU per streamed chunk on the proxy's path, next to a raw baseline measured in the same run.

A request the policy gives to the target alone is relayed chunk by chunk: the upstream's SSE bytes are
decoded and parsed, the engine keeps its books (text, token count, stop strings), the chunk is built and
the proxy writes it as an event. This measures that path in one process, without sockets, so that only
specapi's own work counts: a mock upstream (`httpx2.MockTransport`) streams N chunks at once, one
event per read, and each request runs `completions.create(stream=True)` with `verification="none"`,
`next_data()` and `encode_event` per chunk (what `specapi serve` does per chunk). The baseline does the
least a parsing relay can: the same SSE decoding, `json.loads` and `json.dumps` per event.

The figure per chunk is the difference between requests of 96 and of 16 chunks, divided by 80: what one
more chunk costs, without the per-request work. The two sides alternate `--repeats` times; the best of
each counts (this machine is shared).

    python benchmarks/chunk_cpu.py
    python benchmarks/chunk_cpu.py --requests 500 --repeats 5

Reported, not judged: no exit code for speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx2

from specapi import AsyncSpeculativeOpenAI, Endpoint
from specapi.transport._http import SSEDecoder
from specapi.server.sse import encode_event

SHORT, LONG = 16, 96


def _events(n: int) -> list[bytes]:
    """A completions stream of `n` text chunks, then usage and [DONE], one event per element."""
    def chunk(**fields: object) -> bytes:
        body = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", **fields}
        return b"data: " + json.dumps(body).encode() + b"\n\n"

    parts = [
        chunk(choices=[{"index": 0, "text": f" token{i}", "logprobs": None, "finish_reason": "length" if i == n - 1 else None}])
        for i in range(n)
    ]
    parts.append(chunk(choices=[], usage={"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}))
    parts.append(b"data: [DONE]\n\n")
    return parts


class _Body(httpx2.AsyncByteStream):
    def __init__(self, parts: list[bytes]) -> None:
        self._parts = parts

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for part in self._parts:
            yield part


def _client(n: int) -> AsyncSpeculativeOpenAI:
    parts = _events(n)
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=_Body(parts)))
    endpoint = Endpoint(base_url="http://upstream.invalid/v1", model="m", api_key="k", http_client=httpx2.AsyncClient(transport=transport))
    return AsyncSpeculativeOpenAI(target=endpoint, verification="none", drafter="lookup")


def _specapi(n: int, clients: list[AsyncSpeculativeOpenAI]) -> Callable[[], Awaitable[int]]:
    client = _client(n)
    clients.append(client)

    async def one() -> int:
        stream = await client.completions.create(model="m", prompt="hello", max_tokens=n, stream=True)
        sent = 0
        while (data := await stream.next_data()) is not None:
            sent += len(encode_event(data))
        return sent

    return one


def _raw(n: int, clients: list[AsyncSpeculativeOpenAI]) -> Callable[[], Awaitable[int]]:
    parts = _events(n)

    async def one() -> int:
        decoder, sent = SSEDecoder(), 0
        for part in parts:
            for event in decoder.feed(part):
                if event != "[DONE]":
                    sent += len(b"data: " + json.dumps(json.loads(event), ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n")
        await asyncio.sleep(0)
        return sent

    return one


async def _cpu_per_request(one: Callable[[], Awaitable[int]], requests: int) -> float:
    for _ in range(max(5, requests // 20)):  # warm up: imports, the first request's setup
        await one()
    started = time.process_time()
    for _ in range(requests):
        await one()
    return (time.process_time() - started) / requests


async def _measure(requests: int, repeats: int) -> dict[str, tuple[float, float]]:
    best: dict[str, list[float]] = {"specapi": [float("inf")] * 2, "raw": [float("inf")] * 2}
    clients: list[AsyncSpeculativeOpenAI] = []
    sides = {name: [make(n, clients) for n in (SHORT, LONG)] for name, make in (("specapi", _specapi), ("raw", _raw))}
    try:
        for _ in range(repeats):
            for name, ones in sides.items():
                for index, one in enumerate(ones):
                    best[name][index] = min(best[name][index], await _cpu_per_request(one, requests))
    finally:
        for client in clients:
            await client.close()
    return {name: (short, long) for name, (short, long) in best.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="requests per measurement (default 300)")
    parser.add_argument("--repeats", type=int, default=3, help="alternating passes; the best of each counts (default 3)")
    args = parser.parse_args()
    results = asyncio.run(_measure(args.requests, args.repeats))
    per_chunk = {name: (long - short) / (LONG - SHORT) for name, (short, long) in results.items()}
    for name, (short, long) in results.items():
        label = "specapi (create, next_data, encode_event)" if name == "specapi" else "raw (SSE decoding, json.loads, json.dumps)"
        print(f"  {label:<44} {per_chunk[name] * 1e6:6.1f} µs per chunk; per request {short * 1e3:.3f} ms ({SHORT} chunks), {long * 1e3:.3f} ms ({LONG})")
    print(f"  ratio per chunk: {per_chunk['specapi'] / per_chunk['raw']:.2f}x the raw baseline")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
