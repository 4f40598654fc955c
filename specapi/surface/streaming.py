"""Streams: the engine's accepted text as the SDK's chunk types, as soon as each round accepts it.

`SpeculativeStream` iterates `Completion` chunks (completions) or `ChatCompletionChunk`s (chat), like
`openai.AsyncStream`; `stream.speculative` holds the statistics once the stream has ended, and the
last chunk carries them too (as an extra field OpenAI clients ignore). An engine that hands a whole
answer to its caller (`Engine.relay_alone`, the proxy) passes it on through `next_data`: `stream.handover`.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, TypeVar

from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from ..core import answer_keys
from ..core.answer_keys import AnswerKeys
from ..engine.request import Finished, Piece
from .responses import combined_stats, response_id, usage
from ..core.stats import SpeculativeStats

__all__ = ["SpeculativeStream", "completion_chunks", "chat_chunks", "response_id"]

T = TypeVar("T")


class SpeculativeStream(Generic[T]):
    """An async iterator of chunks; `speculative` is set when the stream is exhausted."""

    def __init__(self, chunks: AsyncIterator[dict[str, Any]], parse: Callable[[dict[str, Any]], T]) -> None:
        self._chunks = chunks
        self._parse = parse
        self.speculative: SpeculativeStats | None = None
        #: The target's whole answer, handed over to be relayed (`AloneStream`; `next_data` readers only):
        #: read it to its end, then `next_data` on until the statistics are set.
        self.handover: Any = None

    def __aiter__(self) -> SpeculativeStream[T]:
        return self

    async def next_data(self) -> dict[str, Any] | None:
        """The next chunk as the JSON object it is built from, None at the end: what a proxy sends on
        as it is, without building the SDK object and dumping it again (`speculative` is set as usual)."""
        try:
            data = await self._chunks.__anext__()
        except StopAsyncIteration:
            return None
        stats = data.pop("_speculative", None)
        if stats is not None:
            self.speculative = stats
        handover = data.pop("_handover", None)
        if handover is not None:
            self.handover = handover
        return data

    async def __anext__(self) -> T:
        data = await self._chunks.__anext__()
        stats = data.pop("_speculative", None)
        if stats is not None:
            self.speculative = stats
        chunk = self._parse(data)
        if stats is not None:
            chunk.speculative = stats  # type: ignore[attr-defined]
        return chunk

    async def close(self) -> None:
        """Stop generating: cancels the calls still in flight."""
        await self._chunks.aclose()  # type: ignore[attr-defined]

    @property
    def response(self) -> _StreamResponse:
        """What the SDK's stream helpers (`chat.completions.stream`) close when they are done, as
        `openai.AsyncStream.response`: closing it closes the stream."""
        return _StreamResponse(self.close)

    async def __aenter__(self) -> SpeculativeStream[T]:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class _StreamResponse:
    """A stream's `response`: only closing is offered (the upstream responses are specapi's)."""

    def __init__(self, close: Callable[[], Any]) -> None:
        self._close = close
        self.headers: dict[str, str] = {}

    async def aclose(self) -> None:
        await self._close()


def _chunker(chat: bool, model: str, keys: AnswerKeys | None = None) -> Callable[..., dict[str, Any]]:
    """What makes the chunks of one new response: a choice's own fields, its finish reason, its index and
    its tokens' logprobs in, a chunk out (with the target alone's top-level scalars and choice fields)."""
    ident, created = response_id(chat), int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    top = dict(keys.top) if keys is not None else {}
    own = dict(keys.choice) if keys is not None else {}
    bare = keys is not None and "logprobs" in keys.absent  # the target's chunks have no `logprobs` unasked

    def chunk(fields: dict[str, Any], finish: str | None, index: int = 0, logprobs: Any = None) -> dict[str, Any]:
        if bare and logprobs is None:
            choice = {"index": index, **fields, "finish_reason": finish}
        else:
            choice = {"index": index, **fields, "logprobs": logprobs, "finish_reason": finish}
        if own:
            choice.update({name: [] if value == [] else value for name, value in own.items()})
        return {"id": ident, "object": kind, "created": created, "model": model, "choices": [choice], **top}

    return chunk


Events = AsyncIterator[tuple[int, Piece | Finished]]


async def _chunks(
    events: Events, chat: bool, model: str, include_usage: bool, choices: int, keys: Callable[[], AnswerKeys | None] = lambda: None
) -> AsyncIterator[dict[str, Any]]:
    """The chunks of `choices` interleaved choices (each event tagged with its choice's index): each
    choice's text as it comes, its finish reason, then the usage and the statistics once all have ended.
    `keys`: the target alone's fields beyond specapi's own (`answer_keys`), asked once the first event is
    out (by then the target has answered)."""
    chunker: Callable[..., dict[str, Any]] | None = None
    known: AnswerKeys | None = None
    started: set[int] = set()  # chat: the choices whose first delta (with the role) is out
    finished: dict[int, Finished] = {}

    def fields(index: int, text: str | None) -> dict[str, Any]:
        if not chat:
            return {"text": text or ""}
        delta = {} if text is None else {"content": text}
        if index not in started:
            started.add(index)
            delta = {"role": "assistant", "content": text or ""}
        return {"delta": delta}

    try:
        async for index, event in events:
            if chunker is None:
                known = keys()
                chunker = _chunker(chat, model, known)
            if isinstance(event, Piece):
                yield chunker(fields(index, event.text), None, index, event.logprobs)
                continue
            if not isinstance(event, Finished):  # the proxy's handover of a whole answer (AloneStream)
                yield {"_handover": event}
                continue
            finished[index] = event
            last = chunker(fields(index, None), event.finish_reason, index, event.logprobs)
            if len(finished) < choices:
                yield last
                continue
            ended = [finished[i] for i in sorted(finished)]
            if include_usage:
                yield last
                last = {**chunker(fields(index, None), None), "choices": [], "usage": usage(*ended)}
            elif event.stream_usage:
                last["usage"] = usage(*ended)  # as the target alone's stream ends (see Capabilities.stream_usage_unasked)
            answer_keys.fill_chunk(last, known, cached_tokens=ended[0].prompt_cached_tokens)
            last["_speculative"] = combined_stats([f.stats for f in ended])
            yield last
    finally:
        await events.aclose()  # type: ignore[attr-defined]


def completion_chunks(events: Events, model: str, include_usage: bool, choices: int = 1, keys: Callable[[], AnswerKeys | None] = lambda: None) -> AsyncIterator[dict[str, Any]]:
    return _chunks(events, False, model, include_usage, choices, keys)


def chat_chunks(events: Events, model: str, include_usage: bool, choices: int = 1, keys: Callable[[], AnswerKeys | None] = lambda: None) -> AsyncIterator[dict[str, Any]]:
    return _chunks(events, True, model, include_usage, choices, keys)


def parse_completion(data: dict[str, Any]) -> Completion:
    # Like the SDK's own streams: chunks are built without validation (a chunk's finish_reason is null).
    return Completion.construct(**data)


def parse_chat_chunk(data: dict[str, Any]) -> ChatCompletionChunk:
    return ChatCompletionChunk.construct(**data)
