"""What each exact way of verifying sampled drafts could keep, on the simulator's own distributions.

    python benchmarks/sampled_acceptance.py                          # lan-code, T = 0 (greedy), 0.7, 1.0
    python benchmarks/sampled_acceptance.py --scenario lookup-edit-t0.7 --temperatures 0.7
    python benchmarks/sampled_acceptance.py --seeds 6 --max-tokens 40

Along texts the simulated target samples for a scenario's prompts (each token after the ones it drew
before), it reads the target's and the draft model's whole distributions after temperature and reports,
per position, the chance that a position is kept by:

* ``greedy``: the draft's most likely token is the target's (what greedy verification keeps);
* ``p(x*)``: the target's tempered probability of the draft's most likely token: a point-mass draft on a
  pick path (token ids, fan-out: the target's own draw must equal the proposal), and the full rejection
  sampler with a point-mass q;
* ``sum min(p,q)``: the full rejection sampler with a sampled draft on exact lists (Leviathan et al.);
* ``sum pq``: a sampled draft on a pick path (an independent target draw must equal the draft's draw);
* ``p(top2)``: two proposals at a position (the draft's two most likely tokens) on a pick path, where the
  target's draw keeps whichever it equals (a token tree; not built in specapi);
* ``top mass``: the target's most likely token's tempered probability (how peaked the target is);
* ``lookup``: prompt lookup (``LookupDrafter``'s rule) proposes the token the target drew; ``lookup none``:
  it proposes nothing (the round is a plain one-token step).

With ``E(K) = (1 - a^(K+1)) / (1 - a)`` tokens per round at acceptance ``a`` (independent positions), the
last columns give the tokens per round at K = 5 for the greedy and point-mass rates.

Pure numbers: no server, no latency, no specapi client. The figures are the simulator's, not a real
model's: they tell what the simulator lets an exact method keep (docs/algorithm.md, "What the simulator
allows").
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import numpy as np

from specapi.bench.scenarios import get_scenario
from specapi.parts.drafters import lookup_continuation
from specapi.sim.corpus import EOS_TOKEN_ID, UNIVERSE_SIZE, decode_text, encode_text
from specapi.sim.models import NGramModel, _tempered, get_model

COLUMNS = ("greedy", "p(x*)", "sum min(p,q)", "sum pq", "p(top2)", "top mass", "lookup", "lookup none")


def tempered(model: NGramModel, context: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(ids, probabilities, one unlisted token's probability) after temperature; T = 0 reads as T = 1
    for the probabilities (greedy only compares argmaxes)."""
    ids, p = model.distribution_from(model.mixture(context))
    weights, tail = _tempered(p, model.tail_prob, temperature if temperature > 0 else 1.0)
    total = float(weights.sum()) + tail * (UNIVERSE_SIZE - len(ids))
    return ids, weights / total, tail / total


def position(target: NGramModel, draft: NGramModel, context: np.ndarray, temperature: float) -> dict[str, float]:
    t_ids, t_p, t_tail = tempered(target, context, temperature)
    d_ids, d_q, d_tail = tempered(draft, context, temperature)
    ids = np.union1d(t_ids, d_ids)
    p = np.full(len(ids), t_tail)
    p[np.searchsorted(ids, t_ids)] = t_p
    q = np.full(len(ids), d_tail)
    q[np.searchsorted(ids, d_ids)] = d_q
    unlisted = UNIVERSE_SIZE - len(ids)
    order = np.argsort(-q, kind="stable")
    return {
        "greedy": float(np.argmax(p) == order[0]),
        "p(x*)": 1.0 if temperature == 0 and np.argmax(p) == order[0] else (0.0 if temperature == 0 else float(p[order[0]])),
        "sum min(p,q)": float(np.minimum(p, q).sum() + unlisted * min(t_tail, d_tail)) if temperature > 0 else float(np.argmax(p) == order[0]),
        "sum pq": float((p * q).sum() + unlisted * t_tail * d_tail) if temperature > 0 else float(np.argmax(p) == order[0]),
        "p(top2)": float(p[order[:2]].sum()) if temperature > 0 else float(np.argmax(p) in order[:2]),
        "top mass": float(p.max()),
    }


def measure(scenario_name: str, temperature: float, seeds: Sequence[int], max_tokens: int) -> tuple[dict[str, float], int]:
    scenario = get_scenario(scenario_name)
    target, draft = get_model("sim-target"), get_model("sim-draft")
    sums = dict.fromkeys(COLUMNS, 0.0)
    count = 0
    for request in scenario.requests:
        if request.prompt is None:
            continue  # chat prompts go through the template: the completions scenarios say enough
        prompt = encode_text(request.prompt)
        for seed in seeds if temperature > 0 else seeds[:1]:
            rng = np.random.default_rng(seed)
            context = np.array(prompt, dtype=np.int64)
            for _ in range(max_tokens):
                row = position(target, draft, context, temperature)
                token = target.sample_from(target.mixture(context), temperature, 1.0, rng)
                history = decode_text(context.tolist())
                follow = lookup_continuation(history, [request.prompt])
                row["lookup none"] = float(not follow)
                row["lookup"] = float(bool(follow) and decode_text([token]) != "" and follow.startswith(decode_text([token])))
                for name in COLUMNS:
                    sums[name] += row[name]
                count += 1
                if token == EOS_TOKEN_ID:
                    break
                context = np.append(context, token)
    return {name: value / max(1, count) for name, value in sums.items()}, count


def tokens_per_round(acceptance: float, k: int = 5) -> float:
    return float(k + 1) if acceptance >= 1.0 else (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="lan-code")
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7, 1.0])
    parser.add_argument("--seeds", type=int, default=3, help="sampled texts per prompt")
    parser.add_argument("--max-tokens", type=int, default=60)
    args = parser.parse_args(argv)
    print(f"{args.scenario}: per-position chance of keeping a token, along texts the simulated target samples")
    print(f"{'T':>4} {'positions':>9} " + " ".join(f"{c:>12}" for c in COLUMNS) + f" {'E(5) greedy':>12} {'E(5) p(x*)':>11}")
    for temperature in args.temperatures:
        means, count = measure(args.scenario, temperature, list(range(args.seeds)), args.max_tokens)
        cells = " ".join(f"{means[c]:>12.3f}" for c in COLUMNS)
        print(f"{temperature:>4} {count:>9} {cells} {tokens_per_round(means['greedy']):>12.2f} {tokens_per_round(means['p(x*)']):>11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
