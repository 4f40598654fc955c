"""The round loop: draft, verify, accept, repeat. One async generator drives every request.

`generate` yields a `Piece` of text each time the target has accepted some, then a final `Finished`
with the statistics; `client.py` collects them into a response or a stream. A request's life: its path
is resolved and planned (`plan.py`, pure), its rounds run here (with the next round's draft prefetched
while one is verified), the target alone writes what rounds do not (`target_alone.py`), and the text
grows in its `Output` (`output.py`). Everything one request holds lives on its `RequestState`
(`state.py`, the one module that writes it: each call's outcome is handed to it as a record); the engine
holds only what its client's requests share. All the decisions are pure functions
(`acceptance.decide_round`, `plan.plan`); this module only sequences the calls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import replace

from ..transport._calls import Clock, Meter, RoleClient
from ..transport._exceptions import DraftError, EndpointError, MalformedResponseError
from ..transport.degraded import FallbackWarnings
from ..core.acceptance import Emitted, RoundDecision, decide_round
from ..core.alignment import token_bytes
from ..core.context import Context
from ..parts.drafters import Draft, Drafter, ModelDrafter, as_drafter
from ..core.load import current_request, queue_delay
from .output import complete_characters, room, with_pick_scores, within_limit
from ..parts.paths import PathResolver, VerificationPath
from .plan import Plan, plan
from ..parts.policy import RECHECK, TARGET_ALONE, DraftLengthPolicy, PolicyState, Start, as_policy
from ..parts.probe import Capabilities
from .request import Finished, GenerationRequest, Piece
from .state import RequestState
from ..core.stats import MODEL_DRAFTER, RoundRecord
from .prefetch import first_draft, settle, start_prefetch, take_prefetch
from .target_alone import AloneStream, can_stream, plain, plain_streamed, regenerate, whole_answer
from ..parts.verifiers import Verification

__all__ = ["GenerationRequest", "Piece", "Finished", "Engine"]

#: The policy's budget when the caller set no max_tokens (the server's own limit applies).
_UNBOUNDED = 1 << 20
#: Steps in a row that may add nothing (rounds that stall, hand over) before the engine gives up.
_MAX_IDLE_STEPS = 64
#: The tokens before the end of the context window that one target call writes, so that the text ends
#: there as the server ends it (a character cut at the window is rendered the server's way).
_WINDOW_STRETCH = 16


class Engine:
    """Runs requests against one target (and optionally one drafter) with one path resolver and one policy."""

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
        seeded_drafter: Drafter | None = None,
        seeded_policy: DraftLengthPolicy | None = None,
        relay_alone: bool = False,
        warnings: FallbackWarnings | None = None,
    ) -> None:
        #: Where a fallback for a failing role is logged (once per endpoint and failure).
        self.warnings = warnings if warnings is not None else FallbackWarnings()
        #: A stream the target writes alone from its first token is handed to the caller as an
        #: `AloneStream` event (the proxy relays its chunks), and the request settled once it has ended.
        self.relay_alone = relay_alone
        #: A seeded sampled request's drafter and policy on paths where the drafts decide the draws (see
        #: client.py): nothing learnt from other requests' text.
        self.seeded_drafter = as_drafter(seeded_drafter) if seeded_drafter is not None else None
        self.seeded_policy = as_policy(seeded_policy) if seeded_policy is not None else None
        self.pipeline = pipeline
        self.target = target
        self.paths = paths
        self.drafter = as_drafter(drafter) if drafter is not None else None
        self.draft_client = draft_meter_endpoint
        self.policy = as_policy(policy)
        self.clock = clock

    async def generate(self, request: GenerationRequest) -> AsyncIterator[Piece | AloneStream | Finished]:
        started = self.clock()
        state = RequestState(
            request=request,
            seeded=request.context.seed is not None,
            target_meter=Meter(self.target.endpoint),
            draft_meter=Meter(self.draft_client.endpoint) if self.draft_client else None,
            top_k=self.target.endpoint.max_logprobs,
            drafter=self.drafter,
            policy=self.policy,
        )
        path = await self._resolve(state)
        planned = plan(
            request, path, self.paths.known, top_k=state.top_k, has_drafter=self.drafter is not None,
            seeded_drafter=self.seeded_drafter is not None,
        )
        caps = self.paths.known
        state.adopt(
            planned, whole_runs=caps is not None and caps.chat_hides_partial_runs and caps.chat_logprobs > 0,
            seeded=(self.seeded_drafter, self.seeded_policy or self.policy),
        )
        if planned.path.whole is not None:
            assert state.drafter is not None
            answer = await whole_answer(self.target, planned.path.whole, state, state.drafter)
            state.answered_whole(answer.record, answer.prompt_tokens)
            if answer.text:
                state.text_began(self.clock() - started)
                yield Piece(text=answer.text)
            yield self._finished(state, started, answer.finish_reason, answer.completion_tokens)
            return
        speculate, first, mode = await self._start(state, planned)
        request = state.request
        out = state.open_output()
        finished_normally = False
        try:
            async for piece in self._steps(state, planned, speculate, first, mode, started):
                yield piece
            finished_normally = True
        finally:
            await self._drop_prefetches(state, finished_normally)
        self._learn_refusal(state)
        if not request.stream and out.text:
            yield Piece(text=out.text)  # collected: handed out whole, once nothing can change it
        yield self._finished(state, started, out.finish_reason, out.produced)

    async def _resolve(self, state: RequestState) -> VerificationPath:
        """The request's verification path (none without a drafter)."""
        if self.drafter is None:
            return VerificationPath("none")
        context = state.request.context
        chars = len(context.completion_prompt()) if not context.is_chat else 0
        sampling = context.sampling
        return await self.paths.resolve(
            context.is_chat, state.target_meter, context_chars=chars, greedy=sampling.greedy, needs_lists=sampling.acceptance.lossy,
            logprobs=context.logprobs is not None,
        )

    async def _drop_prefetches(self, state: RequestState, finished_normally: bool) -> None:
        """The request's drafts still in flight once it ends. A draft call the server has answered is
        billed: after a normal end they are waited for and counted; else cancelled."""
        prefetched = state.take_prefetch()
        if prefetched is not None:
            state.went_stale(prefetched.task)
        if finished_normally:
            if state.stale:
                state.settled_stale(await settle(state.stale))
        else:
            for task in state.stale:
                task.cancel()
            await asyncio.gather(*state.stale, return_exceptions=True)

    async def _start(self, state: RequestState, planned: Plan) -> tuple[bool, int | None, str]:
        """The gates that ask the policy and the target: whether the request speculates, the first
        round's length when it was chosen before the prompt was tokenized, and the policy's mode."""
        policy = state.policy
        assert policy is not None
        speculate = planned.speculate
        started = policy.start_request() if speculate else Start(TARGET_ALONE)
        mode = started.mode
        if speculate and mode == TARGET_ALONE:
            speculate = False
            state.fell_back(started.reason or "the draft-length policy chose the target alone")
        if speculate and policy.watches_queue and self.target.load.rank(current_request.get()) > 1:
            # Before the first round is chosen, for a policy that reads it: how long this client's steps
            # wait for their turn now (a burst's other requests starting), which each call of a round
            # would wait again. Not for the earliest request in flight, which is not charged for it.
            state.waited_in_queue(await queue_delay(self.clock))
        first: int | None = None  # the first round's draft length, when chosen before the prompt is tokenized
        if speculate and planned.first_before_tokenize:
            # Chosen before the tokenize call: a request the policy hands to the target alone
            # (under load, above all) spares that call and goes straight to its stream.
            first = self._choose(state, state.request.max_tokens, mode)
            speculate = first > 0
        if speculate and planned.tokenize_prompt and first is not None and state.request.context.sampling.greedy:
            # A greedy draft reads the text, not the target's ids: drafted first, a draft that fails
            # leaves the target alone with the caller's own request, and no tokenize call is spent.
            limit = state.request.max_tokens
            if state.queue_delay_s > 0.0:
                await asyncio.sleep(0)  # the first round's turn under load (see `_speculate`)
            draft = await self._draft(state.request.context, _draft_length(first, limit, planned.stretch, None), state)
            speculate = draft is not None
            state.drafted_first(draft)
        if speculate and planned.tokenize_prompt:  # (the choice may have said no)
            speculate = await self._tokenize(state)
        return speculate, first, mode

    async def _tokenize(self, state: RequestState) -> bool:
        """Token-id verification: the target tokenizes the prompt once; from then on it is sent ids.
        False when it would not (the target alone generates)."""
        assert state.verifier is not None
        request = state.request
        try:
            ids = await state.verifier.prompt_ids(request.context, state.target_meter)
        except EndpointError as exc:
            unreadable = isinstance(exc, MalformedResponseError)
            if not (exc.refused_shape or exc.not_served or unreadable):
                raise
            reason = f"the target would not tokenize the prompt, continued with the target alone: {exc}"
            # An unreadable answer is a strike (three in a row write the path off); a refusal counts
            # once the plain request has been accepted (`_learn_refusal`).
            state.fell_back(reason, refused=not unreadable)
            if unreadable:
                self.paths.refuse(state.request.context.is_chat, reason, definite=False)
            return False
        if not ids:
            # An empty prompt is no token-id prompt a server takes: the target alone reads the caller's text.
            state.fell_back("the prompt has no tokens to send as ids: the target alone generates")
            return False
        state.tokenized(ids)
        return True

    async def _steps(
        self, state: RequestState, planned: Plan, speculate: bool, first: int | None, mode: str, started: float
    ) -> AsyncIterator[Piece | AloneStream]:
        """The request's steps until its text ends: rounds while they pay, the target alone otherwise."""
        out, request, stretch = state.out, state.request, planned.stretch
        # The previous round handed the next position to the target alone; so does a request whose
        # logprobs' offsets follow a convention its first target-alone step shows (see plan.py).
        target_decides = planned.logprob_shape is not None and planned.logprob_shape.learn_offsets
        idle = 0  # steps in a row that added nothing
        empty = 0  # rounds in a row whose drafter proposed nothing
        while not out.ended and (out.remaining is None or out.remaining > 0):
            remaining, context = out.remaining, out.context
            # The caller's last tokens come from one target call, so the server ends the text its
            # own way (a character cut at the limit, or finished past it, as each server does).
            final = remaining is not None and remaining <= stretch
            space = self._room(state)
            speculate = speculate and not self._window_ends(state, remaining, space)
            k = 0
            if speculate and not target_decides and not final:
                chosen, first = (first, None) if first is not None else (self._choose(state, remaining, mode), None)
                speculate = chosen > 0  # else the policy predicts the target alone is faster from here
                k = _draft_length(chosen, remaining, stretch, space)
            target_decides = False
            new: list[Emitted] = []
            if k > 0:
                outcome = await self._speculate(state, context, k)
                if outcome is None:
                    speculate = False
                    continue
                new, target_decides = outcome
                empty = empty + 1 if not new and not target_decides else 0
            if not new and (not speculate or final) and request.stream and can_stream(state, context):
                async for event in self._alone_to_the_end(state, context, remaining, started):
                    yield event
                continue
            if not new and (not target_decides or final):
                new = await self._plain(state, context, _plain_step(empty, remaining, context.sampling.greedy and not request.stream) if speculate and not final else remaining)
            if state.retokenized and context.sampling.greedy:
                new, speculate = await self._rewrite(state, new), False
            piece, idle = self._add(state, new, idle, started)
            if piece and request.stream:
                yield Piece(text=piece, logprobs=state.piece_logprobs())

    def _window_ends(self, state: RequestState, remaining: int | None, space: int | None) -> bool:
        """The context window ends within the request: the target alone ends it as it would (at the
        window with "length" on llama-server; with its own error where the request as a whole does not
        fit)."""
        if space is None or not (space < 2 + _WINDOW_STRETCH or (remaining is not None and remaining > space and not _runs_to_window(self.paths.known))):
            return False
        state.fell_back("the request reaches the end of the target's context window: the target alone ends it", keep_earlier=True)
        return True

    async def _alone_to_the_end(
        self, state: RequestState, context: Context, remaining: int | None, started: float
    ) -> AsyncIterator[Piece | AloneStream]:
        """The target alone finishes the text as a stream, so that text arrives as it is made. A whole
        answer of one stream of the target's is handed to the caller to relay (`relay_alone`)."""
        out = state.out
        if self.relay_alone and out.produced == 0 and not out.data:
            # The whole answer is one stream of the target's: its chunks go on as it sends them.
            handed = AloneStream(self.target, self.clock, state, context, remaining, state.plain_seed(context, True, 0))
            yield handed  # resumed once the caller has relayed it to its end
            added, books = handed.settle(state)
            for tokens in added:
                out.add(tokens)
            out.ended = True
            state.book_alone(books)
            if handed.first_text_at is not None:
                state.text_began(handed.first_text_at - started)
            return
        if context.logprobs is not None:
            state.caller_logprobs_streamed([])
        seed = state.plain_seed(context, True, out.produced)
        async for streamed in plain_streamed(self.target, self.clock, state, context, remaining, out.produced, seed):
            if streamed.logprobs is not None:
                state.caller_logprobs_streamed(streamed.logprobs)
            if streamed.books is not None:
                state.book_alone(streamed.books)
            piece = out.add(streamed.tokens) if streamed.tokens else ""
            if piece:
                self._first_text(state, started)
                yield Piece(text=piece, logprobs=state.piece_logprobs())
        out.ended = True

    async def _plain(self, state: RequestState, context: Context, step_tokens: int | None) -> list[Emitted]:
        """A target-alone step of `step_tokens` (None: the rest), booked."""
        new, books = await plain(self.target, self.clock, state, context, step_tokens, state.step_seed(context, step_tokens))
        state.book_alone(books)
        return new

    async def _rewrite(self, state: RequestState, new: list[Emitted]) -> list[Emitted]:
        """The target read its own output back with other token boundaries, and every later request
        would re-read the same split: greedy, the target alone writes the whole answer again from the
        prompt, and the part already handed out is checked (`new` stands where it does not match)."""
        rewrite = await regenerate(self.target, self.clock, state)
        state.rewrote(rewrite.prompt_tokens, kept=rewrite.tokens is not None)
        if rewrite.tokens is None:
            return new
        state.out.restart_after(rewrite.kept)
        return rewrite.tokens

    def _add(self, state: RequestState, new: list[Emitted], idle: int, started: float) -> tuple[str, int]:
        """`new` into the output: the text to hand out, and the steps in a row that added nothing."""
        out = state.out
        before = (out.produced, len(out.data), out.ended)
        piece = out.add(new)
        idle = idle + 1 if (out.produced, len(out.data), out.ended) == before else 0
        if idle >= _MAX_IDLE_STEPS:
            raise self.target.error(f"the target's answers added no text in {idle} steps in a row: stopped rather than loop")
        if out.invalid_bytes and not out.ended and out.context.token_ids is None:
            state.approximate("approximate: the target generated bytes that are not UTF-8, which a text API cannot send back to it")
        if piece:
            self._first_text(state, started)
        return piece, idle

    def _first_text(self, state: RequestState, started: float) -> None:
        if state.ttft_s is None:
            state.text_began(self.clock() - started)

    def _room(self, state: RequestState) -> int | None:
        """How many more tokens the target's context window holds after the output so far; None: unknown."""
        caps, out = self.paths.known, state.out
        ids = out.start.token_ids
        prompt = state.prompt_tokens if state.prompt_tokens is not None else (len(ids) if ids is not None else None)
        return room(caps.context_window if caps is not None else None, prompt, out.produced)

    async def _speculate(self, state: RequestState, context: Context, k: int) -> tuple[list[Emitted], bool] | None:
        """A round of `k` drafted tokens (prefetching the next round's draft where that pays): the tokens
        it adds and whether the target alone decides the next position (None: stop speculating)."""
        if not state.rounds and state.queue_delay_s > 0.0 and state.first_draft is None:
            # A first round under load (the event loop's queue was measured): its calls wait one
            # more turn, so that the requests handed to the target alone meanwhile open their
            # streams first. Those are the long jobs, and the last of them sets when a burst
            # ends (longest first); a round is done long before. Cold bursts of 100 through the
            # proxy, median of five: 0.89x the target alone's throughput without the turn, 0.92x
            # with it (`benchmarks/README.md`).
            await asyncio.sleep(0)
        draft = await self._drafted_ahead(state, context, k)
        if draft is None:
            draft = await self._draft(context, k, state)
        if draft is None:
            return None
        if not draft.tokens:
            return [], False
        assert state.policy is not None and state.drafter is not None
        if (
            self.pipeline and draft.model is not None and state.draft_meter is not None and not state.native_drafts
            and state.policy.pipeline_pays(len(draft.tokens))
        ):
            # Guess that every draft token is kept, and draft the next round meanwhile
            # (no longer than the model is asked for in a round sized for free drafts).
            length = state.drafter.paid_length(k)
            state.prefetching(start_prefetch(draft.model, context.advanced(draft.text), length + 1, state.draft_meter, state.seed()))
        return await self._round(context, draft, state)

    async def _drafted_ahead(self, state: RequestState, context: Context, k: int) -> Draft | None:
        """The round's draft if one was made ahead of it: the previous round's prefetch when its guess
        held, else the draft made before the prompt was tokenized (None: draft now)."""
        prefetched = state.take_prefetch()
        taken = take_prefetch(prefetched, context, k, self.clock) if prefetched is not None else None
        if prefetched is not None and taken is None:
            state.went_stale(prefetched.task)
        if taken is not None:
            draft, discarded = await taken
        else:
            early = state.take_first_draft()
            draft, discarded = first_draft(early, context, k) if early is not None else (None, 0)
        state.discarded(discarded)
        return draft

    def _learn_refusal(self, state: RequestState) -> None:
        """The request ended well after its verification was refused: the target accepted the plain
        request, so the verification shape was at fault, not the caller's parameters. The path
        resolver (one per target model) counts it, and writes the path off when it is confirmed."""
        if state.refusal is not None and self.paths.refuse(state.request.context.is_chat, state.refusal, definite=True):
            state.refusal_confirmed(state.verifier.name if state.verifier is not None else "token-ids")

    def _choose(self, state: RequestState, remaining: int | None, mode: str) -> int:
        """The policy's draft length for the next round (0: the target alone from here, with the reason
        in the books, and what the load changed)."""
        policy = state.policy
        assert policy is not None
        budget = remaining if remaining is not None else _UNBOUNDED
        rounds, drafters = state.rounds, state.round_drafters
        last = drafters[-1] if drafters else ""
        own = tuple(r.accepted_by_position for r, d in zip(rounds, drafters) if d == MODEL_DRAFTER)  # the model's rounds
        by_last = tuple(r.accepted_by_position for r, d in zip(rounds, drafters) if d == last)  # the last round's drafter's
        decision = policy.choose(
            PolicyState(
                budget, len(rounds), recheck=mode == RECHECK, accepted_by_position=own,
                last_drafter=last, last_drafter_rounds=by_last, queue_delay_s=0.0 if rounds else state.queue_delay_s,
                sampled=not state.request.context.sampling.greedy,
            )
        )
        state.chose(decision)
        return decision.length

    def _finished(self, state: RequestState, started: float, finish_reason: str, produced: int) -> Finished:
        return state.finished(finish_reason, produced, self.clock() - started, self.paths.known)

    async def _draft(self, context: Context, k: int, state: RequestState) -> Draft | None:
        assert state.drafter is not None
        meter = state.draft_meter if state.draft_meter is not None else Meter(self.target.endpoint)
        verifier = state.verifier
        try:
            if verifier is not None and verifier.sends_token_ids and state.draft_meter is not None:
                # Where both servers list whole distributions after their sampler chains, the draft
                # server draws on the context's ids and says what it drew from (full rejection sampling).
                started = self.clock()
                model = isinstance(state.drafter, ModelDrafter)  # (a combined drafter chooses its own per round)
                tokens = await verifier.native_draft(context, k, state.target_meter, state.draft_meter, state.seed(), model=model)
                if tokens is not None:
                    state.drafts_natively()
                    return Draft(tokens=tokens, latency_s=self.clock() - started, drafter=MODEL_DRAFTER)
            return await state.drafter.draft(context, k, meter, state.seed())
        except (DraftError, MalformedResponseError) as exc:
            state.fell_back(f"draft failed, continued with the target alone: {exc}")
            self.warnings.failed(exc)
            return None

    async def _verify(self, context: Context, draft: Draft, state: RequestState) -> Verification | None:
        """The target's verification of `draft` (None: it failed, continue without speculating)."""
        assert state.verifier is not None
        try:
            seeds = state.seeds_from(state.out.produced)
            verification = await state.verifier.verify(
                context, draft.tokens, state.target_meter, seeds, state.top_k, draft_meter=state.draft_meter, limit=state.out.remaining
            )
        except MalformedResponseError as exc:
            reason = f"target response could not be verified against, continued with the target alone: {exc}"
            state.fell_back(reason)
            self.warnings.failed(exc)
            self.paths.refuse(state.request.context.is_chat, reason, definite=False)
            return None
        except EndpointError as exc:
            if not exc.refused_shape:
                raise
            # The target refuses the verification request: its shape (e.g. echo with logprobs), or the
            # caller's own parameters. The plain request that follows tells which: refused too, it
            # raises the caller's error; accepted, the shape is counted against (`_learn_refusal`).
            state.fell_back(f"target refused the verification request, continued with the target alone: {exc}", refused=True)
            return None
        self.paths.succeeded(state.request.context.is_chat)
        return verification

    async def _round(self, context: Context, draft: Draft, state: RequestState) -> tuple[list[Emitted], bool] | None:
        """One draft-then-verify round: the target tokens it adds, and whether the next position must
        be decided by the target alone (None: verification failed, continue without speculating)."""
        out = state.out
        verification = await self._verify(context, draft, state)
        if verification is None:
            return None
        if not context.accepted:
            state.prompt_counted(verification.prompt_tokens)
        state.check_token_boundaries(verification, context, draft, out.token_starts)
        decision = verification.decision or decide_round(verification.positions, verification.straddle, draft.tokens, context.sampling, state.rng)
        state.check_token_counts(verification, decision.accepted, context, out.produced)
        state.decided(decision, sampled=not context.sampling.greedy)
        if verification.decision is None and verification.seeds and decision.accepted < len(verification.seeds):
            # If the target's pick after the kept tokens was unreadable, the next step redraws it.
            kept = "".join(t.data.decode("utf-8", errors="replace") for t in draft.tokens[: decision.accepted])
            state.redraw_at(context.accepted + kept, verification.seeds[decision.accepted])
        new = list(decision.emitted)
        if decision.all_accepted and not decision.stalled:
            if verification.bonus is not None:
                bonus = verification.bonus
                new.append(Emitted(token=bonus.text, data=token_bytes(bonus.text) or b"", logprob=bonus.logprob, top=dict(bonus.top or {})))
            elif verification.finish_reason == "stop":
                new.append(Emitted(token="", data=b"", eos=True))
        if verification.picks and state.logprob_shape is not None:
            new = with_pick_scores(new, verification.picks)  # the caller's logprobs: each pick's own
        if verification.decision is not None:
            new, decision = _cut_decided(new, decision, verification, context, state)
        else:
            new = _complete_characters(within_limit(new, out.remaining), context.sampling.greedy, state)
        self._record(draft, decision, verification, new, context, state)
        return new, decision.handover or (decision.stalled and not new)

    def _record(
        self, draft: Draft, decision: RoundDecision, verification: Verification, new: list[Emitted], context: Context, state: RequestState
    ) -> None:
        """Book the round, and tell the policy and the drafter how it went."""
        assert state.policy is not None and state.drafter is not None
        record = RoundRecord(
            drafted=len(draft.tokens),
            accepted=decision.accepted,
            emitted=sum(1 for t in new if not t.eos),
            draft_latency_s=draft.latency_s,
            verify_latency_s=verification.latency_s,
            drafter=draft.label,
            accepted_by_position=decision.accepted_by_position,
            sampled=not context.sampling.greedy,
        )
        state.book_round(record, draft.drafter)
        state.policy.observe(record)
        state.drafter.record(draft.drafter, record.drafted, record.accepted)
        state.drafter.observe(record)  # a drafter that weighs costs (CombinedDrafter)


