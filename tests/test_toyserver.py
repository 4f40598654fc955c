"""Tests of the toy OpenAI-format server itself (tests/toyserver.py), over real loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import math
import random
import urllib.error
import urllib.request

import openai
import pytest
from scipy.stats import chisquare

import toyserver as ts
from toyserver import DRAFT, EOT_TEXT, TARGET, TOKENS, VOCAB_SIZE, ToyServer


@pytest.fixture(scope="module")
def srv():
    with ToyServer() as s:
        yield s


@pytest.fixture
async def aclient(srv):
    c = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    yield c
    await c.close()


def post(srv: ToyServer, path: str, body: dict) -> tuple[int, dict, dict]:
    req = urllib.request.Request(srv.base_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read()), dict(r.headers)
    except urllib.error.HTTPError as e:
        with e:
            return e.code, json.loads(e.read()), dict(e.headers)


ALL_CONTEXTS = [[a, b] for a in range(VOCAB_SIZE) for b in range(VOCAB_SIZE)] + [[], [0], [5], [ts.EOT]] + \
    [[c, a, b] for a in range(VOCAB_SIZE) for b in range(VOCAB_SIZE) for c in range(VOCAB_SIZE)]


# ----------------------------------------------------------------------------- the models


@pytest.mark.parametrize("model", [TARGET, DRAFT])
def test_distributions_normalised(model):
    for ctx in ALL_CONTEXTS:
        p = model.probs_ids(ctx)
        assert len(p) == VOCAB_SIZE
        assert all(x > 0 for x in p)
        assert math.isclose(sum(p), 1.0, abs_tol=1e-12)
    for prompt, n in [("ab", 1), ("ab", 3), ("U:ab\nA:", 2), ("", 2)]:
        seq = model.sequence_probs(prompt, n)
        assert math.isclose(sum(seq.values()), 1.0, abs_tol=1e-9)
        assert all(len(t) <= n for t in seq)
    assert math.isclose(sum(model.next_probs("abc").values()), 1.0, abs_tol=1e-12)
    assert set(model.next_probs("abc")) == set(TOKENS)


def test_models_depend_on_last_two_tokens_and_a_hash_of_the_context():
    for ctx in ["", "a", "ab", "U:ab\nA:", "fedcba ab"]:
        ids = ts.tokenize(ctx)
        assert TARGET.probs_ids(ids) == TARGET._table[ts.context_key(ids)]
    assert ts.context_key(ts.tokenize("cab"))[:2] == ts.context_key(ts.tokenize("ab"))[:2]
    # any single-token change anywhere changes the hash
    base = ts.tokenize("U:cafe\nA:")
    for i in range(len(base)):
        for t in range(VOCAB_SIZE):
            if t != base[i]:
                assert ts.context_key(base[:i] + [t] + base[i + 1:]) != ts.context_key(base)
    # chat prompts with different content start differently
    starts = {TARGET.greedy(ts.render_chat([{"role": "user", "content": c}]), 6)
              for c in ["a", "b", "ab", "fed", "cafe", "dd e", "face"]}
    assert len(starts) >= 4


def test_entropy_is_varied_and_draft_is_correlated_but_different():
    ent = [-sum(x * math.log(x) for x in TARGET.probs_ids(c)) for c in ALL_CONTEXTS]
    assert min(ent) < 0.6 and max(ent) > 2.0  # some peaked, some flat contexts
    agree = sum(TARGET.argmax(c) == DRAFT.argmax(c) for c in ALL_CONTEXTS) / len(ALL_CONTEXTS)
    assert 0.5 < agree < 0.9
    tv = [0.5 * sum(abs(p - q) for p, q in zip(TARGET.probs_ids(c), DRAFT.probs_ids(c))) for c in ALL_CONTEXTS]
    assert sum(tv) / len(tv) > 0.1


def test_sampling_transform():
    p = TARGET.probs_ids([0, 1])
    assert ts.transform(p, 0.0).count(1.0) == 1
    d = ts.transform(p, 0.5)
    assert math.isclose(sum(d), 1.0) and max(d) > max(p)
    d = ts.transform(p, 1.0, 0.5)
    kept = [x for x in d if x > 0]
    assert math.isclose(sum(kept), 1.0) and len(kept) < VOCAB_SIZE


def test_tokenizer():
    assert ts.tokenize("ab c") == [0, 1, 6, 2]
    assert ts.tokenize("a" + EOT_TEXT) == [0, ts.EOT]
    assert ts.detokenize([0, ts.EOT, 1]) == "ab"
    with pytest.raises(ts.ToyError):
        ts.tokenize("xyz")


def test_generate_matches_exact_distribution_in_process():
    """The server's sampler (seeded like the server) follows sequence_probs."""
    exact = TARGET.sequence_probs("ab", 2)
    n = 4000
    counts: dict[str, int] = {}
    for seed in range(n):
        g = ts.generate(TARGET, ts.tokenize("ab"), 2, temperature=1.0, rng=random.Random(seed))
        counts[g.text] = counts.get(g.text, 0) + 1
    keys = [k for k in exact if exact[k] * n >= 5]
    rest = [k for k in exact if k not in keys]
    obs = [counts.get(k, 0) for k in keys] + [sum(counts.get(k, 0) for k in rest)]
    exp = [exact[k] * n for k in keys] + [sum(exact[k] for k in rest) * n]
    exp[-1] += n - sum(exp)
    assert chisquare(obs, exp).pvalue > 1e-3


