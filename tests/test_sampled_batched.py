"""Unseeded sampled rounds in one request (`tokenlevel.decide_batched`): the target's distribution, the
draft's alternatives, the requests sent, and drawn tokens whose bytes the answer hid.

Oracle: the simulator's model read directly (`NGramModel.next_distribution`) through vLLM's sampler
(temperature, then the nucleus over the whole vocabulary), written out here. The simulator's vLLM takes
no top_k (the caller's top_k reaches only servers that apply it: the llama.cpp tests in test_sampled.py).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from typing import Any

import pytest

from specapi import AsyncSpeculativeOpenAI
from specapi.transport._calls import Meter
from specapi.core.acceptance import RoundDecision, SamplingParams
from specapi.core.alignment import ScoredToken
from specapi.core.context import Context
from specapi.dialects import Pick
from specapi.transport._exceptions import EndpointError
from specapi.dialects.base import Generated, SampledStep
from specapi.sim import EOS_TOKEN_ID, SimProvider, SimResponse, decode_text, encode_text, get_model, simulated_endpoints
from specapi.sim.corpus import UNIVERSE_SIZE
from specapi.core.load import LoadCurve
from specapi.parts.drafttree import DraftTree, PromptCosts, decide_batched, plan_tree, tempered_estimate
from specapi.parts.tokenlevel import DRAFT_TEMPERATURE, LISTED, SAMPLED_CHAINS, TokenIdVerifier
from toyclient import chisquare_p, text_probs

pytestmark = pytest.mark.usefixtures("fresh_probe_cache")

#: The simulated target is unsure here (', func' and ', other'), and the draft leans the other way.
PROMPT = "    def __init__(self"
TOKENS, SAMPLES = 3, 500


def vllm_chain(model_name: str, ids: list[int], *, temperature: float, top_p: float) -> dict[int, float]:
    """vLLM's sampler on the simulated model: p^(1/T) over the whole vocabulary (every unlisted token has
    the model's tail probability), then the smallest head whose share reaches top_p."""
    model = get_model(model_name)
    listed, probs = model.next_distribution(ids)
    weights = {int(t): float(p) ** (1.0 / temperature) for t, p in zip(listed, probs)}
    tail = model.tail_prob ** (1.0 / temperature) * (UNIVERSE_SIZE - len(weights))
    total = math.fsum(weights.values()) + tail
    kept: dict[int, float] = {}
    mass = 0.0
    for token, w in sorted(weights.items(), key=lambda kv: (-kv[1], kv[0])):
        kept[token] = w
        mass += w
        if mass / total >= top_p:
            norm = math.fsum(kept.values())
            return {t: v / norm for t, v in kept.items()}
    raise AssertionError("the nucleus reaches the tail: choose another prompt")


def sequence_probs(model_name: str, n: int, **chain: float) -> dict[str, float]:
    return text_probs(lambda ids: vllm_chain(model_name, ids, **chain), encode_text(PROMPT), n, end=EOS_TOKEN_ID, decode=decode_text)


@pytest.mark.parametrize("temperature", [0.7, 1.0])
async def test_unseeded_batched_rounds_with_alternatives_have_the_targets_distribution(temperature):
    provider = SimProvider(capabilities="vllm", latency="instant", seed=3)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=2, drafter="model") as client:
        responses = []
        for start in range(0, SAMPLES, 100):
            responses += await asyncio.gather(*(
                client.completions.create(prompt=PROMPT, max_tokens=TOKENS, temperature=temperature, top_p=0.9)
                for _ in range(start, start + 100)))
    counts: dict[str, int] = {}
    for r in responses:
        counts[r.choices[0].text] = counts.get(r.choices[0].text, 0) + 1
    assert {r.speculative.verification for r in responses if r.speculative.speculated} == {"token-ids"}
    assert all(r.speculative.exact for r in responses)
    rounds = [rd for r in responses for rd in r.speculative.rounds]
    assert sum(rd.accepted for rd in rounds) > 0.2 * len(rounds)  # the draft's first choices were kept
    # Every round's tree came from one draft request: chains sampled at the caller's temperature, at most
    # DRAFT_TEMPERATURE, each position listing LISTED ids. (The provider keeps the last calls only.)
    drafts = [c.body for c in provider.calls if c.model == "sim-draft" and c.path == "/v1/completions"]
    assert drafts and all(b["n"] == SAMPLED_CHAINS and b["logprobs"] == LISTED for b in drafts)
    assert {b["temperature"] for b in drafts} == {min(temperature, DRAFT_TEMPERATURE)}
    exact = sequence_probs("sim-target", TOKENS, temperature=temperature, top_p=0.9)
    assert chisquare_p(counts, exact) > 1e-3
    # The test has power: the same counts reject the draft's distribution.
    drafts = sequence_probs("sim-draft", TOKENS, temperature=temperature, top_p=0.9)
    assert not set(counts) <= set(drafts) or chisquare_p(counts, drafts) < 1e-6


