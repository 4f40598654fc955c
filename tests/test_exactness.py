"""Acceptance tests: specapi's output is exactly the target's, against the toy server over real HTTP.

Greedy: token for token equal to the target's own temperature-0 output.  Sampling: the target's
distribution (chi-square against the exact distribution the toy models expose).  Plus
reproducibility, billing, the sync client and chat.

Clients use the fixed draft-length policy, so every request speculates (the default adaptive policy
may rightly decide that speculation does not pay on a zero-latency loopback server): exactness of a
response that never speculated proves nothing, so the tests also check that speculation happened.
The latency-accounting test shapes the toy target's per-token time (TARGET_PER_TOKEN_S).
"""

from __future__ import annotations

import asyncio
import inspect
import math
import random

import openai
import pytest
from scipy.stats import chisquare

import specapi
from specapi import AsyncSpeculativeOpenAI, Endpoint, SpeculativeOpenAI
from toyserver import DRAFT, TARGET, ToyServer, render_chat

LETTERS = "abcdef "
K = 4
# errors with which the engine may refuse a request it cannot serve exactly
REFUSALS = tuple(e for e in (getattr(specapi, "SpecAPIError", None), openai.APIError) if e is not None)


# ----------------------------------------------------------------------------- helpers and fixtures


TARGET_PER_TOKEN_S = 0.025  # seconds per generated token of the toy target
MIN_SPECULATED = 0.75  # fraction of responses that must have speculated, where speculation pays


def shaped(srv: ToyServer) -> ToyServer:
    srv.set_delay("target", per_token=TARGET_PER_TOKEN_S)
    return srv


@pytest.fixture(scope="module")
def srv():
    with ToyServer() as s:
        yield s


def endpoints(srv: ToyServer) -> dict:
    """Client options: both toy models, and a fixed draft length so that every request speculates."""
    return {"target": Endpoint(base_url=srv.base_url, model="target", api_key="x"),
            "draft": Endpoint(base_url=srv.base_url, model="draft", api_key="x"),
            "policy": "fixed"}


async def aclose(obj) -> None:
    for name in ("aclose", "close"):
        f = getattr(obj, name, None)
        if f is not None:
            r = f()
            if inspect.isawaitable(r):
                await r
            return


def sclose(obj) -> None:
    f = getattr(obj, "close", None)
    if f is not None:
        f()


@pytest.fixture
async def client(srv):
    c = AsyncSpeculativeOpenAI(**endpoints(srv), num_speculative_tokens=K)
    yield c
    await aclose(c)


class Reference:
    """The target's own outputs, from plain calls to the same server (with its delays suspended)."""

    def __init__(self, srv: ToyServer):
        self.srv = srv
        self.sdk = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0)

    async def greedy(self, prompt: str, max_tokens: int, stop=None) -> tuple[str, str]:
        with self.srv.delays_suspended():
            r = await self.sdk.completions.create(model="target", prompt=prompt, max_tokens=max_tokens,
                                                  temperature=0, stop=stop)
        got = (r.choices[0].text, r.choices[0].finish_reason)
        assert got == TARGET.greedy(prompt, max_tokens, stop=stop)  # the toy server agrees with its model
        return got

    async def chat_greedy(self, messages: list, max_tokens: int, stop=None) -> tuple[str, str]:
        with self.srv.delays_suspended():
            r = await self.sdk.chat.completions.create(model="target", messages=messages, max_tokens=max_tokens,
                                                       temperature=0, stop=stop)
        return r.choices[0].message.content, r.choices[0].finish_reason


@pytest.fixture
async def plain(srv):
    ref = Reference(srv)
    yield ref
    await ref.sdk.close()


def random_prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(LETTERS) for _ in range(rng.randint(1, 10))) for _ in range(n)]


def chisquare_against(counts: dict[str, int], exact: dict[str, float]) -> float:
    """p-value of a chi-square goodness-of-fit test; cells with expected count < 5 merged into one."""
    n = sum(counts.values())
    unknown = set(counts) - set(exact)
    assert not unknown, f"outputs impossible under the model: {sorted(unknown)[:5]}"
    big = [k for k in exact if exact[k] * n >= 5]
    rest = [k for k in exact if exact[k] * n < 5]
    obs = [counts.get(k, 0) for k in big]
    exp = [exact[k] * n for k in big]
    if rest:
        obs.append(sum(counts.get(k, 0) for k in rest))
        exp.append(sum(exact[k] for k in rest) * n)
    exp[-1] += n - math.fsum(exp)  # rounding: make the totals agree exactly
    return float(chisquare(obs, exp).pvalue)


