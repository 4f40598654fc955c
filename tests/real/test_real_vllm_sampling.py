"""Sampling through specapi draws from real vLLM's own distribution (a chi-square per path).

The oracle is the server's own report of its distribution: vLLM lists raw log-probabilities (the model's
log-softmax, `--logprobs-mode raw_logprobs`), the 20 likeliest at each position. vLLM samples from
softmax(logits / T) cut to the smallest set of likeliest tokens holding `top_p` of it (temperature first,
then top-p). From the 20 listed, the tempered probabilities are known up to the normaliser, which the
unlisted tokens bound (each below the 20th: their tempered mass is at most p20^(1/T - 1) times their raw
mass); where the nucleus ends inside the listed tokens whatever the normaliser, the nucleus and its
renormalised probabilities are exact. That gives the distribution of the first two generated tokens'
text; a few hundred speculative two-token answers per path must follow it (chi-square over the texts
with an expected count of at least 5, the rest pooled, p > 1e-3), and the server's own samples must too
(so the oracle is what the server samples). The same speculative samples are then tested against the
draft's distribution, which the test must reject.
"""

from __future__ import annotations

import asyncio
import json
import math
import pathlib
from collections import Counter, defaultdict
from typing import Any

import httpx2
import pytest
from scipy.stats import chisquare

from real_helpers import SPECULATE_TIMEOUT_S, Server, ServerPair, oracle_post
from specapi import AsyncSpeculativeOpenAI

PROMPT = "def read_lines(path):\n"
MESSAGES = [{"role": "user", "content": "Write a function that reads a file."}]
TOP_P = 0.9
LISTED = 20
SAMPLES = 200
CONCURRENCY = 16
MIN_EXPECTED = 5.0
ALPHA = 1e-3
COMPLETION_PATHS = ("auto", "token-ids", "echo", "prefill-fanout")
CHAT_PATHS = ("auto", "prompt-logprobs", "prefill-fanout")
#: p-values per (temperature, format, path), printed at the end of the module (`pytest -s`).
P_VALUES: dict[tuple[float, str, str], float] = {}


async def _model_config(server: Server) -> dict[str, Any]:
    async with httpx2.AsyncClient(timeout=30.0) as http:
        root = (await http.get(server.base_url + "/models")).json()["data"][0]["root"]
    return json.loads((pathlib.Path(root) / "config.json").read_text())


async def nucleus(server: Server, ids: list[int], temperature: float) -> dict[int, float]:
    """The distribution vLLM samples the token after `ids` from, at `temperature` with top_p 0.9."""
    body = {"prompt": ids, "max_tokens": 1, "temperature": 0, "logprobs": LISTED, "return_tokens_as_token_ids": True}
    top = (await oracle_post(server, "/completions", body))["choices"][0]["logprobs"]["top_logprobs"][0]
    raw = sorted(((int(k.removeprefix("token_id:")), v) for k, v in top.items()), key=lambda item: -item[1])[:LISTED]
    weights = [(token, math.exp(lp / temperature)) for token, lp in raw]
    listed_raw = sum(math.exp(lp) for _, lp in raw)
    smallest = math.exp(raw[-1][1])
    tail = smallest ** (1.0 / temperature - 1.0) * max(0.0, 1.0 - listed_raw)  # the unlisted tokens' tempered mass, at most
    low = sum(w for _, w in weights)
    kept = {}
    for bound in (low, low + tail):
        total, chosen = 0.0, []
        for token, weight in weights:
            chosen.append(token)
            total += weight
            if total >= TOP_P * bound:
                break
        else:
            raise AssertionError(f"the nucleus after {ids[-3:]} is not within the {LISTED} listed tokens at T={temperature}")
        kept[bound] = chosen
    assert kept[low] == kept[low + tail], f"the nucleus after {ids[-3:]} depends on unlisted tokens at T={temperature}"
    chosen = kept[low]
    mass = sum(w for t, w in weights if t in chosen)
    return {t: w / mass for t, w in weights if t in chosen}


async def two_token_texts(server: Server, ids: list[int], temperature: float, eos: int) -> dict[str, float]:
    """P(the text of the first two generated tokens), from the server's reported probabilities."""
    dist: dict[str, float] = defaultdict(float)
    first = await nucleus(server, ids, temperature)
    seconds = await asyncio.gather(*(nucleus(server, ids + [a], temperature) for a in first if a != eos))
    following = dict(zip([a for a in first if a != eos], seconds))
    for a, pa in first.items():
        if a == eos:
            dist[""] += pa
            continue
        for b, pb in following[a].items():
            tokens = [a] if b == eos else [a, b]
            text = (await oracle_post(server, "/detokenize", {"tokens": tokens}))["prompt"]
            dist[text.rstrip("\ufffd")] += pa * pb
    return dict(dist)


def chi_square(samples: list[str], dist: dict[str, float]) -> tuple[float, dict[str, tuple[int, float]]]:
    keep = {text: p for text, p in dist.items() if p * len(samples) >= MIN_EXPECTED}
    categories = sorted(keep, key=lambda t: -keep[t])
    expected = [keep[c] * len(samples) for c in categories] + [max(0.0, 1.0 - sum(keep.values())) * len(samples)]
    counts = Counter(s if s in keep else "<other>" for s in samples)
    observed = [counts[c] for c in categories] + [counts["<other>"]]
    if expected[-1] == 0.0:
        assert observed[-1] == 0, f"{observed[-1]} samples outside the distribution's support"
        observed, expected = observed[:-1], expected[:-1]
    return float(chisquare(observed, expected).pvalue), dict(zip(categories + ["<other>"], zip(observed, expected)))


