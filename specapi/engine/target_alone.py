"""The target alone: one request in which the target generates by itself, as a step or a stream, and
what the engine does with such calls for one request (a step, the rest as a stream, the greedy
rewrite of an answer the target re-read differently, the whole-answer paths).

`plain_step`/`plain_stream` are the wire calls (exact by construction: the target's own text); the
functions below them read a `RequestState` (they never write it) and hand the engine `Emitted` tokens
to add, with what the call reported for the request's books (`AloneBooks`, `Rewrite`, `WholeAnswer`),
which the engine applies through `state.py`. `AloneStream` is a whole answer the engine hands to its
caller instead (`Engine(relay_alone=True)`, the proxy): the caller relays the target's chunks as they
come, and the engine settles the books.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from ..transport._calls import Clock, Meter, RoleClient
from ..core.acceptance import Emitted
from ..core.alignment import held_text, token_bytes
from ..core.context import Context
from ..dialects.base import UNREADABLE, reading
from ..dialects.openai import Prefill, generation_request, openai_format
from ..parts.drafters import Drafter
from .output import find_stop
from ..parts.verifiers import PlainStep
from ..parts.whole import PredictedOutputsPath, PrefixMatchPath
from ..core.stats import RoundRecord
from .state import AloneBooks, RequestState

__all__ = [
    "PlainStep",
    "plain_step",
    "plain_stream",
    "plain_stream_batches",
    "tokens_of",
    "can_stream",
    "target_call",
    "plain",
    "plain_streamed",
    "regenerate",
    "whole_answer",
    "Streamed",
    "Rewrite",
    "WholeAnswer",
    "AloneStream",
]

#: The longest plain step on token ids that waits for a character to end (see `plain`).
_MAX_COMPLETE_CHARACTER_STEP = 64
#: On text, the longest step asked again one token longer for a character to end; past it the target
#: writes the rest of the answer in one call (see `plain`).
_MAX_TEXT_STEP = 8


@dataclass(frozen=True)
class Streamed:
    """A batch of a stream the target writes alone: its tokens, the caller's `logprobs` objects that came
    with them (None: not asked), and on the last batch what the stream reported for the books."""

    tokens: list[Emitted]
    logprobs: list[Any] | None = None
    books: AloneBooks | None = None


@dataclass(frozen=True)
class Rewrite:
    """The answer written again alone from the prompt (`regenerate`): the tokens after the `kept`
    characters already handed out (None: it does not begin with them), and its prompt's billed count."""

    tokens: list[Emitted] | None
    kept: int
    prompt_tokens: int | None


@dataclass(frozen=True)
class WholeAnswer:
    """A whole-answer path's answer: its text (cut at a stop string), its finish reason, the tokens the
    target generated, the round's record (if it drafted) and the prompt's billed count."""

    text: str
    finish_reason: str
    completion_tokens: int
    record: RoundRecord | None
    prompt_tokens: int | None


async def plain_step(
    client: RoleClient,
    context: Context,
    max_tokens: int | None,
    meter: Meter,
    seed: int | None,
    stop: tuple[str, ...],
    *,
    count_tokens: bool = False,
    prefill: Prefill = Prefill(),
    whole_runs: bool = False,
) -> PlainStep:
    """The target alone generates up to `max_tokens` tokens from the context (exact by construction).

    With `count_tokens`, logprobs are requested just to count the tokens exactly; an end-of-text
    token counts, as servers count it in usage (the target alone's usage does). With `whole_runs`, the
    text is cut back to the tokens whose logprobs were listed (see `_whole_runs`).
    """
    form = openai_format(context)
    asks = (count_tokens and max_tokens != 1) or whole_runs
    path, body = generation_request(context, max_tokens, seed, stop, prefill, count_tokens=asks)
    started = client.clock()
    response = await client.post(path, body, meter, options=context.options)
    latency = client.clock() - started
    with reading(client, "generation"):
        choice = response["choices"][0]
        text = form.text(choice, context.accepted, prefill)
    if whole_runs and choice.get("finish_reason") == "length":
        text = _whole_runs(form, choice, text)
    usage = response.get("usage") or {}
    completion = usage.get("completion_tokens")
    if max_tokens == 1 and choice.get("finish_reason") != "length":
        completion = 1  # the one token: text, a stop string's last token or the end of text
    elif count_tokens:
        try:
            completion = len(form.tokens(choice))
        except UNREADABLE:
            pass  # keep the billed count
    scored = None
    if context.logprobs is not None:
        with reading(client, "generation logprobs"):
            scored = tuple(form.tokens(choice))  # the caller's logprobs: every token's, as the target wrote them
    return PlainStep(
        text=text,
        finish_reason=choice.get("finish_reason"),
        completion_tokens=completion if isinstance(completion, int) else 0,
        prompt_tokens=usage.get("prompt_tokens"),
        latency_s=latency,
        scored=scored,
        logprobs=choice.get("logprobs") if scored is not None else None,
    )