async def test_an_unseeded_round_is_one_target_request_without_a_seed_and_a_seeded_one_keeps_position_seeds():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=4, drafter="model") as client:
        await client.completions.create(prompt=PROMPT, max_tokens=12, temperature=0.7)
        unseeded = [c.body for c in provider.calls if c.path == "/v1/completions" and c.model == "sim-target" and c.body.get("prompt")]
        drafts = [c.body for c in provider.calls if c.model == "sim-draft" and c.path == "/v1/completions"]
        provider.calls.clear()
        first = await client.completions.create(prompt=PROMPT, max_tokens=12, temperature=0.7, seed=5)
        seeded = [c.body for c in provider.calls if c.path == "/v1/completions" and c.model == "sim-target"]
        again = await client.completions.create(prompt=PROMPT, max_tokens=12, temperature=0.7, seed=5)
    rounds = [b for b in unseeded if isinstance(b["prompt"][0], list)]
    assert rounds and all("seed" not in b for b in rounds)
    # Each round's request: a tree's nodes after the context, each once, parents with their children (a
    # prompt of every length from the context's up to the deepest).
    for body in rounds:
        lengths = sorted({len(p) for p in body["prompt"]})
        assert lengths == list(range(lengths[0], lengths[-1] + 1))
        assert all(p[:-1] in body["prompt"] for p in body["prompt"] if len(p) > lengths[0])
    # Each round: one draft request, chains sampled at the caller's temperature (0.7 here), the draft's
    # likeliest ids listed at each position, every token named by its id.
    assert drafts and all(
        b["n"] == SAMPLED_CHAINS and b["logprobs"] == LISTED and b["temperature"] == 0.7 and b["max_tokens"] <= 4 and b.get("return_tokens_as_token_ids")
        for b in drafts
    )
    assert all(len({tuple(p) for p in b["prompt"]}) == len(b["prompt"]) for b in rounds)
    assert seeded and all(isinstance(b["prompt"][0], int) and isinstance(b.get("seed"), int) for b in seeded)
    assert first.choices[0].text == again.choices[0].text


# ----------------------------------------------------------------------------- the decision, by hand


def _pick(token: int | None, data: bytes | None = None, end: bool = False) -> Pick:
    return Pick(id=token, data=data, end=end)


def _tree(chain: list[int], *branches: tuple[int, ...]) -> DraftTree:
    return DraftTree.grow([(i, None) for i in chain], branches)


def test_draft_ids_are_kept_while_drawn_and_an_alternative_drawn_gives_the_draw_after_it():
    tree = _tree([1, 2, 3], (1, 7), (1, 6), (4,))
    draws = {(): _pick(1, b"a"), (1,): _pick(7, b"g"), (1, 2): _pick(9, b"x"), (1, 2, 3): _pick(9, b"x"),
             (1, 7): _pick(8, b"h"), (1, 6): _pick(5, b"e"), (4,): _pick(5, b"e")}
    decision, held = decide_batched(tree, draws, 3)
    assert held is None and decision.keeps_partial
    assert [e.ids for e in decision.emitted] == [(1,), (7,), (8,)]
    # Kept along the walked path: 1 (the chain's) and 7 (an alternative's).
    assert decision.accepted == 2 and not decision.all_accepted


def test_the_walk_follows_a_sampled_chain_off_the_draft_chain_and_stops_where_the_draw_leaves_the_tree():
    tree = _tree([1, 2, 3], (4, 5, 6), (4, 5, 8), (4, 9))
    assert tree.nodes[:4] == ((), (1,), (1, 2), (1, 2, 3))  # the root and the chain first
    assert len(tree.nodes) == len(set(tree.nodes)) == 4 + 5  # (4,) (4,5) (4,5,6) (4,5,8) (4,9): each once
    draws = {node: _pick(99, b"?") for node in tree.nodes}
    draws.update({(): _pick(4, b"d"), (4,): _pick(5, b"e"), (4, 5): _pick(8, b"h"), (4, 5, 8): _pick(11, b"k")})
    decision, held = decide_batched(tree, draws, 3)
    assert held is None and [e.data for e in decision.emitted] == [b"d", b"e", b"h", b"k"]
    assert decision.accepted == 3 and decision.all_accepted and decision.accepted_by_position == (True, True, True)
    # The draw after the root is no node's token: it alone is the round's token.
    draws[()] = _pick(12, b"z")
    decision, _ = decide_batched(tree, draws, 3)
    assert [e.ids for e in decision.emitted] == [(12,)] and decision.accepted == 0


def _step(token: int, listed: dict[int, float]) -> SampledStep:
    """A sampled position as vLLM lists it: raw log-probabilities, the sampled id among them."""
    return SampledStep(id=token, logprob=math.log(listed[token]), listed=tuple((t, math.log(p)) for t, p in listed.items()))


