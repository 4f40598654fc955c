"""Sampled speculation: the target's distribution on every path (chi-square against oracles that share no
code with the client), point-mass drafts on the paths that keep the target's own picks, and seeds.

Oracles: the toy server's own models (`toyserver.TARGET.sequence_probs`), and the simulator's model read
directly (`NGramModel.next_distribution`) through llama.cpp's sampler chain written out here (top-k, top-p,
min-p on the raw probabilities, then temperature). Every sampled test uses fixed seeds, so it never flakes.
"""

from __future__ import annotations

import asyncio
import json
import math

import httpx2
import numpy as np
import openai
import pytest

from specapi import AsyncSpeculativeOpenAI
from specapi.sim import EOS_TOKEN_ID, SimProvider, SimTransport, decode_text, encode_text, get_model, simulated_endpoints
from toyclient import InProcessToy, chisquare_p, text_probs
from toyserver import DRAFT, TARGET

pytestmark = pytest.mark.usefixtures("fresh_probe_cache")


async def _counts(client, prompt: str, n: int, *, max_tokens: int, seed_base: int = 0, **sampling):  # type: ignore[no-untyped-def]
    responses = []
    for start in range(0, n, 100):
        responses += await asyncio.gather(*(
            client.completions.create(prompt=prompt, max_tokens=max_tokens, seed=seed_base + s, **sampling)
            for s in range(start, min(n, start + 100))))
    counts: dict[str, int] = {}
    for r in responses:
        counts[r.choices[0].text] = counts.get(r.choices[0].text, 0) + 1
    return responses, counts


# ----------------------------------------------------------------------------- the toy server, every path


TOY_PROMPT, TOY_TOKENS, TOY_SAMPLES = "ab", 2, 1000


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("verification", ["echo", "prefill-fanout"])
async def test_toy_sampling_with_nucleus_and_top_k_is_the_targets(verification, temperature):
    """top_p 0.9 on both paths; fan-out (the target's own picks) also with the caller's top_k, which no
    logprob list can show. The toy's vocabulary is 12 tokens, so its top_k is 5 (20 would cut nothing)."""
    toy = InProcessToy("sampled")
    sampling = {"temperature": temperature, "top_p": 0.9}
    top_k = 5 if verification == "prefill-fanout" else None
    if top_k:
        sampling["extra_body"] = {"top_k": top_k}
    async with AsyncSpeculativeOpenAI(target=toy.endpoint("target"), draft=toy.endpoint("draft"), policy="fixed",
                                      num_speculative_tokens=2, verification=verification) as client:
        responses, counts = await _counts(client, TOY_PROMPT, TOY_SAMPLES, max_tokens=TOY_TOKENS, **sampling)
    assert all(r.speculative.exact for r in responses)
    assert sum(r.speculative.accepted_tokens for r in responses) > 0.1 * TOY_SAMPLES  # speculation did work
    assert {r.speculative.verification for r in responses if r.speculative.speculated} == {verification}
    exact = TARGET.sequence_probs(TOY_PROMPT, TOY_TOKENS, temperature=temperature, top_p=0.9, top_k=top_k)
    draft = DRAFT.sequence_probs(TOY_PROMPT, TOY_TOKENS, temperature=temperature, top_p=0.9, top_k=top_k)
    assert chisquare_p(counts, exact) > 1e-3
    # The test has power: the same counts reject the draft's distribution, and the target's at the other temperature.
    draft_counts = {k: v for k, v in counts.items() if k in draft}
    assert len(draft_counts) < len(counts) or chisquare_p(counts, draft) < 1e-6
    other = TARGET.sequence_probs(TOY_PROMPT, TOY_TOKENS, temperature=1.7 - temperature, top_p=0.9, top_k=top_k)
    assert not set(counts) <= set(other) or chisquare_p(counts, other) < 1e-3


async def test_fanout_drafts_the_drafts_most_likely_tokens_when_sampling():
    toy = InProcessToy("sampled")
    async with AsyncSpeculativeOpenAI(target=toy.endpoint("target"), draft=toy.endpoint("draft"), policy="fixed",
                                      num_speculative_tokens=2, verification="prefill-fanout") as client:
        await _counts(client, TOY_PROMPT, 20, max_tokens=3, temperature=0.7)
    drafts = toy.toy.requests_for("draft")
    assert drafts and all(body.get("temperature") == 0.0 for body in drafts)
    targets = toy.toy.requests_for("target")
    assert targets and all(body.get("temperature") == 0.7 for body in targets)


# ----------------------------------------------------------------------------- the simulator's llama.cpp