def check_round_records(s) -> None:
    assert s.num_rounds == len(s.rounds)
    assert s.drafted_tokens == sum(r.drafted for r in s.rounds)
    assert s.accepted_tokens == sum(r.accepted for r in s.rounds)
    assert all(0 <= r.accepted <= r.drafted for r in s.rounds)
    if s.drafted_tokens:
        assert s.acceptance_rate == pytest.approx(s.accepted_tokens / s.drafted_tokens)


# ----------------------------------------------------------------------------- greedy

GREEDY_PROMPTS = random_prompts(36, seed=2024) + ["U:ab\nA:", "a", "cafe", "U:fed\nA:ab"]
GREEDY_MAX_TOKENS = [5, 12, 20, 33]


async def test_greedy_equals_target_token_for_token(srv, client, plain):
    mismatches, problems, finishes, speculated = [], [], set(), []
    total_tokens = total_target_calls = 0
    for i, prompt in enumerate(GREEDY_PROMPTS):
        max_tokens = GREEDY_MAX_TOKENS[i % len(GREEDY_MAX_TOKENS)]
        expected = await plain.greedy(prompt, max_tokens)
        finishes.add(expected[1])
        resp = await client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=0, seed=1)
        assert isinstance(resp, openai.types.Completion)
        c = resp.choices[0]
        s = resp.speculative
        if (c.text, c.finish_reason) != expected:
            mismatches.append((prompt, max_tokens, expected, (c.text, c.finish_reason)))
            continue
        if s.exact is not True:
            problems.append((prompt, "exact", s.exact, s.exact_reason))
        # One token a character, and the end-of-text token that ends a "stop" (the target counts it too).
        if s.generated_tokens != len(c.text) + (c.finish_reason == "stop"):
            problems.append((prompt, "generated_tokens != the target's count", s.generated_tokens, len(c.text),
                             expected[1]))
        try:
            check_round_records(s)
        except AssertionError as e:
            problems.append((prompt, "round records", str(e)))
        speculated.append(s.speculated)
        total_tokens += len(c.text)
        total_target_calls += s.target.requests
    assert finishes == {"stop", "length"}  # the cases cover both endings
    tokens_per_call = total_tokens / max(total_target_calls, 1)
    print(f"greedy K={K}: {total_tokens} tokens / {total_target_calls} target calls = {tokens_per_call:.3f}, "
          f"speculated in {sum(speculated)}/{len(speculated)}")
    assert not mismatches, "engine output != target greedy output (prompt, max_tokens, expected, got):\n" + \
        "\n".join(map(repr, mismatches))
    assert not problems, "statistics wrong:\n" + "\n".join(map(repr, problems))
    assert sum(speculated) >= MIN_SPECULATED * len(speculated), f"speculated in {sum(speculated)}/{len(speculated)}"
    assert tokens_per_call > 1.5


def _long_greedy_prompts(n: int, length: int = 30) -> list[str]:
    out = []
    for p in random_prompts(200, seed=77):
        text, finish = TARGET.greedy(p, length)
        if finish == "length":
            out.append(p)
        if len(out) == n:
            break
    return out


async def test_greedy_with_stop_sequences(srv, client, plain):
    cases = []
    for p in _long_greedy_prompts(4):
        full, _ = TARGET.greedy(p, 30)
        cases += [
            (p, full[1:3]),  # hit inside the first draft
            (p, [full[9:12], "zzz"]),  # hit in a later round, with a string that never occurs
            (p, full[0]),  # hit at the very first token: empty output
            (p, p[-1] + full[0]),  # spans the prompt/output boundary: servers match generated text only
            (p, "zzz"),  # never hit
            (p, [full[5:7], full[2:4]]),  # several, the earliest wins
        ]
    mismatches, speculated = [], 0
    for prompt, stop in cases:
        expected = await plain.greedy(prompt, 30, stop=stop)
        resp = await client.completions.create(prompt=prompt, max_tokens=30, temperature=0, stop=stop)
        got = (resp.choices[0].text, resp.choices[0].finish_reason)
        speculated += resp.speculative.speculated
        if got != expected:
            mismatches.append((prompt, stop, expected, got))
    assert not mismatches, "with stop (prompt, stop, expected, got):\n" + "\n".join(map(repr, mismatches))
    assert speculated >= 0.5 * len(cases), f"speculated in {speculated}/{len(cases)}"