def _draft_length(chosen: int, remaining: int | None, stretch: int, space: int | None) -> int:
    """A round's draft length: the policy's choice, short of the caller's limit (its last tokens come
    from one target call) and of the context window (the round's calls fit it)."""
    budget = remaining if remaining is not None else _UNBOUNDED
    k = min(chosen, budget - 1 - (stretch if remaining is not None else 0))
    if space is not None:
        k = min(k, space - 1 - _WINDOW_STRETCH)
    return k


def _plain_step(empty: int, remaining: int | None, grows: bool) -> int:
    """Tokens the target writes alone after `empty` rounds in a row whose drafter proposed nothing (a
    lookup or suffix drafter with no match): 1, 2, 4, ... where `grows` (a greedy request not streamed),
    so that a text no draft fits costs a few requests, not one a token; else one token (a sampled request
    draws with a seed a position, and a streamed one hands out each token as it comes)."""
    if empty <= 1 or not grows:
        return 1
    step = 2 ** min(empty - 1, 8)
    return step if remaining is None else min(step, remaining)


def _complete_characters(tokens: list[Emitted], greedy: bool, state: RequestState) -> list[Emitted]:
    """`output.complete_characters`; a sampled round whose tail was cut draws it again, so the
    response says it is approximate."""
    kept = complete_characters(tokens)
    if len(kept) < len(tokens) and not greedy:
        state.approximate("approximate: a token ended inside a UTF-8 character and was drawn again")
    return kept


