"""Sampling through specapi draws from llama-server's own distribution (a statistical check).

The server reports its sampling distribution through its native `/completion` (`n_probs`,
`post_sampling_probs`), given the prompt as token ids: the first generated token's distribution, and
the second token's after each likely first token. Every sampling field is pinned explicitly
(temperature, top_k, top_p, min_p, repeat_penalty), so the server's defaults (temperature 0.8, top_k 40,
top_p 0.95, min_p 0.05) play no part. That gives the distribution of two-token texts; a few hundred
speculative completions of two tokens must follow it (chi-square over the texts with an expected
count of at least 5, the rest pooled). Position 2 is where speculation decides things: after the
draft's first token was kept or replaced. The server's own samples for the same request are checked
the same way, so the reference itself is known to be what the server samples from.
"""

from __future__ import annotations

import asyncio
from collections import Counter, defaultdict

from scipy.stats import chisquare

from real_helpers import Server, ServerPair, client_for, oracle_post, within_deadline

PROMPT = "The model"
TEMPERATURE = 0.9
PINNED = {"top_p": 1.0, "top_k": -1, "min_p": 0.0, "repeat_penalty": 1.0}  # no truncation, no penalty
SAMPLES = 300
CONCURRENCY = 6
MIN_EXPECTED = 5.0
#: Reject only a distribution that is clearly off: a false alarm once in 10,000 runs.
ALPHA = 1e-4


async def next_token_probs(server: Server, ids: list[int]) -> list[dict]:
    """The server's post-sampling top list after the token ids `ids`. llama-server reports no
    probabilities when the token it happens to sample is a partial UTF-8 character (it holds
    incomplete text back), so ask again (it samples anew) until it does."""
    body = {"prompt": ids, "n_predict": 1, "n_probs": 20, "post_sampling_probs": True, "temperature": TEMPERATURE, **PINNED}
    for _ in range(40):
        data = await oracle_post(server, "/completion", body)
        if data.get("completion_probabilities"):
            return data["completion_probabilities"][0]["top_probs"]
    raise AssertionError(f"llama-server never reported probabilities after {ids}: {data}")


async def two_token_distribution(server: Server) -> dict[str, float]:
    """P(text of the first two generated tokens), from the server's own reported probabilities."""
    ids = (await oracle_post(server, "/tokenize", {"content": PROMPT, "add_special": True}))["tokens"]
    dist: dict[str, float] = defaultdict(float)
    for first in await next_token_probs(server, ids):
        if first["prob"] * SAMPLES < MIN_EXPECTED / 2:
            continue  # its pairs cannot reach an expected count of 5: pooled with the rest
        for second in await next_token_probs(server, ids + [first["id"]]):
            text = bytes(first["bytes"] + second["bytes"]).decode("utf-8", errors="replace")
            dist[text] += first["prob"] * second["prob"]
    return dict(dist)


def chi_square(samples: list[str], dist: dict[str, float]) -> tuple[float, dict[str, tuple[int, float]]]:
    keep = {text: p for text, p in dist.items() if p * len(samples) >= MIN_EXPECTED}
    categories = sorted(keep, key=lambda t: -keep[t])
    expected = [keep[c] * len(samples) for c in categories] + [max(0.0, 1.0 - sum(keep.values())) * len(samples)]
    counts = Counter(s if s in keep else "<other>" for s in samples)
    observed = [counts[c] for c in categories] + [counts["<other>"]]
    table = dict(zip(categories + ["<other>"], zip(observed, expected)))
    return float(chisquare(observed, expected).pvalue), table


async def test_sampled_two_tokens_follow_the_servers_distribution(ls: ServerPair) -> None:
    dist = await two_token_distribution(ls.target)
    assert sum(1 for p in dist.values() if p * SAMPLES >= MIN_EXPECTED) >= 4, f"too few likely two-token texts to test: {dist}"
    semaphore = asyncio.Semaphore(CONCURRENCY)

    async def server_sample() -> str:
        async with semaphore:
            data = await oracle_post(ls.target, "/completions", {"prompt": PROMPT, "max_tokens": 2, "temperature": TEMPERATURE, **PINNED})
        return data["choices"][0]["text"]

    own_p, own_table = chi_square(await asyncio.gather(*(server_sample() for _ in range(SAMPLES))), dist)
    assert own_p > ALPHA, f"the server's own samples do not follow its reported probabilities (p={own_p:.2g}); text: (observed, expected) {own_table}"

    stats = []
    async with client_for(ls, policy="fixed", num_speculative_tokens=2) as client:

        async def speculative_sample() -> str:
            async with semaphore:
                top_p, extra = PINNED["top_p"], {k: v for k, v in PINNED.items() if k != "top_p"}
                request = client.completions.create(prompt=PROMPT, max_tokens=2, temperature=TEMPERATURE, top_p=top_p, extra_body=extra)
                resp = await within_deadline(request, f"llama.cpp completions T={TEMPERATURE}")
            stats.append(resp.speculative)
            return resp.choices[0].text

        samples = await asyncio.gather(*(speculative_sample() for _ in range(SAMPLES)))
    problems = []
    p, table = chi_square(samples, dist)
    if p <= ALPHA:
        problems.append(f"specapi's samples do not follow the server's distribution (p={p:.2g}); text: (observed, expected) {table}")
    unexplained = [s for s in stats if not s.exact and not s.exact_reason]
    if unexplained:
        problems.append(f"exact=False without a reason: {unexplained[0]}")
    speculated = [s for s in stats if s.speculated]
    if not speculated:
        problems.append(f"no sample speculated: {stats[0]}")
    elif sum(s.accepted_tokens for s in speculated) == 0:
        rounds = sum(s.num_rounds for s in speculated)
        problems.append(f"no draft token was ever accepted ({len(speculated)} speculated samples, {rounds} rounds; chi-square p={p:.2g})")
    assert not problems, "; ".join(problems)