async def test_greedy_max_tokens_edge_cases(srv, client, plain):
    empty = [p for p in random_prompts(300, seed=5) if TARGET.greedy(p, 5)[0] == ""]
    assert empty, "no prompt whose greedy output is empty"
    early_stop = [p for p in random_prompts(300, seed=6) if 0 < len(TARGET.greedy(p, 30)[0]) < 8]
    assert early_stop
    long = _long_greedy_prompts(2)
    cases = [(p, m) for p in long for m in range(1, 11)]
    cases += [(p, m) for p in empty[:2] for m in (1, 2, 5)]
    cases += [(p, m) for p in early_stop[:3] for m in (1, K, K + 1, 30)]
    mismatches = []
    for prompt, max_tokens in cases:
        expected = await plain.greedy(prompt, max_tokens)
        resp = await client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=0)
        got = (resp.choices[0].text, resp.choices[0].finish_reason)
        if got != expected:
            mismatches.append((prompt, max_tokens, expected, got))
        elif resp.speculative.generated_tokens > max_tokens:
            mismatches.append((prompt, max_tokens, "generated_tokens", resp.speculative.generated_tokens))
    assert not mismatches, "(prompt, max_tokens, expected, got):\n" + "\n".join(map(repr, mismatches))


# ----------------------------------------------------------------------------- sampling

SAMPLE_PROMPT = "cafe"
SAMPLE_TOKENS = 3
NUM_SAMPLES = 1200


async def _sample_many(client, prompt: str, n: int, *, max_tokens: int, temperature: float, chat: bool = False,
                       seed_base: int = 0, batch: int = 25, warmup: int = 3):
    """n seeded samples, `batch` at a time, after `warmup` sequential requests (not returned) so that an
    engine that learns latencies before deciding to speculate has measured something."""
    for i in range(warmup):
        if chat:
            await client.chat.completions.create(messages=[{"role": "user", "content": prompt}],
                                                 max_tokens=max_tokens, temperature=temperature, seed=-1 - i)
        else:
            await client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                                            seed=-1 - i)
    out = []
    for start in range(0, n, batch):
        if chat:
            coros = [client.chat.completions.create(messages=[{"role": "user", "content": prompt}],
                                                    max_tokens=max_tokens, temperature=temperature,
                                                    seed=seed_base + i)
                     for i in range(start, min(n, start + batch))]
        else:
            coros = [client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                                               seed=seed_base + i)
                     for i in range(start, min(n, start + batch))]
        out += await asyncio.gather(*coros)
    return out


def _text(resp) -> str:
    c = resp.choices[0]
    return c.message.content if hasattr(c, "message") else c.text


