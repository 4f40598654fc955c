"""The simulator's score table: fixed memory, least recently used row of a set replaced, and scores read
back bit for bit equal to freshly computed ones, also after the table has been overwritten many times."""

from __future__ import annotations

import gc
import math
import tracemalloc

import pytest

from specapi.sim import models
from specapi.sim.corpus import encode_text
from specapi.sim.models import ModelSpec, get_model
from specapi.sim import scoretable as scoretable_module
from specapi.sim.scoretable import ScoreTable


def test_rows_read_back_as_written():
    table = ScoreTable(slots=16, width=3)
    top = ((7, -0.1), (9, -2.5), (1, -math.pi))
    assert table.put(12345, -0.1, 4, top)
    assert table.put(99, -1.25, None, ((3, -1.25),))
    assert table.get_many([12345, 99, 7]) == [(-0.1, 4, top), (-1.25, None, ((3, -1.25),)), None]


def test_a_top_list_wider_than_the_table_is_not_kept():
    table = ScoreTable(slots=4, width=1)
    assert not table.put(5, -1.0, None, ((1, -1.0), (2, -2.0)))
    assert table.get_many([5]) == [None]


def test_the_least_recently_used_row_of_a_set_is_replaced():
    table = ScoreTable(slots=2, width=1)  # one set of two rows: every key lands in it
    table.put(1, -1.0, None, ())
    table.put(2, -2.0, None, ())
    table.get_many([1])  # 1 read after 2 was written
    table.put(3, -3.0, None, ())
    assert table.get_many([1, 2, 3]) == [(-1.0, None, ()), None, (-3.0, None, ())]


@pytest.mark.parametrize("slots", [0, 3, 12])
def test_slots_must_be_a_power_of_two(slots):
    with pytest.raises(ValueError, match="power of two"):
        ScoreTable(slots=slots, width=1)


def test_the_table_takes_no_memory_as_rows_come_in():
    table = ScoreTable(slots=1024, width=5)
    gc.collect()
    # Only what this test and the table allocate: tracemalloc sees every thread, and threads other tests
    # left behind (a client's loop thread, a library's) allocate while this runs.
    own = [tracemalloc.Filter(True, __file__), tracemalloc.Filter(True, scoretable_module.__file__)]
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot().filter_traces(own)
        for key in range(1, 20_001):
            table.put(key * 0x9E3779B97F4A7C15 % (1 << 64) or 1, -key / 7, key % 50, tuple((key + j, -j / 3) for j in range(5)))
            if key % 1000 == 0:
                table.get_many(list(range(key - 999, key + 1)))
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(own)
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    finally:
        tracemalloc.stop()
    assert grown < 10_000, f"the table held {grown} bytes more after 20,000 rows (allocated: {table.nbytes})"


def test_scores_stay_exact_when_a_tiny_table_is_overwritten_again_and_again(monkeypatch):
    monkeypatch.setattr(models, "_SCORE_TABLE_SLOTS", {1: 8, 5: 8, 20: 8})
    monkeypatch.setattr(models, "_RECENT_SCORES_SIZE", 2)  # nearly every read goes to the table
    model = get_model(ModelSpec(name="tiny-score-table", order=4, tier="target", noise=0.5, seed=11))
    prompts = [encode_text(f"def f{i}(x):\n    return x * {i} + {i * i}\n") for i in range(6)]
    for _ in range(3):
        for ids in prompts:
            for k, with_rank in ((1, False), (5, True), (20, False)):
                got = model.score(ids, k=k, with_rank=with_rank)
                want = [model._score_position(model._as_ids(ids[:pos]), ids[pos], k, with_rank) for pos in range(1, len(ids))]
                assert got == want
    assert {w: t.slots for w, t in model._score_tables.items()} == {1: 8, 5: 8, 20: 8}
    assert len(model._recent_scores) == 2


def test_a_long_prompt_is_served_from_the_table_past_the_recent_objects(monkeypatch):
    monkeypatch.setattr(models, "_RECENT_SCORES_SIZE", 16)
    model = get_model(ModelSpec(name="recent-scores-small", order=4, tier="target", noise=0.5, seed=12))
    ids = encode_text("def total(items):\n    return sum(item.price * item.count for item in items)\n" * 4)
    first = model.score(ids, k=1)
    calls = []
    monkeypatch.setattr(model, "_score_position", lambda *a: calls.append(a))  # nothing may be computed again
    assert model.score(ids, k=1) == first and not calls
