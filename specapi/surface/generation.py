"""One speculated request, from the engine's events to what `create` returns: a stream of the SDK's
chunks, or one response collected from it.

The books kept around each request: it counts as in flight on every upstream it uses (what the
load-aware policy sees) until its events end, and its text is learnt into the suffix index once the
last event is out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from ..core import answer_keys
from ..transport._exceptions import ConfigurationError
from ..core.context import Context
from ..engine.engine import Engine
from ..engine.request import Finished, GenerationRequest, Piece
from ..core.load import current_request, new_request_id
from .responses import build, combined_stats, completion_data
from .runtime import Runtime
from .streaming import SpeculativeStream, chat_chunks, completion_chunks, parse_chat_chunk, parse_completion
from ..engine.target_alone import AloneStream
from .validation import prediction_text

__all__ = ["Speculation", "respond"]


async def respond(
    runtime: Runtime,
    chat: bool,
    context: Context,
    *,
    limit: int | None,
    stop: tuple[str, ...],
    kwargs: Mapping[str, Any],
    stream: bool,
    include_usage: bool,
    model: str,
) -> Any:
    """Run the engine, once per choice (`n`): a stream of chunks, or one response collected from it."""
    if runtime.acceptance.lossy:
        context = replace(context, sampling=replace(context.sampling, acceptance=runtime.acceptance))
    choices = choice_count(kwargs.get("n"))
    speculations = [_speculation(runtime, context, index, limit=limit, stop=stop, kwargs=kwargs, stream=stream, model=model) for index in range(choices)]
    if choices > 1:  # the proxy's handover relays one target stream as the whole answer: not one choice of several
        for speculation in speculations:
            speculation.engine.relay_alone = False
    # The target alone's fields, once the target has answered (a new client's first request probes it first).
    keys = functools.partial(answer_keys.template, (runtime.target.endpoint.base_url, model), chat, stream)
    if stream:
        chunks = chat_chunks if chat else completion_chunks
        return SpeculativeStream(chunks(interleaved(speculations), model, include_usage, choices, keys), parse_chat_chunk if chat else parse_completion)
    # Each choice its own run, at once: they share the prompt, which the target's prefix cache holds for all.
    answers = await asyncio.gather(*(speculation.collect() for speculation in speculations))
    data = answer_keys.fill(completion_data(chat, model, answers), keys(), cached_tokens=answers[0][1].prompt_cached_tokens)
    return build(runtime.target, chat, data, combined_stats([finished.stats for _, finished in answers]))


def choice_count(n: Any) -> int:
    """The caller's `n`: how many choices, each its own speculative run."""
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CHOICES:
        raise ConfigurationError(f"n must be an integer in [1, {MAX_CHOICES}], got {n!r}")
    return n


#: The most choices one request may ask for (OpenAI's limit).
MAX_CHOICES = 128


def _speculation(
    runtime: Runtime, context: Context, index: int, *, limit: int | None, stop: tuple[str, ...], kwargs: Mapping[str, Any], stream: bool, model: str
) -> Speculation:
    """Choice `index`'s run. A seeded request's choices draw with seeds of their own (the caller's, plus
    the choice's index): the same request gives the same choices again, and they differ from each other."""
    if index and context.seed is not None:
        context = replace(context, seed=context.seed + index)
    engine = runtime.engine(prediction=prediction_text(kwargs.get("prediction")), model=model, context=context, max_tokens=limit)
    return Speculation(runtime, engine, GenerationRequest(context=context, max_tokens=limit, stop=stop, stream=stream))


async def interleaved(speculations: Sequence[Speculation]) -> AsyncIterator[tuple[int, Piece | Finished]]:
    """The events of every choice's run, each tagged with its choice's index, as they come."""
    if len(speculations) == 1:
        async with contextlib.aclosing(speculations[0].events()) as events:
            async for event in events:
                yield 0, event
        return
    queue: asyncio.Queue[tuple[int, Piece | Finished] | BaseException | None] = asyncio.Queue()

    async def run(index: int, speculation: Speculation) -> None:
        try:
            async with contextlib.aclosing(speculation.events()) as events:
                async for event in events:
                    await queue.put((index, event))
            await queue.put(None)
        except BaseException as exc:  # handed to the reader, which raises it
            await queue.put(exc)
            raise

    tasks = [asyncio.ensure_future(run(index, speculation)) for index, speculation in enumerate(speculations)]
    try:
        running = len(tasks)
        while running:
            item = await queue.get()
            if item is None:
                running -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Speculation:
    """One request on its engine, with the books kept around it."""

    def __init__(self, runtime: Runtime, engine: Engine, request: GenerationRequest) -> None:
        self.runtime = runtime
        self.engine = engine
        self.request = request

    async def events(self) -> AsyncIterator[Piece | AloneStream | Finished]:
        engine, request = self.engine, self.request
        events = engine.generate(request)
        text: list[str] = []
        loads = [role.load for role in (engine.target, engine.draft_client) if role is not None]
        request_id = new_request_id()
        finished = False
        relayed: AloneStream | None = None
        for load in loads:
            load.enter(request_id)  # what the load-aware policy sees: requests in flight per upstream
        try:
            while True:
                # The request's id is set around each step, not once: a stream may be read on by
                # another task than the one that started it (the proxy reads the first chunk in the
                # request's handler and the rest in the response's task), and a context variable set
                # in the first would be missing in the second, where the policy would rank this
                # request last among those in flight.
                token = current_request.set(request_id)
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    current_request.reset(token)
                if isinstance(event, Piece):
                    text.append(event.text)
                elif isinstance(event, AloneStream):
                    relayed = event  # its text is known once the caller has relayed it
                else:
                    finished = True
                yield event
        finally:
            try:
                if finished:
                    # Learnt once the last event is out (whether the reader then asks for more or
                    # closes): a stream's end does not wait for it, and a proxy that finishes many
                    # streams at once does not hold each one's last bytes behind the others' learning.
                    answer = "".join(text) if relayed is None else "".join(text) + relayed.text
                    self.runtime.learn(request.context, answer, engine.target.endpoint.model)
            finally:
                for load in loads:
                    load.leave(request_id)
                await events.aclose()

    async def collect(self) -> tuple[str, Finished]:
        text = []
        async with contextlib.aclosing(self.events()) as events:  # closed here: it learns then
            async for event in events:
                if isinstance(event, Piece):
                    text.append(event.text)
                else:
                    return "".join(text), event
        raise RuntimeError("the engine ended without finishing")  # pragma: no cover
