"""Replicas that learn together (`specapi serve --share redis://...`): three `specapi serve` processes, a
real `redis-server`, the simulator in front. A conversation one replica answered is drafted from in
another; tenants stay apart; Redis killed mid-run fails no request and changes no output, `/ready` stays
200 and the metrics say sharing is degraded, and sharing resumes when Redis is back; the stream is capped."""

from __future__ import annotations

import asyncio
import pathlib
import signal
import socket
import time
from collections.abc import Callable, Iterator

import httpx2
import pytest

from replicas import RedisServer, Replicas, free_port, metric
from simclient import target_alone
from simserver import ServerThread
from specapi.sim import SimProvider, create_app

MAX_ENTRIES = 5
MAX_TOKENS = 20
# Suffix drafts only, a fixed length: what a replica drafts is what its index holds.
SERVE_OPTIONS = ("--drafter", "suffix", "--policy", "fixed", "--num-speculative-tokens", "16", "--suffix-scope", "api-key",
                 "--share-max-entries", str(MAX_ENTRIES))
PROMPTS = [
    "Once upon a time, 从前有一座山, 山里有座庙 🙂, and then",
    "def parse(line):\n    # café, naïve, 日本語 — split on tabs",
    "The agent called read_file(\"src/app.py\") and then",
    "Résumé of the run: 3 errors, 2 warnings ✅ and",
    "SELECT name, total FROM orders WHERE",
    "第二个问题: how do we retry a request when",
]


@pytest.fixture(scope="module")
def provider() -> SimProvider:
    return SimProvider(capabilities="vllm", latency="instant", seed=0)


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def replicas(provider: SimProvider, redis: RedisServer) -> Iterator[Replicas]:
    with ServerThread(create_app(provider)) as sim:
        with Replicas(sim.root + "/v1", 3, share=redis.url, extra=SERVE_OPTIONS) as started:
            yield started