def test_the_tree_keeps_the_sampled_and_listed_nodes_the_target_is_likely_to_reach():
    first = {1: 0.6, 2: 0.3}
    chains = [
        (_step(1, first), _step(3, {3: 0.5, 4: 0.02}), _step(5, {5: 0.9})),
        (_step(2, first), _step(6, {7: 0.8, 6: 0.05})),
        (_step(1, first), _step(3, {3: 0.5, 4: 0.02})),
    ]
    tree = plan_tree(chains, 1.0, min_reach=0.03)
    # Reach: (1) .6, (2) .3, (1,3) .3, (1,3,5) .27, (2,7) .24 (listed, never sampled); (2,6) .015 and
    # (1,4) .012 are cut. The chain follows the likeliest child at each step.
    assert tree.chain == (1, 3, 5)
    assert tree.nodes[:4] == ((), (1,), (1, 3), (1, 3, 5)) and set(tree.nodes) == {(), (1,), (1, 3), (1, 3, 5), (2,), (2, 7)}
    # A budget keeps the likeliest nodes, a parent before its children (shorter first among equals).
    assert set(plan_tree(chains, 1.0, min_reach=0.03, max_nodes=3).nodes) == {(), (1,), (2,), (1, 3)}
    # Nothing likely enough: the likeliest first id alone.
    assert plan_tree(chains, 1.0, min_reach=0.9).nodes == ((), (1,))
    assert plan_tree([], 1.0).nodes == ((),) and plan_tree([], 1.0).chain == ()


def test_where_a_prompt_costs_the_target_work_only_the_nodes_that_raise_the_rate_are_kept():
    """Reach .6, .3, .3, .27, .24 (the tree above). A node pays when reach * (round's seconds) > its
    prompt's seconds * the round's expected tokens so far. Prompts nearly free beside the call (a GPU
    server): every node. Each prompt a decoding step's worth (vLLM on a CPU, 0.2 s a prompt beside
    0.15 s fixed): (1) .6 * .35 > .2 * 1, kept; (2) .3 * .55 < .2 * 1.6, and the tree ends there."""
    first = {1: 0.6, 2: 0.3}
    chains = [
        (_step(1, first), _step(3, {3: 0.5, 4: 0.02}), _step(5, {5: 0.9})),
        (_step(2, first), _step(6, {7: 0.8, 6: 0.05})),
        (_step(1, first), _step(3, {3: 0.5, 4: 0.02})),
    ]
    everything = set(plan_tree(chains, 1.0, min_reach=0.03).nodes)
    assert set(plan_tree(chains, 1.0, min_reach=0.03, costs=PromptCosts(fixed_s=0.05, per_prompt_s=0.0005)).nodes) == everything
    dear = plan_tree(chains, 1.0, min_reach=0.03, costs=PromptCosts(fixed_s=0.15, per_prompt_s=0.2))
    assert dear.nodes == ((), (1,)) and dear.chain == (1,)
    # Between the two (0.05 s fixed, 0.01 a prompt), each node checked as the rate grows: (2) .3 * .07 >
    # .01 * 1.6, (1,3) .3 * .08 > .01 * 1.9, (1,3,5) .27 * .09 > .01 * 2.2, and (2,7) .24 * .10 < .01 * 2.47.
    middle = plan_tree(chains, 1.0, min_reach=0.03, costs=PromptCosts(fixed_s=0.05, per_prompt_s=0.01))
    assert set(middle.nodes) == {(), (1,), (2,), (1, 3), (1, 3, 5)} and middle.chain == (1, 3, 5)
    # Whatever the costs, the likeliest first id stays.
    assert plan_tree(chains, 1.0, costs=PromptCosts(fixed_s=0.0, per_prompt_s=10.0)).nodes == ((), (1,))


def test_what_the_chains_show_at_one_place_is_read_together_whatever_their_order():
    # Two chains from the root: one samples 1 (the two likeliest listed), one samples 9 (listed with them).
    one = _step(1, {1: 0.6, 2: 0.3})
    nine = SampledStep(id=9, logprob=math.log(0.05), listed=((1, math.log(0.6)), (2, math.log(0.3)), (9, math.log(0.05))))
    # At 0.5 the three together put 2 at .09 / .455 = .198; read from the first chain alone, .09 / .48 = .188.
    assert set(plan_tree([(one,), (nine,)], 0.5, min_reach=0.19).nodes) == {(), (1,), (2,)}
    assert set(plan_tree([(nine,), (one,)], 0.5, min_reach=0.19).nodes) == {(), (1,), (2,)}


