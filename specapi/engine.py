"""The round loop: draft, verify, accept, repeat. One async generator drives every request.

`generate` yields a `Piece` of text each time the target has accepted some, then a final `Finished`
with the statistics; `client.py` collects them into a response or a stream. All the decisions are pure
functions (`acceptance.decide_round`); this module only sequences the calls and keeps the books.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import itertools
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ._calls import Clock, Meter, RoleClient
from ._exceptions import DraftError, EndpointError, MalformedResponseError
from .acceptance import Emitted, decide_round
from .alignment import complete_utf8_prefix, token_bytes
from .context import Context
from .dialects.openai import Prefill
from .lossy import EXACT, lossy_path_note
from .drafters import Draft, Drafter, ModelDrafter, usable_prefix
from .load import current_request, queue_delay
from .policy import RECHECK, TARGET_ALONE, DraftLengthPolicy, PolicyState, pipeline_pays
from .probe import Capabilities
from .stats import MODEL_DRAFTER, PIPELINED, RoleUsage, RoundRecord, SpeculativeStats, drafter_of
from .paths import Path, PathResolver
from .verifiers import PlainStep, Verification, Verifier, plain_step, plain_stream, plain_stream_batches

__all__ = ["GenerationRequest", "Piece", "Finished", "Engine"]


@dataclass(frozen=True)
class GenerationRequest:
    context: Context
    max_tokens: int | None  # None: the caller set none, so the server's own limit applies
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
    #: The target's own usage object (every field it sent: cached tokens, details) when the whole answer
    #: is one target call; None when the answer was assembled from several calls.
    usage: Mapping[str, Any] | None = None
    #: The target alone's stream would carry the usage unasked, on its last chunk (llama-server's completions).
    stream_usage: bool = False


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
    #: The target read its own output back with other token boundaries (see `_check_prompt_count`).
    retokenized: bool = False
    discarded_draft_tokens: int = 0
    acceptance: str = "exact"  # the rule the rounds are decided with (see lossy.py)
    acceptance_note: str | None = None
    divergent: int = 0
    logprob_gap: float = 0.0
    load_reason: str | None = None  # what the load on the upstreams changed (the policy's `load_reason`)
    #: The target refused a verification request (HTTP 400): the shape's fault only if the plain request
    #: that follows is accepted (else the caller's request is at fault, and its error is the answer).
    refusal: str | None = None
    refused_path: str | None = None  # the path this request's refusal wrote off (see `_learn_refusal`)
    plain_calls: int = 0  # target-alone calls whose text is in the answer
    plain_usage: Mapping[str, Any] | None = None  # the usage the last of them reported


@dataclass
class _Output:
    """The text so far: applies new tokens (end of text, max_tokens, stop strings) and says what may
    be handed out. Tokens are bytes: text is decoded only up to the last whole character, so a token
    holding part of a character waits for the rest. A tail that could still grow into a stop string
    is held back, so nothing that may be cut is ever sent."""

    request: GenerationRequest
    context: Context
    text: str = ""
    sent: int = 0
    produced: int = 0
    finish_reason: str = "length"
    ended: bool = False
    #: Byte offsets in the generated text where a single target token began (0: the prompt's end).
    token_starts: list[int] = field(default_factory=lambda: [0])
    data: bytearray = field(default_factory=bytearray)
    #: Holds back the bytes of an unfinished character; bytes that can never be UTF-8 become U+FFFD.
    decoder: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))
    #: The text so far holds U+FFFD for bytes that are not UTF-8: a text API cannot send them back.
    invalid_bytes: bool = False

    def restart_after(self, kept: int) -> None:
        """Forget all text after its first `kept` characters (those the caller already has)."""
        sent = self.text[:kept]
        self.sent = kept
        self.text, self.data, self.produced = sent, bytearray(sent.encode("utf-8")), 0
        self.decoder.reset()
        self.token_starts = [0]
        self.context = self.request.context.advanced(sent)

    @property
    def remaining(self) -> int | None:
        limit = self.request.max_tokens
        return None if limit is None else limit - self.produced

    def add(self, new: list[Emitted]) -> str:
        request = self.request
        before = len(self.text)
        limit = request.max_tokens
        ids: list[int] | None = []  # the target's ids of the new tokens, while all are known
        for index, token in enumerate(new):
            if token.eos:
                # A target's end-of-text token is one it generated, and servers count it (a plain
                # step's finish mark has count 0: the step's own count already holds it).
                self.produced += token.count
                self.finish_reason, self.ended = token.finish_reason, True
                break
            if ids is not None and token.ids is not None and len(token.ids) == token.count:
                ids.extend(token.ids)
            else:
                ids = None
            if token.data:
                if token.count == 1 and self.token_starts[-1] != len(self.data):
                    self.token_starts.append(len(self.data))
                self.data += token.data
                added = self.decoder.decode(token.data)
                self.invalid_bytes = self.invalid_bytes or added.count("\ufffd") > token.data.count(b"\xef\xbf\xbd")
                self.text += added
            self.produced += token.count
            if request.stop and token.data and _find_stop(self.text, request.stop, before) is not None:
                # The target stops at the token that completes a stop string: later tokens of the
                # round were never its own, and are not counted (cut below).
                break
            if limit is not None and self.produced >= limit:
                # The end of text right after the last allowed token still counts as a stop.
                if any(t.eos and t.finish_reason == "stop" for t in new[index + 1 : index + 2]):
                    self.finish_reason, self.ended = "stop", True
                break
        done = self.ended or (limit is not None and self.produced >= limit)
        if done:
            # Only a server's own final text can end inside a character, and it says how (U+FFFD).
            self.text += self.decoder.decode(b"", final=True)
        cut = _find_stop(self.text, request.stop, before)
        if cut is not None:
            self.text = self.text[:cut]
            self.finish_reason, self.ended = "stop", True
            done = True
        self.context = self.context.advanced(self.text[before:], ids)
        safe = len(self.text) if done else len(self.text) - _stop_prefix_len(self.text, request.stop)
        if safe <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent : safe], safe
        return piece


@dataclass
class _Run:
    """Everything one request's rounds share."""

    request: GenerationRequest
    seeded: bool
    target_meter: Meter
    draft_meter: Meter | None
    books: _Books
    top_k: int
    #: Pipelined drafts that turned out stale: not verified, but billed once the server answers.
    stale: list[asyncio.Task[Draft]] = field(default_factory=list)

    #: The seed a fan-out call used on this exact context (accepted text, seed), when its pick could
    #: not be read: the step that decides that position draws the same token again with it.
    pending_seed: tuple[str, int] | None = None
    #: How long a step of the event loop waited for its turn before the first round (0 with no other
    #: request in flight): `PolicyState.queue_delay_s` of the first round.
    queue_delay_s: float = 0.0
    _rng: random.Random | None = None
    _base: int | None = None
    #: The target wrote the whole answer alone, sent the caller's seed unchanged.
    alone_with_callers_seed: bool = False
    #: Drafts come from the verifier's native draft call (whole distributions): no pipelined model drafts.
    native_drafts: bool = False

    @property
    def rng(self) -> random.Random:
        """The request's random draws, seeded with its seed. Made at the first draw: most requests (greedy,
        unseeded) never draw, and seeding one from the system's entropy costs as much as a JSON chunk."""
        if self._rng is None:
            self._rng = random.Random(self.request.context.seed)
        return self._rng

    def seed(self) -> int | None:
        """A seed for the next call, drawn from the request's seed so that runs repeat. Sampled calls
        always get one (random when the caller gave none), so a draw can be repeated exactly."""
        if self.seeded or not self.request.context.sampling.greedy:
            return self.rng.randrange(2**31)
        return None

    def position_seed(self, position: int) -> int | None:
        """The seed of a target call whose draw is the output's token at `position` (0: the first).

        Seeds follow positions, not calls: on the paths that keep the target's own picks, the token at
        each position is then the target's draw with that position's seed given the tokens before it,
        whatever the drafts, the draft lengths and the rounds were, so the same seed gives the same text
        on every call. A position drawn again (a round that ended before it) draws with the same seed;
        the earlier draw was discarded without deciding anything, so the draw kept is still independent
        of the text before it (docs/algorithm.md)."""
        if not self.seeded and self.request.context.sampling.greedy:
            return None
        if self._base is None:
            self._base = random.Random(self.request.context.seed).randrange(2**63)
        return _mix64(self._base + position) & 0x7FFFFFFF

    def seeds_from(self, position: int) -> Callable[[], int | None]:
        """Seeds for calls drawing the tokens at `position`, `position + 1`, ... in turn."""
        positions = itertools.count(position)
        return lambda: self.position_seed(next(positions))

    def plain_seed(self, context: Context, whole: bool, position: int) -> int | None:
        """The seed of a target-alone call drawing from `position` on. A call that writes the whole answer
        before any round (nothing accepted yet) is the request the target alone would get: it carries the
        caller's seed unchanged (or none), so its text is the target's own for that seed."""
        if whole and not context.accepted and not self.books.rounds:
            self.alone_with_callers_seed = True
            return self.request.context.seed
        return self.position_seed(position)


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

    def take(self, context: Context, k: int, clock: Clock, run: _Run) -> Awaitable[Draft | None] | None:
        """The prefetched draft minus the tokens the round already produced, if the guess held.

        A stale guess is not cancelled: the server may have processed it already, and what it bills
        is counted when the request ends."""
        if not context.accepted.startswith(self.assumed):
            run.stale.append(self.task)
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
            rest = usable_prefix(draft.tokens[skipped : skipped + k])  # cut at a whole character
            run.books.discarded_draft_tokens += len(draft.tokens) - skipped - len(rest)
            return Draft(tokens=rest, latency_s=clock() - started, drafter=draft.drafter + PIPELINED) if rest else None

        return usable()



