"""Token-id verification: the target is sent its own token ids, never text it would read back.

The context is kept as the target's ids (`Context.token_ids`: the prompt tokenized once by the target,
then every token it chose). For a draft d1..dK in the target's ids, the prompts `context + d1..dj`
(j = 0..K) each ask the target for one token; d(j+1) is kept while it equals the target's pick after
`context + d1..dj`, and the first pick that differs (or the pick after all K) is emitted. Every emitted
token is the target's own choice on exactly the ids it generated, so the output is the target's, at
token boundaries too, by construction: no re-tokenization check is needed.

Greedy rounds send all prompts in one request where the dialect batches them (llama.cpp's multi-prompt
`/completion`, vLLM's list of token-id prompts, SGLang's batched `input_ids`). A sampled round with the
caller's seed sends one request per prompt, concurrently, each with its position's seed: a batch shares
one seed, so its draws would be correlated across positions. A sampled round without a seed goes as one
request without a seed where each prompt draws independently (vLLM): the draft samples chains on the
context's ids, in one request with `n`, each position listing its likeliest ids; the nodes the target
is likely enough to reach make a tree (`drafttree.plan_tree`), the target draws after each of its
nodes, and the output walks the tree along the draws. A drawn token is always kept, its bytes read back
where the answer hid them (`drafttree.decide_batched`; docs/algorithm.md).

The draft's tokens go as ids when the draft shows them and shares the target's tokenizer (checked
once, by tokenizing a probe text on both); otherwise the draft's text is tokenized by the target.

Where the servers list whole distributions after their sampler chains (llama.cpp's `post_sampling_probs`
with a `top_k`), a sampled round is instead one draft request and one target request, and specapi runs
the full rejection sampler on exact p and q itself (`decide_processed`; docs/algorithm.md).
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from ..transport._calls import Meter, RoleClient
from ..transport._exceptions import EndpointError, MalformedResponseError
from ..core.acceptance import Emitted, RoundDecision
from ..core.alignment import Listed, ScoredToken, streamed_pieces, token_bytes
from ..core.context import Context
from ..dialects import NativeDialect, Pick
from ..dialects.base import ChatTokenizing, Generated, PromptScoring, SampledBatches, spelling
from ..dialects.logprobs import pick_for_caller, step_entries
from ..dialects.openai import sampling_fields
from .drafttree import MAX_NODES, UNMEASURED_NODES, DraftTree, PromptCosts, decide_batched, plan_tree
from .policy_costs import _Linear
from .processed import covers, decide_processed
from ..core.scoring import PICKS, SCORED, PrefixCache, choose_scoring
from .verifiers import PlainStep, SeedSource, Verification, VerifierBase

__all__ = ["TargetFacts", "TokenIdVerifier", "TOKENIZER_PROBE"]

#: The longest list asked after the sampler chain (the caller's top_k bounds the support).
MAX_PROCESSED_LIST = 100

#: Chains the draft samples after the context on the unseeded batched path, in one request with `n`,
#: each position listing its `LISTED` likeliest ids: their nodes, kept where the draft's tempered
#: probabilities say the target walks to them often enough (`drafttree.plan_tree`), make the round's tree.
#: On lan-code at T=0.7 / 1.0, exact expected tokens a round (`python benchmarks/draft_trees.py`): 4.37 /
#: 4.03, where the draft's likeliest chain with an alternative a position and 8 chains sampled beside it
#: in a second request, cut to the ids two of them share, gave 4.16 / 3.78 for as many prompts;
#: `specapi bench --scenario lan-code --requests 16`: 1.68x / 1.61x against 1.58x / 1.37x (docs/algorithm.md).
SAMPLED_CHAINS = 8
LISTED = 2
#: The draft samples its chains at the caller's temperature, but not above this: a tree is worth the
#: paths the target is likeliest to take, and a cooler draft finds more of them, down to a point
#: (`python benchmarks/draft_trees.py`, exact expected tokens a round for a caller at 1.0: chains at 0.7
#: 4.03, at 1.0 4.02, at 0.5 3.97).
DRAFT_TEMPERATURE = 0.7
#: Where the draft server takes no `n`: the draft's most likely ids, each position with this many next
#: most likely ones beside it (the target draws after each).
ALTERNATIVES = 1
#: Request fields that leave a greedy pick the model's own argmax, which prompt scores show: a request
#: with any other field (`logit_bias`, `allowed_token_ids`, ...) has its rounds checked by K + 1 prompts.
SCORED_NEUTRAL = frozenset({"top_k", "top_p", "min_p", "typical_p", "seed", "user", "metadata", "store", "cache_prompt", "stream_options"})
#: The most tokens drawn after a token whose bytes the target's answer hid, to read them back.
_MAX_HELD_STEP = 16

#: Text whose tokenization tells tokenizers apart: code, CJK, emoji and a combining mark.
TOKENIZER_PROBE = "def f(x):\n    return x  # 中文テキスト 😀 e\u0301"


@dataclass
class TargetFacts:
    """What token-id verification learns of a target once, for every request after: whether the draft
    server shares its tokenizer (two tokenize calls) and its prefix cache (its `/metrics`)."""

    same_tokenizer: bool | None = None
    prefix_cache: PrefixCache | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: What a request of n one-token prompts costs the target (seconds against n), from its rounds.
    prompt_line: _Linear = field(default_factory=_Linear)

    def prompt_costs(self) -> PromptCosts | None:
        """`prompt_line` as a tree's costs, once requests of two sizes have measured it."""
        line = self.prompt_line
        if not line.has_slope:
            return None
        fixed = line.predict(0)
        return PromptCosts(fixed_s=fixed, per_prompt_s=line.predict(1) - fixed)