def test_the_draft_probabilities_are_tempered_to_the_callers_temperature():
    listed = {1: math.log(0.6), 2: math.log(0.3)}
    assert tempered_estimate(listed, 1.0) == pytest.approx({1: 0.6, 2: 0.3})
    # At 0.5: weights .36 and .09; the unlisted .1 in tokens no likelier than .3 weighs at most .1 * .3.
    assert tempered_estimate(listed, 0.5) == pytest.approx({1: 0.36 / 0.48, 2: 0.09 / 0.48})
    # A cooler caller sharpens the tree: the second first id falls under the bar.
    chains = [(_step(1, {1: 0.6, 2: 0.3}),), (_step(2, {1: 0.6, 2: 0.3}),)]
    assert set(plan_tree(chains, 1.0, min_reach=0.2).nodes) == {(), (1,), (2,)}
    assert set(plan_tree(chains, 0.3, min_reach=0.2).nodes) == {(), (1,)}


def test_a_drawn_token_whose_bytes_are_hidden_ends_the_round_and_is_held():
    tree = _tree([1, 2])
    decision, held = decide_batched(tree, {(): _pick(1, b"a"), (1,): _pick(2, None), (1, 2): _pick(3, b"c")}, 2)
    assert held == 2 and [e.ids for e in decision.emitted] == [(1,)]
    # The draw after an alternative, hidden too.
    tree = _tree([1, 2], (6,))
    draws = {(): _pick(6, b"\xe4"), (1,): _pick(3, b"c"), (1, 2): _pick(3, b"c"), (6,): _pick(11, None)}
    decision, held = decide_batched(tree, draws, 2)
    assert held == 11 and [e.data for e in decision.emitted] == [b"\xe4"]  # kept inside a character


def test_cjk_and_emoji_tokens_whose_bytes_are_split_are_kept_along_a_sampled_chain():
    # "中" as two tokens (b"\xe4\xb8", b"\xad"), then "😀" as two (b"\xf0\x9f", b"\x98\x80"), along a sampled chain.
    tree = _tree([1, 2, 3, 4], (21, 22, 23, 24))
    pieces = {21: b"\xe4\xb8", 22: b"\xad", 23: b"\xf0\x9f", 24: b"\x98\x80"}
    draws = {node: _pick(99, b"?") for node in tree.nodes}
    path: tuple[int, ...] = ()
    for token in (21, 22, 23, 24):
        draws[path] = _pick(token, pieces[token])
        path += (token,)
    draws[path] = _pick(30, "é".encode())
    decision, held = decide_batched(tree, draws, 4)
    assert held is None and b"".join(e.data for e in decision.emitted).decode() == "中😀é"
    assert decision.accepted == 4
    # The server hid the second half of the emoji: the round ends at it, and it is held.
    draws[(21, 22, 23)] = _pick(24, None)
    decision, held = decide_batched(tree, draws, 4)
    assert held == 24 and b"".join(e.data for e in decision.emitted) == "中".encode() + b"\xf0\x9f"


def test_the_end_of_text_ends_the_round():
    decision, held = decide_batched(_tree([1]), {(): _pick(None, end=True), (1,): _pick(2, b"b")}, 1)
    assert held is None and decision.emitted[-1].eos and decision.accepted == 0


def test_the_end_of_text_drawn_at_a_branch_ends_the_round_there():
    tree = _tree([1, 2], (5, 6), (1, 7))
    draws = {node: _pick(99, b"?") for node in tree.nodes}
    draws.update({(): _pick(5, "日".encode()), (5,): Pick(id=None, data=None, end=True, uncounted=1)})
    decision, held = decide_batched(tree, draws, 2)
    assert held is None and [e.data for e in decision.emitted] == ["日".encode(), b"", b""]
    assert decision.emitted[-1].eos and decision.emitted[1].count == 1 and decision.accepted == 1


class _HidingDialect:
    """A vLLM-like dialect whose answers hide a partial character's bytes: token 11 is b"\\xe4\\xb8",
    token 12 b"\\xad" (together "中"); it records what it was asked."""

    name = "hiding"
    batches = True
    batches_sampled = True
    tokenizes_chat = False
    scores_prompts = False
    lists_processed = False
    BYTES = {11: b"\xe4\xb8", 12: b"\xad", 13: b"!"}

    def __init__(self) -> None:
        self.generated: list[tuple[list[int], Any, int | None]] = []

    async def next_tokens(self, client, prompts, fields, meter, *, options):  # type: ignore[no-untyped-def]
        assert "seed" not in fields
        return [_pick(11, None) for _ in prompts]

    #: What the target writes after the held token (99: its end of text, which vLLM lists among the ids).
    AFTER = (12, 13)

    async def generate(self, client, ids, fields, max_tokens, stop, meter, *, options, stream=False):  # type: ignore[no-untyped-def]
        self.generated.append((list(ids), fields.get("seed"), max_tokens))
        out = self.AFTER[:max_tokens]
        finish = "stop" if out and out[-1] == 99 else "length"
        return Generated(ids=tuple(out), data=b"", finish_reason=finish, prompt_tokens=None, completion_tokens=len(out))

    async def detokenize(self, client, ids, meter):  # type: ignore[no-untyped-def]
        return b"".join(self.BYTES.get(i, b"<end>") for i in ids).decode("utf-8", errors="replace")


