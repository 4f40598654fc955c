"""What replicas learn, shared through Redis: suffix sequences, the policy's measurements, the probe's findings.

One process (a `specapi serve` replica, or a program's client) learns from the requests it finished;
behind a load balancer the next turn of a conversation usually lands on another replica, which had not
seen the earlier ones and drafts nothing from them. A `RedisShare` connects the replicas:

- every sequence a suffix index learns (the token ids of a prompt's end and its output, with its scope:
  tenant and model, as `server/peers.py` writes them) is appended to one Redis Stream,
  `{prefix}:suffix`, capped at about `max_entries` entries (`XADD ... MAXLEN ~`); every process reads
  the stream (`XREAD BLOCK`) and adds the sequences of the others to its own index of the same scope.
  A new process first reads the newest entries the stream holds (`WARM_ENTRIES`), so it starts with
  what the others learnt.
- the adaptive policy's measurements (`AdaptiveDraftLength.measurements`) and the target's probed
  capabilities (`probe.Capabilities`) are kept as small JSON values, `{prefix}:state:...` (expiring
  after `STATE_TTL_S` unless refreshed): a process that has measured nothing yet adopts them at start,
  and skips the probe's calls.

Best effort and bounded, like the datagrams between workers: nothing a request does waits for Redis.
`publish` only appends to a buffer of at most `MAX_PENDING` records (the oldest dropped first), which a
background task writes; another reads. While Redis does not answer, or answers with an error, both
retry every `RETRY_S` seconds and, from the second failure in a row on, the share says it is
`degraded`; what was learnt meanwhile stays local (and what waited, within the bound, goes out once
Redis is back). A lost sequence costs
speed, never correctness: a suffix draft is only a draft, the target verifies it. Requires redis-py
(`pip install 'specapi[share]'`), imported only when a share is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import sys
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import fields
from typing import Any

from .transport._exceptions import ConfigurationError

__all__ = ["RedisShare", "DEFAULT_MAX_ENTRIES", "MAX_PENDING", "STATE_TTL_S", "WARM_ENTRIES", "import_redis"]

logger = logging.getLogger("specapi.share")

#: Entries the stream keeps, about (`MAXLEN ~`: Redis trims whole nodes, so a little more may stay).
DEFAULT_MAX_ENTRIES = 10_000
#: Records waiting to be written, at most (the oldest are dropped first while Redis is away).
MAX_PENDING = 2_000
#: Seconds between tries while Redis does not answer.
RETRY_S = 0.5
#: How long a shared measurement lives in Redis unless a process refreshes it.
STATE_TTL_S = 7 * 24 * 3600
#: Seconds between the writes of a changed measurement (the policy's change with every round).
STATE_INTERVAL_S = 2.0
#: How long one Redis command may take before it counts as a failure (seconds).
COMMAND_TIMEOUT_S = 2.0
#: How long a read waits on Redis for new entries.
_BLOCK_MS = 500
#: Records written in one round trip, at most.
_BATCH = 500
#: The newest entries a process starts from (a suffix index holds about 100 sequences of 300 tokens:
#: more would only be learnt and evicted again, at 1.4 to 2.4 µs of CPU per token).
WARM_ENTRIES = 1000
#: Entries read in one round trip; the event loop gets a turn between every `_YIELD_EVERY` of them.
_READ_COUNT = 200
_YIELD_EVERY = 20
_LITTLE = sys.byteorder == "little"
_MAX_TOKENS_PER_RECORD = 64 * 1024


def import_redis() -> Any:
    """redis-py's asyncio client, or a `ConfigurationError` that says how to install it."""
    try:
        import redis.asyncio as aioredis
    except ImportError as exc:
        raise ConfigurationError(
            "sharing through Redis needs redis-py: pip install 'specapi[share]' (or pip install redis)"
        ) from exc
    return aioredis


def _pack_tokens(tokens: Sequence[int]) -> bytes | None:
    try:
        values = array("I", tokens)
    except OverflowError:  # not token ids of any tokenizer
        return None
    if not _LITTLE:
        values.byteswap()
    return values.tobytes()


def _unpack_tokens(data: bytes) -> list[int] | None:
    if len(data) % 4:
        return None
    values = array("I")
    values.frombytes(data)
    if not _LITTLE:
        values.byteswap()
    return values.tolist()


