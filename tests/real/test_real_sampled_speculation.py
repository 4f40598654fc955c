"""Sampled speculation on the real llama-server: it pays (acceptance near the greedy one) and it is exact.

Acceptance: the same prompts, fixed draft length 4, greedy and at temperature 0.7 with the server's own
sampler defaults (top_k 40, top_p 0.95, min_p 0.05, sent explicitly by specapi), on token ids (auto's
choice): the draft server draws with `post_sampling_probs`, and the target lists its distribution after
the chain at every position in one request (the whole support: top_k 40), so specapi keeps a draft token
with min(1, p/q) and draws rejections from the residual itself.

Exactness: the distribution of two-token texts at temperature 0.7 under the server's default chain,
from the server's own `post_sampling_probs` (the oracle of `test_real_sampling.py`), against specapi's
samples on each path (chi-square, p > 1e-3).
"""

from __future__ import annotations

import asyncio

import pytest

from real_helpers import ServerPair, client_for, within_deadline
from real_helpers import Server, oracle_post
from test_real_sampling import MIN_EXPECTED, chi_square

PROMPTS = ["def fibonacci(n):", "class Counter:\n    def increment(self", "for i in range(10):\n    print(", "The model"]
SEEDS = range(6)
K = 4
TEMPERATURE = 0.7
#: The server's own defaults (its /props), pinned so the oracle and specapi sample the same chain.
CHAIN = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}
CHI_PROMPT, CHI_SAMPLES = "The model", 300


async def _acceptance(ls: ServerPair, verification: str, temperature: float) -> tuple[int, int]:
    accepted = drafted = inexact = 0
    async with client_for(ls, policy="fixed", num_speculative_tokens=K, verification=verification, drafter="model") as client:
        for prompt in PROMPTS:
            for seed in SEEDS if temperature else (0,):
                request = client.completions.create(
                    prompt=prompt, max_tokens=40, temperature=temperature, seed=seed, top_p=CHAIN["top_p"],
                    extra_body={k: v for k, v in CHAIN.items() if k != "top_p"})
                response = await within_deadline(request, f"{verification} T={temperature} seed={seed} {prompt!r}")
                stats = response.speculative
                assert (stats.exact or stats.exact_reason) and stats.verification == verification, stats
                inexact += not stats.exact
                accepted += stats.accepted_tokens
                drafted += stats.drafted_tokens
    print(f'{verification} T={temperature}: {inexact} responses not exact')
    return accepted, drafted


async def test_sampled_acceptance_is_near_the_greedy_one(ls: ServerPair) -> None:
    """On token ids (auto's path here) both servers list whole distributions after their chains, so
    specapi runs the full rejection sampler: a position is kept with the overlap of p and q."""
    verification = "token-ids"
    greedy_accepted, greedy_drafted = await _acceptance(ls, verification, 0.0)
    sampled_accepted, sampled_drafted = await _acceptance(ls, verification, TEMPERATURE)
    greedy, sampled = greedy_accepted / greedy_drafted, sampled_accepted / sampled_drafted
    print(f"llama-server {verification}, K={K}: greedy acceptance {greedy:.3f} ({greedy_accepted}/{greedy_drafted}), "
          f"T={TEMPERATURE} {sampled:.3f} ({sampled_accepted}/{sampled_drafted}), ratio {sampled / greedy:.2f}")
    assert sampled >= 0.9 * greedy


async def next_token_probs(server: Server, ids: list[int], chain: dict) -> list[dict]:
    """The server's post-sampling list after `ids` (all of the chain's support: top_k 40 at most). It
    reports none when the token it samples is part of a character: ask again until it does."""
    body = {"prompt": ids, "n_predict": 1, "n_probs": 40, "post_sampling_probs": True, **chain}
    for _ in range(40):
        data = await oracle_post(server, "/completion", body)
        if data.get("completion_probabilities"):
            return data["completion_probabilities"][0]["top_probs"]
    raise AssertionError(f"llama-server never reported probabilities after {ids}: {data}")


async def _two_token_distribution(ls: ServerPair) -> dict[str, float]:
    ids = (await oracle_post(ls.target, "/tokenize", {"content": CHI_PROMPT, "add_special": True}))["tokens"]
    body = {"temperature": TEMPERATURE, **CHAIN}
    dist: dict[str, float] = {}
    for first in await next_token_probs(ls.target, ids, body):
        if first["prob"] * CHI_SAMPLES < MIN_EXPECTED / 2:
            continue
        for second in await next_token_probs(ls.target, ids + [first["id"]], body):
            text = bytes(first["bytes"] + second["bytes"]).decode("utf-8", errors="replace")
            dist[text] = dist.get(text, 0.0) + first["prob"] * second["prob"]
    return dist


@pytest.mark.parametrize("verification", ["token-ids", "prefill-fanout"])
async def test_sampled_texts_follow_the_servers_distribution(ls: ServerPair, verification: str) -> None:
    """Forced or not, a sampled completion runs on token ids on llama-server (a path forced onto text
    goes to them: text the target re-tokenizes would bias its draws), and follows its distribution."""
    dist = await _two_token_distribution(ls)
    assert sum(1 for p in dist.values() if p * CHI_SAMPLES >= MIN_EXPECTED) >= 3, dist
    semaphore = asyncio.Semaphore(6)
    async with client_for(ls, policy="fixed", num_speculative_tokens=2, verification=verification, drafter="model") as client:

        async def sample(seed: int) -> tuple[str, int]:
            async with semaphore:
                request = client.completions.create(
                    prompt=CHI_PROMPT, max_tokens=2, temperature=TEMPERATURE, seed=seed, top_p=CHAIN["top_p"],
                    extra_body={k: v for k, v in CHAIN.items() if k != "top_p"})
                response = await within_deadline(request, f"two tokens of {CHI_PROMPT!r} seed={seed}")
            assert response.speculative.exact and response.speculative.verification == "token-ids", response.speculative
            return response.choices[0].text, response.speculative.accepted_tokens

        results = await asyncio.gather(*(sample(seed) for seed in range(CHI_SAMPLES)))
    p, table = chi_square([text for text, _ in results], dist)
    print(f"llama-server {verification}, T={TEMPERATURE}: chi-square p={p:.3g}, accepted {sum(a for _, a in results)}")
    assert sum(a for _, a in results) > 0
    assert p > 1e-3, f"(observed, expected) {table}"
