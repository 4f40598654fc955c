"""The tree of drafts behind an unseeded sampled round in one request, and the walk that decides it (pure).

The draft samples `n` chains after the context in one request, each position listing its most likely
ids with their log-probabilities (`SampledStep`). Every sampled id and every listed one is a candidate
node: a path of ids after the context. The draft's probabilities, tempered to the caller's
temperature, estimate how likely the target is to walk to each node (`reach`: the product along the
path), and the nodes the target reaches often enough to pay for their prompt are kept (`plan_tree`).
The target then draws one token after every kept node, all in one request, and `decide_batched` walks
the tree along the draws.

Exactness does not depend on which nodes are kept: the tree is a function of the draft's answer alone,
so it is independent of the target's draws, and which draw is used at a position depends only on the
tokens before it (docs/algorithm.md, "Without a seed: one request a round, on a tree of drafts").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..core.acceptance import Emitted, RoundDecision
from ..dialects import Pick
from ..dialects.base import SampledStep, spelling

__all__ = ["DraftTree", "MAX_NODES", "MIN_REACH", "UNMEASURED_NODES", "PromptCosts", "decide_batched", "plan_tree", "tempered_estimate"]

#: The least estimated reach of a kept node. A node costs the prefill of its prompt's uncached tokens
#: (the context's last, partial cache block and its path: about 10 tokens); it pays when the target
#: walks to it often enough: on lan-code (target 25 ms a token, 0.05 ms a prefilled token, rounds of
#: about 65 ms yielding 4 tokens) a node is worth its prompt above a reach of about 0.03.
MIN_REACH = 0.03
#: The most nodes a tree holds (besides the root): a flat draft distribution passes many nodes.
MAX_NODES = 32
#: The most nodes while what a prompt costs the target is not measured yet: on a target where each
#: prompt recomputes its share of work (vLLM on a CPU: the context's partial cache block, about 16
#: tokens at 13 ms each beside a 190 ms decoding step on a 612 M model), a round of 33 one-token prompts
#: took 8.3 s, where the target alone writes 40 tokens.
UNMEASURED_NODES = 8


@dataclass(frozen=True)
class DraftTree:
    """What the draft proposes for an unseeded batched round: paths of the target's token ids after the
    context, as a trie. `nodes` holds every prefix of every path once (the root, the empty path, first,
    then the chain's prefixes, parents before children); `chain` is the draft's most likely path (its
    tokens are the round's drafted ones); `data` the bytes of chain nodes' last ids where shown."""

    chain: tuple[int, ...]
    nodes: tuple[tuple[int, ...], ...]
    data: Mapping[tuple[int, ...], bytes] = field(default_factory=dict)

    @classmethod
    def grow(cls, chain: Sequence[tuple[int, bytes | None]], branches: Iterable[Sequence[int]] = ()) -> DraftTree:
        """The trie of the chain (ids with their bytes where known) and of `branches` (paths after the context)."""
        ids = tuple(i for i, _ in chain)
        nodes = dict.fromkeys(ids[:j] for j in range(len(ids) + 1))
        for path in branches:
            for j in range(1, len(path) + 1):
                nodes.setdefault(tuple(path[:j]))
        data = {ids[: j + 1]: d for j, (_, d) in enumerate(chain) if d is not None}
        return cls(chain=ids, nodes=tuple(nodes), data=data)


def tempered_estimate(listed: Mapping[int, float], temperature: float) -> dict[int, float]:
    """The draft's probabilities of its listed ids at `temperature`, from their raw log-probabilities
    (servers list them before temperature: vLLM's default). The unlisted mass is spread over tokens no
    likelier than the least listed one, which bounds their tempered weight (an upper bound for
    temperature <= 1): an estimate, used only to rank nodes."""
    raw = {t: math.exp(lp) for t, lp in listed.items() if lp is not None and math.isfinite(lp)}
    if not raw or temperature <= 0:
        return {}
    exponent = 1.0 / temperature
    weights = {t: q**exponent for t, q in raw.items()}
    rest = max(0.0, 1.0 - math.fsum(raw.values()))
    least = min(raw.values())
    total = math.fsum(weights.values()) + (rest * least ** (exponent - 1.0) if least > 0 else 0.0)
    return {t: w / total for t, w in weights.items()} if total > 0 else {}


@dataclass(frozen=True)
class PromptCosts:
    """What one target request of `n` prompts costs: `fixed_s + per_prompt_s * n` (measured on the
    target's batched rounds)."""

    fixed_s: float
    per_prompt_s: float


def _pays(reach: float, expected: float, prompts: int, costs: PromptCosts) -> bool:
    """Whether one more node, reached with probability `reach`, raises the round's expected tokens per
    second: (expected + reach) / (seconds + per prompt) > expected / seconds, where the round so far
    has `prompts` prompts and `expected` tokens."""
    seconds = costs.fixed_s + costs.per_prompt_s * prompts
    return reach * seconds > costs.per_prompt_s * expected


def plan_tree(
    chains: Sequence[Sequence[SampledStep]], temperature: float, *, min_reach: float = MIN_REACH, max_nodes: int = MAX_NODES,
    costs: PromptCosts | None = None,
) -> DraftTree:
    """The tree of the draft's sampled `chains` and the ids each position lists: every node whose
    estimated reach (the product of `tempered_estimate` along its path) is at least `min_reach`, the
    likeliest `max_nodes` of them, and always the likeliest first id. Its `chain` goes from the root to
    the likeliest kept child at each step.

    With `costs`, a node is kept only while it raises the round's expected tokens per second: the
    target walks to it with its reach and draws one more token there, for one more prompt. Nodes are
    taken likeliest first, so the first that does not pay ends the tree (the rate only grows as nodes
    are added, and the reach falls)."""
    shown: dict[tuple[int, ...], dict[int, float]] = {}  # after each sampled prefix: every id shown there
    for steps in chains:
        path: tuple[int, ...] = ()
        for step in steps:
            here = shown.setdefault(path, {})
            here.update(step.listed)
            if step.logprob is not None:
                here[step.id] = step.logprob
            path += (step.id,)
    estimate = {path + (token,): q for path, here in shown.items() for token, q in tempered_estimate(here, temperature).items()}
    for steps in chains:  # a sampled id shown with no log-probability: a node nothing estimates
        for j, step in enumerate(steps):
            estimate.setdefault(tuple(s.id for s in steps[: j + 1]), 0.0)
    reach: dict[tuple[int, ...], float] = {}
    for node in sorted(estimate, key=len):
        reach[node] = reach.get(node[:-1], 1.0) * estimate[node]
    # Reach never grows along a path, so the best nodes, shorter first among equals, hold their parents.
    ranked = sorted(reach, key=lambda v: (-reach[v], len(v), v))
    kept = [v for v in ranked if reach[v] >= min_reach][:max_nodes]
    if costs is not None and kept:
        expected = 1.0  # the root's draw
        for n, node in enumerate(kept):
            if n and not _pays(reach[node], expected, n + 1, costs):
                kept = kept[:n]
                break
            expected += reach[node]
    kept = kept or [v for v in ranked if len(v) == 1][:1]
    children: dict[tuple[int, ...], list[tuple[int, ...]]] = {}
    for node in kept:
        children.setdefault(node[:-1], []).append(node)
    chain: tuple[int, ...] = ()
    while chain in children:
        chain = children[chain][0]  # in rank order: the likeliest child first
    return DraftTree.grow([(i, None) for i in chain], kept)


def decide_batched(tree: DraftTree, draws: Mapping[tuple[int, ...], Pick], draft_tokens: int) -> tuple[RoundDecision, int | None]:
    """The tokens of an unseeded batched round (pure). `draws[v]` is the target's draw after the context
    plus the ids of node v of the draft's tree, for every node. The walk starts at the root: at node v the
    token is the draw made after v; when that token is a child of v the walk goes on from the child, else
    it stops. So each position's token is the draw made on exactly the tokens before it. Every draw is
    independent of the others, and which draw is used depends only on the tokens before it, so each
    token has the target's distribution given the text before it. A drawn token is kept whatever it is
    (a token that ends inside a character too): the second element is the id of a drawn token whose
    bytes the answer did not show, which ends the round and must still be kept
    (`TokenIdVerifier._read_held`). `accepted` counts the draft's ids kept along the walked path."""
    emitted: list[Emitted] = []
    node: tuple[int, ...] = ()
    held: int | None = None
    while True:
        draw = draws[node]
        if draw.end:
            if draw.uncounted:
                # The server counts its end-of-text token as generated: so does the response.
                emitted.append(Emitted(token="", data=b"", count=draw.uncounted))
            emitted.append(Emitted(token="", data=b"", eos=True, count=0))
            break
        child = node + (draw.id,) if draw.id is not None else None
        data = draw.data if draw.data is not None or child is None else tree.data.get(child)
        if data is None:
            held = draw.id
            break
        emitted.append(Emitted(token=spelling(data), data=data, ids=(draw.id,) if draw.id is not None else None))
        if child is None or child not in draws:
            break
        node = child
    kept, drafted = len(node), len(tree.chain)
    accepted = min(draft_tokens, kept if drafted == draft_tokens else round(kept * draft_tokens / max(1, drafted)))
    decision = RoundDecision(
        emitted=tuple(emitted),
        accepted=accepted,
        accepted_by_position=tuple(i < accepted for i in range(draft_tokens)),
        all_accepted=kept >= drafted,
        stalled=not emitted and held is None,
        keeps_partial=True,
    )
    return decision, held