# ----------------------------------------------------------------------------- completions over HTTP


async def test_greedy_one_call_equals_token_by_token(srv, aclient):
    for prompt in ["ab", "c", "fed cab", "U:ab\nA:", "a a"]:
        one = await aclient.completions.create(model="target", prompt=prompt, max_tokens=25, temperature=0)
        text, finish = one.choices[0].text, one.choices[0].finish_reason
        assert (text, finish) == TARGET.greedy(prompt, 25)
        built = ""
        for _ in range(25):
            r = await aclient.completions.create(model="target", prompt=prompt + built, max_tokens=1,
                                                 temperature=0, logprobs=1)
            if r.choices[0].finish_reason == "stop":
                assert r.choices[0].text == "" and r.choices[0].logprobs.tokens == [EOT_TEXT]
                break
            built += r.choices[0].text
        assert built == text
        assert (finish == "stop") == (len(built) < 25)


async def test_echo_logprobs_are_exact(srv, aclient):
    prompt = "U:cab\nA:fe d"
    r = await aclient.completions.create(model="draft", prompt=prompt, max_tokens=0, echo=True,
                                         logprobs=VOCAB_SIZE, temperature=0)
    c = r.choices[0]
    assert c.text == prompt and c.finish_reason == "length"
    lp = c.logprobs
    assert lp.tokens == list(prompt)
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == list(range(len(prompt)))
    for i in range(1, len(prompt)):
        exact = DRAFT.next_logprobs(prompt[:i])
        assert lp.token_logprobs[i] == pytest.approx(exact[prompt[i]], abs=1e-12)
        assert set(lp.top_logprobs[i]) == set(TOKENS)  # top-12 covers the whole vocabulary
        for tok, v in lp.top_logprobs[i].items():
            assert v == pytest.approx(exact[tok], abs=1e-12)
        assert math.fsum(math.exp(v) for v in lp.top_logprobs[i].values()) == pytest.approx(1.0, abs=1e-12)
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == 0


async def test_echo_with_generation_and_topk(srv, aclient):
    prompt = "abc"
    r = await aclient.completions.create(model="target", prompt=prompt, max_tokens=4, echo=True, logprobs=2,
                                         temperature=0)
    c = r.choices[0]
    gen, _ = TARGET.greedy(prompt, 4)
    assert c.text == prompt + gen
    n = len(c.logprobs.tokens)
    assert n == 3 + r.usage.completion_tokens
    assert c.logprobs.text_offset[:3] == [0, 1, 2] and c.logprobs.text_offset[3] == 3
    for i in range(1, n):
        top = c.logprobs.top_logprobs[i]
        assert c.logprobs.tokens[i] in top and 2 <= len(top) <= 3
        ctx = (prompt + gen)[:i] if i < len(prompt) + len(gen) else prompt + gen
        exact = TARGET.next_logprobs(ctx)
        best2 = sorted(exact, key=lambda t: -exact[t])[:2]
        assert set(best2) <= set(top)


async def test_no_echo_offsets_start_at_zero_and_logprobs_exact(srv, aclient):
    prompt = "fa"
    r = await aclient.completions.create(model="target", prompt=prompt, max_tokens=6, temperature=1, seed=3,
                                         logprobs=5)
    c = r.choices[0]
    lp = c.logprobs
    assert lp.text_offset[0] == 0
    ctx = prompt
    for i, tok in enumerate(lp.tokens):
        assert lp.token_logprobs[i] == pytest.approx(TARGET.next_logprobs(ctx)[tok], abs=1e-12)
        assert lp.text_offset[i] == len(ctx) - len(prompt)
        if tok != EOT_TEXT:
            ctx += tok
    assert ctx == prompt + c.text
    assert r.usage.completion_tokens == len(lp.tokens)


