"""What one worker learns, told to the others: the processes of `specapi serve --workers N` share
their suffix indexes.

A worker's suffix index learns from the requests it finished, and the kernel hands each connection
to one worker: a prompt one worker answered was new to the others. In two-worker runs of
`benchmarks/proxy_load.py`, the requests whose worker had not seen their prompt went to the target
alone and ended last, after the target alone's whole burst (the wall time of the run).

So each worker binds a datagram socket in a directory the processes share (`PEERS_DIR_VARIABLE`; the
supervisor of `--workers` makes a private one) and sends every sequence its index learns (the token
ids: a prompt's end and its output) to the sockets of the others, which add it to their own index of
the same scope. Sequences learnt in one turn of the event loop go out together (a burst that ends
at once is a few messages, not one per request: a socket's queue holds only
`/proc/sys/net/unix/max_dgram_qlen` messages, 10 here).

Best effort and bounded: nothing waits for a peer. What a peer has no room for is tried again a
little later, up to `MAX_PENDING_BYTES` per peer, oldest dropped first; a sequence larger than a
message is not sent. Losing one costs speed, never correctness: a suffix draft is only a draft, the
target verifies it. Only the sockets are on disk (no text); the directory is the user's alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import struct
import sys
from array import array
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

__all__ = ["PEERS_DIR_VARIABLE", "Peers", "pack", "unpack", "MAX_MESSAGE_BYTES", "MAX_PENDING_BYTES"]

logger = logging.getLogger("specapi.server")

#: The directory in which the processes that serve one port find each other.
PEERS_DIR_VARIABLE = "SPECAPI_PEERS_DIR"
#: The largest message sent (a datagram: well under the socket's send buffer, 208 KiB here).
MAX_MESSAGE_BYTES = 64 * 1024
#: What waits for one peer that has no room, at most (about 200 sequences of 300 tokens).
MAX_PENDING_BYTES = 256 * 1024
#: How long a worker waits before trying a full peer again.
RETRY_S = 0.02

_MAGIC = b"spk1"
_RECORD = struct.Struct("<HI")  # the scope's length in bytes, the number of token ids
_SOCKET_SUFFIX = ".sock"
_LITTLE = sys.byteorder == "little"


def _ids(tokens: Sequence[int]) -> bytes:
    values = array("I", tokens)  # 4 bytes each on every platform CPython runs on; OverflowError outside 0..2**32-1
    if not _LITTLE:
        values.byteswap()
    return values.tobytes()


def pack(records: Sequence[tuple[str, Sequence[int]]]) -> tuple[list[bytes], int]:
    """`(scope, token ids)` records as messages of at most `MAX_MESSAGE_BYTES`, in order, and how many
    were left out (a record larger than a message alone, or with ids outside 0 to 2**32 - 1)."""
    messages: list[bytes] = []
    left_out = 0
    current = bytearray(_MAGIC)
    for scope, tokens in records:
        key = scope.encode()
        if len(_MAGIC) + _RECORD.size + len(key) + 4 * len(tokens) > MAX_MESSAGE_BYTES:
            left_out += 1
            continue
        try:
            ids = _ids(tokens)
        except OverflowError:  # not token ids of any tokenizer (negative, or over 32 bits)
            left_out += 1
            continue
        record = _RECORD.pack(len(key), len(tokens)) + key + ids
        if len(current) + len(record) > MAX_MESSAGE_BYTES:
            messages.append(bytes(current))
            current = bytearray(_MAGIC)
        current += record
    if len(current) > len(_MAGIC):
        messages.append(bytes(current))
    return messages, left_out


def unpack(message: bytes) -> list[tuple[str, list[int]]]:
    """The records of one message; [] for anything that is not a whole message of this format."""
    if not message.startswith(_MAGIC):
        return []
    records = []
    at = len(_MAGIC)
    view = memoryview(message)
    while at < len(message):
        if at + _RECORD.size > len(message):
            return []
        size, count = _RECORD.unpack_from(message, at)
        start = at + _RECORD.size + size
        end = start + 4 * count
        if end > len(message):
            return []
        try:
            scope = bytes(view[at + _RECORD.size : start]).decode()
        except UnicodeDecodeError:
            return []
        values = array("I")
        values.frombytes(view[start:end])
        if not _LITTLE:
            values.byteswap()
        records.append((scope, values.tolist()))
        at = end
    return records


class Peers:
    """This process's end of the sharing: `publish` what the index learnt, `deliver` what others did.

    `deliver(scope, tokens)` is called on the event loop for every record another process sent.
    `start()` binds the socket (on the running loop); `close()` removes it. Where it cannot bind (a
    directory whose socket paths are too long for the system, 107 bytes on Linux), sharing is off,
    with a warning that says why.
    """

    def __init__(self, directory: str | os.PathLike[str], deliver: Callable[[str, list[int]], None]) -> None:
        self.directory = Path(directory)
        self.deliver = deliver
        self.path = self.directory / f"{os.getpid()}-{os.urandom(4).hex()}{_SOCKET_SUFFIX}"
        self.sent = 0  # messages handed to a peer's socket
        self.dropped = 0  # records not sent (no room, too large)
        self.received = 0  # records delivered
        self._socket: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: list[tuple[str, Sequence[int]]] = []
        self._waiting: dict[Path, deque[bytes]] = {}  # per peer, messages it had no room for
        # A socket per peer to send on: a datagram sent counts against its sender's buffer until it
        # is read, so one shared socket would let a peer that does not read stop the sending to all.
        self._links: dict[Path, socket.socket] = {}
        self._flush_handle: asyncio.Handle | None = None  # this turn's sending
        self._retry_handle: asyncio.TimerHandle | None = None  # a later try for peers that had no room

    @property
    def started(self) -> bool:
        return self._socket is not None

    def start(self) -> None:
        if not hasattr(socket, "AF_UNIX"):
            logger.warning("workers do not share what they learn: this system has no Unix sockets")
            return
        self._loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            sock.bind(os.fspath(self.path))
        except OSError as exc:
            sock.close()
            logger.warning("workers do not share what they learn: cannot bind %s (%s)", self.path, exc)
            return
        self._socket = sock
        self._loop.add_reader(sock.fileno(), self._read)

    def close(self) -> None:
        for handle in (self._flush_handle, self._retry_handle):
            if handle is not None:
                handle.cancel()
        self._flush_handle = self._retry_handle = None
        for link in self._links.values():
            link.close()
        self._links.clear()
        self._waiting.clear()
        sock, self._socket = self._socket, None
        if sock is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(sock.fileno())
        sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()

    # -- sending

    def publish(self, scope: str, tokens: Sequence[int]) -> None:
        """Send `tokens` (learnt under `scope`) to every other process, with what else is learnt in
        this turn of the event loop."""
        if self._socket is None or self._loop is None:
            return
        self._outbox.append((scope, tokens))
        if self._flush_handle is None:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _peers(self) -> Iterator[Path]:
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.directory):
                if entry.name.endswith(_SOCKET_SUFFIX) and entry.path != os.fspath(self.path):
                    yield Path(entry.path)

    def _retry(self) -> None:
        self._retry_handle = None
        if self._flush_handle is None:  # else the flush already due tries them again
            self._flush()

    def _flush(self) -> None:
        self._flush_handle = None
        records, self._outbox = self._outbox, []
        messages, left_out = pack(records)
        self.dropped += left_out
        peers = set(self._peers())
        for gone in set(self._waiting) - peers:
            del self._waiting[gone]
        for gone in set(self._links) - peers:
            self._links.pop(gone).close()
        for peer in peers:
            queue = self._waiting.setdefault(peer, deque())
            queue.extend(messages)
            if queue:
                self._send(peer, queue)
            if not queue:
                del self._waiting[peer]
        if self._waiting and self._retry_handle is None and self._loop is not None:
            self._retry_handle = self._loop.call_later(RETRY_S, self._retry)

    def _link(self, peer: Path) -> socket.socket | None:
        link = self._links.get(peer)
        if link is None:
            link = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            link.setblocking(False)
            try:
                link.connect(os.fspath(peer))
            except ConnectionRefusedError:  # a socket nobody reads: a process that ended without closing it
                link.close()
                with contextlib.suppress(OSError):
                    peer.unlink()
                return None
            except OSError:  # removed since the listing
                link.close()
                return None
            self._links[peer] = link
        return link

    def _send(self, peer: Path, queue: deque[bytes]) -> None:
        link = self._link(peer)
        while queue and link is not None:
            try:
                link.send(queue[0])
            except BlockingIOError:  # it has no room: later, within the bound
                while sum(map(len, queue)) > MAX_PENDING_BYTES:
                    self.dropped += len(unpack(queue.popleft()))
                return
            except OSError:  # it went away
                self._links.pop(peer).close()
                break
            queue.popleft()
            self.sent += 1
        self.dropped += sum(len(unpack(m)) for m in queue)  # a peer gone: what was for it goes too
        queue.clear()

    # -- receiving

    def _read(self) -> None:
        sock = self._socket
        while sock is not None:
            try:
                message = sock.recv(MAX_MESSAGE_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            for scope, tokens in unpack(message):
                self.received += 1
                try:
                    self.deliver(scope, tokens)
                except Exception:  # a record this process cannot place must not stop the others
                    logger.exception("a sequence learnt by another worker could not be added")