def _cut_decided(
    new: list[Emitted], decision: RoundDecision, verification: Verification, context: Context, state: RequestState
) -> tuple[list[Emitted], RoundDecision]:
    """Token ids: what is cut here (at the caller's limit, or a character left unfinished) is drawn
    again by the next step, a plain one, with the seed of the call that drew it first: the same token,
    so the output is the target's draws whatever the cut depended on."""
    drawn = [t for t in new if not t.eos]
    new = within_limit(new, state.out.remaining)
    remaining = state.out.remaining
    if remaining is not None and sum(t.count for t in new if not t.eos) > remaining:
        # Tokens read back together (`TokenIdVerifier._read_held`) that reach past the caller's limit.
        while new and (new[-1].eos or sum(t.count for t in new if not t.eos) > remaining):
            new = new[:-1]
        state.approximate("approximate: a drawn token's bytes could not be read back within the limit, and it was drawn again")
    cut = new if decision.keeps_partial else _complete_characters(new, True, state)
    kept = [t for t in cut if not t.eos]
    decided = len(drawn) + (1 if decision.handover else 0)
    if len(kept) < decided and not any(t.eos for t in cut):
        seeds = verification.seeds
        if len(kept) < len(seeds) and seeds[len(kept)] is not None:
            text = b"".join(t.data for t in kept).decode("utf-8", errors="replace")
            state.redraw_at(context.accepted + text, seeds[len(kept)])
        decision = replace(decision, handover=True)
    return cut, decision


def _runs_to_window(caps: Capabilities | None) -> bool:
    """The server runs a request whose limit is past its window up to the window (llama-server), where
    others refuse it (vLLM, OpenAI)."""
    return caps is not None and caps.server in ("llama-server", "llama-cpp-python")
