"""The round loop: draft, verify, accept, repeat. One async generator drives every request.

`generate` yields a `Piece` of text each time the target has accepted some, then a final `Finished`
with the statistics; `client.py` collects them into a response or a stream. All the decisions are pure
functions (`acceptance.decide_round`); this module only sequences the calls and keeps the books.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field, replace

from ._calls import Clock, Meter, RoleClient
from ._exceptions import DraftError, EndpointError, MalformedResponseError
from .acceptance import Emitted, decide_round
from .alignment import complete_utf8_prefix, token_bytes
from .context import Context, Prefill
from .drafters import Draft, Drafter, ModelDrafter
from .policy import RECHECK, TARGET_ALONE, DraftLengthPolicy, PolicyState
from .sampling import COVERAGE_TOLERANCE
from .stats import RoleUsage, RoundRecord, SpeculativeStats
from .paths import Path, PathResolver
from .verifiers import Verification, Verifier, plain_step, plain_stream

__all__ = ["GenerationRequest", "Piece", "Finished", "Engine"]


@dataclass(frozen=True)
class GenerationRequest:
    context: Context
    max_tokens: int
    stop: tuple[str, ...] = ()
    stream: bool = False  # the caller streams: a final target-alone step is streamed too


@dataclass(frozen=True)
class Piece:
    """Text the target accepted, ready to hand out."""

    text: str


@dataclass(frozen=True)
class Finished:
    finish_reason: str
    stats: SpeculativeStats
    prompt_tokens: int | None
    completion_tokens: int


@dataclass
class _Books:
    """Mutable per-request bookkeeping."""

    rounds: list[RoundRecord] = field(default_factory=list)
    fallback_reason: str | None = None
    inexact_reason: str | None = None
    max_gap: float = 0.0
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    path_note: str | None = None
    boundaries_checked: int = 0  # how many of the output's token starts a scored prompt has confirmed


@dataclass
class _Output:
    """The text so far: applies new tokens (end of text, max_tokens, stop strings) and says what may
    be handed out. A tail that could still grow into a stop string is held back, so nothing that may
    be cut is ever sent."""

    request: GenerationRequest
    context: Context
    text: str = ""
    sent: int = 0
    produced: int = 0
    finish_reason: str = "length"
    ended: bool = False
    #: Byte offsets in the generated text where a single target token began (0: the prompt's end).
    token_starts: list[int] = field(default_factory=lambda: [0])
    generated_bytes: int = 0

    def add(self, new: list[Emitted]) -> str:
        request = self.request
        before = len(self.text)
        for index, token in enumerate(new):
            if token.eos:
                self.finish_reason, self.ended = "stop", True
                break
            if token.data:
                if token.count == 1 and self.token_starts[-1] != self.generated_bytes:
                    self.token_starts.append(self.generated_bytes)
                self.generated_bytes += len(token.data)
            self.produced += token.count
            self.text += token.data.decode("utf-8")
            if self.produced >= request.max_tokens:
                # The end of text right after the last allowed token still counts as a stop.
                if any(t.eos for t in new[index + 1 : index + 2]):
                    self.finish_reason, self.ended = "stop", True
                break
        cut = _find_stop(self.text, request.stop, before)
        if cut is not None:
            self.text = self.text[:cut]
            self.finish_reason, self.ended = "stop", True
        self.context = self.context.advanced(self.text[before:])
        done = self.ended or self.produced >= request.max_tokens
        safe = len(self.text) if done else len(self.text) - _stop_prefix_len(self.text, request.stop)
        if safe <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent : safe], safe
        return piece


@dataclass
class _Run:
    """Everything one request's rounds share."""

    request: GenerationRequest
    rng: random.Random
    seeded: bool
    target_meter: Meter
    draft_meter: Meter | None
    books: _Books
    top_k: int

    def seed(self) -> int | None:
        """A seed for the next call, drawn from the request's seed so that runs repeat."""
        return self.rng.randrange(2**31) if self.seeded else None


