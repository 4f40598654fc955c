"""A lean path for streams the target writes alone: its chunks go on as it sent them.

Two kinds of stream are the target's alone from their first token: every stream with verification off
(`--verification none`), and those the engine decides to leave to the target before any round (the
policy turns speculation off, under load above all, or the plan finds no path): the engine hands such a
whole answer over (`AloneStream`, `Engine.relay_alone`) and settles the request once it has been
relayed. Through the speculative client, each chunk of such a stream went through the engine (bytes
held until a character is whole, stop strings, limits: the server has done all of that already), was
built again as a chunk and encoded; the proxy spent 2.3x-2.6x a byte relay's CPU per stream
(`benchmarks/README.md`). Here each chunk is read once, for what the statistics need (the target's
usage, which the meter records; when the first text came), and the chunks that arrived together go out
in one write. The chunk that may end the stream (one that finishes a choice, or the usage) waits for
the next, so that the statistics (`"speculative"`) go on the last chunk; a stream that ends on a chunk
already sent gets one more, without choices, for them. Usage is always asked of the target, so the
statistics are billed figures; its chunk goes on only if the caller asked for it, as the target would
send it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from ..transport._calls import Meter, RoleClient
from ..transport._exceptions import MalformedResponseError
from ..core.stats import SpeculativeStats, passed_on
from ..surface.streaming import SpeculativeStream
from ..engine.target_alone import AloneStream

__all__ = ["TargetStream", "RELAY_REASON", "stream_path", "relayed_stream", "handed_over_stream"]

#: The statistics' `fallback_reason` of a relayed stream (the engine's words for the same choice).
RELAY_REASON = "verification='none': the target alone"


class TargetStream:
    """One stream of the target's, relayed: `await next_batch()` until None; `speculative` is set with
    the batch that ends it. Closing it (`aclose`) closes the upstream response (and what `on_close` names).

    `batches`: the target's chunks as they arrived together; `settle()`: the statistics, once they have
    ended; `malformed`: the error for a stream that ended without a finish_reason."""

    def __init__(
        self,
        batches: AsyncIterator[list[dict[str, Any]]],
        *,
        wanted_usage: bool,
        settle: Callable[[], Awaitable[SpeculativeStats]],
        malformed: Callable[[str], MalformedResponseError],
        on_close: Callable[[], Awaitable[None]] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._batches = batches
        #: When the first chunk with text was read (kept with a `clock` only: a relayed stream's TTFT).
        self.first_text_at: float | None = None
        self._clock = clock
        self._wanted_usage = wanted_usage
        self._settle = settle
        self._malformed = malformed
        self._on_close = on_close
        self._held: dict[str, Any] | None = None
        self._last: dict[str, Any] | None = None
        self._finished = False  # a choice came with its finish_reason
        self._ended = False
        self.speculative: SpeculativeStats | None = None

    async def next_batch(self) -> list[dict[str, Any]] | None:
        """The next chunks to send (at least one), None once the stream has ended."""
        while not self._ended:
            try:
                batch = await self._batches.__anext__()
            except StopAsyncIteration:
                self._ended = True
                return await self._closing()
            out = self._pass(batch)
            if out:
                return out
        return None

    def _pass(self, batch: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.first_text_at is None and self._clock is not None and any(_has_text(chunk.get("choices")) for chunk in batch):
            self.first_text_at = self._clock()
        out: list[dict[str, Any]] = []
        for chunk in batch:
            choices = chunk.get("choices")
            if not self._wanted_usage and "usage" in chunk:
                if not choices and chunk["usage"]:
                    continue  # asked for the statistics; the meter has it
                if chunk["usage"] is None:
                    del chunk["usage"]  # what asking for it added to every chunk (OpenAI's way)
            if self._held is not None:
                out.append(self._held)
                self._held = None
            if _may_end_a_stream(choices):
                self._finished = self._finished or bool(choices)
                self._held = chunk
            else:
                out.append(chunk)
            self._last = chunk
        return out

    async def _closing(self) -> list[dict[str, Any]] | None:
        last = self._last
        if last is None:
            return None
        if not self._finished:  # never silently cut text: the caller gets an error, as from the engine
            raise self._malformed("the stream ended without a finish_reason: the text may be incomplete")
        held = self._held
        if held is None:
            held = {key: last[key] for key in ("id", "object", "created", "model") if key in last}
            held["choices"] = []
        self._held = None
        self.speculative = await self._settle()
        return [held]

    async def aclose(self) -> None:
        with contextlib.suppress(Exception):
            await self._batches.aclose()  # type: ignore[attr-defined]
        if self._on_close is not None:
            await self._on_close()


def relayed_stream(role: RoleClient, path: str, body: Mapping[str, Any], *, clock: Callable[[], float], started: float) -> TargetStream:
    """A stream with verification off: the caller's request, sent to the target as it came (usage asked)."""
    options = body.get("stream_options")
    wanted_usage = isinstance(options, Mapping) and bool(options.get("include_usage"))
    upstream = {**body, "stream_options": {**(options if isinstance(options, Mapping) else {}), "include_usage": True}}
    meter = Meter(role.endpoint)

    async def settle() -> SpeculativeStats:
        first = relay.first_text_at
        return passed_on(meter.snapshot(), RELAY_REASON, clock() - started, ttft_s=first - started if first is not None else None)

    # The target's batches as `stream_batches` reads them, with no generator of its own around them:
    # each chunk of each stream went through one more `__anext__` for nothing.
    relay = TargetStream(role.stream_batches(path, upstream, meter), wanted_usage=wanted_usage, settle=settle, malformed=role.malformed, clock=clock)
    return relay


def handed_over_stream(stream: SpeculativeStream[Any], handover: AloneStream, *, wanted_usage: bool) -> TargetStream:
    """A whole answer the engine handed over (`stream.handover`): relayed, then the engine resumed to
    settle the request; its statistics are the engine's, and closing closes the engine's stream too."""

    async def settle() -> SpeculativeStats:
        while stream.speculative is None:
            if await stream.next_data() is None:
                raise handover.target.malformed("the engine ended a handed-over stream without its statistics")
        return stream.speculative

    return TargetStream(handover.batches(), wanted_usage=wanted_usage, settle=settle, malformed=handover.target.malformed, on_close=stream.close)


def _has_text(choices: Any) -> bool:
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if isinstance(choice, Mapping):
            delta = choice.get("delta")
            if choice.get("text") or (isinstance(delta, Mapping) and delta.get("content")):
                return True
    return False


def _may_end_a_stream(choices: Any) -> bool:
    """Whether a well-formed stream may end after a chunk with these choices: one finishes, or there are
    none (usage)."""
    if not isinstance(choices, list) or not choices:
        return True
    if len(choices) == 1:  # nearly every chunk: one choice's delta (no generator to set up per chunk)
        choice = choices[0]
        return isinstance(choice, Mapping) and choice.get("finish_reason") is not None
    return any(isinstance(choice, Mapping) and choice.get("finish_reason") is not None for choice in choices)


def stream_path(route: str) -> str:
    """The target's path for one of the proxy's routes (`/v1/completions` -> `/completions`)."""
    return route.removeprefix("/v1")
