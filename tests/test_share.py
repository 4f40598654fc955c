"""Sharing through Redis (`specapi.share`) in one process, against a real `redis-server`: a client that
attaches starts warm (suffix sequences, the policy's measurements, the probe's findings), Redis away at
start or meanwhile costs nothing but the sharing, what waits for it is bounded, and the settings say
clearly what is wrong."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator

import pytest

from replicas import RedisServer, free_port
from specapi import AsyncSpeculativeOpenAI, ConfigurationError
from specapi.parts.policy import AdaptiveDraftLength
from specapi.server import ServerConfig
from specapi.share import MAX_PENDING, RedisShare
from specapi.sim import SimProvider, simulated_endpoints
from specapi.core.stats import MODEL_DRAFTER, RoundRecord
from simclient import target_alone

PROMPT = "A shared start: 共有された知識 🙂 and the rest of the"


@pytest.fixture(scope="module")
def redis() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.kill()


def client(provider: SimProvider, **options) -> AsyncSpeculativeOpenAI:  # type: ignore[no-untyped-def]
    target, draft = simulated_endpoints(provider=provider)
    return AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="suffix", policy="fixed", num_speculative_tokens=16, **options)


async def settle(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def test_a_client_attached_later_drafts_from_what_another_learnt_before(redis):
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    first, later = client(provider), client(provider)
    sharing = RedisShare(redis.url, prefix="warm-suffix")
    await sharing.attach(first)
    try:
        taught = await first.completions.create(model="sim-target", prompt=PROMPT, max_tokens=24, temperature=0)
        await settle(lambda: sharing.published == 1)
        joining = RedisShare(redis.url, prefix="warm-suffix")
        await joining.attach(later)  # reads what the stream holds
        try:
            assert later._runtime.suffix_index.tokens > 0
            learnt = await later.completions.create(model="sim-target", prompt=PROMPT, max_tokens=24, temperature=0)
        finally:
            await joining.close()
    finally:
        await sharing.close()
    expected, _ = await target_alone(provider, prompt=PROMPT, max_tokens=24)
    assert taught.choices[0].text == learnt.choices[0].text == expected
    assert taught.speculative.accepted_tokens == 0 and learnt.speculative.accepted_tokens >= 16


def record(accepted: int, drafted: int = 4) -> RoundRecord:
    return RoundRecord(
        drafted=drafted, accepted=accepted, emitted=accepted + 1, drafter=MODEL_DRAFTER, draft_latency_s=0.01 * drafted, verify_latency_s=0.05 + 0.001 * drafted,
        accepted_by_position=tuple([True] * accepted + [False] * (drafted - accepted > 0)),
    )


async def test_a_new_client_adopts_the_policy_measurements_and_the_probe_findings_others_shared(redis):
    provider = SimProvider(capabilities="llamacpp", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    measured = AdaptiveDraftLength()
    for n in range(12):
        measured.observe(record(n % 4))
    measured.observe_plain(20, 0.4)
    first = AsyncSpeculativeOpenAI(target=target, draft=draft, policy=measured)
    sharing = RedisShare(redis.url, prefix="warm-state")
    await sharing.attach(first)
    try:
        await first.completions.create(model="sim-target", prompt="ab", max_tokens=4, temperature=0)  # probes the target
        sharing._poll_states()
        await settle(lambda: not sharing._states and len(sharing._written_states) == 2)
        fresh = AsyncSpeculativeOpenAI(target=target, draft=draft)
        joining = RedisShare(redis.url, prefix="warm-state")
        await joining.attach(fresh)
        await joining.close()
    finally:
        await sharing.close()
    adopted = fresh._runtime.policy
    assert adopted.measurements() == measured.measurements() | {"rounds_seen": adopted.measurements()["rounds_seen"]}
    assert adopted.acceptance() == pytest.approx(measured.acceptance())
    assert adopted.predicted_target_rate(64) == pytest.approx(measured.predicted_target_rate(64))
    # No request made: the target's capabilities came from the other client's probe (a llama-server).
    caps = fresh._runtime.paths.capabilities
    assert caps == first._runtime.paths.capabilities and caps.server == "llama-server"


def test_a_policy_that_measured_keeps_its_own_and_odd_data_is_ignored():
    mine, theirs = AdaptiveDraftLength(), AdaptiveDraftLength()
    for n in range(6):
        theirs.observe(record(n % 3))
    mine.observe(record(4))
    assert not mine.adopt(theirs.measurements())  # it measured: its own figures stand
    cold = AdaptiveDraftLength()
    assert not cold.adopt({"version": 99})
    assert not cold.adopt({**theirs.measurements(), "verify": "fast"})
    assert cold.acceptance() == AdaptiveDraftLength().acceptance()  # untouched by what it refused
    assert cold.adopt(theirs.measurements()) and cold.acceptance() == theirs.acceptance()


async def test_redis_away_at_start_costs_the_sharing_only_and_what_waits_is_bounded():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    speculative = client(provider)
    changes: list[bool] = []
    sharing = RedisShare(f"redis://127.0.0.1:{free_port()}/0", on_degraded=changes.append, timeout=0.5)
    started = time.monotonic()
    await sharing.attach(speculative)
    try:
        assert time.monotonic() - started < 3.0 and sharing.degraded and changes == [True]
        answer = await speculative.completions.create(model="sim-target", prompt=PROMPT, max_tokens=12, temperature=0)
        assert answer.choices[0].text == (await target_alone(provider, prompt=PROMPT, max_tokens=12))[0]
        for n in range(MAX_PENDING + 500):
            sharing.publish("\nsim-target", [n, n + 1])
        assert len(sharing._pending) == MAX_PENDING and sharing.dropped >= 500
        assert sharing._pending[-1][0] == "\nsim-target"  # the newest stay
    finally:
        await sharing.close()


async def test_sharing_resumes_once_redis_answers_and_what_waited_goes_out():
    server = RedisServer()
    changes: list[bool] = []
    got: list[tuple[str, list[int]]] = []
    sender = RedisShare(server.url, on_degraded=changes.append, timeout=0.5)
    listener = RedisShare(server.url, deliver=lambda scope, tokens: got.append((scope, tokens)), timeout=0.5)
    await sender.start()
    await listener.start()
    try:
        sender.publish("tenant\nmodèle-😀", [1, 2, 3])  # learnt while Redis is away
        await settle(lambda: sender.failures > 0)
        server.start()
        try:
            await settle(lambda: got == [("tenant\nmodèle-😀", [1, 2, 3])], timeout=10)
            assert changes == [True, False] and not sender.degraded
        finally:
            server.kill()
    finally:
        await sender.close()
        await listener.close()


def test_settings_name_what_is_wrong(monkeypatch):
    target, _ = simulated_endpoints(latency="instant")
    with pytest.raises(ConfigurationError, match="redis://"):
        ServerConfig(target=target, share_url="http://127.0.0.1:6379")
    with pytest.raises(ConfigurationError, match="share_max_entries"):
        ServerConfig(target=target, share_url="redis://127.0.0.1:6379/0", share_max_entries=0)
    config = ServerConfig(target=target, share_url="redis://:hunter2@127.0.0.1:6379/0")
    assert "hunter2" in config.secrets  # scrubbed from error messages
    monkeypatch.setitem(sys.modules, "redis.asyncio", None)  # as if redis-py were not installed
    with pytest.raises(ConfigurationError, match=r"pip install 'specapi\[share\]'"):
        ServerConfig(target=target, share_url="redis://127.0.0.1:6379/0")
    from specapi.cli import cli_logic

    assert cli_logic(["serve", "--target-base-url", "http://127.0.0.1:9/v1", "--target-model", "t", "--drafter", "lookup",
                      "--share", "redis://127.0.0.1:6379/0"]) == 2


async def test_a_process_starts_from_the_newest_entries_only(redis, monkeypatch):
    import specapi.share

    monkeypatch.setattr(specapi.share, "WARM_ENTRIES", 10)  # a suffix index holds about 100 sequences
    writer = RedisShare(redis.url, prefix="warm-bound")
    await writer.start()
    try:
        for n in range(30):
            writer.publish("\nsim-target", [n, 1, 2])
        await settle(lambda: writer.published == 30)
        got: list[int] = []
        reader = RedisShare(redis.url, prefix="warm-bound", deliver=lambda scope, tokens: got.append(tokens[0]))
        await reader.start()
        writer.publish("\nsim-target", [99, 1, 2])  # and it goes on from there
        await settle(lambda: got[-1:] == [99])
        await reader.close()
    finally:
        await writer.close()
    assert got == [*range(20, 30), 99]


def test_workers_that_share_through_redis_use_no_sockets(monkeypatch, tmp_path):
    from specapi.server.command import add_arguments, proxy_app, resolve_settings
    import argparse

    monkeypatch.setenv("SPECAPI_PEERS_DIR", str(tmp_path))  # as the supervisor of --workers sets it
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    common = ["--target-base-url", "http://127.0.0.1:9/v1", "--target-model", "t", "--drafter", "lookup"]
    alone = proxy_app(resolve_settings(parser.parse_args(common), {}))
    shared = proxy_app(resolve_settings(parser.parse_args([*common, "--share", "redis://127.0.0.1:6379/0"]), {}))
    assert alone.state.config.peers_dir == str(tmp_path) and alone.state.config.share_url is None
    assert shared.state.config.peers_dir is None and shared.state.config.share_url == "redis://127.0.0.1:6379/0"
