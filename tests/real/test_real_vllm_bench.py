"""The real-vLLM benchmark (benchmarks/real_vllm.py), short: exactness, rounds and requests, not speed.

On the session's real vLLM pair (the trained tiny target and its draft, `vllm` in conftest.py) and a
`specapi serve` in front of them, the benchmark's own rows answer a code prompt and a CJK prompt greedily,
16 tokens each: the target alone, specapi's default client, its client with a fixed draft length, the
proxy (fixed draft length) and, on an agentic workload (each prompt sent again), the suffix drafter. Every
text must be the target alone's; the fixed rows must have kept draft tokens in rounds; and the target's
own `/metrics` must show one engine request a round on the one-pass scoring (a short context is checked
by one scored prompt: docs/verification.md), plus at most a plain step or two per request. Speed is the
benchmark's business (ratios from one run), never asserted here.
"""

from __future__ import annotations

import json
import pathlib
import re
import sys
from collections.abc import Iterator

import pytest
from real_helpers import ServerPair

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"
if str(BENCHMARKS) not in sys.path:
    sys.path.insert(0, str(BENCHMARKS))

import real_llamacpp as lc  # noqa: E402
import real_vllm as bench  # noqa: E402

PROMPTS = [bench.CODE_PROMPTS[0], bench.PROSE_PROMPTS[1]]
MAX_TOKENS = 16
K = 4
FIXED = ("--policy", "fixed", "--num-speculative-tokens", str(K))


def _process(server, name: str) -> lc.Process:  # type: ignore[no-untyped-def]
    return lc.Process(name, server.port, server.process, server.log)


@pytest.fixture(scope="module")
def pair(vllm: ServerPair, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[lc.Process, lc.Process, lc.Process]]:
    """The session's target and draft vLLM, and `specapi serve` (fixed draft length) in front of them."""
    target, draft = _process(vllm.target, "target vLLM"), _process(vllm.draft, "draft vLLM")
    models = (vllm.target.model, vllm.draft.model)
    proxy = bench.start_proxy(tmp_path_factory.mktemp("proxy"), target, draft, list(FIXED), models=models)
    try:
        yield target, draft, proxy
    finally:
        lc.stop_process(proxy)


def _growth(sample: lc.Sample) -> dict[str, float]:
    found = re.search(r"\{.*\}$", sample.note)
    return json.loads(found.group(0)) if found else {}


async def test_rows_are_the_target_alones_and_rounds_are_one_request(vllm: ServerPair, pair: tuple[lc.Process, lc.Process, lc.Process]) -> None:
    target, draft, proxy = pair
    models = (vllm.target.model, vllm.draft.model)
    routes = [
        bench.target_route("target alone", target, model=models[0]),
        bench.specapi_route("specapi client (defaults)", target, draft, models=models),
        bench.specapi_route(f"specapi client, fixed K={K}", target, draft, models=models, policy="fixed", num_speculative_tokens=K),
        bench.proxy_route(proxy, target, draft, model=models[0]),
    ]
    rows = {row.name: row for row in await bench.lc.measure(routes, PROMPTS, MAX_TOKENS, 0.0)}
    for route in routes:
        if route.close is not None:
            await route.close()
    alone = rows["target alone"]
    assert [s.tokens for s in alone.samples] == [MAX_TOKENS] * len(PROMPTS), [(s.prompt, s.tokens, s.text) for s in alone.samples]
    for name, row in rows.items():
        assert not row.failed and row.error is None, (name, row.error, [s.error for s in row.failed])
        for sample, expected in zip(row.samples, alone.samples, strict=True):
            assert sample.text == expected.text, f"{name} on {sample.prompt!r}: {sample.text!r} != the target alone's {expected.text!r} ({sample.note})"
            assert sample.exact in (None, True), f"{name}: {sample.note}"
    for name in (f"specapi client, fixed K={K}", proxy.name):
        row = rows[name]
        assert sum(s.accepted for s in row.samples) > 0, f"{name}: no draft token kept: {[s.note for s in row.samples]}"
    fixed = rows[f"specapi client, fixed K={K}"]
    assert fixed.rounds >= len(PROMPTS), [s.note for s in fixed.samples]
    whole = [sample for sample in fixed.samples if "\ufffd" not in sample.text]
    assert whole, "no answer of whole characters to count requests on"
    for sample in fixed.samples:
        assert sample.note.startswith("token-ids"), sample.note
    for sample in whole:
        # Counted by the target itself: each round one engine request (one scored prompt), and a plain
        # step or two to finish (the last tokens, a character left whole). (Where the target's own text
        # holds bytes that never make a character, U+FFFD in its answer, the target alone writes those
        # tokens a step at a time: that answer is checked for its text only.)
        engine = _growth(sample).get("engine_requests", 0)
        assert sample.rounds <= engine <= sample.rounds + 2, (sample.rounds, _growth(sample), sample.note)


async def test_agentic_suffix_rows_are_exact_and_draft(vllm: ServerPair, pair: tuple[lc.Process, lc.Process, lc.Process]) -> None:
    target, _, _ = pair
    models = (vllm.target.model, vllm.draft.model)
    routes = [
        bench.target_route("target alone", target, model=models[0]),
        bench.specapi_route("specapi drafter=suffix", target, None, models=models, drafter="suffix", policy="fixed", num_speculative_tokens=8),
    ]
    rows = await bench.lc.measure(routes, bench.agentic_prompts(PROMPTS[:1], 2), MAX_TOKENS, 0.0)
    for route in routes:
        if route.close is not None:
            await route.close()
    alone, suffix = rows
    assert [s.text for s in suffix.samples] == [s.text for s in alone.samples]
    # The second time the same context comes, the suffix index holds the first answer: it drafts it.
    assert suffix.samples[1].accepted > 0, [s.note for s in suffix.samples]
