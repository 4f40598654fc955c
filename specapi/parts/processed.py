"""Speculative sampling on whole distributions (pure): where the servers list each position's whole
distribution after their sampler chains (llama.cpp's `post_sampling_probs` with a `top_k`), specapi runs
the rejection sampler on exact p and q itself (docs/algorithm.md)."""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any

from ..core.acceptance import Emitted, RoundDecision
from ..core.sampling import acceptance_probability
from ..dialects.base import spelling

__all__ = ["WHOLE_TOLERANCE", "covers", "decide_processed"]

#: A list after the sampler chain is the whole distribution when its probabilities sum to 1 within this.
WHOLE_TOLERANCE = 1e-6


def covers(dist: Mapping[int, Any]) -> bool:
    """Whether a list after the sampler chain is the whole distribution (its probabilities sum to 1)."""
    total = math.fsum((v[0] if isinstance(v, tuple) else v) for v in dist.values())
    return abs(total - 1.0) <= WHOLE_TOLERANCE


def _draw(weights: Mapping[int, float], rng: random.Random) -> int:
    """Inverse CDF over the ids in a fixed order, so a seeded rng repeats."""
    order = sorted(weights)
    u = rng.random() * math.fsum(weights.values())
    cumulative = 0.0
    for token in order:
        cumulative += weights[token]
        if u < cumulative:
            return token
    return order[-1]


def decide_processed(
    draft: Sequence[tuple[int, bytes, Mapping[int, float]]], targets: Sequence[Mapping[int, tuple[float, bytes]] | None], rng: random.Random
) -> RoundDecision:
    """Speculative sampling on whole distributions (pure). `draft[j]` is the token drawn at position j,
    its bytes and the whole distribution q_j it was drawn from; `targets[j]` the target's whole
    distribution p_j after the sampler chain at position j (j = len(draft): after the draft), or None
    where the server listed nothing. Keep x_j with probability min(1, p_j(x_j)/q_j(x_j)); at the first
    rejection draw from max(0, p_j - q_j) renormalised; after a whole kept draft draw from p_K. A
    position whose p is missing or not whole is handed to the target alone, before anything is drawn
    there. Tokens that end inside a character are kept: the context continues in ids, and cutting a
    token because of what was drawn would bias the draw."""
    emitted: list[Emitted] = []
    accepted = 0
    handover = False
    for j, target in enumerate(targets):
        if target is None or not covers(target):
            handover = True
            break
        p = {t: v for t, (v, _) in target.items()}
        if j < len(draft):
            token, data, q = draft[j]
            if rng.random() < acceptance_probability(p.get(token, 0.0), q.get(token, 0.0)):
                data = target[token][1]  # kept: p(token) > 0, so the server spelled it
                emitted.append(Emitted(token=spelling(data), data=data, ids=(token,)))
                accepted += 1
                continue
            residual = {t: v - q.get(t, 0.0) for t, v in p.items() if v > q.get(t, 0.0)}
            choice = _draw(residual if math.fsum(residual.values()) > 1e-12 else p, rng)
        else:
            choice = _draw(p, rng)
        data = target[choice][1]
        # A candidate with no bytes is the end of the text (the only token a chain keeps that spells nothing).
        emitted.append(Emitted(token=spelling(data), data=data, ids=(choice,)) if data else Emitted(token="", data=b"", eos=True))
        break
    return RoundDecision(
        emitted=tuple(emitted),
        accepted=accepted,
        accepted_by_position=tuple(i < accepted for i in range(len(draft))),
        all_accepted=accepted == len(draft) and not handover,
        stalled=not emitted,
        handover=handover,
        keeps_partial=True,
    )