async def test_sampling_follows_target_distribution(srv):
    client = AsyncSpeculativeOpenAI(**endpoints(srv), num_speculative_tokens=3)
    try:
        resps = await _sample_many(client, SAMPLE_PROMPT, NUM_SAMPLES, max_tokens=SAMPLE_TOKENS, temperature=1.0)
    finally:
        await aclose(client)
    counts: dict[str, int] = {}
    for r in resps:
        counts[_text(r)] = counts.get(_text(r), 0) + 1
    not_exact = [(r.speculative.exact, r.speculative.exact_reason) for r in resps if r.speculative.exact is not True]
    speculated = sum(r.speculative.speculated for r in resps)
    p_target = chisquare_against(counts, TARGET.sequence_probs(SAMPLE_PROMPT, SAMPLE_TOKENS))
    p_draft = chisquare_against(counts, DRAFT.sequence_probs(SAMPLE_PROMPT, SAMPLE_TOKENS))
    tokens = sum(r.speculative.generated_tokens for r in resps)
    calls = sum(r.speculative.target.requests for r in resps)
    accepted = sum(r.speculative.accepted_tokens for r in resps)
    drafted = sum(r.speculative.drafted_tokens for r in resps)
    print(f"sampling T=1: n={NUM_SAMPLES} distinct={len(counts)} p_target={p_target:.4g} p_draft={p_draft:.3g} "
          f"tokens/target call={tokens / max(calls, 1):.3f} acceptance={accepted}/{drafted} "
          f"speculated={speculated}/{len(resps)}")
    assert p_target > 1e-3, f"output distribution is not the target's (p={p_target:.3g})"
    assert p_draft < 1e-6, f"output looks like the draft's (p={p_draft:.3g})"
    assert not not_exact, f"{len(not_exact)} responses not exact, e.g. {not_exact[:3]}"
    assert speculated >= MIN_SPECULATED * len(resps)  # speculation really happened
    assert drafted > 0 and accepted > 0.3 * drafted
    assert tokens / calls > 1.2


async def test_sampling_at_temperature_0_6_follows_target_distribution(srv):
    """Raw logprobs + temperature: the engine must sample from p^(1/T) renormalised."""
    client = AsyncSpeculativeOpenAI(**endpoints(srv), num_speculative_tokens=3)
    try:
        resps = await _sample_many(client, "ab", 1000, max_tokens=3, temperature=0.6, seed_base=10_000)
    finally:
        await aclose(client)
    counts: dict[str, int] = {}
    for r in resps:
        counts[_text(r)] = counts.get(_text(r), 0) + 1
    p_t06 = chisquare_against(counts, TARGET.sequence_probs("ab", 3, temperature=0.6))
    p_t1 = chisquare_against(counts, TARGET.sequence_probs("ab", 3, temperature=1.0))
    speculated = sum(r.speculative.speculated for r in resps)
    print(f"sampling T=0.6: p_target(T=0.6)={p_t06:.4g} p_target(T=1)={p_t1:.3g} speculated={speculated}/{len(resps)}")
    assert speculated >= MIN_SPECULATED * len(resps)
    assert p_t06 > 1e-3
    assert p_t1 < 1e-6


async def test_chat_sampling_follows_target_distribution(srv):
    client = AsyncSpeculativeOpenAI(**endpoints(srv), num_speculative_tokens=3)
    try:
        resps = await _sample_many(client, "ab", 800, max_tokens=2, temperature=1.0, chat=True, seed_base=50_000)
    finally:
        await aclose(client)
    counts: dict[str, int] = {}
    for r in resps:
        counts[_text(r)] = counts.get(_text(r), 0) + 1
    prompt = render_chat([{"role": "user", "content": "ab"}])
    p_target = chisquare_against(counts, TARGET.sequence_probs(prompt, 2))
    p_draft = chisquare_against(counts, DRAFT.sequence_probs(prompt, 2))
    speculated = sum(r.speculative.speculated for r in resps)
    print(f"chat sampling T=1: p_target={p_target:.4g} p_draft={p_draft:.3g} speculated={speculated}/{len(resps)}")
    assert speculated >= MIN_SPECULATED * len(resps)
    assert p_target > 1e-3
    assert p_draft < 1e-6


async def test_same_seed_same_output(srv, client):
    first = [await client.completions.create(prompt="U:ab\nA:", max_tokens=20, temperature=1.0, seed=s)
             for s in range(6)]
    again = [await client.completions.create(prompt="U:ab\nA:", max_tokens=20, temperature=1.0, seed=s)
             for s in range(6)]
    assert [_text(r) for r in first] == [_text(r) for r in again]
    assert len({_text(r) for r in first}) > 1  # the seed matters
    c1 = await client.chat.completions.create(messages=[{"role": "user", "content": "fa"}], max_tokens=15,
                                              temperature=1.0, seed=42)
    c2 = await client.chat.completions.create(messages=[{"role": "user", "content": "fa"}], max_tokens=15,
                                              temperature=1.0, seed=42)
    assert _text(c1) == _text(c2)


# ----------------------------------------------------------------------------- billing