#: A position where the simulated target is unsure (', func' 0.45, ', other' 0.37 at T=0.7) and the draft leans
#: the other way (', other' 0.75): the test sees several texts, and speculation is both kept and rejected.
SIM_PROMPT = "    def __init__(self"
SIM_TOKENS, SIM_SAMPLES = 2, 600


def llamacpp_chain(ids: np.ndarray, probs: np.ndarray, *, temperature: float, top_k: int, top_p: float, min_p: float) -> dict[int, float]:
    """llama.cpp's sampler chain, written out for the oracle: top-k, top-p (the smallest head whose raw
    mass reaches top_p), min-p (against the most likely), all on the raw probabilities, then temperature."""
    order = sorted(range(len(ids)), key=lambda i: (-probs[i], ids[i]))[:top_k]
    head = [(int(ids[i]), float(probs[i])) for i in order]
    total, kept, mass = sum(p for _, p in head), [], 0.0
    for token, p in head:
        kept.append((token, p))
        mass += p
        if mass / total >= top_p:
            break
    kept = [(t, p) for t, p in kept if p >= min_p * kept[0][1]]
    weights = {t: p ** (1.0 / temperature) for t, p in kept}
    norm = math.fsum(weights.values())
    return {t: w / norm for t, w in weights.items()}


def sim_sequence_probs(model_name: str, prompt: str, n: int, **chain: float) -> dict[str, float]:
    model = get_model(model_name)
    return text_probs(
        lambda ids: llamacpp_chain(*model.next_distribution(ids), **chain),  # type: ignore[arg-type]
        encode_text(prompt), n, end=EOS_TOKEN_ID, decode=decode_text,
    )


@pytest.mark.parametrize("temperature", [0.7, 1.0])
async def test_sim_token_ids_sampling_with_top_k_20_and_top_p_is_the_targets(temperature):
    provider = SimProvider(capabilities="llamacpp", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    sampling = {"temperature": temperature, "top_p": 0.9, "extra_body": {"top_k": 20, "min_p": 0.05}}
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=2, drafter="model") as client:
        responses, counts = await _counts(client, SIM_PROMPT, SIM_SAMPLES, max_tokens=SIM_TOKENS, **sampling)
    assert {r.speculative.verification for r in responses if r.speculative.speculated} == {"token-ids"}
    assert all(r.speculative.exact for r in responses)
    assert sum(r.speculative.accepted_tokens for r in responses) > 0.3 * SIM_SAMPLES
    chain = {"temperature": temperature, "top_k": 20, "top_p": 0.9, "min_p": 0.05}
    assert chisquare_p(counts, sim_sequence_probs("sim-target", SIM_PROMPT, SIM_TOKENS, **chain)) > 1e-3
    draft_probs = sim_sequence_probs("sim-draft", SIM_PROMPT, SIM_TOKENS, **chain)
    assert not set(counts) <= set(draft_probs) or chisquare_p(counts, draft_probs) < 1e-6


# ----------------------------------------------------------------------------- seeds


def _sdk(provider: SimProvider) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", max_retries=0,
                              http_client=httpx2.AsyncClient(transport=SimTransport(provider)))


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("chat", [False, True])
async def test_a_request_to_the_target_alone_sends_the_callers_seed(chat, stream):
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, _ = simulated_endpoints(provider=provider)
    request = {"max_tokens": 24, "temperature": 0.7, "seed": 11}
    if chat:
        request["messages"] = [{"role": "user", "content": "Write about the sea."}]
    else:
        request["prompt"] = "The sea is"
    async with AsyncSpeculativeOpenAI(target=target, verification="none") as client:
        resource = client.chat.completions if chat else client.completions
        start = len(provider.calls)
        if stream:
            chunks = [c async for c in await resource.create(stream=True, **request)]
            text = "".join((c.choices[0].delta.content or "") if chat else c.choices[0].text for c in chunks if c.choices)
        else:
            response = await resource.create(**request)
            text = response.choices[0].message.content if chat else response.choices[0].text
    sent = [c.body for c in provider.calls[start:] if c.method == "POST"]
    assert sent and all(body.get("seed") == 11 for body in sent)
    if not stream:
        assert "unchanged" in (response.speculative.seed_note or "")
    async with _sdk(provider) as sdk:
        own = await (sdk.chat.completions if chat else sdk.completions).create(model="sim-target", **request)
    assert text == (own.choices[0].message.content if chat else own.choices[0].text)


async def test_a_request_without_a_seed_sends_none_to_the_target_alone():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, _ = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, verification="none") as client:
        await client.completions.create(prompt="The sea is", max_tokens=8, temperature=0.7)
    assert all("seed" not in c.body for c in provider.calls if c.method == "POST")