def _whole_runs(form: Any, choice: Mapping[str, Any], text: str) -> str:
    """The text up to the end of the last token run the server listed logprobs for. llama-server's chat
    content leaves out the bytes of an unfinished character silently (no U+FFFD), and its logprobs list a
    run of tokens that straddle characters as one entry only once the run ends: text past the listed runs
    ended inside a token, and continuing it as text would re-tokenize it otherwise than the target
    generated it (so it is asked again with more tokens, as a partial character is). Unreadable
    logprobs: the text as it is."""
    if choice.get("logprobs") is None:
        listed = b""  # asked, and none listed: no run ended within the step
    else:
        try:
            listed = b"".join(token.data for token in form.tokens(choice))
        except UNREADABLE:
            return text
    data = text.encode("utf-8")
    return listed.decode("utf-8") if data.startswith(listed) and len(listed) < len(data) else text


def first_choice(chunk: Mapping[str, Any], usage: dict | None) -> Iterator[Mapping[str, Any]]:
    """A stream chunk's choice 0 (a request of one choice: any other is not ours), the usage it
    carries copied into `usage` on the way."""
    if usage is not None and isinstance(chunk.get("usage"), dict):
        usage.update(chunk["usage"])
    for choice in chunk.get("choices") or ():
        if choice.get("index", 0) == 0:
            yield choice


async def plain_stream_batches(
    client: RoleClient,
    context: Context,
    max_tokens: int | None,
    meter: Meter,
    seed: int | None,
    stop: tuple[str, ...],
    *,
    prefill: Prefill = Prefill(),
    usage: dict | None = None,
    logprobs: list | None = None,
) -> AsyncIterator[list[tuple[str, str | None]]]:
    """`plain_stream`'s `(text, finish_reason)` pairs, those of chunks that arrived together in one
    list (see `RoleClient.stream_batches`). Does not check that a finish_reason came. The chunks'
    `logprobs` objects (the caller's, when it asked) are appended to `logprobs`, in order."""
    form = openai_format(context)
    path, body = generation_request(context, max_tokens, seed, stop, prefill, stream_usage=True)
    async with contextlib.aclosing(client.stream_batches(path, body, meter, options=context.options)) as batches:
        async for chunks in batches:
            out: list[tuple[str, str | None]] = []
            for chunk in chunks:
                for choice in first_choice(chunk, usage):
                    text = form.delta(choice)
                    finish = choice.get("finish_reason")
                    if logprobs is not None and choice.get("logprobs") is not None:
                        logprobs.append(choice["logprobs"])
                    if text or finish is not None:
                        out.append((text, finish))
            if out:
                yield out


async def plain_stream(
    client: RoleClient,
    context: Context,
    max_tokens: int | None,
    meter: Meter,
    seed: int | None,
    stop: tuple[str, ...],
    *,
    prefill: Prefill = Prefill(),
    usage: dict | None = None,
) -> AsyncIterator[tuple[str, str | None]]:
    """Like `plain_step`, streamed: yields `(text, finish_reason)` per chunk (finish_reason None until
    the end). The billed usage, when the server sends it, is copied into `usage`."""
    finished = False
    batches = plain_stream_batches(client, context, max_tokens, meter, seed, stop, prefill=prefill, usage=usage)
    async with contextlib.aclosing(batches):
        async for batch in batches:
            for text, finish in batch:
                finished = finished or finish is not None
                yield text, finish
    if not finished:
        raise client.malformed("the stream ended without a finish_reason: the text may be incomplete")


def tokens_of(step: PlainStep, asked: int | None) -> int:
    """The target tokens a plain step produced. At its limit a server stopped at the tokens it was
    allowed, or past them to finish a character (llama-cpp-python), or before them at the end of its
    context window (llama-server): its own count says which."""
    if step.finish_reason == "length" and asked is not None:
        return step.completion_tokens or asked
    return step.completion_tokens or (1 if step.text else 0)


