"""Workers that tell each other what they learn (`specapi/server/peers.py`): the message format, the
sockets between processes (full, gone, too long a path), and two proxies that share a directory:
a prompt one proxy answered is drafted from in the other, per API key where the index is keyed so."""

from __future__ import annotations

import asyncio
import logging
import os
import socket

import pytest

from specapi.server import ServerConfig, create_app
from specapi.server.peers import MAX_MESSAGE_BYTES, MAX_PENDING_BYTES, Peers, pack, unpack
from specapi.sim import SimProvider, simulated_endpoints
from simclient import proxy_completion, target_alone

# Scopes as the proxy writes them ("tenant\nmodel"), with text that is not ASCII.
SCOPES = ["\nsim-target", "9f86d081884c7d65\nsim-target", "\n模型-日本語-🙂"]


def test_records_survive_the_round_trip_in_order():
    records = [(SCOPES[0], [0, 1, 2]), (SCOPES[1], [199_997, 2**32 - 1]), (SCOPES[2], []), (SCOPES[0], list(range(300)))]
    messages, left_out = pack(records)
    assert left_out == 0 and len(messages) == 1
    assert unpack(messages[0]) == records


def test_records_too_many_for_one_message_are_split_and_ones_that_cannot_go_are_left_out():
    record = (SCOPES[0], list(range(1000)))  # about 4 KB
    huge = (SCOPES[1], [7] * (MAX_MESSAGE_BYTES // 4))
    messages, left_out = pack([record] * 40 + [huge, (SCOPES[0], [-1]), (SCOPES[0], [2**32])] + [record] * 3)
    assert left_out == 3
    assert all(len(m) <= MAX_MESSAGE_BYTES for m in messages) and len(messages) == 3
    assert [r for m in messages for r in unpack(m)] == [record] * 43


@pytest.mark.parametrize(
    "message",
    [b"", b"spk0" + bytes(6), b"spk1\x05", b"spk1" + b"\x02\x00\x01\x00\x00\x00ab", b"spk1" + b"\x02\x00\x00\x00\x00\x00\xff\xfe"],
    ids=["empty", "another format", "cut in the header", "cut in the tokens", "scope not UTF-8"],
)
def test_anything_but_a_whole_message_is_ignored(message):
    assert unpack(message) == []


class Inbox:
    def __init__(self) -> None:
        self.records: list[tuple[str, list[int]]] = []

    def __call__(self, scope: str, tokens: list[int]) -> None:
        self.records.append((scope, tokens))


async def settle(condition, timeout: float = 5.0) -> None:  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.005)


async def test_what_one_process_learns_in_a_turn_reaches_every_other_in_one_message(tmp_path):
    inboxes = [Inbox() for _ in range(3)]
    peers = [Peers(tmp_path, inbox) for inbox in inboxes]
    for p in peers:
        p.start()
    try:
        assert sorted(os.listdir(tmp_path)) == sorted(p.path.name for p in peers)
        sent = [(SCOPES[n % 3], list(range(n, n + 50))) for n in range(12)]  # more than a socket's queue of 10
        for scope, tokens in sent:
            peers[0].publish(scope, tokens)
        await settle(lambda: all(len(inbox.records) == 12 for inbox in inboxes[1:]))
        assert inboxes[1].records == inboxes[2].records == sent
        assert peers[0].sent == 2  # one message to each of the two others
        assert inboxes[0].records == []  # never to itself
        peers[2].publish(SCOPES[2], [5, 6])
        await settle(lambda: len(inboxes[0].records) == 1 and len(inboxes[1].records) == 13)
    finally:
        for p in peers:
            p.close()
    assert os.listdir(tmp_path) == []


async def test_a_peer_that_does_not_read_holds_back_no_one_and_what_waits_for_it_is_bounded(tmp_path):
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # a worker stuck in a long step
    deaf.bind(str(tmp_path / "deaf.sock"))
    deaf.setblocking(False)
    inbox = Inbox()
    sender, listener = Peers(tmp_path, Inbox()), Peers(tmp_path, inbox)
    sender.start()
    listener.start()
    try:
        record = list(range(4000))  # 16 KB a record: four to a message
        for _ in range(40):
            for _ in range(4):
                sender.publish(SCOPES[0], record)
            await asyncio.sleep(0)
        await settle(lambda: len(inbox.records) == 160)
        waiting = sender._waiting[tmp_path / "deaf.sock"]
        assert 0 < sum(map(len, waiting)) <= MAX_PENDING_BYTES
        assert sender.dropped > 0
        # Once it reads again, what waited for it is sent on the next tries.
        received = []
        async def drain() -> bool:
            while True:
                try:
                    received.extend(unpack(deaf.recv(MAX_MESSAGE_BYTES)))
                except BlockingIOError:
                    return not sender._waiting
        while not await drain():
            await asyncio.sleep(0.01)
        assert received and all(r == (SCOPES[0], record) for r in received)
        assert len(received) + sender.dropped == 160
    finally:
        sender.close()
        listener.close()
        deaf.close()


async def test_a_socket_left_by_a_process_that_died_is_removed(tmp_path):
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    dead.bind(str(tmp_path / "123-dead.sock"))
    dead.close()  # the file stays, nobody reads it
    peer = Peers(tmp_path, Inbox())
    peer.start()
    try:
        peer.publish(SCOPES[0], [1, 2, 3])
        await settle(lambda: not (tmp_path / "123-dead.sock").exists())
        assert not peer._waiting
    finally:
        peer.close()


async def test_a_directory_too_deep_for_a_socket_path_turns_sharing_off_with_a_warning(tmp_path, caplog):
    deep = tmp_path / ("d" * 100)
    deep.mkdir()
    peer = Peers(deep, Inbox())
    with caplog.at_level(logging.WARNING, logger="specapi.server"):
        peer.start()
    assert not peer.started and "too long" in caplog.text
    peer.publish(SCOPES[0], [1])  # does nothing, raises nothing
    peer.close()


# ------------------------------------------------------------------------ two proxies, one directory

PROMPT = "Once upon a time, 从前有一座山, 山里有座庙 🙂, and then"


async def post(app, key: str) -> dict:  # type: ignore[no-untyped-def]
    return await proxy_completion(app, key, PROMPT)


async def no_check() -> None:
    return None


def proxies(target, scope: str, directories: list) -> list:  # type: ignore[no-untyped-def]
    return [
        create_app(
            ServerConfig(
                target=target, client_options={"drafter": "suffix", "policy": "fixed"}, num_speculative_tokens=16,
                suffix_scope=scope, peers_dir=None if d is None else str(d), readiness_check=no_check,
            )
        )
        for d in directories
    ]


async def test_a_prompt_one_proxy_answered_is_drafted_from_in_the_other_exactly(tmp_path):
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, _ = simulated_endpoints(provider=provider)
    expected, _ = await target_alone(provider, prompt=PROMPT, max_tokens=30)
    first, second, apart = proxies(target, "model", [tmp_path, tmp_path, None])
    async with first.router.lifespan_context(first), second.router.lifespan_context(second), apart.router.lifespan_context(apart):
        taught = await post(first, "k")
        assert taught["speculative"]["accepted_tokens"] == 0  # nobody knew it
        await settle(lambda: second.state.peers.received == 1)
        learnt, alone, again = await post(second, "k"), await post(apart, "k"), await post(first, "k")
    assert taught["choices"][0]["text"] == learnt["choices"][0]["text"] == alone["choices"][0]["text"] == expected
    # As if it had been learnt there: as many drafted tokens accepted as in the proxy that answered it.
    assert learnt["speculative"]["accepted_tokens"] == again["speculative"]["accepted_tokens"] >= 25
    assert learnt["speculative"]["exact"]
    assert alone["speculative"]["drafted_tokens"] == 0  # no directory: learns alone


async def test_keyed_by_api_key_only_the_same_key_learns_in_the_other_proxy(tmp_path):
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, _ = simulated_endpoints(provider=provider)
    first, second = proxies(target, "api-key", [tmp_path, tmp_path])
    async with first.router.lifespan_context(first), second.router.lifespan_context(second):
        await post(first, "tenant-a")
        await settle(lambda: second.state.peers.received == 1)
        same, other = await post(second, "tenant-a"), await post(second, "tenant-b")
    assert same["speculative"]["accepted_tokens"] >= 25
    assert other["speculative"]["drafted_tokens"] == 0  # a's text never shapes b's drafts
    assert same["choices"][0]["text"] == other["choices"][0]["text"]