class _Client:
    endpoint = None
    load = LoadCurve()  # nothing else in flight

    @staticmethod
    def clock() -> float:
        return 0.0


async def test_a_held_token_is_kept_and_its_bytes_read_back_with_the_tokens_after_it():
    dialect = _HidingDialect()
    verifier = TokenIdVerifier(client=_Client(), dialect=dialect)  # type: ignore[arg-type]
    context = Context(prompt="x", sampling=SamplingParams(temperature=0.7, point_mass_draft=True), token_ids=(5,))
    seeds = iter(range(100, 200))
    draft = (ScoredToken(text="token_id:3", logprob=0.0, id=3),)
    verification = await verifier.verify(context, draft, Meter(None), lambda: next(seeds), 5)  # type: ignore[arg-type]
    decision: RoundDecision | None = verification.decision
    assert decision is not None and not decision.handover and not decision.redrawn
    # The held draw (11) is the first token, never drawn again; the tokens after it come seeded by
    # position (the seed of the position after the held one), until the bytes make whole characters.
    # Each token adds what vLLM's stream adds at it: nothing at 11, the whole character at 12.
    assert [(e.ids, e.data, e.count) for e in decision.emitted] == [((11,), b"", 1), ((12,), "中".encode(), 1)]
    assert dialect.generated[0][0] == [5, 11] and dialect.generated[0][1] == 101


@pytest.mark.parametrize(
    ("after", "pieces", "ends"),
    [
        # 13 breaks the character 11 began: vLLM shows U+FFFD for it, with 13's text, once 13 is there.
        ((13, 12), [b"", "\ufffd!".encode()], False),
        # 11 then 11 again, then the end of text: the unfinished bytes are left out, as vLLM leaves them.
        ((11, 99), [b"", b"", b""], True),
        # The end of text right after the held token: the held bytes are left out of the text.
        ((99,), [b"", b""], True),
    ],
)
async def test_a_held_run_adds_the_text_vllms_stream_adds_at_each_token(after: tuple[int, ...], pieces: list[bytes], ends: bool):
    dialect = _HidingDialect()
    dialect.AFTER = after
    verifier = TokenIdVerifier(client=_Client(), dialect=dialect)  # type: ignore[arg-type]
    context = Context(prompt="x", sampling=SamplingParams(temperature=0.7, point_mass_draft=True), token_ids=(5,))
    seeds = iter(range(100, 200))
    verification = await verifier.verify(context, (ScoredToken(text="token_id:3", logprob=0.0, id=3),), Meter(None), lambda: next(seeds), 5)  # type: ignore[arg-type]
    decision = verification.decision
    assert decision is not None and not decision.redrawn and not decision.handover
    tokens = [e for e in decision.emitted if not e.eos]
    assert [e.data for e in tokens] == pieces and all(e.count == 1 for e in tokens)
    assert [i for e in tokens for i in e.ids or ()] == [11, *after[: len(pieces) - 1]]
    assert decision.emitted[-1].eos == ends


@pytest.mark.parametrize(("limit", "asked", "pieces"), [(1, [], [b""]), (2, [1], [b"", b""]), (3, [1, 2], [b"", b"", "\ufffd中".encode()])])
async def test_a_held_run_draws_nothing_past_the_callers_limit(limit: int, asked: list[int], pieces: list[bytes]):
    """The caller allows `limit` more tokens: the run after the held token stops there, its text what vLLM
    alone's answer holds at that limit (nothing of an unfinished character)."""
    dialect = _HidingDialect()
    dialect.AFTER = (11, 12, 13)  # a second start of the character, which 12 then finishes
    verifier = TokenIdVerifier(client=_Client(), dialect=dialect)  # type: ignore[arg-type]
    context = Context(prompt="x", sampling=SamplingParams(temperature=0.7, point_mass_draft=True), token_ids=(5,))
    seeds = iter(range(100, 200))
    draft = (ScoredToken(text="token_id:3", logprob=0.0, id=3),)
    verification = await verifier.verify(context, draft, Meter(None), lambda: next(seeds), 5, limit=limit)  # type: ignore[arg-type]
    decision = verification.decision
    assert decision is not None and not decision.redrawn and not decision.handover
    assert [e.data for e in decision.emitted] == pieces and [m for _, _, m in dialect.generated] == asked