def can_stream(state: RequestState, context: Context) -> bool:
    """Streaming a target-alone step needs no prefix handling the stream could get wrong, and a context
    kept as token ids is continued from its ids (one plain call)."""
    if context.token_ids is not None and state.verifier is not None and state.verifier.sends_token_ids:
        return False
    if context.logprobs is not None:
        # The caller's logprobs: a stream of the whole answer passes the target's own on as they come;
        # later steps bring them with each step's tokens (see `_step_tokens`).
        return not context.accepted and not state.rounds
    return not (context.is_chat and context.accepted and state.prefill.echoes_prefix)


async def target_call(
    target: RoleClient, clock: Clock, state: RequestState, context: Context, max_tokens: int | None, seed: int | None, *,
    streamed: bool, count_tokens: bool = False, whole_runs: bool = False, last: bool = True,
) -> PlainStep:
    """One target-alone call; `streamed` asks it as a stream and collects it, so that the text is
    rendered as a streaming caller would receive it. `last`: no text follows the step's (the caller's
    limit ends it), so it ends as the server renders it, inside a character or not."""
    stop = state.request.stop
    verifier = state.verifier
    if verifier is not None and verifier.sends_token_ids and context.token_ids is not None:
        step: PlainStep = await verifier.plain(context, max_tokens, state.target_meter, seed, stop, streamed=streamed, whole_characters=not last)
        return step
    if not streamed or not can_stream(state, context) or context.logprobs is not None:
        return await plain_step(
            target, context, max_tokens, state.target_meter, seed, stop, count_tokens=count_tokens, prefill=state.prefill, whole_runs=whole_runs
        )
    texts: list[str] = []
    finish: str | None = None
    usage: dict = {}
    started = clock()
    stream = plain_stream(target, context, max_tokens, state.target_meter, seed, stop, prefill=state.prefill, usage=usage)
    async with contextlib.aclosing(stream) as chunks:
        async for text, finish_reason in chunks:
            texts.append(text)
            finish = finish_reason or finish
    prompt_tokens = usage.get("prompt_tokens")
    return PlainStep(
        text="".join(texts),
        finish_reason=finish,
        completion_tokens=int(usage.get("completion_tokens") or 0),
        prompt_tokens=prompt_tokens if isinstance(prompt_tokens, int) else None,
        latency_s=clock() - started,
    )


async def plain(
    target: RoleClient, clock: Clock, state: RequestState, context: Context, step_tokens: int | None, seed: int | None
) -> tuple[list[Emitted], AloneBooks]:
    """The target alone generates: one token while speculating, everything that remains otherwise
    (`seed`: `RequestState.step_seed`, so that a step asked again draws the same tokens).

    A step that stops inside a character (its text empty or ending in U+FFFD, depending on the
    server) is asked again for one more token with the same seed, until the text ends on a complete
    character or reaches the caller's limit, where the server's own rendering is the answer.
    """
    out = state.out
    remaining = out.remaining
    counting = state.verifier is not None and state.verifier.counts_plain_tokens
    asked: list[Any] = []  # each call's logprobs object: only the last step's text goes into the answer
    while True:
        # The caller's last tokens, streamed to a streaming caller: servers drop an unfinished
        # character from a stream where a plain answer shows U+FFFD.
        last = remaining is not None and step_tokens is not None and step_tokens >= remaining
        # llama-server's chat hides where a step ended inside a token: a step that the text goes on from
        # is cut back to whole token runs (`_whole_runs`).
        whole_runs = state.whole_runs and context.is_chat and not last
        step = await target_call(
            target, clock, state, context, step_tokens, seed, streamed=state.request.stream and last, count_tokens=counting, whole_runs=whole_runs,
            last=last,
        )
        asked.append(step.logprobs)
        # Text goes on only from text the target would read back as its own bytes: not from inside a
        # character, nor past a U+FFFD a server wrote for bytes that are no character (on token ids the
        # ids go on, whatever the text shows).
        unreadable = step.text.endswith("\ufffd") if step.ids is not None else "\ufffd" in step.text
        partial = step.finish_reason == "length" and (not step.text or unreadable)
        if not partial or step_tokens is None or last:
            break
        if step.ids is None:
            if step_tokens >= _MAX_TEXT_STEP:
                # Text goes on only from a whole character: past a few tokens, the target writes the
                # rest of the answer in this one call (the caller's last tokens).
                step_tokens = remaining
                continue
            step_tokens += 1
        else:
            # Token ids: a run of characters that each straddle a token boundary can be long, and
            # the text only ends complete where one of them ends; each longer step reuses the cache.
            if step_tokens >= _MAX_COMPLETE_CHARACTER_STEP:
                break
            step_tokens = min(2 * step_tokens, _MAX_COMPLETE_CHARACTER_STEP if remaining is None else remaining)
    assert state.policy is not None
    state.policy.observe_plain(step.completion_tokens, step.latency_s)
    books = AloneBooks(context, out.produced, step.prompt_tokens, state.target_meter.last_usage, tuple(asked))
    return _step_tokens(step, step_tokens, remaining), books