def complete(replicas: Replicas, index: int, prompt: str, key: str) -> dict:
    response = httpx2.post(
        replicas.url(index) + "/v1/completions",
        json={"model": "sim-target", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0},
        headers={"authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert response.status_code == 200, response.text
    return response.json()


_EXPECTED: dict[str, str] = {}


def expected(provider: SimProvider, prompt: str) -> str:
    """The target's own greedy output for `prompt` (asked of the simulator once)."""
    if prompt not in _EXPECTED:
        _EXPECTED[prompt] = asyncio.run(target_alone(provider, prompt=prompt, max_tokens=MAX_TOKENS))[0]
    return _EXPECTED[prompt]


def metrics(replicas: Replicas, index: int) -> str:
    return httpx2.get(replicas.url(index) + "/metrics", timeout=10).text


def received(replicas: Replicas, index: int) -> float:
    return metric(metrics(replicas, index), 'specapi_share_records_total{direction="received"}')


def received_all(replicas: Replicas, index: int, before: float) -> None:
    """Wait until replica `index` received more than `before` records and then nothing more for a while
    (what waited for Redis during an outage goes out when it returns, ahead of what comes after)."""
    settle(lambda: received(replicas, index) > before)
    last, since = received(replicas, index), time.monotonic()
    while time.monotonic() - since < 0.5:
        time.sleep(0.05)
        now = received(replicas, index)
        if now != last:
            last, since = now, time.monotonic()


def settle(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_conversation_one_replica_answered_drafts_in_another_and_tenants_stay_apart(replicas, provider):
    prompt = PROMPTS[0]
    before = [received(replicas, i) for i in (1, 2)]
    taught = complete(replicas, 0, prompt, "tenant-a")
    assert taught["speculative"]["accepted_tokens"] == 0  # nobody knew it
    settle(lambda: all(received(replicas, i) > b for i, b in zip((1, 2), before)))
    same_tenant = complete(replicas, 1, prompt, "tenant-a")
    # Other tenants never draft from a's text, on the replica that learnt it through Redis or on another
    # (two tenants: each one's own answer is shared with its other replicas too).
    other_on_b = complete(replicas, 1, prompt, "tenant-b")
    other_on_c = complete(replicas, 2, prompt, "tenant-c")
    text = expected(provider, prompt)
    assert [r["choices"][0]["text"] for r in (taught, same_tenant, other_on_b, other_on_c)] == [text] * 4
    assert same_tenant["speculative"]["accepted_tokens"] >= 12 and same_tenant["speculative"]["exact"]
    assert other_on_b["speculative"]["drafted_tokens"] == 0
    assert other_on_c["speculative"]["drafted_tokens"] == 0


def test_a_replica_started_later_starts_warm(replicas, provider, redis):
    # The others probed the target and shared its capabilities (written every 2 seconds when changed).
    settle(lambda: redis.command("KEYS", "specapi:state:probe:*").count(b"probe:") == 1)
    late = Replicas(replicas.target_url, 1, share=redis.url, extra=SERVE_OPTIONS)
    try:
        late.wait_ready()
        page = metrics(late, 0)
        # No probe calls at startup: the capabilities came from Redis.
        assert metric(page, 'specapi_upstream_requests_total{role="target"}') == 0
        # What the others learnt before it started: tenant a's conversation drafts from the stream.
        learnt = complete(late, 0, PROMPTS[0], "tenant-a")
        assert learnt["choices"][0]["text"] == expected(provider, PROMPTS[0])
        assert learnt["speculative"]["accepted_tokens"] >= 12
    finally:
        late.stop()


def test_redis_killed_fails_no_request_and_sharing_resumes_when_it_returns(replicas, provider, redis):
    redis.kill()
    # Every replica notices (its reader's next try fails): degraded, still ready.
    settle(lambda: all(metric(metrics(replicas, i), "specapi_share_degraded") == 1 for i in range(3)))
    outcomes = []
    for n, prompt in enumerate(PROMPTS[1:4]):
        for index in range(3):
            outcomes.append((prompt, complete(replicas, (index + n) % 3, prompt, "tenant-a")))
    assert all(r["choices"][0]["text"] == expected(provider, p) and r["speculative"]["exact"] for p, r in outcomes)
    for index in range(3):
        ready = httpx2.get(replicas.url(index) + "/ready", timeout=5)
        assert ready.status_code == 200 and (ready.json()["status"], ready.json()["sharing"]) == ("ready", "degraded")
        assert metric(metrics(replicas, index), 'specapi_requests_total{route="/v1/completions",status="200"}') >= 3

    redis.start()  # empty: what was shared before is gone, as after a real outage
    settle(lambda: all(metric(metrics(replicas, i), "specapi_share_degraded") == 0 for i in range(3)))
    ready = httpx2.get(replicas.url(2) + "/ready", timeout=5).json()
    assert (ready["status"], ready["sharing"]) == ("ready", "ok")
    prompt = "After the outage: 新しい会話 🎉 starts with"
    before = received(replicas, 2)
    taught = complete(replicas, 1, prompt, "tenant-a")
    received_all(replicas, 2, before)
    learnt = complete(replicas, 2, prompt, "tenant-a")
    assert taught["choices"][0]["text"] == learnt["choices"][0]["text"] == expected(provider, prompt)
    assert learnt["speculative"]["accepted_tokens"] >= 12


def test_the_stream_in_redis_stays_capped(replicas, redis):
    def published() -> float:
        return sum(metric(metrics(replicas, i), 'specapi_share_records_total{direction="published"}') for i in range(3))

    before = published()
    for n in range(12):
        complete(replicas, n % 3, f"Entry {n}: the cap holds, ключ {n} 🔑", "tenant-d")
    settle(lambda: published() >= before + 12)
    # MAXLEN ~: Redis trims whole nodes of the stream (5 entries each here), never keeps them all.
    assert redis.integer("XLEN", "specapi:suffix") <= MAX_ENTRIES + 5 < published() - before


def _serving_on(ports: list[int]) -> list[int]:
    """Pids of any process (a child, or one it started) whose command line serves on one of `ports`."""
    wanted = {f"--port\0{port}\0" for port in ports}
    found = []
    for entry in pathlib.Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:  # not a process, or gone meanwhile
            continue
        if any(w in cmdline + "\0" for w in wanted):
            found.append(int(entry.name))
    return found


def test_a_failed_start_leaves_no_replica_running(provider: SimProvider):
    """One replica cannot bind its port (taken), the other starts and is ready: the failure stops it too."""
    with ServerThread(create_app(provider)) as sim, socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = [free_port(), taken.getsockname()[1]]
        started = Replicas(sim.root + "/v1", 2, share=None, ports=ports)
        with pytest.raises(AssertionError):
            started.wait_ready()
        first, second = started.processes
        assert second.returncode is not None and second.returncode > 0  # it exited by itself: its port was taken
        # The first was up (it became ready before the second was looked at), and was stopped: SIGTERM (a
        # clean exit, or the signal's code) or SIGKILL after the wait.
        assert first.returncode in (0, -signal.SIGTERM, -signal.SIGKILL), first.returncode
        assert _serving_on(ports) == []


def test_a_start_that_times_out_leaves_no_replica_running(provider: SimProvider):
    with ServerThread(create_app(provider)) as sim:
        started = Replicas(sim.root + "/v1", 2, share=None)
        with pytest.raises(AssertionError, match="did not become ready"):
            started.wait_ready(timeout_s=0.0)
        assert all(p.returncode is not None for p in started.processes)
        assert _serving_on(started.ports) == []