class RedisShare:
    """This process's end of the sharing: `publish` what an index learnt, `deliver` what others did.

    Args:
        url: `redis://host:port/db` (or `rediss://`, `unix://`), as redis-py's `from_url` takes it.
        deliver: called on the event loop with `(scope, tokens)` for every sequence another process
            published (set it before `start`, or pass `attach` a client).
        prefix: the keys' prefix: processes that share use the same one.
        max_entries: the stream's cap, in entries (about).
        on_degraded: called with True when Redis stops answering, False when it answers again.
        on_count: called with ("published" | "received" | "dropped", how many) as sequences are
            written, delivered, or dropped (metrics).
        timeout: seconds one command may take.
    """

    def __init__(
        self,
        url: str,
        *,
        deliver: Callable[[str, list[int]], None] | None = None,
        prefix: str = "specapi",
        max_entries: int = DEFAULT_MAX_ENTRIES,
        on_degraded: Callable[[bool], None] | None = None,
        on_count: Callable[[str, int], None] | None = None,
        timeout: float = COMMAND_TIMEOUT_S,
    ) -> None:
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigurationError(f"max_entries must be an integer >= 1, got {max_entries!r}")
        aioredis = import_redis()
        try:
            # Reads block for _BLOCK_MS: a command may take that long on top of its own timeout.
            self._redis = aioredis.from_url(
                url, socket_timeout=timeout + _BLOCK_MS / 1000, socket_connect_timeout=timeout, retry_on_timeout=False
            )
        except ValueError as exc:
            raise ConfigurationError(f"invalid Redis URL for sharing: {exc}") from exc
        self.url = url
        self.deliver = deliver
        self.prefix = prefix
        self.stream = f"{prefix}:suffix"
        self.max_entries = max_entries
        self.on_degraded = on_degraded
        self.on_count = on_count
        self.timeout = timeout
        self.origin = f"{os.getpid()}-{os.urandom(4).hex()}".encode()  # this process's entries, skipped when read
        self.published = 0  # records written to the stream
        self.received = 0  # records of other processes delivered
        self.dropped = 0  # records not written (the buffer was full, or not token ids)
        self.failures = 0  # commands that failed
        self._failed_in_a_row = 0
        self.degraded = False
        self._pending: deque[tuple[str, bytes]] = deque()
        self._states: dict[str, str] = {}  # name -> JSON waiting to be written
        self._state_sources: list[Callable[[], tuple[str, Any] | None]] = []
        self._written_states: dict[str, str] = {}
        self._wake = asyncio.Event()
        self._last_id = b"0-0"
        self._positioned = False  # the reader knows where in the stream to go on from
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False

    # -- health

    def _count(self, kind: str, amount: int) -> None:
        setattr(self, kind, getattr(self, kind) + amount)
        if self.on_count is not None:
            self.on_count(kind, amount)

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        self._failed_in_a_row += 1
        # One failure alone is not an outage: after Redis comes back, the first command on a connection
        # pooled before it went away fails once (seen in tests/test_share_replicas.py).
        if not self.degraded and self._failed_in_a_row >= 2:
            self.degraded = True
            logger.warning("sharing through Redis is degraded (%s: %s); requests go on without it", type(exc).__name__, exc)
            if self.on_degraded is not None:
                self.on_degraded(True)

    def _answered(self) -> None:
        self._failed_in_a_row = 0
        if self.degraded:
            self.degraded = False
            self._written_states.clear()  # a Redis back from an outage may have lost them: write them again
            logger.info("sharing through Redis resumed")
            if self.on_degraded is not None:
                self.on_degraded(False)

    # -- starting and stopping

    async def start(self, *, warm: bool = True) -> None:
        """Read what the stream holds (with `warm`), then keep reading and writing in the background.
        Never raises for Redis: when it does not answer, the share starts degraded and keeps trying."""
        if warm:
            await self._warm()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._read_loop()), loop.create_task(self._write_loop())]

    async def _warm(self) -> None:
        """Learn the newest `WARM_ENTRIES` entries; the reader goes on after them."""
        try:
            count = min(self.max_entries, WARM_ENTRIES)
            entries = await asyncio.wait_for(self._redis.xrevrange(self.stream, count=count), timeout=self.timeout)
        except Exception as exc:  # Redis away: start cold, the reader starts here once it is back
            self._failed(exc)
            return
        self._answered()
        self._positioned = True
        for n, (entry_id, values) in enumerate(reversed(entries)):
            self._last_id = entry_id
            self._take(values)
            if n % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)  # requests in flight go on meanwhile

    async def close(self) -> None:
        """Write what waits (briefly), stop the background tasks, close the connections."""
        if self._tasks and (self._pending or self._states) and not self.degraded:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._write_once(), timeout=1.0)
        # redis-py may turn a cancellation in the middle of a connection attempt into a ConnectionError:
        # the loops also stop on the flag, and are waited for a bounded time.
        self._closing = True
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=self.timeout + 1.0)
        self._tasks = []
        with contextlib.suppress(Exception):
            await self._redis.aclose()

    # -- sending

    def publish(self, scope: str, tokens: Sequence[int]) -> None:
        """Queue `tokens` (learnt under `scope`) for the other processes; returns at once."""
        if not tokens:
            return
        data = _pack_tokens(tokens[-_MAX_TOKENS_PER_RECORD:])
        if data is None:
            self._count("dropped", 1)
            return
        self._pending.append((scope, data))
        if len(self._pending) > MAX_PENDING:
            self._pending.popleft()
            self._count("dropped", 1)
        self._wake.set()

    def put_state(self, name: str, value: Any) -> None:
        """Queue a small JSON value (`{prefix}:state:{name}`) for the other processes; returns at once."""
        text = json.dumps(value, separators=(",", ":"))
        if self._written_states.get(name) != text:
            self._states[name] = text
            self._wake.set()

    def watch_state(self, source: Callable[[], tuple[str, Any] | None]) -> None:
        """Every `STATE_INTERVAL_S`, `source()` gives a (name, value) to write if it changed (or None)."""
        self._state_sources.append(source)

    async def get_state(self, name: str, *, timeout: float = 1.0) -> Any:
        """The value another process put under `name`, or None (none, unreadable, or Redis away)."""
        try:
            raw = await asyncio.wait_for(self._redis.get(f"{self.prefix}:state:{name}"), timeout=timeout)
        except Exception as exc:
            self._failed(exc)
            return None
        self._answered()
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None

    async def _write_once(self) -> bool:
        """Write what waits; False if nothing did."""
        batch = [self._pending.popleft() for _ in range(min(len(self._pending), _BATCH))]
        states = dict(self._states)
        if not batch and not states:
            return False
        pipe = self._redis.pipeline(transaction=False)
        for scope, data in batch:
            pipe.xadd(self.stream, {"o": self.origin, "s": scope.encode(), "t": data}, maxlen=self.max_entries, approximate=True)
        for name, text in states.items():
            pipe.set(f"{self.prefix}:state:{name}", text, ex=STATE_TTL_S)
        try:
            await pipe.execute()
        except BaseException:
            self._pending.extendleft(reversed(batch))  # tried again later, within the bound
            excess = len(self._pending) - MAX_PENDING
            for _ in range(max(0, excess)):
                self._pending.popleft()
            if excess > 0:
                self._count("dropped", excess)
            raise
        if batch:
            self._count("published", len(batch))
        for name, text in states.items():
            self._written_states[name] = text
            if self._states.get(name) == text:
                del self._states[name]
        return True

    def _poll_states(self) -> None:
        for source in self._state_sources:
            try:
                found = source()
            except Exception:  # a source that cannot say must not stop the sharing
                logger.exception("a measurement could not be read for sharing")
                continue
            if found is not None:
                self.put_state(*found)

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        next_poll = loop.time()
        while not self._closing:
            if loop.time() >= next_poll:
                self._poll_states()
                next_poll = loop.time() + STATE_INTERVAL_S
            self._wake.clear()
            try:
                wrote = await self._write_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(exc)
                await asyncio.sleep(RETRY_S)
                continue
            if wrote:
                self._answered()
            if not self._pending:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=max(0.01, next_poll - loop.time()))

    # -- receiving

    async def _read_loop(self) -> None:
        while not self._closing:
            if not self._positioned:  # Redis was away at start: begin at its newest entries, not its oldest
                await self._warm()
                if not self._positioned:
                    await asyncio.sleep(RETRY_S)
                    continue
            try:
                reply = await self._redis.xread({self.stream: self._last_id}, count=_READ_COUNT, block=_BLOCK_MS)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._failed(exc)
                await asyncio.sleep(RETRY_S)
                continue
            self._answered()
            for _stream, entries in reply or ():
                for n, (entry_id, values) in enumerate(entries):
                    self._last_id = entry_id
                    self._take(values)
                    if n % _YIELD_EVERY == _YIELD_EVERY - 1:
                        await asyncio.sleep(0)

    def _take(self, values: dict[bytes, bytes]) -> None:
        if values.get(b"o") == self.origin or self.deliver is None:
            return
        tokens = _unpack_tokens(values.get(b"t", b""))
        try:
            scope = values.get(b"s", b"").decode()
        except UnicodeDecodeError:
            return
        if not tokens:
            return
        self._count("received", 1)
        try:
            self.deliver(scope, tokens)
        except Exception:  # a record this process cannot place must not stop the others
            logger.exception("a sequence learnt by another process could not be added")

    # -- a client's measurements

    async def attach(self, client: Any, *, tenant: str = "") -> None:
        """Share what `client` (an `AsyncSpeculativeOpenAI`) learns with the other processes and learn
        what they do: its suffix indexes (scope `tenant`), its adaptive policy's measurements and its
        target's probed capabilities, adopted now where the client has none. Then `start`s the share."""
        runtime = client._runtime
        previous = runtime.on_learn

        def tell(model: str, tokens: list[int]) -> None:
            if previous is not None:
                previous(model, tokens)
            self.publish(f"{tenant}\n{model}", tokens)

        def deliver(scope: str, tokens: list[int]) -> None:
            their_tenant, _, model = scope.partition("\n")
            if their_tenant == tenant and runtime.learning:
                runtime.suffix_for(model).add(tokens)

        runtime.on_learn = tell
        if self.deliver is None:
            self.deliver = deliver
        await self.warm_client(client)
        await self.start()

    async def warm_client(self, client: Any) -> None:
        """Adopt the policy's measurements and the target's capabilities other processes shared (where
        `client` has none), and share this client's from now on (`watch_state`)."""
        runtime = client._runtime
        policy, paths = runtime.policy, runtime.paths
        policy_name, probe_name = policy_state_name(runtime), probe_state_name(runtime)
        if hasattr(policy, "adopt"):
            measured = await self.get_state(policy_name)
            if isinstance(measured, dict) and policy.adopt(measured):
                logger.info("the policy starts from measurements another process shared")
        if paths.capabilities is None and not self.degraded:  # Redis away: no second wait
            found = capabilities_from(await self.get_state(probe_name))
            if found is not None:
                paths.capabilities = found
                logger.info("the target's capabilities come from another process's probe")

        def policy_state() -> tuple[str, Any] | None:
            measure = getattr(policy, "measurements", None)
            measured = measure() if measure is not None else None
            return (policy_name, measured) if measured and measured.get("rounds_seen") else None  # nothing measured: nothing to tell

        def probe_state() -> tuple[str, Any] | None:
            caps = paths.capabilities
            return (probe_name, caps.to_dict()) if caps is not None else None

        self.watch_state(policy_state)
        self.watch_state(probe_state)


def _endpoint_label(role: Any) -> str:
    if role is None:
        return "-"
    endpoint = role.endpoint
    return f"{endpoint.model}@{endpoint.base_url or ''}"


def policy_state_name(runtime: Any) -> str:
    """The shared name of a client's policy measurements: per target and draft (model and URL)."""
    return f"policy:{_endpoint_label(runtime.target)}|{_endpoint_label(runtime.draft)}|{getattr(runtime.policy, 'name', '')}"


def probe_state_name(runtime: Any) -> str:
    """The shared name of a target's probed capabilities."""
    return f"probe:{_endpoint_label(runtime.target)}"


def capabilities_from(data: Any) -> Any:
    """`probe.Capabilities` from shared JSON (fields this version does not know are left out), or None."""
    from .parts.probe import Capabilities

    if not isinstance(data, dict):
        return None
    known = {f.name for f in fields(Capabilities)}
    values = {k: v for k, v in data.items() if k in known}
    values["notes"] = tuple(values.get("notes") or ())
    try:
        return Capabilities(**values)
    except TypeError:
        return None