async def test_token_id_prompts_and_return_token_ids(srv, aclient):
    r = await aclient.completions.create(model="target", prompt=[0, 1], max_tokens=3, temperature=0,
                                         extra_body={"return_token_ids": True, "prompt_logprobs": 2})
    c = r.choices[0]
    assert c.text == TARGET.greedy("ab", 3)[0]
    d = c.model_dump()
    assert d["prompt_token_ids"] == [0, 1]
    assert ts.detokenize(d["token_ids"]) == c.text
    pl = d["prompt_logprobs"]
    assert pl[0] is None and set(pl[1]) >= {"1"}
    assert pl[1]["1"]["decoded_token"] == "b"
    assert pl[1]["1"]["logprob"] == pytest.approx(math.log(TARGET.next_probs("a")["b"]))


async def test_seed_reproducible_and_fresh_randomness_without_seed(srv, aclient):
    async def sample(**kw):
        r = await aclient.completions.create(model="target", prompt="U:ab\nA:", max_tokens=12, temperature=1, **kw)
        return r.choices[0].text
    a = [await sample(seed=s) for s in range(8)]
    b = [await sample(seed=s) for s in range(8)]
    assert a == b and len(set(a)) > 1
    fresh = {await sample() for _ in range(8)}
    assert len(fresh) > 1


async def test_stop_sequences(srv, aclient):
    prompt = "ab"
    full, _ = TARGET.greedy(prompt, 30)
    stop = full[4:6]
    assert len(stop) == 2
    r = await aclient.completions.create(model="target", prompt=prompt, max_tokens=30, temperature=0,
                                         stop=[stop, "zz"])
    cut = full.find(stop)
    assert r.choices[0].text == full[:cut] and r.choices[0].finish_reason == "stop"
    assert r.usage.completion_tokens == cut + len(stop)
    # the stop string is searched for in the generated text only
    assert "ab" not in full[:3]
    r = await aclient.completions.create(model="target", prompt=prompt, max_tokens=3, temperature=0, stop="ab")
    assert r.choices[0].text == full[:3]


async def test_max_tokens_validation_and_errors(srv, aclient):
    with pytest.raises(openai.BadRequestError):
        await aclient.completions.create(model="target", prompt="ab", max_tokens=0)
    with pytest.raises(openai.BadRequestError):
        await aclient.completions.create(model="target", prompt="xyz", max_tokens=1)
    with pytest.raises(openai.BadRequestError):
        await aclient.completions.create(model="target", prompt="ab", max_tokens=2, n=0)
    with pytest.raises(openai.BadRequestError):
        await aclient.completions.create(model="target", prompt="ab", max_tokens=2, logprobs=21)
    with pytest.raises(openai.NotFoundError):
        await aclient.completions.create(model="nope", prompt="ab", max_tokens=1)
    status, body, _ = post(srv, "/completions", {"model": "nope", "prompt": "ab"})
    assert status == 404 and set(body["error"]) >= {"message", "type", "code"}
    status, body, _ = post(srv, "/completions", {"model": "target", "prompt": "ab", "max_tokens": -1})
    assert status == 400 and body["error"]["param"] == "max_tokens"


async def test_models_endpoint(srv, aclient):
    models = await aclient.models.list()
    assert {m.id for m in models.data} == {"target", "draft"}


# ----------------------------------------------------------------------------- chat


def test_chat_template():
    assert ts.render_chat([{"role": "user", "content": "ab"}]) == "U:ab\nA:"
    msgs = [{"role": "system", "content": "f"}, {"role": "user", "content": "ab"},
            {"role": "assistant", "content": "cd"}]
    assert ts.render_chat(msgs, add_generation_prompt=False, continue_final_message=True) == "U:f\nU:ab\nA:cd"
    assert ts.render_chat(msgs) == "U:f\nU:ab\nA:cd\nA:"