@dataclass
class _Prefetch:
    """A draft of the next round started while the current one is verified (pipelined drafting)."""

    task: asyncio.Task[Draft]
    assumed: str  # the accepted text the prefetched draft continues

    @classmethod
    def start(cls, drafter: Drafter, context: Context, k: int, run: _Run) -> _Prefetch:
        assert run.draft_meter is not None
        task = asyncio.ensure_future(drafter.draft(context, k, run.draft_meter, run.seed()))
        return cls(task=task, assumed=context.accepted)

    def take(self, context: Context, k: int, clock: Clock) -> Awaitable[Draft | None] | None:
        """The prefetched draft minus the tokens the round already produced, if the guess held."""
        if not context.accepted.startswith(self.assumed):
            self.task.cancel()
            return None
        produced = context.accepted[len(self.assumed) :].encode("utf-8")

        async def usable() -> Draft | None:
            started = clock()
            try:
                draft = await self.task
            except Exception:
                return None  # a failed guess costs nothing but the call: draft afresh
            skipped, offset = 0, 0
            while offset < len(produced) and skipped < len(draft.tokens):
                offset += len(draft.tokens[skipped].data)
                skipped += 1
            if draft.text.encode("utf-8")[: len(produced)] != produced or offset != len(produced):
                return None
            rest = draft.tokens[skipped : skipped + k]
            return Draft(tokens=rest, latency_s=clock() - started, drafter=draft.drafter + "+pipelined") if rest else None

        return usable()

    async def cancel(self) -> None:
        if not self.task.done():
            self.task.cancel()
        try:
            await self.task
        except BaseException:
            pass