async def _prompt_ids(server: Server, chat: bool) -> list[int]:
    if chat:
        body = {"model": server.model, "messages": MESSAGES, "add_generation_prompt": True}
    else:
        body = {"model": server.model, "prompt": PROMPT, "add_special_tokens": True}
    return (await oracle_post(server, "/tokenize", body))["tokens"]


async def _samples(create: Any, chat: bool, temperature: float, stats: list[Any] | None = None) -> list[str]:
    semaphore = asyncio.Semaphore(CONCURRENCY)
    request = {"messages": MESSAGES} if chat else {"prompt": PROMPT}

    async def one() -> str:
        async with semaphore:
            response = await asyncio.wait_for(create(**request, max_tokens=2, temperature=temperature, top_p=TOP_P), SPECULATE_TIMEOUT_S)
        if stats is not None:
            stats.append(response.speculative)
        return (response.choices[0].message.content or "") if chat else response.choices[0].text

    return await asyncio.gather(*(one() for _ in range(SAMPLES)))


@pytest.fixture(scope="module")
def distributions() -> dict[tuple[str, float, bool], dict[str, float]]:
    """The two-token distributions by (role, temperature, chat), computed once per module."""
    return {}


async def _distribution(pair: ServerPair, cache: dict[Any, Any], role: str, temperature: float, chat: bool) -> dict[str, float]:
    key = (role, temperature, chat)
    if key not in cache:
        server = pair.target if role == "target" else pair.draft
        config = await _model_config(server)
        eos = config["eos_token_id"][0] if isinstance(config["eos_token_id"], list) else config["eos_token_id"]
        cache[key] = await two_token_texts(server, await _prompt_ids(server, chat), temperature, eos)
    return cache[key]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_vllms_own_samples_follow_the_reported_distribution(vllm: ServerPair, distributions: dict[Any, Any], chat: bool, temperature: float) -> None:
    """The oracle itself: the server's own samples of the same request follow it."""
    dist = await _distribution(vllm, distributions, "target", temperature, chat)
    assert sum(1 for p in dist.values() if p * SAMPLES >= MIN_EXPECTED) >= 3, f"too few likely two-token texts to test: {dist}"
    import openai

    alone = openai.AsyncOpenAI(base_url=vllm.target.base_url, api_key="sk-none", max_retries=0)
    try:
        create = alone.chat.completions.create if chat else alone.completions.create

        async def own(**request: Any) -> Any:
            response = await create(model=vllm.target.model, **request)
            response.speculative = None
            return response

        p, table = chi_square(await _samples(own, chat, temperature), dist)
    finally:
        await alone.close()
    P_VALUES[(temperature, "chat" if chat else "completions", "target alone")] = p
    assert p > ALPHA, f"vLLM's own samples do not follow its reported distribution (p={p:.2g}): {table}"


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize(("chat", "path"), [(False, p) for p in COMPLETION_PATHS] + [(True, p) for p in CHAT_PATHS])
async def test_sampled_two_tokens_follow_vllms_distribution_on_every_path(vllm: ServerPair, distributions: dict[Any, Any], chat: bool, path: str, temperature: float) -> None:
    """specapi's samples follow the target's distribution (p > 1e-3), and reject the draft's (p < 1e-3);
    rounds ran and kept draft tokens."""
    dist = await _distribution(vllm, distributions, "target", temperature, chat)
    draft_dist = await _distribution(vllm, distributions, "draft", temperature, chat)
    stats: list[Any] = []
    client = AsyncSpeculativeOpenAI(
        target=vllm.target.endpoint(max_retries=0), draft=vllm.draft.endpoint(max_retries=0), verification=path, policy="fixed", num_speculative_tokens=2
    )
    try:
        create = client.chat.completions.create if chat else client.completions.create
        samples = await _samples(create, chat, temperature, stats)
    finally:
        await client.close()
    p, table = chi_square(samples, dist)
    p_draft, draft_table = chi_square(samples, draft_dist)
    P_VALUES[(temperature, "chat" if chat else "completions", path)] = p
    print(f"\nT={temperature} {'chat' if chat else 'completions'} {path}: p={p:.3g} against the target, p={p_draft:.3g} against the draft; "
          f"accepted {sum(s.accepted_tokens for s in stats)} of {sum(s.drafted_tokens for s in stats)} drafted; "
          f"paths {Counter(s.verification for s in stats)}")
    assert p > ALPHA, f"specapi's samples do not follow vLLM's distribution (p={p:.2g}): {table}"
    assert p_draft < ALPHA, f"the draft's distribution is not rejected (p={p_draft:.2g}): {draft_table}"
    unexplained = [s for s in stats if not s.exact and not s.exact_reason]
    assert not unexplained, unexplained[0]
    assert sum(s.accepted_tokens for s in stats) > 0, f"no draft token accepted: {stats[0]}"