async def test_chat_greedy_and_logprobs(srv, aclient):
    r = await aclient.chat.completions.create(model="target", messages=[{"role": "user", "content": "ab"}],
                                              max_tokens=15, temperature=0, logprobs=True, top_logprobs=3)
    c = r.choices[0]
    text, finish = TARGET.greedy("U:ab\nA:", 15)
    assert (c.message.content, c.finish_reason) == (text, finish)
    assert r.object == "chat.completion" and c.message.role == "assistant"
    ctx = "U:ab\nA:"
    for item in c.logprobs.content:
        exact = TARGET.next_logprobs(ctx)
        assert item.logprob == pytest.approx(exact[item.token])
        assert item.bytes == list(item.token.encode())
        assert [t.token for t in item.top_logprobs] == sorted(exact, key=lambda t: -exact[t])[:3]
        ctx += item.token if item.token != EOT_TEXT else ""
    assert r.usage.prompt_tokens == len("U:ab\nA:") and r.usage.completion_tokens == len(c.logprobs.content)


async def test_chat_continue_final_message_prompt_logprobs_and_token_ids(srv, aclient):
    msgs = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}]
    r = await aclient.chat.completions.create(
        model="target", messages=msgs, max_tokens=6, temperature=0,
        extra_body={"continue_final_message": True, "add_generation_prompt": False, "prompt_logprobs": 1,
                    "return_token_ids": True})
    prompt = "U:ab\nA:cd"
    assert r.choices[0].message.content == TARGET.greedy(prompt, 6)[0]
    d = r.model_dump()
    assert d["prompt_token_ids"] == ts.tokenize(prompt)
    pl = d["prompt_logprobs"]
    assert len(pl) == len(prompt) and pl[0] is None
    for i in range(1, len(prompt)):
        entry = pl[i][str(ts.tokenize(prompt[i])[0])]
        exact = TARGET.next_logprobs(prompt[:i])
        assert entry["logprob"] == pytest.approx(exact[prompt[i]])
        assert entry["decoded_token"] == prompt[i]
        assert entry["rank"] == 1 + sum(v > exact[prompt[i]] for v in exact.values())
        assert any(v["rank"] == 1 for v in pl[i].values())
    status, body, _ = post(srv, "/chat/completions", {"model": "target", "messages": msgs,
                                                      "continue_final_message": True})
    assert status == 400  # add_generation_prompt defaults to true


async def test_streaming_is_parsed_by_sdk(srv, aclient):
    stream = await aclient.completions.create(model="target", prompt="ab", max_tokens=10, temperature=0, stream=True,
                                              stream_options={"include_usage": True}, logprobs=2)
    text, finish, usage = "", None, None
    async for ch in stream:
        if ch.choices:
            text += ch.choices[0].text
            finish = ch.choices[0].finish_reason or finish
        if ch.usage:
            usage = ch.usage
    assert (text, finish) == TARGET.greedy("ab", 10)
    assert usage is not None and usage.prompt_tokens == 2
    stream = await aclient.chat.completions.create(model="target", messages=[{"role": "user", "content": "ab"}],
                                                   max_tokens=10, temperature=0, stream=True)
    text = ""
    async for ch in stream:
        if ch.choices and ch.choices[0].delta.content:
            text += ch.choices[0].delta.content
    assert text == TARGET.greedy("U:ab\nA:", 10)[0]


# ----------------------------------------------------------------------------- accounting and faults


async def test_accounting_matches_usage(srv, aclient):
    before = srv.snapshot()
    n_log = len(srv.log)
    rs = await asyncio.gather(*[aclient.completions.create(model="draft", prompt="abc", max_tokens=5, seed=i)
                                for i in range(10)])
    rc = await aclient.chat.completions.create(model="target", messages=[{"role": "user", "content": "a"}],
                                               max_tokens=4)
    after = srv.snapshot()
    d = after["draft"].minus(before["draft"])
    assert d.requests == 10
    assert d.prompt_tokens == sum(r.usage.prompt_tokens for r in rs) == 30
    assert d.completion_tokens == sum(r.usage.completion_tokens for r in rs)
    t = after["target"].minus(before["target"])
    assert (t.requests, t.prompt_tokens, t.completion_tokens) == (1, rc.usage.prompt_tokens,
                                                                  rc.usage.completion_tokens)
    new = srv.log[n_log:]
    assert len(new) == 11 and all(r.status == 200 for r in new)
    assert new[-1].body["messages"] == [{"role": "user", "content": "a"}]