class Engine:
    """Runs requests against one target (and optionally one drafter) with one verifier and one policy."""

    def __init__(
        self,
        *,
        target: RoleClient,
        paths: PathResolver,
        drafter: Drafter | None,
        draft_meter_endpoint: RoleClient | None,
        policy: DraftLengthPolicy,
        clock: Clock = time.perf_counter,
        pipeline: bool = True,
        chat: bool = False,
        stream_plain: bool = True,
    ) -> None:
        self.stream_plain = stream_plain
        self.pipeline = pipeline
        self.target = target
        self.paths = paths
        self.chat = chat
        self.verifier: Verifier | None = None
        self.prefill = Prefill()
        self.drafter = drafter
        self.draft_client = draft_meter_endpoint
        self.policy = policy
        self.clock = clock

    async def generate(self, request: GenerationRequest, *, unverifiable_reason: str | None = None) -> AsyncIterator[Piece | Finished]:
        started = self.clock()
        run = _Run(
            request=request,
            rng=random.Random(request.context.seed),
            seeded=request.context.seed is not None,
            target_meter=Meter(self.target.endpoint),
            draft_meter=Meter(self.draft_client.endpoint) if self.draft_client else None,
            books=_Books(fallback_reason=unverifiable_reason),
            top_k=1 if request.context.sampling.greedy else self.target.endpoint.max_logprobs,
        )
        path = await self.paths.resolve(self.chat, run.target_meter) if unverifiable_reason is None and self.drafter else Path("none")
        run.books.path_note = path.note
        self.prefill = path.prefill
        if path.whole is not None:
            async for event in self._whole(path, request, run, started):
                yield event
            return
        self.verifier = path.verifier
        if path.max_logprobs is not None:
            run.top_k = min(run.top_k, path.max_logprobs)
        if path.raw_logprobs is not None and not request.context.sampling.greedy:
            sampling = replace(request.context.sampling, raw_logprobs=path.raw_logprobs)
            request = replace(request, context=replace(request.context, sampling=sampling))
            run.request = request
        speculate = self.verifier is not None and self.drafter is not None and unverifiable_reason is None
        mode = self.policy.start_request() if speculate else TARGET_ALONE
        if speculate and mode == TARGET_ALONE:
            speculate = False
            run.books.fallback_reason = getattr(self.policy, "reason", "") or "the draft-length policy chose the target alone"
        out = _Output(request=request, context=request.context)
        prefetch: _Prefetch | None = None
        try:
            while not out.ended and out.produced < request.max_tokens:
                remaining = request.max_tokens - out.produced
                context = out.context
                k = 0
                if speculate:
                    chosen = self.policy.choose(PolicyState(remaining, len(run.books.rounds), recheck=mode == RECHECK))
                    if chosen <= 0:
                        speculate = False  # the policy predicts the target alone is faster from here
                        run.books.fallback_reason = run.books.fallback_reason or (
                            getattr(self.policy, "reason", "") or "the draft-length policy turned speculation off"
                        )
                    k = min(chosen, remaining - 1)
                new: list[Emitted] = []
                if k > 0:
                    draft = prefetch.take(context, k, self.clock) if prefetch is not None else None
                    if draft is not None:
                        draft = await draft
                    prefetch = None
                    if draft is None:
                        draft = await self._draft(context, k, run)
                    if draft is None:
                        speculate = False
                        continue
                    if draft.tokens:
                        model = _model_drafter(self.drafter, draft)
                        if self.pipeline and model is not None and run.draft_meter is not None:
                            # Guess that every draft token is kept, and draft the next round meanwhile.
                            prefetch = _Prefetch.start(model, context.advanced(draft.text), k + 1, run)
                        outcome = await self._round(context, draft, run, out.token_starts, out.produced)
                        if outcome is None:
                            speculate = False
                            continue
                        new = outcome
                if not new and not speculate and request.stream and self._can_stream(context):
                    # The target alone finishes the text: stream it, so that text arrives as it is made.
                    async for tokens in self._plain_stream(context, remaining, run):
                        piece = out.add(tokens)
                        if piece:
                            run.books.ttft_s = run.books.ttft_s if run.books.ttft_s is not None else self.clock() - started
                            yield Piece(text=piece)
                    out.ended = True
                    continue
                if not new:
                    new = await self._plain(context, 1 if speculate else remaining, remaining, run)
                piece = out.add(new)
                if piece:
                    run.books.ttft_s = run.books.ttft_s if run.books.ttft_s is not None else self.clock() - started
                    yield Piece(text=piece)
        finally:
            if prefetch is not None:
                await prefetch.cancel()

        yield self._finished(run, started, out.finish_reason, out.produced)

    def _finished(self, run: _Run, started: float, finish_reason: str, produced: int) -> Finished:
        books = run.books
        if not books.rounds and books.fallback_reason is None and books.path_note:
            books.fallback_reason = books.path_note
        stats = SpeculativeStats(
            rounds=tuple(books.rounds),
            draft=run.draft_meter.snapshot() if run.draft_meter else RoleUsage(),
            target=run.target_meter.snapshot(),
            exact=books.inexact_reason is None,
            exact_reason=books.inexact_reason,
            speculated=bool(books.rounds),
            fallback_reason=books.fallback_reason,
            verification=getattr(self.verifier, "name", "none") if books.rounds else "none",
            generated_tokens=produced,
            wall_s=self.clock() - started,
            ttft_s=books.ttft_s,
            max_coverage_gap=books.max_gap,
        )
        return Finished(finish_reason=finish_reason, stats=stats, prompt_tokens=books.prompt_tokens, completion_tokens=produced)

    async def _whole(self, path: Path, request: GenerationRequest, run: _Run, started: float) -> AsyncIterator[Piece | Finished]:
        """Whole-answer paths: one draft and one target call; the target's text is the answer."""
        assert self.drafter is not None
        self.verifier = path.whole
        draft_meter = run.draft_meter if run.draft_meter is not None else Meter(self.target.endpoint)
        result = await path.whole.run(
            request.context, self.drafter, draft_meter, run.target_meter, request.max_tokens, (run.seed(), run.seed()), list(request.stop) or None
        )
        text, finish = result.text, result.finish_reason
        cut = _find_stop(text, request.stop, 0)
        if cut is not None:
            text, finish = text[:cut], "stop"
        if result.record is not None:
            run.books.rounds.append(result.record)
        run.books.prompt_tokens = result.prompt_tokens
        if text:
            run.books.ttft_s = self.clock() - started
            yield Piece(text=text)
        yield self._finished(run, started, finish, result.completion_tokens)

    def _can_stream(self, context: Context) -> bool:
        """Streaming the last step needs no prefix handling the stream could get wrong."""
        return self.stream_plain and not (context.is_chat and context.accepted and self.prefill.echoes_prefix)

    async def _plain_stream(self, context: Context, remaining: int, run: _Run) -> AsyncIterator[list[Emitted]]:
        """The target alone generates the rest as a stream. A chunk's text counts as one token (servers
        stream token by token); when the server stops at the limit, the count is settled to it."""
        pieces = plain_stream(
            self.target, context, remaining, run.target_meter, run.seed(), list(run.request.stop) or None, prefill=self.prefill
        )
        chunks = 0
        started = self.clock()
        async with contextlib.aclosing(pieces) as stream:
            async for text, finish_reason in stream:
                new = []
                if text:
                    chunks += 1
                    new.append(Emitted(token=text, data=text.encode("utf-8")))
                if finish_reason == "length":
                    new.append(Emitted(token="", data=b"", count=max(0, remaining - chunks)))
                elif finish_reason is not None:
                    new.append(Emitted(token="", data=b"", eos=True))
                if finish_reason is not None:
                    # What the target alone costs is what the policy compares speculation with.
                    self.policy.observe_plain(remaining if finish_reason == "length" else chunks, self.clock() - started)
                if new:
                    yield new

    async def _plain(self, context: Context, step_tokens: int, remaining: int, run: _Run) -> list[Emitted]:
        """The target alone generates: one token while speculating, everything that remains otherwise."""
        counting = getattr(self.verifier, "name", "") in ("echo", "prompt-logprobs")
        step = await plain_step(
            self.target,
            context,
            step_tokens,
            run.target_meter,
            run.seed(),
            list(run.request.stop) or None,
            count_tokens=counting,
            prefill=self.prefill,
        )
        if run.books.prompt_tokens is None and not context.accepted and step.prompt_tokens is not None:
            run.books.prompt_tokens = step.prompt_tokens
        self.policy.observe_plain(step.completion_tokens, step.latency_s)
        new: list[Emitted] = []
        if step.text:
            count = step.completion_tokens or 1
            if step.finish_reason == "length":
                count = step_tokens  # the server stopped at exactly the tokens it was allowed
            new.append(Emitted(token=step.text, data=step.text.encode("utf-8"), count=min(count, remaining)))
        if step.finish_reason != "length" or not step.text:
            new.append(Emitted(token="", data=b"", eos=True))
        return new

    async def _draft(self, context: Context, k: int, run: _Run) -> Draft | None:
        assert self.drafter is not None
        meter = run.draft_meter if run.draft_meter is not None else Meter(self.target.endpoint)
        try:
            return await self.drafter.draft(context, k, meter, run.seed())
        except (DraftError, MalformedResponseError) as exc:
            run.books.fallback_reason = f"draft failed, continued with the target alone: {exc}"
            return None

    async def _round(self, context: Context, draft: Draft, run: _Run, token_starts: list[int], produced: int) -> list[Emitted] | None:
        assert self.verifier is not None
        books, top_k = run.books, run.top_k
        try:
            verification = await self.verifier.verify(context, draft.tokens, run.target_meter, run.seed, top_k)
        except MalformedResponseError as exc:
            books.fallback_reason = f"target response could not be verified against, continued with the target alone: {exc}"
            self.paths.refuse(self.chat, books.fallback_reason, definite=False)
            return None
        except EndpointError as exc:
            if exc.status_code not in (400, 422):
                raise
            # The target refuses the verification request's shape (e.g. echo with logprobs): a plain
            # request may still be fine, and if it is not, the plain step raises the real error.
            books.fallback_reason = f"target refused the verification request, continued with the target alone: {exc}"
            self.paths.refuse(self.chat, books.fallback_reason, definite=True)
            return None
        self.paths.succeeded(self.chat)
        if books.prompt_tokens is None and not context.accepted and verification.prompt_tokens is not None:
            books.prompt_tokens = verification.prompt_tokens
        _check_token_boundaries(verification, context, draft, token_starts, books)
        _check_token_count(verification, context, produced, books)
        decision = decide_round(verification.positions, verification.straddle, draft.tokens, context.sampling, run.rng)
        new = list(decision.emitted)
        if decision.all_accepted and not decision.stalled:
            if verification.bonus is not None:
                bonus = verification.bonus
                new.append(Emitted(token=bonus.text, data=token_bytes(bonus.text) or b"", logprob=bonus.logprob, top=dict(bonus.top or {})))
            elif verification.finish_reason == "stop":
                new.append(Emitted(token="", data=b"", eos=True))
        if not context.sampling.greedy:
            books.max_gap = max(books.max_gap, decision.gap)
            if decision.gap > COVERAGE_TOLERANCE and books.inexact_reason is None:
                books.inexact_reason = (
                    f"approximate: the top-{top_k} logprob lists left up to {decision.gap:.2%} of the probability mass unseen"
                )
        new = _whole_characters(new, context.sampling.greedy, books)
        record = RoundRecord(
            drafted=len(draft.tokens),
            accepted=decision.accepted,
            emitted=sum(1 for t in new if not t.eos),
            draft_latency_s=draft.latency_s,
            verify_latency_s=verification.latency_s,
            drafter=draft.drafter,
            accepted_by_position=decision.accepted_by_position,
        )
        books.rounds.append(record)
        self.policy.observe(record)
        observe = getattr(self.drafter, "record", None)
        if observe is not None:
            observe(draft.drafter, record.drafted, record.accepted)
        observe_round = getattr(self.drafter, "observe", None)  # a drafter that weighs costs (CombinedDrafter)
        if observe_round is not None:
            observe_round(record)
        return new