def _step_tokens(step: PlainStep, step_tokens: int | None, remaining: int | None) -> list[Emitted]:
    """A plain step as the tokens it adds: its text (counted as the server counts it), then its end."""
    new: list[Emitted] = []
    count = len(step.ids) if step.ids is not None and step.finish_reason == "length" else tokens_of(step, step_tokens)
    if remaining is not None:
        count = min(count, remaining)
    scored = _scored_tokens(step, count)
    if scored:
        new += scored  # the caller's logprobs: one token at a time, each with the target's scores
        count -= len(scored)  # what remains is the end of text's, where the server counts it
    elif step.text or (step.finish_reason == "length" and count):
        data = step.data if step.data is not None else step.text.encode("utf-8")
        new.append(Emitted(token=step.text, data=data, count=max(count, 1), ids=step.ids))
        count = 0  # counted with the text
    window_end = step.finish_reason == "length" and step_tokens is not None and 0 < (step.completion_tokens or 0) + step.held_back < step_tokens
    if step.finish_reason != "length" or step_tokens is None or window_end:
        # A step of no text that ended still generated its end-of-text token, when its server says so;
        # one that stopped short of its limit with "length" met the end of the context window.
        new.append(Emitted(token="", data=b"", eos=True, finish_reason=step.finish_reason or "stop", count=count))
    return new


def _scored_tokens(step: PlainStep, count: int) -> list[Emitted] | None:
    """A step's tokens one by one with their scores (the caller asked for logprobs), when they spell its
    text (the last ones may go past a stop string the server cut) and its count holds them; else None."""
    if step.tokens is not None:  # rendered by the server, each holding its share of the text (token ids)
        return list(step.tokens) if 0 <= count - len(step.tokens) <= (0 if step.finish_reason == "length" else 1) else None
    if not step.scored or not 0 <= count - len(step.scored) <= (0 if step.finish_reason == "length" else 1):
        return None  # the list is not one entry per counted token (the end of text may be left out)
    shown = [token_bytes(token.text) for token in step.scored]
    if any(data is None for data in shown):
        return None
    text = step.data if step.data is not None else step.text.encode("utf-8")
    if not b"".join(shown).startswith(text):  # type: ignore[arg-type]
        # Tokens rendered "" (parts of a character) and text no token shows (U+FFFD): each token holds
        # its share of the server's text.
        held = held_text(shown, text, last_holds_rest=step.finish_reason != "length")  # type: ignore[arg-type]
        if held is None:
            return None
        shown = held  # type: ignore[assignment]
    return [
        Emitted(token=token.text, data=data, logprob=token.logprob, top=dict(token.top or {}), ids=(token.id,) if token.id is not None else None)  # type: ignore[arg-type]
        for token, data in zip(step.scored, shown)
    ]