async def test_a_draft_server_that_refuses_drafts_named_by_id_drafts_text_and_the_round_stays_batched():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=1)
    handle = provider.handle
    refused: list[dict] = []

    async def refusing(method, path, body=None, headers=None):  # type: ignore[no-untyped-def]
        parsed = json.loads(body) if isinstance(body, (bytes, str)) else body
        if isinstance(parsed, dict) and parsed.get("return_tokens_as_token_ids"):
            refused.append(parsed)
            return SimResponse(400, {"content-type": "application/json"}, {"error": {"message": "unknown field", "type": "invalid_request_error"}})
        return await handle(method, path, body, headers)

    provider.handle = refusing  # type: ignore[method-assign]
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=4, drafter="model") as client:
        responses = [await client.completions.create(prompt=PROMPT, max_tokens=16, temperature=0.7) for _ in range(2)]
    assert all(r.speculative.speculated and r.speculative.exact and r.speculative.fallback_reason is None for r in responses)
    # Asked once a request (each has its own verifier), chains and sampled chains; then the model proposes text.
    assert len([b for b in refused if "n" not in b]) == 2 and len([b for b in refused if "n" in b]) == 2
    assert [c for c in provider.calls if c.model == "sim-draft" and c.path == "/v1/completions"]
    rounds = [c.body for c in provider.calls if c.model == "sim-target" and isinstance((c.body or {}).get("prompt"), list)]
    assert rounds and all(isinstance(b["prompt"][0], list) and "seed" not in b for b in rounds if len(b["prompt"]) > 1)


async def test_a_held_token_whose_bytes_never_come_back_is_drawn_again_and_said_so():
    class Unreadable(_HidingDialect):
        async def detokenize(self, client, ids, meter):  # type: ignore[no-untyped-def]
            return "\ufffd" * len(ids)

    dialect = Unreadable()
    verifier = TokenIdVerifier(client=_Client(), dialect=dialect)  # type: ignore[arg-type]
    context = Context(prompt="x", sampling=SamplingParams(temperature=0.7, point_mass_draft=True), token_ids=(5,))
    verification = await verifier.verify(context, (ScoredToken(text="token_id:3", logprob=0.0, id=3),), Meter(None), lambda: 7, 5)  # type: ignore[arg-type]
    assert verification.decision is not None and verification.decision.redrawn and verification.decision.handover
    assert [m for _, _, m in dialect.generated] == [1, 2, 4, 8, 16]  # each longer step with the same seed


class _TreeDialect:
    """A vLLM-like dialect with a scripted draft and target: the draft samples the chains 5 6 9 (twice),
    5 6 7 and 1 2 8 (`DRAFT`: its probabilities after each prefix), or, asked without `n`, proposes its
    most likely ids 1 2 3 (with the alternative 4 first); the target draws 5, 6, 9, 10 along the first
    chain and 99 elsewhere. It records the prompts it was asked and can refuse `n`."""

    name = "tree"
    batches = True
    batches_sampled = True
    tokenizes_chat = False
    scores_prompts = False
    lists_processed = False
    ALONG = {(): 5, (5,): 6, (5, 6): 9, (5, 6, 9): 10}
    DRAFT = {(): {5: 0.5, 1: 0.4}, (5,): {6: 0.9}, (5, 6): {9: 0.5, 7: 0.4}, (1,): {2: 0.9}, (1, 2): {8: 0.6}}

    def __init__(self, *, refuse_n: bool = False) -> None:
        self.refuse_n = refuse_n
        self.prompts: list[list[int]] = []
        self.sampled_fields: list[dict] = []

    async def tokenize(self, client, text, meter, *, special, options=None):  # type: ignore[no-untyped-def]
        return [(ord(c), None) for c in text]

    async def ids_draft(self, client, ids, k, fields, alternatives, meter, *, options):  # type: ignore[no-untyped-def]
        return [(1, (4,)), (2, ()), (3, ())][:k]

    async def sampled_drafts(self, client, ids, k, fields, n, listed, meter, *, options):  # type: ignore[no-untyped-def]
        self.sampled_fields.append(dict(fields))
        if self.refuse_n:
            raise EndpointError("n must be 1", role="draft", endpoint="scripted", status_code=400)
        chains = [(5, 6, 9), (5, 6, 7), (1, 2, 8), (5, 6, 9)]
        return [tuple(_step(t, self.DRAFT[chain[:j]]) for j, t in enumerate(chain[:k])) for chain in chains]

    async def next_tokens(self, client, prompts, fields, meter, *, options):  # type: ignore[no-untyped-def]
        assert "seed" not in fields
        self.prompts = [list(p) for p in prompts]
        return [_pick(self.ALONG.get(tuple(p[1:]), 99), b"x") for p in prompts]


async def test_the_draft_tree_sends_one_prompt_per_node_and_the_output_walks_a_sampled_chain():
    dialect = _TreeDialect()
    verifier = TokenIdVerifier(client=_Client(), dialect=dialect, draft_client=_Client())  # type: ignore[arg-type]
    context = Context(prompt="x", sampling=SamplingParams(temperature=0.7, top_p=0.9, point_mass_draft=True), token_ids=(100,))
    draft = await verifier.native_draft(context, 3, Meter(None), Meter(None), None)  # type: ignore[arg-type]
    assert draft is not None and [t.id for t in draft] == [5, 6, 9]  # the likeliest path of the tree
    assert dialect.sampled_fields == [{"temperature": 0.7, "top_p": 0.9}]  # the caller's sampler, no seed
    verification = await verifier.verify(context, draft, Meter(None), lambda: 1, 5, draft_meter=Meter(None))  # type: ignore[arg-type]
    nodes = [tuple(p[1:]) for p in dialect.prompts]
    assert all(p[0] == 100 for p in dialect.prompts) and len(nodes) == len(set(nodes))
    # Every sampled path, each node once (all likely enough at 0.7).
    assert set(nodes) == {(), (5,), (5, 6), (5, 6, 9), (5, 6, 7), (1,), (1, 2), (1, 2, 8)}
    decision = verification.decision
    assert decision is not None and [e.ids for e in decision.emitted] == [(5,), (6,), (9,), (10,)]
    assert decision.accepted == 3