def _check_token_boundaries(verification: Verification, context: Context, draft: Draft, token_starts: list[int], books: _Books) -> None:
    """Say so when the target read the text so far with other token boundaries than it generated.

    Over a text API the target re-tokenizes what it is sent. Where the prompt's end or a generated
    token's start is no longer a token boundary in the scored text, the target's view of the context
    differs from the one its own single call would have had, so the rest may differ from it too.
    """
    if verification.starts_from_end is None or books.inexact_reason is not None:
        return
    accepted = len(context.accepted.encode("utf-8"))
    tail = len(draft.text.encode("utf-8"))
    # Boundaries checked in earlier rounds stay checked: appended text re-splits only the end of the
    # text, so each round looks at the newest boundaries (and the last one already seen) only.
    newest = token_starts[max(0, books.boundaries_checked - 1) :]
    books.boundaries_checked = len(token_starts)
    for start in newest:
        if start <= accepted and accepted - start + tail not in verification.starts_from_end:
            books.inexact_reason = (
                "approximate: the target re-tokenized the text across a token boundary of its own output "
                f"({accepted - start} bytes before the newest text), so it saw the context split differently "
                "than a single call would have"
            )
            return


def _check_token_count(verification: Verification, context: Context, produced: int, books: _Books) -> None:
    """The same guard where no scored prompt is returned (fan-out): the target billed the context as
    more or fewer tokens than the prompt plus the tokens it generated, so it split the text differently."""
    if context.is_chat or not context.accepted or books.inexact_reason is not None:
        return
    if books.prompt_tokens is None or verification.prompt_tokens is None:
        return
    if verification.prompt_tokens != books.prompt_tokens + produced:
        books.inexact_reason = (
            "approximate: the target re-tokenized the text so far into "
            f"{verification.prompt_tokens} tokens instead of {books.prompt_tokens + produced} (prompt plus its own output), "
            "so it saw the context split differently than a single call would have"
        )