@pytest.mark.parametrize("verification", ["token-ids", "echo", "prefill-fanout", "none"])
async def test_the_same_seed_gives_the_same_text_on_each_path(verification):
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    prompt = 'def glob(pathname, *, root_dir=None):\n    """Return a list of paths matching 中文 😀 e\u0301'
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=4,
                                      verification=verification) as client:
        texts = {}
        for seed in (3, 3, 4):
            for stream in (False, True):
                if stream:
                    chunks = [c async for c in await client.completions.create(
                        prompt=prompt, max_tokens=30, temperature=1.0, seed=seed, stream=True)]
                    text = "".join(c.choices[0].text for c in chunks if c.choices)
                else:
                    last = await client.completions.create(prompt=prompt, max_tokens=30, temperature=1.0, seed=seed)
                    text = last.choices[0].text
                texts.setdefault((seed, stream), set()).add(text)
    assert len(texts[(3, False)]) == 1 and len(texts[(3, True)]) == 1
    if verification != "none":
        assert "fixes specapi's draws" in (last.speculative.seed_note or "")
    assert texts[(3, False)] != texts[(4, False)]  # the seed matters


async def test_on_pick_paths_the_text_of_a_seed_does_not_depend_on_the_drafts():
    """Seeds follow output positions: whatever the draft lengths and drafters (the model, auto, prompt
    lookup alone), a seed gives one text on token ids. (A request the adaptive policy hands to the target
    alone for its rest draws that rest in one call instead: docs/algorithm.md.)"""
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    prompt = "def fnmatch(name, pat):\n    "
    request = {"prompt": prompt, "max_tokens": 40, "temperature": 0.7, "seed": 5}
    texts = set()
    for options in ({"num_speculative_tokens": 2, "drafter": "model"}, {"num_speculative_tokens": 7}, {"drafter": "lookup"}):
        target, draft = simulated_endpoints(provider=provider)  # a client closes its endpoints' connections
        async with AsyncSpeculativeOpenAI(target=target, draft=draft, verification="token-ids", policy="fixed", **options) as client:
            for _ in range(2):
                response = await client.completions.create(**request)
                texts.add(response.choices[0].text)
    assert len(texts) == 1


# ----------------------------------------------------------------------------- whole distributions (pure)


P0 = {1: (0.5, b"a"), 2: (0.3, b"b"), 3: (0.2, b"\xe4")}  # token 3 holds the first byte of a character
Q0 = {1: 0.2, 2: 0.7, 3: 0.1}
P1 = {1: (0.6, b"a"), 4: (0.4, b"")}  # token 4 spells nothing: the end of the text


def test_full_rejection_sampling_on_whole_distributions_gives_p():
    import random

    from specapi.parts.processed import decide_processed

    rng = random.Random(7)
    first: dict[str, int] = {}
    kept = 0
    n = 20_000
    for _ in range(n):
        x = rng.choices(list(Q0), weights=list(Q0.values()))[0]
        decision = decide_processed([(x, P0[x][1], Q0)], [P0, P1], rng)
        assert decision.emitted and decision.keeps_partial and not decision.handover
        token = decision.emitted[0]
        first[str(token.ids)] = first.get(str(token.ids), 0) + 1
        kept += decision.accepted
        if decision.accepted:  # the bonus comes from P1: a token or the end of the text
            assert len(decision.emitted) == 2 and (decision.emitted[1].eos or decision.emitted[1].data == b"a")
    exact = {str((t,)): v for t, (v, _) in P0.items()}
    assert chisquare_p(first, exact) > 1e-3
    assert chisquare_p(first, {str((t,)): v for t, v in Q0.items()}) < 1e-6  # power: not the draft's
    assert abs(kept / n - sum(min(P0[t][0], Q0[t]) for t in Q0)) < 0.02  # kept with the overlap, 0.6


def test_a_position_the_server_did_not_list_goes_to_the_target_before_any_draw():
    import random

    from specapi.parts.processed import decide_processed

    class NoDraws(random.Random):
        def random(self) -> float:
            raise AssertionError("drew at a position that had no distribution")

    decision = decide_processed([(1, b"a", Q0)], [None, P1], NoDraws())
    assert decision.handover and not decision.emitted and decision.stalled
    partial = decide_processed([(1, b"a", {1: 0.5, 2: 0.5})], [{1: (0.4, b"a"), 2: (0.5, b"b")}, P1], NoDraws())
    assert partial.handover  # p sums to 0.9: not the whole distribution


LOOKUP_PROMPT = "Copy this line:\n    result = [name for name in names if match(name)]\nCopy:\n    result = [name for"