async def _settle(run: _Run) -> None:
    """Wait for the stale prefetches (their usage reaches the draft meter) and count their tokens."""
    if not run.stale:
        return
    results = await asyncio.gather(*run.stale, return_exceptions=True)
    run.books.discarded_draft_tokens += sum(len(r.tokens) for r in results if isinstance(r, Draft))
    run.stale.clear()


#: The policy's budget when the caller set no max_tokens (the server's own limit applies).
_UNBOUNDED = 1 << 20
#: The longest plain step on token ids that waits for a character to end (see `_plain`).
_MAX_WHOLE_CHARACTER_STEP = 64
#: Steps in a row that may add nothing (rounds that stall, hand over) before the engine gives up.
_MAX_IDLE_STEPS = 64


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
        seeded_drafter: Drafter | None = None,
        seeded_policy: DraftLengthPolicy | None = None,
    ) -> None:
        #: A seeded sampled request's drafter and policy on paths where the drafts decide the draws (see
        #: client.py): nothing learnt from other requests' text.
        self.seeded_drafter = seeded_drafter
        self.seeded_policy = seeded_policy
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
            seeded=request.context.seed is not None,
            target_meter=Meter(self.target.endpoint),
            draft_meter=Meter(self.draft_client.endpoint) if self.draft_client else None,
            books=_Books(fallback_reason=unverifiable_reason),
            top_k=self.target.endpoint.max_logprobs,
        )
        context = request.context
        if unverifiable_reason is None and self.drafter:
            chars = len(context.completion_prompt()) if not context.is_chat else 0
            path = await self.paths.resolve(
                self.chat, run.target_meter, context_chars=chars, greedy=context.sampling.greedy, needs_lists=context.sampling.acceptance.lossy
            )
        else:
            path = Path("none")
        run.books.path_note = path.note
        self.prefill = path.prefill
        request = _lossy_where_possible(request, path, run.books)
        run.request = request
        if request.context.sampling.greedy and not request.context.sampling.acceptance.needs_distribution:
            # Greedy needs the argmax only; the typical rule (when this path applies it) reads the
            # target's whole list (its entropy) even when greedy.
            run.top_k = 1
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
        caps = self.paths.capabilities
        penalty_reason = None
        if caps is not None and caps.sampler_defaults:
            request, penalty_reason = _with_server_defaults(request, caps.sampler_defaults, caps.server or "the target")
            run.request = request
        if self.seeded_drafter is not None and not getattr(self.verifier, "draws_target_tokens", False):
            self.drafter = self.seeded_drafter
            self.policy = self.seeded_policy or self.policy
        if not request.context.sampling.greedy and getattr(self.verifier, "draws_target_tokens", False):
            # Only the target's own picks are kept here, whatever the draft proposed: a position is kept
            # with probability p(x) for a proposal x, most often for the draft's most likely token.
            sampling = replace(request.context.sampling, point_mass_draft=True)
            request = replace(request, context=replace(request.context, sampling=sampling))
            run.request = request
        speculate = self.verifier is not None and self.drafter is not None and unverifiable_reason is None
        if speculate and penalty_reason is not None:
            speculate = False
            run.books.fallback_reason = penalty_reason
        if speculate and request.context.sampling.target_sampler_only and not getattr(self.verifier, "draws_target_tokens", False):
            speculate = False
            run.books.fallback_reason = (
                f"the request's sampler (top_k, min_p, ...) cannot be reproduced from the logprob lists of the "
                f"{getattr(self.verifier, 'name', '')} path: the target alone generates"
            )
        if speculate and request.max_tokens is None and not request.context.is_chat:
            # The caller set no limit: the target alone would stop at its server's default for completions
            # (OpenAI's and vLLM's 16; llama-server's n_predict). Rounds end there too; None: the context's end.
            default = caps.default_max_tokens if caps is not None else Capabilities().default_max_tokens
            if default is not None:
                request = replace(request, max_tokens=default)
                run.request = request
        mode = self.policy.start_request() if speculate else TARGET_ALONE
        if speculate and mode == TARGET_ALONE:
            speculate = False
            run.books.fallback_reason = getattr(self.policy, "reason", "") or "the draft-length policy chose the target alone"
        if speculate and getattr(self.policy, "watches_queue", False) and self.target.load.rank(current_request.get()) > 1:
            # Before the first round is chosen, for a policy that reads it: how long this client's steps
            # wait for their turn now (a burst's other requests starting), which each call of a round
            # would wait again. Not for the earliest request in flight, which is not charged for it.
            run.queue_delay_s = await queue_delay(self.clock)
        stretch = caps.final_stretch if caps is not None else 0  # see Capabilities.final_stretch
        prompt_ids = getattr(self.verifier, "prompt_ids", None)
        first: int | None = None  # the first round's draft length, when chosen before the prompt is tokenized
        if speculate and prompt_ids is not None and not request.context.is_chat:
            limit = request.max_tokens
            if limit is None or limit > stretch:
                # Chosen before the tokenize call: a request the policy hands to the target alone
                # (under load, above all) spares that call and goes straight to its stream.
                first = self._choose(run, limit, mode)
                speculate = first > 0
        if speculate and prompt_ids is not None and not request.context.is_chat:  # (the choice may have said no)
            # Token-id verification: the target tokenizes the prompt once; from then on it is sent ids.
            try:
                ids = await prompt_ids(request.context, run.target_meter)
            except EndpointError as exc:
                unreadable = isinstance(exc, MalformedResponseError)
                if not (exc.refused_shape or exc.not_served or unreadable):
                    raise
                speculate = False
                run.books.fallback_reason = f"the target would not tokenize the prompt, continued with the target alone: {exc}"
                # An unreadable answer is a strike (three in a row write the path off); a refusal counts
                # once the plain request has been accepted (`_learn_refusal`).
                if unreadable:
                    self.paths.refuse(self.chat, run.books.fallback_reason, definite=False)
                else:
                    run.books.refusal = run.books.fallback_reason
            else:
                request = replace(request, context=replace(request.context, token_ids=ids))
                run.request = request
        out = _Output(request=request, context=request.context)
        prefetch: _Prefetch | None = None
        target_decides = False  # the previous round handed the next position to the target alone
        finished_normally = False
        idle = 0  # steps in a row that added nothing
        try:
            while not out.ended and (out.remaining is None or out.remaining > 0):
                remaining = out.remaining
                context = out.context
                # The caller's last tokens come from one target call, so the server ends the text its
                # own way (a character cut at the limit, or finished past it, as each server does).
                final = remaining is not None and remaining <= stretch
                room = _room(caps, out, run)
                if speculate and room is not None and (room < 2 + _WINDOW_STRETCH or (remaining is not None and remaining > room and not _runs_to_window(caps))):
                    # The context window ends within the request: the target alone ends it as it would (at
                    # the window with "length" on llama-server; with its own error where the request as a
                    # whole does not fit).
                    speculate = False
                    run.books.fallback_reason = run.books.fallback_reason or "the request reaches the end of the target's context window: the target alone ends it"
                k = 0
                if speculate and not target_decides and not final:
                    budget = remaining if remaining is not None else _UNBOUNDED
                    if first is not None:
                        chosen, first = first, None
                    else:
                        chosen = self._choose(run, remaining, mode)
                    speculate = chosen > 0  # else the policy predicts the target alone is faster from here
                    k = min(chosen, budget - 1 - (stretch if remaining is not None else 0))
                    if room is not None:
                        # The round's calls fit the window, and its last tokens come from one target call.
                        k = min(k, room - 1 - _WINDOW_STRETCH)
                target_decides = False
                new: list[Emitted] = []
                if k > 0 and not run.books.rounds and run.queue_delay_s > 0.0:
                    # A first round under load (the event loop's queue was measured): its calls wait one
                    # more turn, so that the requests handed to the target alone meanwhile open their
                    # streams first. Those are the long jobs, and the last of them sets when a burst
                    # ends (longest first); a round is done long before. Cold bursts of 100 through the
                    # proxy, median of five: 0.89x the target alone's throughput without the turn, 0.92x
                    # with it (`benchmarks/README.md`).
                    await asyncio.sleep(0)
                if k > 0:
                    draft = prefetch.take(context, k, self.clock, run) if prefetch is not None else None
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
                        if (
                            self.pipeline and model is not None and run.draft_meter is not None and not run.native_drafts
                            and pipeline_pays(self.policy, len(draft.tokens))
                        ):
                            # Guess that every draft token is kept, and draft the next round meanwhile
                            # (no longer than the model is asked for in a round sized for free drafts).
                            paid_length = getattr(self.drafter, "paid_length", None)
                            length = paid_length(k) if paid_length is not None else k
                            prefetch = _Prefetch.start(model, context.advanced(draft.text), length + 1, run)
                        outcome = await self._round(context, draft, run, out)
                        if outcome is None:
                            speculate = False
                            continue
                        new, target_decides = outcome
                if not new and (not speculate or final) and request.stream and self._can_stream(context):
                    # The target alone finishes the text: stream it, so that text arrives as it is made.
                    async for tokens in self._plain_stream(context, remaining, out.produced, run):
                        piece = out.add(tokens)
                        if piece:
                            run.books.ttft_s = run.books.ttft_s if run.books.ttft_s is not None else self.clock() - started
                            yield Piece(text=piece)
                    out.ended = True
                    continue
                if not new and (not target_decides or final):
                    new = await self._plain(context, 1 if speculate and not final else remaining, out, run)
                if run.books.retokenized and context.sampling.greedy:
                    # Every later request would re-read the same split: the target alone writes the
                    # whole answer again from the prompt, and the part already handed out is checked.
                    regenerated = await self._regenerate(out, run)
                    new = regenerated if regenerated is not None else new
                    speculate = False
                produced_before = (out.produced, len(out.data), out.ended)
                piece = out.add(new)
                if (out.produced, len(out.data), out.ended) == produced_before:
                    idle += 1
                    if idle >= _MAX_IDLE_STEPS:
                        raise self.target.error(f"the target's answers added no text in {idle} steps in a row: stopped rather than loop")
                else:
                    idle = 0
                if out.invalid_bytes and not out.ended and run.books.inexact_reason is None and out.context.token_ids is None:
                    run.books.inexact_reason = (
                        "approximate: the target generated bytes that are not UTF-8, which a text API cannot send back to it"
                    )
                if piece:
                    run.books.ttft_s = run.books.ttft_s if run.books.ttft_s is not None else self.clock() - started
                    if request.stream:
                        yield Piece(text=piece)
            finished_normally = True
        finally:
            if prefetch is not None:
                run.stale.append(prefetch.task)
            if finished_normally:
                # A draft call the server has answered is billed: wait for stale prefetches and count them.
                await _settle(run)
            else:
                for task in run.stale:
                    task.cancel()
                await asyncio.gather(*run.stale, return_exceptions=True)

        self._learn_refusal(run)
        if not request.stream and out.text:
            yield Piece(text=out.text)  # collected: handed out whole, once nothing can change it
        yield self._finished(run, started, out.finish_reason, out.produced)

    def _learn_refusal(self, run: _Run) -> None:
        """The request ended well after its verification was refused: the target accepted the plain
        request, so the verification shape was at fault, not the caller's parameters. The path
        resolver (one per target model) counts it, and writes the path off when it is confirmed."""
        books = run.books
        if books.refusal is not None and self.paths.refuse(self.chat, books.refusal, definite=True):
            books.refused_path = getattr(self.verifier, "name", None) or "token-ids"

    def _choose(self, run: _Run, remaining: int | None, mode: str) -> int:
        """The policy's draft length for the next round (0: the target alone from here, with the reason
        in the books, and what the load changed)."""
        budget = remaining if remaining is not None else _UNBOUNDED
        rounds = run.books.rounds
        last = drafter_of(rounds[-1]) if rounds else ""
        own: list[tuple[bool, ...]] = []  # the model's rounds
        by_last: list[tuple[bool, ...]] = []  # the last round's drafter's
        for r in rounds:
            drafter = drafter_of(r)
            if drafter == MODEL_DRAFTER:
                own.append(r.accepted_by_position)
            if drafter == last:
                by_last.append(r.accepted_by_position)
        chosen = self.policy.choose(
            PolicyState(
                budget, len(rounds), recheck=mode == RECHECK, accepted_by_position=tuple(own),
                last_drafter=last, last_drafter_rounds=tuple(by_last), queue_delay_s=0.0 if rounds else run.queue_delay_s,
                sampled=not run.request.context.sampling.greedy,
            )
        )
        load_reason = getattr(self.policy, "load_reason", None)  # set by this very choose
        if load_reason is not None and (chosen <= 0 or run.books.load_reason is None):
            run.books.load_reason = load_reason
        if chosen <= 0:
            run.books.fallback_reason = run.books.fallback_reason or (
                getattr(self.policy, "reason", "") or "the draft-length policy turned speculation off"
            )
        return chosen

    def _finished(self, run: _Run, started: float, finish_reason: str, produced: int) -> Finished:
        books = run.books
        if not books.rounds and books.fallback_reason is None and books.path_note:
            books.fallback_reason = books.path_note
        stats = SpeculativeStats(
            rounds=tuple(books.rounds),
            draft=run.draft_meter.snapshot() if run.draft_meter else RoleUsage(),
            target=run.target_meter.snapshot(),
            exact=books.inexact_reason is None and books.acceptance == "exact",
            exact_reason=books.inexact_reason or (
                f"lossy acceptance {books.acceptance!r} (opted in): kept draft tokens exact verification might reject"
                if books.acceptance != "exact" else None
            ),
            speculated=bool(books.rounds),
            fallback_reason=books.fallback_reason,
            verification=getattr(self.verifier, "name", "none") if books.rounds else "none",
            generated_tokens=produced,
            wall_s=self.clock() - started,
            ttft_s=books.ttft_s,
            max_coverage_gap=books.max_gap,
            discarded_draft_tokens=books.discarded_draft_tokens,
            acceptance=books.acceptance,
            acceptance_note=books.acceptance_note,
            divergent_tokens=books.divergent,
            logprob_gap=books.logprob_gap,
            load_reason=books.load_reason,
            verification_refused=books.refused_path,
            seed_note=_seed_note(run),
        )
        # One target call wrote the whole answer: its usage is the answer's, as the target alone reports it.
        alone = not books.rounds and books.plain_calls == 1 and not books.retokenized and isinstance(books.plain_usage, Mapping)
        usage = books.plain_usage if alone else None
        caps = self.paths.capabilities
        stream_usage = caps is not None and caps.stream_usage_unasked and not self.chat
        return Finished(
            finish_reason=finish_reason, stats=stats, prompt_tokens=books.prompt_tokens, completion_tokens=produced, usage=usage,
            stream_usage=stream_usage,
        )

    async def _whole(self, path: Path, request: GenerationRequest, run: _Run, started: float) -> AsyncIterator[Piece | Finished]:
        """Whole-answer paths: one draft and one target call; the target's text is the answer."""
        assert self.drafter is not None
        self.verifier = path.whole
        draft_meter = run.draft_meter if run.draft_meter is not None else Meter(self.target.endpoint)
        # The target writes the whole text itself here: it gets the caller's seed unchanged.
        run.alone_with_callers_seed = True
        seeds = (run.seed(), request.context.seed)
        result = await path.whole.run(request.context, self.drafter, draft_meter, run.target_meter, request.max_tokens, seeds, list(request.stop) or None)
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
        """Streaming the last step needs no prefix handling the stream could get wrong, and a context
        kept as token ids is continued from its ids (one plain call)."""
        if context.token_ids is not None and hasattr(self.verifier, "plain"):
            return False
        return self.stream_plain and not (context.is_chat and context.accepted and self.prefill.echoes_prefix)

    async def _plain_stream(self, context: Context, remaining: int | None, produced: int, run: _Run) -> AsyncIterator[list[Emitted]]:
        """The target alone generates the rest as a stream. A chunk's text counts as one token (servers
        stream token by token); when the server stops at the limit, the count is settled to it."""
        usage: dict = {}
        # Chunks that arrived together (the reader fell behind, under load) go on as one piece: the
        # same tokens, counted one by one, with the work per piece (and per chunk sent on) done once.
        batches = plain_stream_batches(
            self.target, context, remaining, run.target_meter, run.plain_seed(context, True, produced), list(run.request.stop) or None,
            prefill=self.prefill, usage=usage,
        )
        chunks = 0
        started = self.clock()
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
                        self.policy.observe_plain(remaining if finish_reason == "length" and remaining else chunks, self.clock() - started)
                if chunks > before:
                    now = self.clock()
                    if last is not None:  # the gap after the first token: the pace the target writes at now
                        self.target.load.pace((now - last) / (chunks - before))
                    last = now
                if new:
                    yield new
        if not finished:
            raise self.target.malformed("the stream ended without a finish_reason: the text may be incomplete")
        # A chunk is a token, but not every token is a chunk (a character of several tokens, the end of
        # text, a stop string): the server's count settles it; without one, a "length" end is the limit.
        billed = usage.get("completion_tokens")
        if isinstance(billed, int) and not isinstance(billed, bool) and billed > 0:
            settle = billed - chunks
        else:
            settle = remaining - chunks if remaining is not None and stopped_at_length else 0
        if settle > 0:
            yield [Emitted(token="", data=b"", count=settle)]
        run.books.plain_calls += 1
        run.books.plain_usage = run.target_meter.last_usage
        prompt_tokens = usage.get("prompt_tokens")
        if not context.accepted and run.books.prompt_tokens is None and isinstance(prompt_tokens, int):
            run.books.prompt_tokens = prompt_tokens
        # Streamed text is out before the usage arrives: a split found here can only be reported.
        _check_prompt_count(prompt_tokens if isinstance(prompt_tokens, int) else None, 0, context, produced, run.books)

    async def _plain(self, context: Context, step_tokens: int | None, out: _Output, run: _Run) -> list[Emitted]:
        """The target alone generates: one token while speculating, everything that remains otherwise.

        A step that stops inside a character (its text empty or ending in U+FFFD, depending on the
        server) is asked again for one more token with the same seed, until the text ends on a whole
        character or reaches the caller's limit, where the server's own rendering is the answer.
        """
        remaining = out.remaining
        counting = getattr(self.verifier, "name", "") in ("echo", "prompt-logprobs")
        whole = step_tokens is None or (remaining is not None and step_tokens >= remaining)
        seed = run.plain_seed(context, whole, out.produced)  # a sampled step has one: a step asked again draws the same tokens
        if run.pending_seed is not None and run.pending_seed[0] == context.accepted:
            # A fan-out call drew this position but its token could not be read: draw it again, the same.
            seed = run.pending_seed[1]
        run.pending_seed = None
        while True:
            # The caller's last tokens, streamed to a streaming caller: servers drop an unfinished
            # character from a stream where a plain answer shows U+FFFD.
            last = remaining is not None and step_tokens is not None and step_tokens >= remaining
            step = await self._target_call(context, step_tokens, seed, run, streamed=run.request.stream and last, count_tokens=counting)
            run.books.plain_calls += 1
            run.books.plain_usage = run.target_meter.last_usage
            partial = step.finish_reason == "length" and (not step.text or step.text.endswith("\ufffd"))
            if not partial or step_tokens is None or last:
                break
            if step.ids is None:
                if step_tokens >= 8:
                    break
                step_tokens += 1
            else:
                # Token ids: a run of characters that each straddle a token boundary can be long, and
                # the text only ends whole where one of them ends; each longer step reuses the cache.
                if step_tokens >= _MAX_WHOLE_CHARACTER_STEP:
                    break
                step_tokens = min(2 * step_tokens, _MAX_WHOLE_CHARACTER_STEP if remaining is None else remaining)
        books = run.books
        if books.prompt_tokens is None and not context.accepted and step.prompt_tokens is not None:
            books.prompt_tokens = step.prompt_tokens
        _check_prompt_count(step.prompt_tokens, 0, context, out.produced, books)
        self.policy.observe_plain(step.completion_tokens, step.latency_s)
        new: list[Emitted] = []
        count = len(step.ids) if step.ids is not None and step.finish_reason == "length" else _tokens_of(step, step_tokens)
        if remaining is not None:
            count = min(count, remaining)
        if step.text or (step.finish_reason == "length" and count):
            data = step.data if step.data is not None else step.text.encode("utf-8")
            new.append(Emitted(token=step.text, data=data, count=max(count, 1), ids=step.ids))
            count = 0  # counted with the text
        window_end = step.finish_reason == "length" and step_tokens is not None and 0 < (step.completion_tokens or 0) < step_tokens
        if step.finish_reason != "length" or step_tokens is None or window_end:
            # A step of no text that ended still generated its end-of-text token, when its server says so;
            # one that stopped short of its limit with "length" met the end of the context window.
            new.append(Emitted(token="", data=b"", eos=True, finish_reason=step.finish_reason or "stop", count=count))
        return new

    async def _target_call(
        self, context: Context, max_tokens: int | None, seed: int | None, run: _Run, *, streamed: bool, count_tokens: bool = False
    ) -> PlainStep:
        """One target-alone call; `streamed` asks it as a stream and collects it, so that the text is
        rendered as a streaming caller would receive it."""
        stop = list(run.request.stop) or None
        native = getattr(self.verifier, "plain", None)
        if native is not None and context.token_ids is not None:
            return await native(context, max_tokens, run.target_meter, seed, stop, streamed=streamed)
        if not streamed or not self._can_stream(context):
            return await plain_step(
                self.target, context, max_tokens, run.target_meter, seed, stop, count_tokens=count_tokens, prefill=self.prefill
            )
        texts, finish, usage = [], None, {}
        started = self.clock()
        stream = plain_stream(
            self.target, context, max_tokens, run.target_meter, seed, stop, prefill=self.prefill, usage=usage
        )
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
            latency_s=self.clock() - started,
        )

    async def _regenerate(self, out: _Output, run: _Run) -> list[Emitted] | None:
        """Greedy text from the prompt in one target call, rendered as the caller receives it (streamed
        or not): it replaces everything not yet handed out. None when it does not begin with the text
        already handed out (then the response stays marked approximate)."""
        request, books = run.request, run.books
        books.retokenized = False  # one attempt per request
        books.plain_calls += 1  # the answer is now this call's and the earlier ones' (their usage is not its)
        step = await self._target_call(request.context, request.max_tokens, None, run, streamed=request.stream)
        text, finish = step.text, step.finish_reason
        kept = out.sent if request.stream else 0  # a collected response has handed out nothing yet
        sent = out.text[:kept]
        if not text.startswith(sent):
            return None
        books.inexact_reason = None
        books.fallback_reason = books.fallback_reason or "the target re-read its own output with other token boundaries: it wrote the answer again alone"
        out.restart_after(kept)
        rest = text[len(sent) :]
        return [
            Emitted(token=rest, data=rest.encode("utf-8"), count=_tokens_of(step, request.max_tokens)),
            Emitted(token="", data=b"", eos=True, finish_reason=finish or "stop", count=0),
        ]

    async def _draft(self, context: Context, k: int, run: _Run) -> Draft | None:
        assert self.drafter is not None
        meter = run.draft_meter if run.draft_meter is not None else Meter(self.target.endpoint)
        try:
            native = getattr(self.verifier, "native_draft", None)
            if native is not None and run.draft_meter is not None:
                # Where both servers list whole distributions after their sampler chains, the draft
                # server draws on the context's ids and says what it drew from (full rejection sampling).
                started = self.clock()
                tokens = await native(context, k, run.target_meter, run.draft_meter, run.seed())
                if tokens is not None:
                    run.native_drafts = True
                    return Draft(tokens=tokens, latency_s=self.clock() - started, drafter=MODEL_DRAFTER)
            return await self.drafter.draft(context, k, meter, run.seed())
        except (DraftError, MalformedResponseError) as exc:
            run.books.fallback_reason = f"draft failed, continued with the target alone: {exc}"
            return None

    async def _round(self, context: Context, draft: Draft, run: _Run, out: _Output) -> tuple[list[Emitted], bool] | None:
        """One draft-then-verify round: the target tokens it adds, and whether the next position must
        be decided by the target alone (None: verification failed, continue without speculating)."""
        assert self.verifier is not None
        books, top_k = run.books, run.top_k
        try:
            seeds = run.seeds_from(out.produced)
            verification = await self.verifier.verify(context, draft.tokens, run.target_meter, seeds, top_k, draft_meter=run.draft_meter)
        except MalformedResponseError as exc:
            books.fallback_reason = f"target response could not be verified against, continued with the target alone: {exc}"
            self.paths.refuse(self.chat, books.fallback_reason, definite=False)
            return None
        except EndpointError as exc:
            if not exc.refused_shape:
                raise
            # The target refuses the verification request: its shape (e.g. echo with logprobs), or the
            # caller's own parameters. The plain request that follows tells which: refused too, it
            # raises the caller's error; accepted, the shape is counted against (`_learn_refusal`).
            books.fallback_reason = f"target refused the verification request, continued with the target alone: {exc}"
            books.refusal = books.fallback_reason
            return None
        self.paths.succeeded(self.chat)
        if books.prompt_tokens is None and not context.accepted and verification.prompt_tokens is not None:
            books.prompt_tokens = verification.prompt_tokens
        _check_token_boundaries(verification, context, draft, out.token_starts, books)
        decision = verification.decision or decide_round(verification.positions, verification.straddle, draft.tokens, context.sampling, run.rng)
        _check_token_counts(verification, decision.accepted, context, out.produced, books)
        books.divergent += decision.divergent
        books.logprob_gap += decision.logprob_gap
        if verification.decision is None and verification.seeds and decision.accepted < len(verification.seeds):
            # If the target's pick after the kept tokens was unreadable, the next step redraws it.
            kept = "".join(t.data.decode("utf-8", errors="replace") for t in draft.tokens[: decision.accepted])
            run.pending_seed = (context.accepted + kept, verification.seeds[decision.accepted]) if verification.seeds[decision.accepted] is not None else None
        new = list(decision.emitted)
        if decision.all_accepted and not decision.stalled:
            if verification.bonus is not None:
                bonus = verification.bonus
                new.append(Emitted(token=bonus.text, data=token_bytes(bonus.text) or b"", logprob=bonus.logprob, top=dict(bonus.top or {})))
            elif verification.finish_reason == "stop":
                new.append(Emitted(token="", data=b"", eos=True))
        if not context.sampling.greedy:
            books.max_gap = max(books.max_gap, decision.gap)
        if verification.decision is not None:
            # Token ids: what is cut here (at the caller's limit, or a character left unfinished) is
            # drawn again by the next step, a plain one, with the seed of the call that drew it first:
            # the same token, so the output is the target's draws whatever the cut depended on.
            drawn = [t for t in new if not t.eos]
            new = _within_limit(new, out.remaining)
            cut = new if decision.keeps_partial else _whole_characters(new, True, books)
            kept = [t for t in cut if not t.eos]
            decided = len(drawn) + (1 if decision.handover else 0)
            if len(kept) < decided and not any(t.eos for t in cut):
                seeds = verification.seeds
                if len(kept) < len(seeds) and seeds[len(kept)] is not None:
                    text = b"".join(t.data for t in kept).decode("utf-8", errors="replace")
                    run.pending_seed = (context.accepted + text, seeds[len(kept)])
                decision = replace(decision, handover=True)
            new = cut
        else:
            new = _whole_characters(_within_limit(new, out.remaining), context.sampling.greedy, books)
        record = RoundRecord(
            drafted=len(draft.tokens),
            accepted=decision.accepted,
            emitted=sum(1 for t in new if not t.eos),
            draft_latency_s=draft.latency_s,
            verify_latency_s=verification.latency_s,
            drafter=draft.drafter,
            accepted_by_position=decision.accepted_by_position,
            sampled=not context.sampling.greedy,
        )
        books.rounds.append(record)
        self.policy.observe(record)
        observe = getattr(self.drafter, "record", None)
        if observe is not None:
            observe(draft.drafter, record.drafted, record.accepted)
        observe_round = getattr(self.drafter, "observe", None)  # a drafter that weighs costs (CombinedDrafter)
        if observe_round is not None:
            observe_round(record)
        return new, decision.handover or (decision.stalled and not new)