async def plain_streamed(
    target: RoleClient, clock: Clock, state: RequestState, context: Context, remaining: int | None, produced: int, seed: int | None
) -> AsyncIterator[Streamed]:
    """The target alone generates the rest as a stream (`seed`: `RequestState.plain_seed`). A chunk's text
    counts as one token (servers stream token by token); when the server stops at the limit, the count
    is settled to it. The last batch yielded carries the stream's books."""
    assert state.policy is not None
    usage: dict = {}
    # The caller's logprobs: the target's own, handed on with the text (`RequestState.piece_logprobs`).
    caller: list[Any] | None = [] if context.logprobs is not None else None
    # Chunks that arrived together (the reader fell behind, under load) go on as one piece: the
    # same tokens, counted one by one, with the work per piece (and per chunk sent on) done once.
    batches = plain_stream_batches(
        target, context, remaining, state.target_meter, seed, state.request.stop, prefill=state.prefill, usage=usage, logprobs=caller,
    )
    chunks = 0
    started = clock()
    last: float | None = None  # when the previous batch with text arrived
    finished = stopped_at_length = False
    async with contextlib.aclosing(batches) as stream:
        async for batch in stream:
            new = []
            before = chunks
            for text, finish_reason in batch:
                if text:
                    chunks += 1
                    new.append(Emitted(token=text, data=text.encode("utf-8")))
                if finish_reason == "length":
                    pass  # settled below, from the server's own count
                elif finish_reason is not None:
                    new.append(Emitted(token="", data=b"", eos=True, finish_reason=finish_reason, count=0))
                if finish_reason is not None:
                    finished = True
                    stopped_at_length = finish_reason == "length"
                    # What the target alone costs is what the policy compares speculation with.
                    state.policy.observe_plain(remaining if finish_reason == "length" and remaining else chunks, clock() - started)
            if chunks > before:
                now = clock()
                if last is not None:  # the gap after the first token: the pace the target writes at now
                    target.load.pace((now - last) / (chunks - before))
                last = now
            if new:
                yield Streamed(new, _taken(caller))
    if not finished:
        raise target.malformed("the stream ended without a finish_reason: the text may be incomplete")
    settle = _settled_count(usage, chunks, remaining, stopped_at_length)
    prompt_tokens = usage.get("prompt_tokens")
    # Streamed text is out before the usage arrives: a split found here can only be reported.
    books = AloneBooks(context, produced, prompt_tokens if isinstance(prompt_tokens, int) else None, state.target_meter.last_usage)
    yield Streamed([Emitted(token="", data=b"", count=settle)] if settle > 0 else [], _taken(caller), books)


def _taken(objects: list[Any] | None) -> list[Any] | None:
    """The objects gathered so far, the list emptied for the next ones (None stays None)."""
    if objects is None:
        return None
    taken = objects.copy()
    objects.clear()
    return taken


def _settled_count(usage: dict, chunks: int, remaining: int | None, stopped_at_length: bool) -> int:
    """The tokens a stream produced beyond its chunks. A chunk is a token, but not every token is a
    chunk (a character of several tokens, the end of text, a stop string): the server's count settles
    it; without one, a "length" end is the limit."""
    billed = usage.get("completion_tokens")
    if isinstance(billed, int) and not isinstance(billed, bool) and billed > 0:
        return billed - chunks
    return remaining - chunks if remaining is not None and stopped_at_length else 0


async def regenerate(target: RoleClient, clock: Clock, state: RequestState) -> Rewrite:
    """Greedy text from the prompt in one target call, rendered as the caller receives it (streamed
    or not): it replaces everything not yet handed out. Its tokens are None when it does not begin with
    the text already handed out (then the response stays marked approximate)."""
    request, out = state.request, state.out
    step = await target_call(target, clock, state, request.context, request.max_tokens, None, streamed=request.stream)
    text, finish = step.text, step.finish_reason
    kept = out.sent if request.stream else 0  # a collected response has handed out nothing yet
    sent = out.text[:kept]
    if not text.startswith(sent):
        return Rewrite(None, kept, step.prompt_tokens)
    tokens = [t for t in _step_tokens(step, request.max_tokens, request.max_tokens) if not t.eos]  # with the caller's logprobs
    skipped, skipped_count = b"", 0
    while tokens and len(skipped) < len(sent.encode("utf-8")):
        token = tokens.pop(0)
        skipped, skipped_count = skipped + token.data, skipped_count + token.count
    if skipped == sent.encode("utf-8"):
        # The tokens after what was handed out, each with its scores; the end counts the ones before.
        return Rewrite([*tokens, Emitted(token="", data=b"", eos=True, finish_reason=finish or "stop", count=skipped_count)], kept, step.prompt_tokens)
    rest = text[len(sent) :]
    return Rewrite(
        [
            Emitted(token=rest, data=rest.encode("utf-8"), count=tokens_of(step, request.max_tokens)),
            Emitted(token="", data=b"", eos=True, finish_reason=finish or "stop", count=0),
        ],
        kept,
        step.prompt_tokens,
    )