def _assert_billing(s, delta: dict, what: str) -> None:
    for role in ("target", "draft"):
        mine, server = getattr(s, role), delta[role]
        got = (mine.requests, mine.prompt_tokens, mine.completion_tokens)
        want = (server.requests, server.prompt_tokens, server.completion_tokens)
        assert got == want, f"{what}: {role} (requests, prompt_tokens, completion_tokens) reported {got}, " \
                            f"server billed {want}"


@pytest.mark.parametrize("cache_block", [None, 4])
async def test_billing_matches_server(cache_block):
    with ToyServer(cache_block=cache_block) as srv:
        shaped(srv)
        client = AsyncSpeculativeOpenAI(**endpoints(srv), num_speculative_tokens=K)
        try:
            calls = [
                ("completions greedy", lambda: client.completions.create(prompt="fed", max_tokens=25, temperature=0)),
                ("completions sampled", lambda: client.completions.create(prompt="ab", max_tokens=25,
                                                                          temperature=1.0, seed=7)),
                ("completions with stop", lambda: client.completions.create(
                    prompt="cafe", max_tokens=25, temperature=0, stop=TARGET.greedy("cafe", 25)[0][6:8] or "zz")),
                ("chat greedy", lambda: client.chat.completions.create(
                    messages=[{"role": "user", "content": "dab"}], max_tokens=25, temperature=0)),
            ]
            for what, call in calls:
                before = srv.snapshot()
                log_start = len(srv.log)
                resp = await call()
                after = srv.snapshot()
                delta = {m: after[m].minus(before[m]) for m in ("target", "draft")}
                s = resp.speculative
                _assert_billing(s, delta, what)
                assert delta["target"].failed == delta["draft"].failed == 0
                logged = [r for r in srv.log[log_start:] if r.status == 200 and r.method == "POST"]  # GETs bill nothing
                assert len(logged) == s.target.requests + s.draft.requests
                if cache_block:
                    assert (s.target.cached_tokens, s.draft.cached_tokens) == \
                        (delta["target"].cached_tokens, delta["draft"].cached_tokens), what
                assert s.target.latency_s > 0 and s.draft.latency_s >= 0
        finally:
            await aclose(client)


async def test_latency_accounts_for_server_time():
    with ToyServer() as srv:
        shaped(srv)
        srv.set_delay("draft", per_request=0.003)
        client = AsyncSpeculativeOpenAI(**endpoints(srv), num_speculative_tokens=K)
        try:
            resp = await client.completions.create(prompt="fed", max_tokens=12, temperature=0)
        finally:
            await aclose(client)
        s = resp.speculative
        assert s.target.latency_s >= TARGET_PER_TOKEN_S * s.target.completion_tokens * 0.95
        assert s.draft.latency_s >= 0.003 * s.draft.requests * 0.95
        assert s.draft.requests > 0


# ----------------------------------------------------------------------------- sync client


def test_sync_client_gives_same_greedy_text(srv):
    plain = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    client = SpeculativeOpenAI(**endpoints(srv), num_speculative_tokens=K)
    try:
        for prompt in ["ab", "fed", "U:cafe\nA:", "a b"]:
            with srv.delays_suspended():
                r = plain.completions.create(model="target", prompt=prompt, max_tokens=20, temperature=0)
            expected = (r.choices[0].text, r.choices[0].finish_reason)
            resp = client.completions.create(prompt=prompt, max_tokens=20, temperature=0)
            assert isinstance(resp, openai.types.Completion)
            assert (resp.choices[0].text, resp.choices[0].finish_reason) == expected, prompt
            assert resp.speculative.exact is True
            chat = client.chat.completions.create(messages=[{"role": "user", "content": prompt.strip(":\nUA")}],
                                                  max_tokens=12, temperature=0)
            with srv.delays_suspended():
                rc = plain.chat.completions.create(model="target", max_tokens=12, temperature=0,
                                                   messages=[{"role": "user", "content": prompt.strip(":\nUA")}])
            assert chat.choices[0].message.content == rc.choices[0].message.content
    finally:
        sclose(client)
        plain.close()


# ----------------------------------------------------------------------------- chat