@dataclass
class TokenIdVerifier(VerifierBase):
    client: RoleClient
    dialect: NativeDialect
    #: The draft's endpoint, to check once whether it shares the target's tokenizer.
    draft_client: RoleClient | None = None
    name: str = "token-ids"
    #: Every kept token is one the target chose itself, so any sampler settings are reproduced.
    draws_target_tokens: bool = True
    sends_token_ids = True
    #: What the target's verifiers learn once and share across requests (the resolver holds one).
    facts: TargetFacts = field(default_factory=TargetFacts, repr=False)
    _processed_refused: bool = field(default=False, repr=False)
    #: The draft server refused (or answered unreadably) a draft on ids named by id: this request's
    #: drafts go as text.
    _ids_draft_refused: bool = field(default=False, repr=False)
    #: The draft server refused (or answered unreadably) sampled chains with `n`: rounds go without them.
    _sampled_refused: bool = field(default=False, repr=False)
    #: The target refused (or answered unreadably) a scored prompt: its rounds go as K + 1 prompts.
    _scored_refused: bool = field(default=False, repr=False)
    #: The target's context window (vLLM's `max_model_len`), where known: a chat request without a limit
    #: runs to its end, as vLLM's chat endpoint lets it.
    context_window: int | None = None

    async def prompt_ids(self, context: Context, meter: Meter) -> tuple[int, ...]:
        """The prompt as the target tokenizes it for a request of its own; a chat request's messages as
        its chat endpoint renders and tokenizes them (vLLM's `/tokenize` with `messages`)."""
        if context.is_chat:
            if not self.dialect.tokenizes_chat or context.accepted:
                raise self.client.malformed("token-id verification of chat needs the server's chat tokenizer")
            assert context.messages is not None
            chat = cast(ChatTokenizing, self.dialect)
            return tuple(await chat.tokenize_chat(self.client, context.messages, context.extras, meter, options=context.options))
        return tuple(i for i, _ in await self.dialect.tokenize(self.client, context.completion_prompt(), meter, special=True, options=context.options))

    @property
    def verifies_chat(self) -> bool:  # type: ignore[override]
        """Chat requests can run on token ids here: the server renders and tokenizes a chat's messages."""
        return self.dialect.tokenizes_chat

    @property
    def carries_logprobs(self) -> bool:  # type: ignore[override]
        """The server's picks and steps list each kept token's entry as the target alone renders it."""
        return self.dialect.carries_logprobs

    async def _cache(self) -> PrefixCache:
        """The target's prefix cache as its server reports it (asked once), else vLLM's usual one."""
        facts = self.facts
        async with facts.lock:
            if facts.prefix_cache is None:
                reported = await cast(PromptScoring, self.dialect).prefix_cache(self.client)
                facts.prefix_cache = reported if reported is not None else PrefixCache()
            return facts.prefix_cache

    async def scoring(self, context: Context, drafted: int) -> str:
        """How a greedy round checks `drafted` ids (`scoring.choose_scoring`): one scored prompt where the
        server offers it and it recomputes less than K + 1 prompts on the cached context. The cache holds
        the context once a call has run on it: the prompt alone has never been sent by this request."""
        if not self.dialect.scores_prompts or self._scored_refused or not context.sampling.greedy:
            return PICKS
        if any(key not in SCORED_NEUTRAL for key in context.extras):
            return PICKS  # a field that may move the pick (logit_bias, ...): prompt scores are the model's own
        assert context.token_ids is not None
        n = len(context.token_ids)
        known = n - 1 if context.accepted else 0
        return choose_scoring(n, drafted, known, await self._cache())

    async def _shares_tokenizer(self, meter: Meter, draft_meter: Meter | None) -> bool:
        facts = self.facts
        async with facts.lock:
            if facts.same_tokenizer is None:
                facts.same_tokenizer = False
                if self.draft_client is not None:
                    try:
                        mine = await self.dialect.tokenize(self.client, TOKENIZER_PROBE, meter, special=False)
                        theirs = await self.dialect.tokenize(self.draft_client, TOKENIZER_PROBE, draft_meter or Meter(self.draft_client.endpoint), special=False)
                        facts.same_tokenizer = [i for i, _ in mine] == [i for i, _ in theirs]
                    except Exception:  # a draft that cannot tokenize (another kind of server): not shared
                        facts.same_tokenizer = False
            return facts.same_tokenizer

    async def _draft_ids(self, draft: Sequence[ScoredToken], meter: Meter, draft_meter: Meter | None) -> list[tuple[int, bytes | None]]:
        """The draft's text in the target's token ids (with their bytes where shown). A draft server
        with the same tokenizer splits it (a draft call, not one more target call); else the target."""
        text = b"".join(t.data for t in draft).decode("utf-8")
        if not text:
            return []
        if self.draft_client is not None and await self._shares_tokenizer(meter, draft_meter):
            return await self.dialect.tokenize(self.draft_client, text, draft_meter or Meter(self.draft_client.endpoint), special=False)
        return await self.dialect.tokenize(self.client, text, meter, special=False)

    def processed_list(self, context: Context) -> int | None:
        """How long a list after the sampler chain shows a sampled request's whole support here (the
        caller's or the server's top_k), or None where it cannot (greedy, no top_k, no such API)."""
        top_k = context.extras.get("top_k")
        if context.sampling.greedy or not self.dialect.lists_processed or context.token_ids is None or self._processed_refused:
            return None
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 0 < top_k <= MAX_PROCESSED_LIST:
            return None
        return top_k

    def batched_sampling(self, context: Context) -> bool:
        """Whether a sampled round goes as one unseeded request (`decide_batched`): no caller's seed to
        keep, and a server whose prompts of one request draw independently."""
        return (
            not context.sampling.greedy and context.seed is None and context.token_ids is not None
            and self.dialect.batches and self.dialect.batches_sampled
        )

    async def native_draft(
        self, context: Context, k: int, meter: Meter, draft_meter: Meter, seed: int | None, *, model: bool = True
    ) -> tuple[ScoredToken, ...] | None:
        """A draft drawn by the draft server on the context's ids, each token with the distribution it
        was drawn from (after the sampler chain), where both servers list those and share a tokenizer;
        on the unseeded batched path (`model`: the request's drafter is the draft model), the draft's
        most likely ids with their alternatives and sampled chains as branches (`_tree_draft`); None
        otherwise (the engine's drafter proposes instead)."""
        ids_draft = model and not self._ids_draft_refused and context.sampling.point_mass_draft
        if ids_draft and self.draft_client is not None and self.batched_sampling(context):
            if not await self._shares_tokenizer(meter, draft_meter):
                return None
            return await self._tree_draft(context, k, draft_meter)
        list_length = self.processed_list(context)
        if list_length is None or self.draft_client is None or not self.dialect.lists_processed:
            return None
        if not await self._shares_tokenizer(meter, draft_meter):
            return None
        assert context.token_ids is not None
        drawn = await self.dialect.processed_draft(
            self.draft_client, context.token_ids, k, sampling_fields(context, seed), list_length, draft_meter, options=context.options
        )
        tokens: list[ScoredToken] = []
        for token, data, dist in drawn:
            if not covers(dist):
                break  # the draw is exact only where the list is the whole distribution
            q = {t: v for t, (v, _) in dist.items()}
            tokens.append(ScoredToken(text=spelling(data), logprob=math.log(q[token]) if q[token] > 0 else None, id=token, drawn_from=q))
        return tuple(tokens)

    async def _tree_draft(self, context: Context, k: int, draft_meter: Meter) -> tuple[ScoredToken, ...] | None:
        """The draft's proposals as a tree (`DraftTree`): `SAMPLED_CHAINS` chains it samples in one request,
        pruned by `plan_tree`; where the server takes no `n`, its most likely ids, each with its next most
        likely ones. The tree travels as its chain, the first token holding the other nodes as branches."""
        assert context.token_ids is not None and self.draft_client is not None
        dialect = cast(SampledBatches, self.dialect)
        if not self._sampled_refused and SAMPLED_CHAINS:
            cool = replace(context.sampling, temperature=min(context.sampling.temperature, DRAFT_TEMPERATURE), point_mass_draft=False)
            try:
                chains = await dialect.sampled_drafts(
                    self.draft_client, context.token_ids, k, sampling_fields(replace(context, sampling=cool), None, target=False),
                    SAMPLED_CHAINS, LISTED, draft_meter, options=context.options,
                )
            except EndpointError as exc:
                if not _declined(exc):
                    raise
                self._sampled_refused = True  # a server without `n` (or unreadable choices): the chain and its alternatives
            else:
                costs = self.facts.prompt_costs()
                tree = plan_tree(chains, context.sampling.temperature, costs=costs, max_nodes=MAX_NODES if costs is not None else UNMEASURED_NODES)
                if tree.chain:
                    on_chain = set(tree.nodes[: len(tree.chain) + 1])
                    branches = tuple(node for node in tree.nodes if node not in on_chain)
                    tokens = [_id_only(i) for i in tree.chain]
                    tokens[0] = replace(tokens[0], branches=branches)
                    return tuple(tokens)
        try:
            chain = await dialect.ids_draft(
                self.draft_client, context.token_ids, k, sampling_fields(context, None, target=False), ALTERNATIVES, draft_meter, options=context.options
            )
        except EndpointError as exc:
            if not _declined(exc):
                raise
            self._ids_draft_refused = True  # an older server: the draft model proposes text, without alternatives
            return None
        return tuple(_id_only(i, tuple((a,) for a in alternatives)) for i, alternatives in chain)

    async def verify(
        self, context: Context, draft: Sequence[ScoredToken], meter: Meter, next_seed: SeedSource, top_k: int, draft_meter: Meter | None = None,
        limit: int | None = None,
    ) -> Verification:
        if context.token_ids is None:
            raise self.client.malformed("token-id verification needs the context's token ids")
        list_length = self.processed_list(context)
        refused = False  # the target refused the processed-list request of this round
        if list_length is not None and draft and all(t.drawn_from is not None and t.id is not None for t in draft):
            proposals = [(int(t.id), t.data, dict(t.drawn_from or {})) for t in draft]  # type: ignore[arg-type]
            verification = await self._verify_processed(context, proposals, len(draft), meter, next_seed, list_length)
            if verification is not None:
                return verification
            refused = True
        if self.batched_sampling(context):
            return await self._verify_batched(context, draft, meter, next_seed, draft_meter, limit)
        pieces = await self._draft_ids(draft, meter, draft_meter)
        if list_length is not None and not refused and pieces and all(t.logprob == 0.0 for t in draft):
            # A point-mass draft (prompt lookup, the suffix index, a prediction, the draft model's most
            # likely tokens: q(x) = 1): its ids are a function of the context, so q_j is a point mass on
            # each of them, whole, and the same rejection sampler applies.
            proposals = [(i, data or b"", {i: 1.0}) for i, data in pieces]
            verification = await self._verify_processed(context, proposals, len(draft), meter, next_seed, list_length)
            if verification is not None:
                return verification
            refused = True
        drafted = [i for i, _ in pieces]
        base = list(context.token_ids)
        prompts = [base + drafted[:j] for j in range(len(drafted) + 1)]
        started = self.client.clock()
        if context.sampling.greedy and self.dialect.batches:
            seeds = [next_seed()] * len(prompts)
            picks = await self._greedy_picks(context, drafted, prompts, sampling_fields(context, seeds[0]), meter)
            if self.caller_logprobs(context) is not None:
                picks = [pick_for_caller(p, context.is_chat, context.logprobs or 0) for p in picks]
        else:
            seeds = [next_seed() for _ in prompts]
            answers = await asyncio.gather(
                *(self.dialect.next_tokens(self.client, [p], sampling_fields(context, seed), meter, options=context.options) for p, seed in zip(prompts, seeds))
            )
            picks = [a[0] for a in answers]
        if refused:
            # The same fields were accepted for picks: the processed lists' shape was refused (e.g. a server
            # without post_sampling_probs), not the caller's parameters, which would have been refused again.
            self._processed_refused = True
        latency = self.client.clock() - started
        return Verification(
            positions=(),
            straddle=0,
            bonus=None,
            finish_reason=None,
            latency_s=latency,
            prompt_tokens=picks[0].prompt_tokens,
            decision=_decide(pieces, picks, len(draft)),
            seeds=tuple(seeds),
        )

    def caller_logprobs(self, context: Context) -> int | None:
        """The caller's top count, where its logprobs are asked and this target's picks and steps carry
        them (`NativeDialect.carries_logprobs`, greedy requests); else None."""
        if context.logprobs is None or not context.sampling.greedy or not self.dialect.carries_logprobs:
            return None
        return context.logprobs

    async def _greedy_picks(
        self, context: Context, drafted: Sequence[int], prompts: Sequence[Sequence[int]], fields: Mapping[str, Any], meter: Meter
    ) -> list[Pick]:
        """The target's greedy picks after each prompt, by the scoring that recomputes least (`scoring`),
        each with its position's logprobs entry where the caller asked for them."""
        count = self.caller_logprobs(context)
        listing = {"logprobs": count} if count is not None else {}
        shape = await self.scoring(context, len(drafted)) if drafted else PICKS
        if shape == SCORED:
            assert context.token_ids is not None
            try:
                scorer = cast(PromptScoring, self.dialect)
                picks = await scorer.scored_next(self.client, context.token_ids, drafted, fields, meter, options=context.options, **listing)
            except EndpointError as exc:
                if not _declined(exc):
                    raise
                self._scored_refused = True  # the target's picks on K + 1 prompts from now on
            else:
                return picks
        started = self.client.clock()
        picks = await self.dialect.next_tokens(self.client, prompts, fields, meter, options=context.options, **listing)
        self._timed(len(prompts), self.client.clock() - started)
        return picks

    def _timed(self, prompts: int, seconds: float) -> None:
        """A request of `prompts` one-token prompts took `seconds`: what the next trees are sized by. Under
        load a call is slower by what others ask, not by its prompts: such calls move the line's level
        only (as the policy's lines)."""
        self.facts.prompt_line.add(prompts, seconds, keep_slope=self.client.load.requests > 1)

    async def _verify_batched(
        self, context: Context, draft: Sequence[ScoredToken], meter: Meter, next_seed: SeedSource, draft_meter: Meter | None, limit: int | None
    ) -> Verification:
        """One unseeded request: the target draws after every node of the draft's tree (`DraftTree`,
        `decide_batched`). A drawn token whose bytes the answer hid is kept, and its bytes read back."""
        assert context.token_ids is not None
        native = all(_is_id_only(t) for t in draft)
        pieces = [(int(t.id), None) for t in draft] if native else await self._draft_ids(draft, meter, draft_meter)  # type: ignore[arg-type]
        drafted = tuple(i for i, _ in pieces)
        branches = (drafted[:j] + b for j, t in enumerate(draft[: len(drafted)]) if native for b in t.branches)
        tree = DraftTree.grow(pieces, branches)
        base = list(context.token_ids)
        started = self.client.clock()
        picks = await self.dialect.next_tokens(
            self.client, [base + list(node) for node in tree.nodes], sampling_fields(context, None), meter, options=context.options
        )
        self._timed(len(tree.nodes), self.client.clock() - started)
        decision, held = decide_batched(tree, dict(zip(tree.nodes, picks)), len(draft))
        if held is not None:
            decision = await self._read_held(context, decision, held, meter, next_seed, limit)
        return Verification(
            positions=(), straddle=0, bonus=None, finish_reason=None, latency_s=self.client.clock() - started,
            prompt_tokens=picks[0].prompt_tokens, decision=decision,
        )

    async def _read_held(
        self, context: Context, decision: RoundDecision, held: int, meter: Meter, next_seed: SeedSource, limit: int | None = None
    ) -> RoundDecision:
        """The round's last drawn token, `held`, came without its bytes (part of a character): it is kept
        (drawing it again because of what was drawn would bias the draw). The target continues after it,
        seeded by position so that a longer step repeats a shorter one, until the run of tokens renders
        whole (the character finished, or shown as U+FFFD once a later token breaks it) or the target ends
        the text. Each token then adds the text vLLM's own stream adds at it (`streamed_pieces`, from the
        server's renderings of the run): "" while a character is unfinished, so a run the caller's limit
        (`limit`: the tokens it still allows, where it reaches past no more are drawn) or the end of text
        cuts short reads as the target alone's answer would. Where the run never renders whole, the
        decision says the token is drawn again (`redrawn`: the response is approximate)."""
        assert context.token_ids is not None
        prefix = [i for e in decision.emitted for i in (e.ids or ())]
        seed = None
        for _ in range(len(prefix) + 2):
            seed = next_seed()  # the seed of the position after the held token
        dialect = cast(SampledBatches, self.dialect)
        ids = list(context.token_ids) + prefix + [held]
        renders: dict[tuple[int, ...], str] = {}  # the server's rendering of each start of the run
        room = None if limit is None else max(0, limit - len(prefix) - 1)  # tokens the caller allows after it
        steps = 1 if room is None else min(1, room)
        while True:
            generated = Generated(ids=(), data=b"", finish_reason="length", prompt_tokens=None, completion_tokens=0)
            if steps:
                generated = await self.dialect.generate(self.client, ids, sampling_fields(context, seed), steps, (), meter, options=context.options)
            ended = generated.finish_reason != "length"
            run = [held, *(generated.ids or ())]
            at_limit = room is not None and len(run) - 1 >= room
            # The token that ended the text: vLLM lists and counts it, and its stream adds nothing for it.
            stop_token = run.pop() if ended and generated.ids and len(generated.ids) == generated.completion_tokens else None
            starts = [tuple(run[:n]) for n in range(1, len(run) + 1)]
            for start in starts:
                if start not in renders:
                    renders[start] = await dialect.detokenize(self.client, start, meter)
            pieces = streamed_pieces([renders[start] for start in starts])
            if pieces is not None and (pieces[-1] or ended or at_limit):
                tokens = tuple(Emitted(token=piece, data=piece.encode("utf-8"), ids=(i,)) for i, piece in zip(run, pieces))
                if ended:
                    counted = max(0, generated.completion_tokens - len(generated.ids or ()))  # counted, not listed
                    end = Emitted(token="", data=b"", ids=(stop_token,)) if stop_token is not None else Emitted(token="", data=b"", count=counted)
                    tokens += (end, Emitted(token="", data=b"", eos=True, count=0))
                return replace(decision, emitted=decision.emitted + tokens, stalled=False, handover=False)
            if ended or pieces is None or steps >= _MAX_HELD_STEP or (room is not None and steps >= room):
                return replace(decision, handover=True, redrawn=True)
            steps = steps * 2 if room is None else min(steps * 2, room)

    async def _verify_processed(
        self,
        context: Context,
        proposals: Sequence[tuple[int, bytes, Mapping[int, float]]],
        draft_tokens: int,
        meter: Meter,
        next_seed: SeedSource,
        list_length: int,
    ) -> Verification | None:
        """The full rejection sampler on exact distributions: one request lists the target's distribution
        after its sampler chain at every draft position and after the draft, and specapi draws (see
        `decide_processed`). The seed is not a position's: the server's own draws here only decide where it
        lists nothing, and a step that draws such a position again must draw independently of them."""
        assert context.token_ids is not None
        seed = next_seed()
        own = _other_seed(seed)
        base = list(context.token_ids)
        prompts = [base + [token for token, _, _ in proposals[:j]] for j in range(len(proposals) + 1)]
        started = self.client.clock()
        try:
            targets, prompt_tokens = await self.dialect.processed_next(  # type: ignore[attr-defined]
                self.client, prompts, sampling_fields(context, own), list_length, meter, options=context.options
            )
        except EndpointError as exc:
            if not exc.refused_shape:
                raise
            return None  # the target's picks decide this round (`verify` learns whether the shape was at fault)
        latency = self.client.clock() - started
        decision = decide_processed(proposals, targets, random.Random(own))
        if len(proposals) != draft_tokens:
            # Draft positions as the draft proposed them, counted by their share of the kept target tokens.
            accepted = min(draft_tokens, round(decision.accepted * draft_tokens / max(1, len(proposals))))
            decision = replace(decision, accepted=accepted, accepted_by_position=tuple(i < accepted for i in range(draft_tokens)))
        return Verification(
            positions=(),
            straddle=0,
            bonus=None,
            finish_reason=None,
            latency_s=latency,
            prompt_tokens=prompt_tokens,
            decision=decision,
        )

    async def plain(
        self, context: Context, max_tokens: int | None, meter: Meter, seed: int | None, stop: tuple[str, ...], *, streamed: bool = False,
        whole_characters: bool = False,
    ) -> PlainStep:
        """The target alone continues the context's ids (the engine's plain steps on this path);
        `streamed` renders the text as a stream would (a streaming caller's last step)."""
        assert context.token_ids is not None
        if max_tokens is None and context.is_chat and self.context_window is not None:
            # vLLM's chat endpoint lets a request without a limit run to the end of the window; its
            # completions endpoint would stop at 16 tokens.
            max_tokens = max(1, self.context_window - len(context.token_ids))
        started = self.client.clock()
        count = self.caller_logprobs(context)
        generated = await self.dialect.generate(
            self.client, context.token_ids, sampling_fields(context, seed), max_tokens, stop, meter, options=context.options, stream=streamed,
            whole_characters=whole_characters, **({"logprobs": count} if count is not None else {}),
        )
        return PlainStep(
            text=generated.data.decode("utf-8", errors="replace"),
            finish_reason=generated.finish_reason,
            completion_tokens=generated.completion_tokens,
            prompt_tokens=generated.prompt_tokens,
            latency_s=self.client.clock() - started,
            data=generated.data,
            ids=generated.ids,
            held_back=generated.held_back,
            tokens=step_entries(generated, context.is_chat, count) if count is not None else None,
        )