async def test_sim_point_mass_drafts_run_the_rejection_sampler_on_whole_lists():
    """Prompt lookup (q a point mass) on the simulator's llama.cpp with top_k 20: one target request a
    round lists p after the chain at every position, specapi keeps x with p(x) and draws the rest."""
    provider = SimProvider(capabilities="llamacpp", latency="instant", seed=0)
    target, _ = simulated_endpoints(provider=provider)
    sampling = {"temperature": 0.7, "top_p": 0.9, "extra_body": {"top_k": 20, "min_p": 0.05}}
    async with AsyncSpeculativeOpenAI(target=target, policy="fixed", num_speculative_tokens=2, drafter="lookup") as client:
        responses, counts = await _counts(client, LOOKUP_PROMPT, SIM_SAMPLES, max_tokens=SIM_TOKENS, seed_base=70_000, **sampling)
    listed = [c for c in provider.calls if isinstance(c.body, dict) and c.body.get("post_sampling_probs")]
    assert listed and all(isinstance(c.body["prompt"], list) for c in listed)
    assert all(r.speculative.exact for r in responses)
    assert sum(r.speculative.accepted_tokens for r in responses) > 0.3 * SIM_SAMPLES
    chain = {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.05}
    assert chisquare_p(counts, sim_sequence_probs("sim-target", LOOKUP_PROMPT, SIM_TOKENS, **chain)) > 1e-3
    assert counts.get(" name in", 0) < 0.99 * SIM_SAMPLES  # power: not the proposal every time (target: 0.964)


def _refusing(provider: SimProvider, refuses) -> list[dict]:  # type: ignore[no-untyped-def]
    """Make `provider` answer HTTP 400 to the bodies `refuses` picks, as a server refuses a field; the
    list of the bodies it refused."""
    from specapi.sim.provider import SimResponse

    handle = provider.handle
    refused: list[dict] = []

    async def refusing_handle(method, path, body=None, headers=None):  # type: ignore[no-untyped-def]
        parsed = body if isinstance(body, dict) else (json.loads(body) if body else None)
        if isinstance(parsed, dict) and refuses(parsed):
            refused.append(parsed)
            error = {"error": {"message": "unknown field", "type": "invalid_request_error", "code": 400}}
            return SimResponse(400, {"content-type": "application/json"}, json=error)
        return await handle(method, path, body, headers)

    provider.handle = refusing_handle  # type: ignore[method-assign]
    return refused


async def test_a_server_that_refuses_processed_lists_is_verified_by_its_picks_for_the_rest_of_the_request():
    provider = SimProvider(capabilities="llamacpp", latency="instant", seed=0)
    refused = _refusing(provider, lambda body: bool(body.get("post_sampling_probs")))
    target, _ = simulated_endpoints(provider=provider)
    sampling = {"temperature": 0.7, "top_p": 0.9, "extra_body": {"top_k": 20}}
    async with AsyncSpeculativeOpenAI(target=target, policy="fixed", num_speculative_tokens=2, drafter="lookup") as client:
        for seed in range(3):
            response = await client.completions.create(prompt=LOOKUP_PROMPT, max_tokens=SIM_TOKENS, seed=seed, **sampling)
            assert response.speculative.exact and response.speculative.accepted_tokens > 0
    # Learnt in each request's first round (a request resolves its own verifier): its later rounds are
    # decided by the target's picks, not asked for the lists again.
    assert len(refused) == 3


async def test_a_callers_refused_parameter_does_not_turn_the_processed_lists_off():
    """A field the target refuses in every request shape is the caller's error: it reaches the caller,
    and later requests still get the full rejection sampler on the server's lists."""
    provider = SimProvider(capabilities="llamacpp", latency="instant", seed=0)
    _refusing(provider, lambda body: "bogus" in body)
    target, _ = simulated_endpoints(provider=provider)
    sampling = {"temperature": 0.7, "top_p": 0.9}
    async with AsyncSpeculativeOpenAI(target=target, policy="fixed", num_speculative_tokens=2, drafter="lookup") as client:
        with pytest.raises(openai.BadRequestError):
            await client.completions.create(prompt=LOOKUP_PROMPT, max_tokens=SIM_TOKENS, seed=1, extra_body={"top_k": 20, "bogus": 1}, **sampling)
        before = len(provider.calls)
        response = await client.completions.create(prompt=LOOKUP_PROMPT, max_tokens=SIM_TOKENS, seed=2, extra_body={"top_k": 20}, **sampling)
    assert response.speculative.exact and response.speculative.accepted_tokens > 0
    listed = [c for c in provider.calls[before:] if isinstance(c.body, dict) and c.body.get("post_sampling_probs")]
    assert listed  # still asked for the lists after the caller's bad request
