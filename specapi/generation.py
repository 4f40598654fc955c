"""One speculated request, from the engine's events to what `create` returns: a stream of the SDK's
chunks, or one response collected from it.

The books kept around each request: it counts as in flight on every upstream it uses (what the
load-aware policy sees) until its events end, and its text is learnt into the suffix index once the
last event is out.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import replace
from typing import Any

from .context import Context
from .engine import Engine
from .request import Finished, GenerationRequest, Piece
from .load import current_request, new_request_id
from .responses import build, completion_data
from .runtime import Runtime
from .streaming import SpeculativeStream, chat_chunks, completion_chunks, parse_chat_chunk, parse_completion
from .target_alone import AloneStream
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
    """Run the engine: a stream of chunks, or one response collected from it."""
    if runtime.acceptance.lossy:
        context = replace(context, sampling=replace(context.sampling, acceptance=runtime.acceptance))
    engine = runtime.engine(prediction=prediction_text(kwargs.get("prediction")), model=model, context=context, max_tokens=limit)
    request = GenerationRequest(context=context, max_tokens=limit, stop=stop, stream=stream)
    speculation = Speculation(runtime, engine, request)
    if stream:
        if chat:
            return SpeculativeStream(chat_chunks(speculation.events(), model, include_usage), parse_chat_chunk)
        return SpeculativeStream(completion_chunks(speculation.events(), model, include_usage), parse_completion)
    text, finished = await speculation.collect()
    return build(runtime.target, chat, completion_data(chat, model, text, finished), finished.stats)


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