def _model_drafter(drafter: Drafter | None, draft: Draft) -> ModelDrafter | None:
    """The draft model that produced `draft` (directly or inside a combined drafter), if any."""
    if isinstance(drafter, ModelDrafter):
        return drafter
    for inner in getattr(drafter, "drafters", ()):
        if isinstance(inner, ModelDrafter) and draft.drafter.startswith(inner.name):
            return inner
    return None


def _whole_characters(tokens: list[Emitted], greedy: bool, books: _Books) -> list[Emitted]:
    """Drop trailing tokens that end inside a UTF-8 character: text can only be sent back whole.

    The next round re-derives them from the same text, which is exact for greedy decoding; for sampling
    it re-draws a token, so the response says it is approximate.
    """
    data = b"".join(t.data for t in tokens)
    if complete_utf8_prefix(data) == data:
        return tokens
    kept = list(tokens)
    while kept and complete_utf8_prefix(b"".join(t.data for t in kept)) != b"".join(t.data for t in kept):
        kept.pop()
    if not greedy and books.inexact_reason is None:
        books.inexact_reason = "approximate: a token ended inside a UTF-8 character and was drawn again"
    return kept


def _stop_prefix_len(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def _find_stop(text: str, stops: tuple[str, ...], new_from: int) -> int | None:
    """Where the earliest stop string begins, searching only matches that involve new text."""
    best: int | None = None
    for stop in stops:
        index = text.find(stop, max(0, new_from - len(stop) + 1))
        if index != -1 and (best is None or index < best):
            best = index
    return best