class _TimedClient(_Client):
    """A target whose one-token prompts cost `fixed + per_prompt * n` seconds a request (the dialect's
    `next_tokens` advances the clock)."""

    def __init__(self, fixed: float, per_prompt: float) -> None:
        self.now, self.fixed, self.per_prompt = 0.0, fixed, per_prompt

    def clock(self) -> float:  # type: ignore[override]
        return self.now


async def test_the_tree_is_sized_by_what_the_targets_prompts_cost_once_its_rounds_measured_it():
    """Unmeasured, the tree keeps every likely node (here 7); two rounds of different sizes measure what
    a prompt costs the target. Where a prompt costs a decoding step's worth of work (0.2 s beside 0.15 s
    a request: vLLM on a CPU, where each prompt recomputes the context's partial cache block), the next
    tree is the likeliest first id alone; where prompts are nearly free, it stays whole."""
    for per_prompt, expected in ((0.2, {(), (5,)}), (0.0005, {(), (5,), (5, 6), (5, 6, 9), (5, 6, 7), (1,), (1, 2), (1, 2, 8)})):
        client = _TimedClient(0.15, per_prompt)
        dialect = _TreeDialect()
        original = dialect.next_tokens

        async def timed(client_, prompts, fields, meter, *, options, _original=original, _client=client):  # type: ignore[no-untyped-def]
            _client.now += _client.fixed + _client.per_prompt * len(prompts)
            return await _original(client_, prompts, fields, meter, options=options)

        dialect.next_tokens = timed  # type: ignore[method-assign]
        verifier = TokenIdVerifier(client=client, dialect=dialect, draft_client=_Client())  # type: ignore[arg-type]
        sizes = []
        for k in (3, 1, 3):  # a round of 3 tokens (the whole tree), of 1 (a smaller tree), then of 3 again
            context = Context(prompt="x", sampling=SamplingParams(temperature=0.7, top_p=0.9, point_mass_draft=True), token_ids=(100,))
            draft = await verifier.native_draft(context, k, Meter(None), Meter(None), None)  # type: ignore[arg-type]
            assert draft is not None
            await verifier.verify(context, draft, Meter(None), lambda: 1, 5, draft_meter=Meter(None))  # type: ignore[arg-type]
            sizes.append({tuple(p[1:]) for p in dialect.prompts})
        assert len(sizes[0]) == 8 and len(sizes[1]) == 3  # unmeasured: every likely node
        assert sizes[2] == expected, per_prompt


async def test_a_caller_above_the_draft_temperature_gets_chains_sampled_cooler():
    dialect = _TreeDialect()
    verifier = TokenIdVerifier(client=_Client(), dialect=dialect, draft_client=_Client())  # type: ignore[arg-type]
    context = Context(prompt="x", sampling=SamplingParams(temperature=1.3, point_mass_draft=True), token_ids=(100,))
    assert await verifier.native_draft(context, 3, Meter(None), Meter(None), None) is not None  # type: ignore[arg-type]
    assert dialect.sampled_fields == [{"temperature": DRAFT_TEMPERATURE}]


async def test_a_draft_server_that_refuses_n_is_asked_once_and_the_rounds_go_on_with_the_chain_and_alternatives():
    dialect = _TreeDialect(refuse_n=True)
    verifier = TokenIdVerifier(client=_Client(), dialect=dialect, draft_client=_Client())  # type: ignore[arg-type]
    context = Context(prompt="x", sampling=SamplingParams(temperature=1.0, point_mass_draft=True), token_ids=(100,))
    for _ in range(2):
        draft = await verifier.native_draft(context, 3, Meter(None), Meter(None), None)  # type: ignore[arg-type]
        assert draft is not None and [t.id for t in draft] == [1, 2, 3]
        verification = await verifier.verify(context, draft, Meter(None), lambda: 1, 5, draft_meter=Meter(None))  # type: ignore[arg-type]
        assert {tuple(p[1:]) for p in dialect.prompts} == {(), (1,), (1, 2), (1, 2, 3), (4,)}
        assert verification.decision is not None and [e.ids for e in verification.decision.emitted] == [(5,)]
    assert len(dialect.sampled_fields) == 1


# ----------------------------------------------------------------------------- a tree of sampled chains, scripted