async def test_fault_injection(srv, aclient):
    before = srv.snapshot()
    srv.fail_next(1, 500, model="target")
    with pytest.raises(openai.InternalServerError):
        await aclient.completions.create(model="target", prompt="ab", max_tokens=1)
    srv.fail_next(1, 429, model="target", retry_after=0.01)
    status, body, headers = post(srv, "/completions", {"model": "target", "prompt": "ab", "max_tokens": 1})
    assert status == 429 and headers.get("Retry-After") == "0.01" and "error" in body
    # the SDK retries a 429 and then succeeds
    retrying = openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=2)
    srv.fail_next(1, 429, model="target", retry_after=0.01)
    # greedy: sampled, the target ends "ab" at once with p = 0.02, and the text is empty (seen once in CI)
    r = await retrying.completions.create(model="target", prompt="ab", max_tokens=1, temperature=0)
    await retrying.close()
    assert r.choices[0].text
    # faults for another model do not fire
    srv.fail_next(1, 500, model="draft")
    await aclient.completions.create(model="target", prompt="ab", max_tokens=1)
    with pytest.raises(openai.InternalServerError):
        await aclient.completions.create(model="draft", prompt="ab", max_tokens=1)
    after = srv.snapshot()
    assert after["target"].minus(before["target"]).failed == 3
    assert after["target"].minus(before["target"]).requests == 2
    assert after["draft"].minus(before["draft"]).failed == 1
    # omitted logprobs
    srv.omit_logprobs_next(1, model="target")
    r = await aclient.completions.create(model="target", prompt="ab", max_tokens=2, logprobs=3, echo=True)
    assert r.choices[0].logprobs is None and r.usage.prompt_tokens == 2
    r = await aclient.completions.create(model="target", prompt="ab", max_tokens=2, logprobs=3, echo=True)
    assert r.choices[0].logprobs is not None


def test_prefix_cache_reporting():
    with ToyServer(cache_block=4) as s:
        _, b1, _ = post(s, "/completions", {"model": "target", "prompt": "abcdefabc", "max_tokens": 1})
        _, b2, _ = post(s, "/completions", {"model": "target", "prompt": "abcdefab d", "max_tokens": 1})
        _, b3, _ = post(s, "/completions", {"model": "draft", "prompt": "abcdefab d", "max_tokens": 1})
        assert b1["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert b2["usage"]["prompt_tokens_details"]["cached_tokens"] == 8
        assert b3["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert s.stats["target"].cached_tokens == 8


def test_delay():
    import time
    with ToyServer() as s:
        s.set_delay("target", per_request=0.05)
        t0 = time.perf_counter()
        post(s, "/completions", {"model": "target", "prompt": "ab", "max_tokens": 1})
        assert time.perf_counter() - t0 >= 0.05
        s.set_delay("draft", per_token=0.02)
        t0 = time.perf_counter()
        post(s, "/completions", {"model": "draft", "prompt": "ab", "max_tokens": 3, "temperature": 0})
        assert time.perf_counter() - t0 >= 0.02 * s.stats["draft"].completion_tokens
        with s.delays_suspended():
            t0 = time.perf_counter()
            post(s, "/completions", {"model": "target", "prompt": "ab", "max_tokens": 1})
            assert time.perf_counter() - t0 < 0.05


async def test_n_choices_are_drawn_apart_and_billed_with_the_prompt_once(srv, aclient):
    """n > 1 as OpenAI and vLLM answer it: choices indexed in order, a seeded choice i drawn with the seed
    plus i, the prompt billed once; streamed, each chunk names its choice and one usage ends the stream."""
    one = [await aclient.completions.create(model="target", prompt="ab", max_tokens=6, temperature=1.0, seed=40 + i)
           for i in range(3)]
    both = await aclient.completions.create(model="target", prompt="ab", max_tokens=6, temperature=1.0, seed=40, n=3)
    assert [c.index for c in both.choices] == [0, 1, 2]
    assert [c.text for c in both.choices] == [r.choices[0].text for r in one]
    assert both.usage.prompt_tokens == one[0].usage.prompt_tokens
    assert both.usage.completion_tokens == sum(r.usage.completion_tokens for r in one)
    stream = await aclient.chat.completions.create(
        model="target", messages=[{"role": "user", "content": "ab"}], max_tokens=4, temperature=0, n=2, stream=True,
        stream_options={"include_usage": True})
    texts, usages = ["", ""], []
    async for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
        if chunk.usage is not None:
            usages.append(chunk.usage)
    alone = await aclient.chat.completions.create(model="target", messages=[{"role": "user", "content": "ab"}], max_tokens=4, temperature=0)
    assert texts == [alone.choices[0].message.content] * 2
    assert len(usages) == 1 and usages[0].completion_tokens == 2 * alone.usage.completion_tokens