def _decide(pieces: Sequence[tuple[int, bytes | None]], picks: Sequence[Pick], draft_tokens: int) -> RoundDecision:
    """Keep draft ids while they equal the target's picks; emit the first pick that differs (or the
    pick after the whole draft). A pick's bytes are the server's, or the draft piece's when it is the
    same id; a pick whose bytes nobody showed ends the round before it (a plain step decides it)."""
    drafted = [i for i, _ in pieces]
    emitted: list[Emitted] = []
    kept = 0
    unread = False
    for j, pick in enumerate(picks):
        if pick.end:
            if pick.uncounted:
                # The server counts its end-of-text token as generated: so does the response (and lists
                # it among the caller's logprobs, by its name).
                emitted.append(Emitted(token=pick.token or "", data=b"", count=pick.uncounted, logprob=pick.logprob, listed=pick.listed))
            emitted.append(Emitted(token="", data=b"", eos=True, count=0))
            break
        data = pick.data
        if data is None and j < len(pieces) and pieces[j][0] == pick.id:
            data = pieces[j][1]
        if data is None:
            unread = True  # drawn, but its bytes are unknown: the target alone decides it again
            break
        pick = replace(pick, data=data)
        token = pick.token if pick.listed is not None and pick.token is not None else pick.data.decode("utf-8", errors="replace")
        emitted.append(Emitted(token=token, data=pick.data, ids=(pick.id,) if pick.id is not None else None, logprob=pick.logprob, listed=pick.listed))
        if j < len(drafted) and pick.id == drafted[j]:
            kept += 1
            continue
        break
    all_kept = kept == len(drafted)
    # Accepted draft positions as the draft proposed them: the draft's tokens are counted by their share
    # of the kept target tokens (tokenizers may differ).
    accepted = min(draft_tokens, kept if len(drafted) == draft_tokens else round(kept * draft_tokens / max(1, len(drafted))))
    return RoundDecision(
        emitted=tuple(emitted),
        accepted=accepted,
        accepted_by_position=tuple(i < accepted for i in range(draft_tokens)),
        all_accepted=all_kept,
        stalled=not emitted,
        handover=unread,
    )


def _declined(exc: EndpointError) -> bool:
    """The draft server refused the request's shape or answered it unreadably: it lacks that way of asking."""
    return exc.refused_shape or isinstance(exc, MalformedResponseError)


def _id_only(token_id: int, branches: tuple[tuple[int, ...], ...] = ()) -> ScoredToken:
    """A draft token known by its id alone (the draft on ids; its bytes come with the target's draw),
    written as a server writes a token it names by id, so that its text stands for no bytes."""
    return ScoredToken(text=f"token_id:{token_id}", logprob=0.0, id=token_id, branches=branches)


def _is_id_only(token: ScoredToken) -> bool:
    return token.id is not None and token.text == f"token_id:{token.id}"


def _other_seed(seed: int | None) -> int:
    """A seed unrelated to `seed` (a position's), derived from it so that runs repeat."""
    return random.Random(0x5EED ^ (seed if seed is not None else random.randrange(2**31))).randrange(2**31)
