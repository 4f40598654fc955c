"""The real-compute benchmark (benchmarks/real_llamacpp.py), short: exactness and rounds, not speed.

The compute-bound target and its draft, written by `make_models.py` (`make_compute_models`, cached like
the tiny models), each on its own llama-server as the benchmark starts them, plus a llama-server running
llama.cpp's in-engine speculation with the same pair and `specapi serve` in front of the two servers
(fixed draft length 4, so that it speculates on every request). The benchmark's own rows answer a code,
a prose and a CJK prompt greedily, 32 tokens each: every text must be the target alone's, and the rows
that speculate must have kept draft tokens (llama.cpp's `draft_n_accepted`, specapi's
`accepted_tokens`), and a round's slots must evaluate only what they have not cached (llama-server's own
count of prompt tokens). Speed is the benchmark's business (ratios from one run), never asserted here.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import real_llamacpp as bench  # noqa: E402

PROMPTS = [bench.CODE_PROMPTS[0], bench.PROSE_PROMPTS[1], bench.PROSE_PROMPTS[2]]
MAX_TOKENS = 32
K = 4


@pytest.fixture(scope="module")
def compute(real_build: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, bench.Process]]:
    """The benchmark's servers: target, draft, in-engine speculation (defaults) and specapi serve."""
    flags = ["--policy", "fixed", "--num-speculative-tokens", str(K)]
    args = bench.parse_args(["--tuned", "none", "--no-tightwad", *(f"--proxy-flag={flag}" for flag in flags)])
    with bench.servers(args, tmp_path_factory.mktemp("compute")) as started:
        yield started


async def test_greedy_texts_are_the_target_alones_and_rounds_happen(compute: dict[str, bench.Process]) -> None:
    routes = bench.build_routes(compute, diagnose=[K])
    try:
        rows = {row.name: row for row in await bench.measure(routes, PROMPTS, MAX_TOKENS, 0.0)}
    finally:
        for route in routes:
            if route.close is not None:
                await route.close()
    alone = rows["target alone"]
    assert [s.tokens for s in alone.samples] == [MAX_TOKENS] * len(PROMPTS), [(s.prompt, s.tokens, s.text) for s in alone.samples]
    assert len(rows) == 5, list(rows)
    for name, row in rows.items():
        for sample, expected in zip(row.samples, alone.samples, strict=True):
            assert sample.text == expected.text, f"{name} on {sample.prompt!r}: {sample.text!r} != the target alone's {expected.text!r} ({sample.note})"
            assert sample.exact in (None, True), f"{name}: {sample.note}"
    proxy = next(name for name in rows if name.startswith("specapi serve"))
    for name in ("llama.cpp in-engine, defaults", f"specapi client, fixed K={K}", proxy):
        row = rows[name]
        assert row.acceptance is not None and sum(s.accepted for s in row.samples) > 0, f"{name}: no draft token kept: {[s.note for s in row.samples]}"
    client = rows[f"specapi client, fixed K={K}"]
    assert client.rounds >= len(PROMPTS), [s.note for s in client.samples]
    assert all(s.note.startswith("token-ids") for s in client.samples), [s.note for s in client.samples]
    # Each slot of a round evaluates the tokens emitted since it last ran and its draft tail (about K + 1
    # an output token, plus K(K + 1) / 2 a round), not its whole prompt: 30-60 an output token where the
    # server re-reads whole prompts (a unified KV pool with the RAM prompt cache on, its default).
    evaluated = client.counters["target llama-server"]["prompt_tokens_total"] / client.tokens
    assert evaluated < 3 * (K + 1), f"{evaluated:.1f} prompt tokens evaluated per output token"
    # CPU seconds were read for every process of every row (the benchmark's column).
    assert alone.cpu_s["target llama-server"] > 0 and client.cpu_s["draft llama-server"] > 0, (alone.cpu_s, client.cpu_s)