async def whole_answer(
    target: RoleClient, path: PredictedOutputsPath | PrefixMatchPath, state: RequestState, drafter: Drafter
) -> WholeAnswer:
    """Whole-answer paths: one draft and one target call; the target's text is the answer."""
    request = state.request
    draft_meter = state.draft_meter if state.draft_meter is not None else Meter(target.endpoint)
    # The target writes the whole text itself here: it gets the caller's seed unchanged.
    seeds = (state.seed(), request.context.seed)
    result = await path.run(request.context, drafter, draft_meter, state.target_meter, request.max_tokens, seeds, request.stop)
    text, finish = result.text, result.finish_reason
    cut = find_stop(text, request.stop, 0)
    if cut is not None:
        text, finish = text[:cut], "stop"
    return WholeAnswer(text, finish, result.completion_tokens, result.record, result.prompt_tokens)


class AloneStream:
    """A whole answer the target writes alone, handed to the engine's caller to relay as the target
    sends it (`Engine(relay_alone=True)`; the proxy, `specapi/server/relay.py`).

    `batches()` opens the target's stream (the request the engine would send, usage asked) and yields
    its chunks as the target sent them, those that arrived together in one list, recording on the way
    what the engine's own stream records: the text (learnt into the suffix index), when it began, the
    pace between tokens, the finish reason and the billed usage. A stream that ends without a
    finish_reason raises the target's malformed-response error. Once the caller has read it to its end,
    the engine resumes and `settle`s the request from those records."""

    def __init__(
        self, target: RoleClient, clock: Clock, state: RequestState, context: Context, remaining: int | None, seed: int | None
    ) -> None:
        self.target = target
        self._clock = clock
        self._form = openai_format(context)
        self._context = context
        self.path, self.body = generation_request(
            context, remaining, seed, state.request.stop, state.prefill, stream_usage=True
        )
        self._options = context.options
        self._meter = state.target_meter
        self._remaining = remaining
        self.texts: list[str] = []  # the text of each chunk that had some
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] = {}  # the target's bill, as it sent it
        self.started = clock()
        self.first_text_at: float | None = None
        self._finished_at: float | None = None

    @property
    def text(self) -> str:
        return "".join(self.texts)

    async def batches(self) -> AsyncIterator[list[dict[str, Any]]]:
        target, clock, form, texts = self.target, self._clock, self._form, self.texts
        last: float | None = None  # when the previous batch with text arrived
        stream = target.stream_batches(self.path, self.body, self._meter, options=self._options)
        async with contextlib.aclosing(stream) as batches:
            async for batch in batches:
                before = len(texts)
                for chunk in batch:
                    for choice in first_choice(chunk, self.usage):
                        text = form.delta(choice)
                        if text:
                            texts.append(text)
                        if choice.get("finish_reason") is not None and self.finish_reason is None:
                            self.finish_reason = choice["finish_reason"]
                            self._finished_at = clock()
                if len(texts) > before:
                    now = clock()
                    if last is None:
                        self.first_text_at = self.first_text_at or now
                    else:  # the gap after the first token: the pace the target writes at now
                        target.load.pace((now - last) / (len(texts) - before))
                    last = now
                yield batch
        if self.finish_reason is None:
            raise target.malformed("the stream ended without a finish_reason: the text may be incomplete")

    def settle(self, state: RequestState) -> tuple[list[list[Emitted]], AloneBooks]:
        """The relayed answer as `plain_streamed` gives it: the token lists to add to the output in turn,
        and what goes into the request's books."""
        finish = self.finish_reason
        if finish is None or self._finished_at is None:
            raise self.target.malformed("the stream handed over ended without a finish_reason: the text may be incomplete")
        chunks = len(self.texts)
        tokens = [Emitted(token=text, data=text.encode("utf-8")) for text in self.texts]
        if finish != "length":
            tokens.append(Emitted(token="", data=b"", eos=True, finish_reason=finish, count=0))
        assert state.policy is not None
        state.policy.observe_plain(self._remaining if finish == "length" and self._remaining else chunks, self._finished_at - self.started)
        settle = _settled_count(self.usage, chunks, self._remaining, finish == "length")
        prompt_tokens = self.usage.get("prompt_tokens")
        books = AloneBooks(self._context, 0, prompt_tokens if isinstance(prompt_tokens, int) else None, state.target_meter.last_usage)
        return [tokens, [Emitted(token="", data=b"", count=settle)]] if settle > 0 else [tokens], books
