"""Trees of drafts for unseeded sampled rounds, compared by their exact expected tokens a round.

    python benchmarks/draft_trees.py --temperature 1.0            # ~1 min: every tree below
    python benchmarks/draft_trees.py --temperature 0.7 --trees one-request --draft-temperature 0.5

A round on a tree yields, in expectation, the sum over its nodes (the root included) of the probability
that the target's draws walk to them: the product of the target's probabilities along the node's path.
This script reads both simulated models' distributions directly (`specapi.sim`), samples texts from the
target at the given temperature along the lan-code prompts, and at every `--stride`-th position of each
text builds each tree from the draft alone and sums that expectation exactly. No server and no timing:
it says what a tree yields and what it sends (prompts a round, and their uncached tokens with the
simulator's 16-token cache blocks), so that trees can be chosen without a noisy benchmark.

Trees (K = 5):
* ``chain``: the draft's most likely ids.
* ``earlier``: the chain, the second most likely id at each of its positions, and 8 chains the draft
  samples at the caller's temperature, each kept to its first id and the ids at least two chains share
  (two draft requests: specapi's tree before this one).
* ``one-request``: specapi's tree (`specapi.parts.drafttree.plan_tree`): 8 chains sampled at the caller's
  temperature but not above `--draft-temperature`, each position listing its `--listed` likeliest ids
  with their raw log-probabilities, nodes kept from an estimated reach of `--min-reach`.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter
from collections.abc import Callable

import numpy as np

from specapi.bench.scenarios import get_scenario
from specapi.dialects.base import SampledStep
from specapi.parts.drafttree import MIN_REACH, plan_tree
from specapi.sim.corpus import EOS_TOKEN_ID, UNIVERSE_SIZE, encode_text
from specapi.sim.models import get_model
from specapi.parts.tokenlevel import DRAFT_TEMPERATURE, LISTED, SAMPLED_CHAINS

K = 5
TARGET, DRAFT = get_model("sim-target"), get_model("sim-draft")
Node = tuple[int, ...]


class Distributions:
    """Next-token distributions of a simulated model after a context, tempered, remembered."""

    def __init__(self, model) -> None:  # type: ignore[no-untyped-def]
        self.model = model
        self._seen: dict[tuple[tuple[int, ...], float], dict[int, float]] = {}

    def mixture(self, context: tuple[int, ...]):  # type: ignore[no-untyped-def]
        return self.model.mixture(np.array(context, dtype=np.int64))

    def at(self, context: tuple[int, ...], temperature: float) -> dict[int, float]:
        key = (context, temperature)
        if key not in self._seen:
            ids, p = self.model.distribution_from(self.mixture(context))
            if temperature <= 0:
                self._seen[key] = {int(ids[np.argmax(p)]): 1.0}
            else:
                weights = p ** (1.0 / temperature)
                total = weights.sum() + self.model.tail_prob ** (1.0 / temperature) * (UNIVERSE_SIZE - len(ids))
                self._seen[key] = dict(zip(ids.tolist(), (weights / total).tolist()))
        return self._seen[key]


def likeliest(dist: dict[int, float], count: int) -> list[int]:
    return sorted(dist, key=lambda t: (-dist[t], t))[:count]


def sampled_chain(draft: Distributions, context: tuple[int, ...], temperature: float, rng: np.random.Generator) -> Node:
    chain: Node = ()
    for _ in range(K):
        token = int(draft.model.sample_from(draft.mixture(context + chain), temperature, 1.0, rng))
        chain += (token,)
        if token == EOS_TOKEN_ID:
            break
    return chain


def chain_tree(draft: Distributions, context: tuple[int, ...], temperature: float, rng: np.random.Generator, *, alternatives: int = 0) -> set[Node]:
    nodes: set[Node] = {()}
    path: Node = ()
    for _ in range(K):
        ranked = likeliest(draft.at(context + path, 1.0), 1 + alternatives)
        nodes.update(path + (a,) for a in ranked[1:])
        path += (ranked[0],)
        nodes.add(path)
    return nodes


def earlier_tree(draft: Distributions, context: tuple[int, ...], temperature: float, rng: np.random.Generator) -> set[Node]:
    nodes = chain_tree(draft, context, temperature, rng, alternatives=1)
    chains = [sampled_chain(draft, context, temperature, rng) for _ in range(SAMPLED_CHAINS)]
    shared = Counter(c[:j] for c in chains for j in range(1, len(c) + 1))
    for c in chains:
        depth = 1
        while depth < len(c) and shared[c[: depth + 1]] >= 2:
            depth += 1
        nodes.update(c[:j] for j in range(1, depth + 1))
    return nodes


def one_request_tree(args: argparse.Namespace) -> Callable[..., set[Node]]:
    def build(draft: Distributions, context: tuple[int, ...], temperature: float, rng: np.random.Generator) -> set[Node]:
        chains = []
        for _ in range(SAMPLED_CHAINS):
            chain = sampled_chain(draft, context, min(temperature, args.draft_temperature), rng)
            steps = []
            for j, token in enumerate(chain):
                raw = draft.at(context + chain[:j], 1.0)  # servers list raw log-probabilities (vLLM)
                listed = {t: math.log(raw[t]) for t in likeliest(raw, args.listed)}
                logprob = math.log(raw[token]) if token in raw else math.log(draft.model.tail_prob)
                steps.append(SampledStep(id=token, logprob=logprob, listed=tuple(listed.items())))
            chains.append(tuple(steps))
        return set(plan_tree(chains, temperature, min_reach=args.min_reach).nodes)

    return build


def expected_tokens(target: Distributions, context: tuple[int, ...], nodes: set[Node], temperature: float) -> float:
    reach: dict[Node, float] = {(): 1.0}
    for node in sorted(nodes, key=len):
        if node:
            reach[node] = reach[node[:-1]] * target.at(context + node[:-1], temperature).get(node[-1], 0.0)
    return math.fsum(reach.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--trees", default="chain,earlier,one-request")
    parser.add_argument("--texts", type=int, default=2, help="target texts a prompt (60 tokens each)")
    parser.add_argument("--stride", type=int, default=3, help="every n-th position of each text is a round's start")
    parser.add_argument("--draft-temperature", type=float, default=DRAFT_TEMPERATURE)
    parser.add_argument("--listed", type=int, default=LISTED)
    parser.add_argument("--min-reach", type=float, default=MIN_REACH)
    args = parser.parse_args(argv)
    trees: dict[str, Callable[..., set[Node]]] = {"chain": chain_tree, "earlier": earlier_tree, "one-request": one_request_tree(args)}
    target, draft = Distributions(TARGET), Distributions(DRAFT)
    contexts = []
    for number, request in enumerate(get_scenario("lan-code").requests):
        prompt = tuple(encode_text(request.prompt or ""))
        for text in range(args.texts):
            rng = np.random.default_rng([number, text])
            sampled: Node = ()
            while len(sampled) < 60:
                token = int(TARGET.sample_from(target.mixture(prompt + sampled), args.temperature, 1.0, rng))
                if token == EOS_TOKEN_ID:
                    break
                sampled += (token,)
            contexts += [prompt + sampled[:i] for i in range(0, len(sampled), args.stride)]
    print(f"T={args.temperature}: {len(contexts)} round starts on lan-code texts the target sampled")
    for name in args.trees.split(","):
        rng = np.random.default_rng(0)
        tokens = prompts = uncached = 0.0
        for context in contexts:
            nodes = trees[name](draft, context, args.temperature, rng)
            tokens += expected_tokens(target, context, nodes, args.temperature)
            prompts += len(nodes)
            uncached += sum(len(context) % 16 + len(node) for node in nodes)
        n = len(contexts)
        print(f"  {name:12s} tokens a round {tokens / n:.3f}   prompts a round {prompts / n:5.1f}   uncached prompt tokens {uncached / n:5.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