def _seed_note(run: _Run) -> str | None:
    """What the caller's seed fixed (see `SpeculativeStats.seed_note`)."""
    seed = run.request.context.seed
    if seed is None or run.request.context.sampling.greedy:
        return None
    if run.alone_with_callers_seed:
        return f"seed {seed} went to the target unchanged: the target drew the text itself with that seed"
    return (
        f"seed {seed} fixes specapi's draws (each target call gets a seed derived from it and the output position): "
        f"the same request gives the same text again, but not the text the target alone gives for seed {seed}"
    )


def _mix64(value: int) -> int:
    """SplitMix64's finaliser: neighbouring positions get unrelated seeds."""
    value = (value + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return value ^ (value >> 31)


def _with_server_defaults(request: GenerationRequest, defaults: Mapping[str, float], server: str) -> tuple[GenerationRequest, str | None]:
    """The request as the target server will run it: the settings the caller left out take the
    server's own defaults, sent explicitly (the same request, and the verification knows them).
    Returns the request and, if the defaults hold a penalty verification cannot reproduce, why not."""
    context = request.context
    sampling, extras = context.sampling, dict(context.extras)
    changes: dict[str, Any] = {}
    for name in ("temperature", "top_p"):
        if name not in sampling.explicit and name in defaults:
            changes[name] = defaults[name]
    for name in ("top_k", "min_p", "repeat_penalty"):
        if name not in extras and name in defaults:
            extras[name] = defaults[name]
    sampling = replace(sampling, **changes)
    truncates = _number(extras.get("top_k")) > 0 or _number(extras.get("min_p")) > 0.0
    sampling = replace(sampling, target_sampler_only=sampling.target_sampler_only or (truncates and not sampling.greedy))
    reason = None
    if extras.get("repeat_penalty", 1.0) != 1.0:
        reason = (
            f"{server} applies repeat_penalty {extras['repeat_penalty']} to requests that do not set it, which verification "
            "cannot reproduce: the target alone generates (send extra_body={'repeat_penalty': 1.0} to speculate)"
        )
    # Every other default the server reports that changes its pick, at a value that does: the text would
    # differ from what the verification calls score.
    active = {
        name: defaults[name] for name, neutral in _NEUTRAL_DEFAULTS.items()
        if name not in extras and name in defaults and not neutral(_number(defaults[name]))
    }  # fmt: skip
    if reason is None and active:
        settings = ", ".join(f"{name} {value:g}" for name, value in active.items())
        reason = (
            f"{server} applies {settings} to requests that do not set them, which verification cannot reproduce: "
            "the target alone generates (send the neutral values in extra_body to speculate)"
        )
    return replace(request, context=replace(context, sampling=sampling, extras=extras)), reason


#: llama-server's sampling settings (as `/props` reports its defaults) and the values that leave the
#: target's pick alone: a penalty, DRY, XTC, typical-p, top-n-sigma, mirostat or dynamic temperature at any
#: other value changes the distribution the target samples from, which the verification calls do not see.
_NEUTRAL_DEFAULTS: dict[str, Callable[[float], bool]] = {
    "presence_penalty": lambda v: v == 0.0,
    "frequency_penalty": lambda v: v == 0.0,
    "dry_multiplier": lambda v: v == 0.0,
    "xtc_probability": lambda v: v == 0.0,
    "typical_p": lambda v: v >= 1.0,
    "top_n_sigma": lambda v: v <= 0.0,
    "mirostat": lambda v: v == 0,
    "dynatemp_range": lambda v: v == 0.0,
}


def _lossy_where_possible(request: GenerationRequest, path: Path, books: _Books) -> GenerationRequest:
    """A lossy rule needs the target's distribution per draft position: paths where the target shows
    only its own tokens (fan-out picks, whole answers) decide exactly, and the books say why."""
    rule = request.context.sampling.acceptance
    if not rule.lossy:
        return request
    if path.whole is None and path.verifier is None:
        books.acceptance_note = f"acceptance {rule.mode!r} unused: no verification path, the target alone generated"
    elif path.whole is not None or getattr(path.verifier, "draws_target_tokens", False):
        books.acceptance_note = lossy_path_note(rule, path.name)
    else:
        books.acceptance = rule.mode
        return request
    sampling = replace(request.context.sampling, acceptance=EXACT)
    return replace(request, context=replace(request.context, sampling=sampling))


def _tokens_of(step: PlainStep, asked: int | None) -> int:
    """The target tokens a plain step produced. At its limit a server stopped at the tokens it was
    allowed, or past them to finish a character (llama-cpp-python), or before them at the end of its
    context window (llama-server): its own count says which."""
    if step.finish_reason == "length" and asked is not None:
        return step.completion_tokens or asked
    return step.completion_tokens or (1 if step.text else 0)


#: The tokens before the end of the context window that one target call writes, so that the text ends
#: there as the server ends it (a character cut at the window is rendered the server's way).
_WINDOW_STRETCH = 16


def _room(caps: Capabilities | None, out: _Output, run: _Run) -> int | None:
    """How many more tokens the target's context window holds after the output so far; None: unknown."""
    window = caps.context_window if caps is not None else None
    ids = out.request.context.token_ids
    prompt = run.books.prompt_tokens if run.books.prompt_tokens is not None else (len(ids) if ids is not None else None)
    if window is None or prompt is None:
        return None
    return window - prompt - out.produced


def _runs_to_window(caps: Capabilities | None) -> bool:
    """The server runs a request whose limit is past its window up to the window (llama-server), where
    others refuse it (vLLM, OpenAI)."""
    return caps is not None and caps.server in ("llama-server", "llama-cpp-python")


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


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
    covered = max(verification.starts_from_end, default=0)  # tokens whose bytes the server showed
    for start in newest:
        back = accepted - start + tail
        if start <= accepted and back <= covered and back not in verification.starts_from_end:
            books.retokenized = True
            books.inexact_reason = (
                "approximate: the target re-tokenized the text across a token boundary of its own output "
                f"({accepted - start} bytes before the newest text), so it saw the context split differently "
                "than a single call would have"
            )
            return


def _check_token_counts(verification: Verification, accepted: int, context: Context, produced: int, books: _Books) -> None:
    """The same guard where no scored prompt is returned (fan-out): each call whose pick was used
    continued the text so far plus `j` draft tokens, each one a target token, so it must have been
    billed the prompt plus `produced + j` tokens; any other count means the target split the text
    differently than its own generation did."""
    counts = verification.prompt_counts
    for j, count in enumerate(counts[: accepted + 1]):
        if context.accepted or j:
            _check_prompt_count(count, j, context, produced, books)


def _check_prompt_count(count: int | None, extra: int, context: Context, produced: int, books: _Books) -> None:
    """Say so when a call on the text so far (plus `extra` target tokens) was billed another count
    than the prompt plus the tokens the target generated: it re-tokenized its own output."""
    if books.inexact_reason is not None or books.prompt_tokens is None or count is None:
        return
    if not context.accepted and not extra:
        return
    expected = books.prompt_tokens + produced + extra
    if count != expected:
        books.retokenized = True
        books.inexact_reason = (
            f"approximate: the target re-tokenized the text so far into {count} tokens instead of {expected} "
            "(prompt plus its own output), so it saw the context split differently than a single call would have"
        )


def _within_limit(tokens: list[Emitted], remaining: int | None) -> list[Emitted]:
    """The tokens up to the caller's limit (an end of text right after it is kept: it counts as a stop)."""
    if remaining is None:
        return tokens
    kept: list[Emitted] = []
    used = 0
    for token in tokens:
        if used >= remaining and not token.eos:
            break
        kept.append(token)
        used += 0 if token.eos else token.count
        if token.eos:
            break
    return kept


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