#: Tokens of a scripted vocabulary (CJK, emoji and a combining mark among them); 5 is the end of text.
_BYTES = {0: b"a", 1: "中".encode(), 2: "😀".encode(), 3: "e\u0301".encode(), 4: b" "}
_END = 5
#: The scripted target's next-token distribution after the last token (9: the prompt), and the draft's,
#: which differs enough that its sampled chains often leave the target's likeliest paths.
_TARGET = {9: {0: .4, 1: .3, 2: .2, 3: .1}, 0: {0: .1, 1: .5, 4: .4}, 1: {2: .6, 3: .2, 0: .2},
           2: {4: .5, 1: .3, _END: .2}, 3: {0: .5, 3: .5}, 4: {1: .25, 2: .25, 3: .25, 4: .25}}
_DRAFT = {9: {1: .5, 0: .3, 4: .2}, 0: {4: .6, 1: .3, 0: .1}, 1: {3: .5, 2: .4, 0: .1},
          2: {1: .6, 4: .4}, 3: {3: .7, 0: .3}, 4: {4: .5, 2: .3, 1: .2}, _END: {}}


class _ScriptedPair:
    """Both servers of a scripted pair: each prompt of a target request draws its next token on its own
    (`_TARGET`, after the prompt's last id); the draft proposes its likeliest ids (`_DRAFT`) with the next
    likeliest at each position, and samples `n` chains from `_DRAFT`."""

    name = "scripted"
    batches = True
    batches_sampled = True
    tokenizes_chat = False
    scores_prompts = False
    lists_processed = False

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def _draw(self, table: dict[int, float]) -> int:
        return self.rng.choices(list(table), weights=list(table.values()))[0]

    async def tokenize(self, client, text, meter, *, special, options=None):  # type: ignore[no-untyped-def]
        return [(ord(c), None) for c in text]

    async def ids_draft(self, client, ids, k, fields, alternatives, meter, *, options):  # type: ignore[no-untyped-def]
        chain, last = [], ids[-1]
        for _ in range(k):
            ranked = sorted(_DRAFT[last], key=lambda t: -_DRAFT[last][t])
            if not ranked:
                break
            chain.append((ranked[0], tuple(ranked[1 : 1 + alternatives])))
            last = ranked[0]
        return chain

    async def sampled_drafts(self, client, ids, k, fields, n, listed, meter, *, options):  # type: ignore[no-untyped-def]
        chains = []
        for _ in range(n):
            chain, last = [], ids[-1]
            while len(chain) < k and _DRAFT[last]:
                table = _DRAFT[last]
                top = sorted(table, key=lambda t: -table[t])[:listed]
                last = self._draw(table)
                chain.append(SampledStep(id=last, logprob=math.log(table[last]), listed=tuple((t, math.log(table[t])) for t in top)))
            chains.append(tuple(chain))
        return chains

    async def next_tokens(self, client, prompts, fields, meter, *, options):  # type: ignore[no-untyped-def]
        draws = [self._draw(_TARGET[p[-1]]) for p in prompts]
        return [_pick(None, end=True) if t == _END else _pick(t, _BYTES[t]) for t in draws]


def _markov_texts(table: dict[int, dict[int, float]], n: int) -> dict[str, float]:
    return text_probs(lambda ids: table[ids[-1]], [9], n, end=_END, decode=lambda ids: b"".join(_BYTES[i] for i in ids).decode())


async def test_walks_of_a_tree_of_sampled_chains_have_the_targets_distribution():
    pair = _ScriptedPair(seed=7)
    verifier = TokenIdVerifier(client=_Client(), dialect=pair, draft_client=_Client())  # type: ignore[arg-type]
    counts: dict[str, int] = {}
    kept = 0
    for _ in range(3000):
        ids: list[int] = []
        while len(ids) < 3:
            context = Context(prompt="x", sampling=SamplingParams(temperature=1.0, point_mass_draft=True), token_ids=(9, *ids))
            draft = await verifier.native_draft(context, 3, Meter(None), Meter(None), None)  # type: ignore[arg-type]
            assert draft is not None
            verification = await verifier.verify(context, draft, Meter(None), lambda: 1, 5, draft_meter=Meter(None))  # type: ignore[arg-type]
            assert verification.decision is not None
            kept += verification.decision.accepted
            emitted = verification.decision.emitted
            ids += [e.ids[0] for e in emitted if not e.eos and e.ids][: 3 - len(ids)]  # a cut at a count
            if any(e.eos for e in emitted) and len(ids) < 3:
                break
        text = b"".join(_BYTES[i] for i in ids).decode()
        counts[text] = counts.get(text, 0) + 1
    assert kept > 3000  # draft ids were kept (more than one a text)
    assert chisquare_p(counts, _markov_texts(_TARGET, 3)) > 1e-3
    drafts = _markov_texts({**_DRAFT, _END: {}}, 3)
    assert not set(counts) <= set(drafts) or chisquare_p(counts, drafts) < 1e-6
