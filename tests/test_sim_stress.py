"""The simulator over real HTTP under many connections at once: keep-alive clients reusing a pool,
short-lived connections (`Connection: close`), streams abandoned mid-way, idle and half-sent
connections; streamed and not, bounded and unbounded (`max_tokens` unset) chat. Every request
completes, and none takes much longer than its time alone.

Unbounded chat is what stalled LangChain's integration suite (issue 39): the simulated model never
ended its answer, so each ran to the 8,192-token context window (206 s on the `lan` profile, 82 s on
this test's 10 ms per token: past the client's timeout, and past the answer length asserted here).
"""

from __future__ import annotations

import asyncio
import contextlib
import json

import httpx2

from simserver import ServerThread
from specapi.sim import SimProvider, create_app
from specapi.sim.latency import LatencyProfile, ModelTiming, request_timing
from specapi.sim.models import MODEL_SPECS

TIMING = ModelTiming(rtt_s=0.001, ttft_base_s=0.010, prefill_tokens_per_s=50_000.0, tpot_s=0.010)
PROFILE = LatencyProfile(name="stress", target=TIMING, draft=TIMING)
CLIENT_TIMEOUT_S = 30.0
#: A request counts as stalled past this many times its time alone, plus this slack (a loaded 2-core
#: machine generates the answers on the server's one event loop): generous, to count stalls, not speed.
STALL_FACTOR, STALL_SLACK_S = 3.0, 5.0

MESSAGES = [
    [{"role": "user", "content": "Write a function that returns the area of a circle."}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Explain décor, naïve and 東京 in one line 🙂"}],
]


def _body(index: int, *, stream: bool) -> dict:
    """Request `index`: completions or chat, bounded or (every fifth chat) unbounded."""
    body: dict = {"model": "sim-target", "stream": stream}
    if index % 3 == 0:
        body.update(prompt="def fibonacci(n):\n", max_tokens=8 + index % 24, temperature=0)
    else:
        body.update(messages=MESSAGES[index % 2], temperature=0.7 * (index % 2), seed=index)
        if index % 5:
            body["max_tokens"] = 8 + index % 32
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def _request(client: httpx2.AsyncClient, index: int, *, stream: bool, headers: dict | None = None) -> tuple[float, float, int]:
    """Send request `index` and read all of it; (wall seconds, its time alone, its completion tokens)."""
    body = _body(index, stream=stream)
    path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
    loop = asyncio.get_running_loop()
    started = loop.time()
    if stream:
        usage = None
        async with client.stream("POST", path, json=body, headers=headers) as response:
            assert response.status_code == 200
            events = [line[len("data: "):] async for line in response.aiter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        usage = json.loads(events[-2])["usage"]
    else:
        response = await client.post(path, json=body, headers=headers)
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
    wall = loop.time() - started
    alone = request_timing(TIMING, prompt_tokens=usage["prompt_tokens"], completion_tokens=usage["completion_tokens"]).total_s
    return wall, alone, usage["completion_tokens"]


async def _keep_alive_worker(root: str, first: int, count: int) -> list[tuple[float, float, int]]:
    """One long-lived client: `count` requests in turn over its pool of kept-alive connections."""
    limits = httpx2.Limits(max_connections=2, max_keepalive_connections=2)
    async with httpx2.AsyncClient(base_url=root, timeout=CLIENT_TIMEOUT_S, limits=limits) as client:
        return [await _request(client, first + i, stream=(first + i) % 2 == 0) for i in range(count)]


async def _short_lived(root: str, index: int) -> tuple[float, float, int]:
    """One request on a connection of its own, closed after it."""
    async with httpx2.AsyncClient(base_url=root, timeout=CLIENT_TIMEOUT_S) as client:
        return await _request(client, index, stream=index % 2 == 1, headers={"connection": "close"})


async def _abandoned_stream(port: int, index: int) -> None:
    """A streamed request read up to its first event, then the connection dropped."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    payload = json.dumps({**_body(index, stream=True), "max_tokens": 200}).encode()
    path = "/v1/completions" if index % 3 == 0 else "/v1/chat/completions"
    writer.write(
        f"POST {path} HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: {len(payload)}\r\n\r\n".encode() + payload
    )
    await writer.drain()
    assert (await asyncio.wait_for(reader.readuntil(b"data: "), CLIENT_TIMEOUT_S)).startswith(b"HTTP/1.1 200")
    writer.transport.abort()
    await _closed(writer)


async def _half_sent(port: int) -> None:
    """A request whose body never arrives in full: the client gives up and closes."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{\"mod")
    await writer.drain()
    await asyncio.sleep(0.2)
    await _closed(writer)


async def _closed(writer: asyncio.StreamWriter) -> None:
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def test_every_request_completes_under_many_mixed_connections():
    provider = SimProvider(capabilities="vllm", latency=PROFILE, seed=0, deduct_compute_time=True, max_calls=0)
    provider.warm_up()
    with ServerThread(create_app(provider)) as server:
        idle = [(await asyncio.open_connection("127.0.0.1", server.port))[1] for _ in range(16)]  # open, never used
        try:
            timed = await _load(server)
        finally:
            await asyncio.gather(*(_closed(writer) for writer in idle))
    assert len(timed) == 6 * 6 + 16 + 1
    lengths = [tokens for _, _, tokens in timed]
    assert max(lengths) > 64  # the unbounded chat answers ran past any limit the others set...
    assert max(lengths) <= MODEL_SPECS["sim-target"].turn_end_by  # ...and ended by themselves, far from the window
    stalled = [(round(wall, 2), round(alone, 2)) for wall, alone, _ in timed if wall > STALL_FACTOR * alone + STALL_SLACK_S]
    assert stalled == []


async def _load(server: ServerThread) -> list[tuple[float, float, int]]:
    """Every kind of connection at once; (wall, alone) of each request read in full."""
    tasks = [asyncio.ensure_future(_keep_alive_worker(server.root, 100 * w, 6)) for w in range(6)]
    singles = [asyncio.ensure_future(_short_lived(server.root, 1000 + i)) for i in range(16)]
    others = [asyncio.ensure_future(_abandoned_stream(server.port, 2000 + i)) for i in range(8)]
    others += [asyncio.ensure_future(_half_sent(server.port)) for _ in range(4)]
    timed = [t for batch in await asyncio.gather(*tasks) for t in batch] + list(await asyncio.gather(*singles))
    await asyncio.gather(*others)
    # After all that, the server still answers a fresh client at once.
    async with httpx2.AsyncClient(base_url=server.root, timeout=CLIENT_TIMEOUT_S) as client:
        timed.append(await _request(client, 5, stream=False))
    return timed