CHAT_CASES = [
    [{"role": "user", "content": c}] for c in random_prompts(14, seed=99)
] + [
    [{"role": "system", "content": "be a"}, {"role": "user", "content": "fed"}],
    [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}, {"role": "user", "content": "e"}],
    [{"role": "user", "content": [{"type": "text", "text": "face"}]}],
]


async def test_chat_greedy_equals_target_chat_greedy(srv, client, plain):
    mismatches, tokens, calls, speculated = [], 0, 0, 0
    for i, messages in enumerate(CHAT_CASES):
        max_tokens = (8, 20, 30)[i % 3]
        expected = await plain.chat_greedy(messages, max_tokens)
        resp = await client.chat.completions.create(messages=messages, max_tokens=max_tokens, temperature=0)
        assert isinstance(resp, openai.types.chat.ChatCompletion)
        got = (resp.choices[0].message.content, resp.choices[0].finish_reason)
        if got != expected:
            mismatches.append((messages, max_tokens, expected, got))
            continue
        assert resp.choices[0].message.role == "assistant"
        assert resp.speculative.exact is True
        tokens += resp.speculative.generated_tokens
        calls += resp.speculative.target.requests
        speculated += resp.speculative.speculated
    assert not mismatches, "chat (messages, max_tokens, expected, got):\n" + "\n".join(map(repr, mismatches))
    print(f"chat greedy: {tokens} tokens / {calls} target calls = {tokens / max(calls, 1):.3f}, "
          f"speculated in {speculated}/{len(CHAT_CASES)}")
    assert speculated >= MIN_SPECULATED * len(CHAT_CASES)


async def test_chat_greedy_with_stop(srv, client, plain):
    messages = [{"role": "user", "content": "cafe"}]
    full, _ = await plain.chat_greedy(messages, 30)
    for stop in [full[1:3], full[7:9], "zzz"]:
        expected = await plain.chat_greedy(messages, 30, stop=stop)
        resp = await client.chat.completions.create(messages=messages, max_tokens=30, temperature=0, stop=stop)
        assert (resp.choices[0].message.content, resp.choices[0].finish_reason) == expected, stop


async def test_chat_speculation_uses_few_target_calls(srv, client):
    tokens = calls = speculated = 0
    for messages in CHAT_CASES:
        resp = await client.chat.completions.create(messages=messages, max_tokens=30, temperature=0)
        tokens += resp.speculative.generated_tokens
        calls += resp.speculative.target.requests
        speculated += resp.speculative.speculated
    assert speculated >= MIN_SPECULATED * len(CHAT_CASES), f"speculated in {speculated}/{len(CHAT_CASES)}"
    assert tokens / calls > 1.5, f"{tokens} tokens / {calls} target calls"


# ----------------------------------------------------------------------------- failures must not cost exactness


async def test_transient_draft_and_target_errors_keep_output_exact(srv, client, plain):
    expected = await plain.greedy("fed", 20)
    srv.fail_next(1, 500, model="draft")
    srv.fail_next(1, 429, model="target", retry_after=0.01)
    try:
        resp = await client.completions.create(prompt="fed", max_tokens=20, temperature=0)
    finally:
        srv.clear_faults()
    assert (resp.choices[0].text, resp.choices[0].finish_reason) == expected


async def test_missing_target_logprobs_never_silently_inexact(srv, client, plain):
    """With a target that returns no logprobs the output is the target's, or the response says it is not exact."""
    srv.omit_logprobs_next(10_000, model="target")
    try:
        results = []
        for prompt in ["fed", "ab", "cafe"]:
            expected = await plain.greedy(prompt, 20)
            try:
                resp = await client.completions.create(prompt=prompt, max_tokens=20, temperature=0)
            except REFUSALS as e:  # refusing with a library error is acceptable; silently wrong output is not
                results.append(("raised", type(e).__name__))
                continue
            got = (resp.choices[0].text, resp.choices[0].finish_reason)
            s = resp.speculative
            assert got == expected or s.exact is False, (prompt, expected, got, s.exact)
            if s.exact is False:
                assert s.exact_reason
            results.append(("ok", got == expected, s.speculated, s.fallback_reason))
        print(f"target without logprobs: {results}")
    finally:
        srv.clear_faults()
