"""Drafts learnt from traffic, end to end: the client learns finished requests, the combined drafter
chooses between suffix drafts, prompt lookup and the draft model, Predicted Outputs carry suffix
drafts, and the proxy keeps tenants' indexes apart when asked to."""

from __future__ import annotations

import asyncio
import json

import pytest

from specapi import AsyncSpeculativeOpenAI
from specapi.transport._calls import Meter, RoleClient
from specapi.core.acceptance import SamplingParams
from specapi.surface.runtime import Runtime as _Runtime
from specapi.core.context import Context
from specapi.parts.drafters import CombinedDrafter, Draft, LookupDrafter, ModelDrafter
from specapi.server import ServerConfig, create_app
from specapi.sim import SimProvider, simulated_endpoints
from specapi.core.stats import RoundRecord
from specapi.parts.suffix import SuffixDrafter, SuffixIndex, learn
from simclient import answer, proxy_completion, target_alone

GREEDY = SamplingParams(temperature=0.0)
PREAMBLE = "You are a coding agent. Answer with one tool call as JSON, then the code.\n"
TASK = 'Call: {"tool": "write_file", "path": "lib/fnmatch.py", "content": """\ndef fnmatch(name, pat):\n    """Test whether FILENAME matches PATTERN.'


def step(n: int) -> str:
    return f"{PREAMBLE}Step {n}. Observation: run {1000 + 37 * n} failed.\n{TASK}"


def sim(profile: str = "vllm") -> tuple[SimProvider, object, object]:
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    return provider, target, draft


def drafters_of(response) -> set[str]:  # type: ignore[no-untyped-def]
    return {r.drafter.split(" ")[0].removesuffix("+pipelined") for r in response.speculative.rounds}


async def test_a_client_learns_finished_requests_and_drafts_from_them_exactly():
    provider, target, _ = sim()
    expected = [await target_alone(provider, prompt=step(n), max_tokens=40) for n in (1, 2)]
    async with AsyncSpeculativeOpenAI(target=target, drafter="suffix", policy="fixed", num_speculative_tokens=16) as client:
        first = await client.completions.create(prompt=step(1), max_tokens=40, temperature=0)
        second = await client.completions.create(prompt=step(2), max_tokens=40, temperature=0)
        assert client._runtime.suffix_index.sequences == 2
    assert [answer(first), answer(second)] == expected
    assert first.speculative.accepted_tokens == 0  # nothing learnt yet
    assert drafters_of(second) == {"suffix"}
    assert second.speculative.accepted_tokens >= 30 and second.speculative.exact
    assert second.speculative.draft.requests == 0  # zero network calls to draft


async def test_streamed_requests_are_learnt_too_and_copies_share_the_index():
    provider, target, _ = sim()
    async with AsyncSpeculativeOpenAI(target=target, drafter="suffix", policy="fixed") as client:
        stream = await client.completions.create(prompt=step(1), max_tokens=20, temperature=0, stream=True)
        async for _ in stream:
            pass
        copy = client.with_options(num_speculative_tokens=8)
        assert copy._runtime.suffix_index is client._runtime.suffix_index
        assert client._runtime.suffix_index.sequences == 1
        other = client.with_options(suffix_index=SuffixIndex())
        response = await other.completions.create(prompt=step(2), max_tokens=20, temperature=0)
    assert response.speculative.accepted_tokens == 0  # its own, empty index


async def test_a_stream_learns_once_its_last_chunk_is_out_whether_read_on_or_closed():
    provider, target, _ = sim()
    messages = [{"role": "user", "content": "東京の天気を日本語で教えて 🌧️ 简短一点"}]
    expected = await target_alone(provider, messages=messages, max_tokens=24)
    async with AsyncSpeculativeOpenAI(target=target, drafter="suffix", policy="fixed") as client:
        index = client._runtime.suffix_index
        for ending in ("read on", "closed"):
            learnt_before = index.sequences
            stream = await client.chat.completions.create(messages=messages, max_tokens=24, temperature=0, stream=True)
            text = []
            async for chunk in stream:
                text.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
                if getattr(chunk, "speculative", None) is not None:  # the last chunk
                    assert index.sequences == learnt_before  # it came out before the learning
                    if ending == "closed":
                        await stream.close()
                        break
            assert index.sequences == learnt_before + 1, ending
            assert ("".join(text), stream.speculative.exact) == (expected[0], True)
    assert stream.speculative.accepted_tokens > 0  # the second asking drafted from the first's answer


async def test_a_proxy_streams_end_before_the_metrics_and_the_learning(monkeypatch):
    """Many streams that end together do not hold each other's last bytes: the last chunk, `[DONE]` and
    the end of the body go out in one write, then the proxy counts the response and the client learns
    its text (both before the request's handling returns)."""
    provider, target, _ = sim()
    prompt = "東京の天気は、今日は 🌧️ "
    expected = await target_alone(provider, prompt=prompt, max_tokens=20)
    app = create_app(ServerConfig(target=target, client_options={"drafter": "suffix", "policy": "fixed"}, num_speculative_tokens=16))
    log: list[object] = []
    learn_text, observe = _Runtime.learn, app.state.metrics.observe
    monkeypatch.setattr(_Runtime, "learn", lambda self, *args: (log.append("learn"), learn_text(self, *args))[1])
    monkeypatch.setattr(app.state.metrics, "observe", lambda *args: (log.append("metrics"), observe(*args))[1])

    async def stream_once() -> tuple[str, dict]:
        log.clear()
        body = json.dumps({"model": "sim-target", "prompt": prompt, "max_tokens": 20, "temperature": 0, "stream": True}).encode()
        sent = [{"type": "http.request", "body": body, "more_body": False}]
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
            "path": "/v1/completions", "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
            "headers": [(b"content-type", b"application/json"), (b"host", b"proxy")],
            "client": ("127.0.0.1", 1), "server": ("proxy", 80),
        }

        async def receive() -> dict:
            if sent:
                return sent.pop()
            await asyncio.Event().wait()  # the client stays
            raise AssertionError("unreachable")

        async def send(message: dict) -> None:
            if message["type"] == "http.response.body":
                log.append((message["body"], message.get("more_body", False)))

        await app(scope, receive, send)
        bodies = [entry for entry in log if isinstance(entry, tuple)]
        end = log.index(bodies[-1])
        assert bodies[-1] == (b"data: [DONE]\n\n", False)  # [DONE] ends the body in the same write
        assert "metrics" in log[end:] and "learn" in log[end:] and not {"metrics", "learn"} & set(log[:end])
        events = [json.loads(line[6:]) for b, _ in bodies for line in b.decode().split("\n\n") if line.startswith("data: {")]
        return "".join(e["choices"][0]["text"] for e in events if e["choices"]), events[-1]["speculative"]

    first_text, first = await stream_once()
    again_text, again = await stream_once()
    assert first_text == again_text == expected[0]
    assert first["accepted_tokens"] == 0 and again["accepted_tokens"] > 0  # learnt from the first stream


async def test_one_request_mixes_suffix_drafts_and_the_draft_model():
    provider, target, draft = sim()
    expected = await target_alone(provider, prompt=step(2), max_tokens=70)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=8) as client:
        await client.completions.create(prompt=step(1), max_tokens=30, temperature=0)  # teaches the first 30 tokens only
        response = await client.completions.create(prompt=step(2), max_tokens=70, temperature=0)
    assert answer(response) == expected
    used = drafters_of(response)
    assert "suffix" in used and "draft-model" in used


async def test_an_answer_the_index_knows_comes_in_long_free_rounds_and_the_model_drafts_as_before():
    """The default policy lets drafts without a call run to `free_max_length` (32), the draft model to
    `max_length` (10): a repeated request is verified in fewer, longer rounds than with free drafts held
    to 10, and its output is the target's own either way. Chinese, Japanese and an emoji in the prompt."""
    from specapi.parts.policy import AdaptiveDraftLength
    from specapi.sim import LatencyProfile, ModelTiming

    # Real latencies, so that the policy measures speculation paying (on "instant" nothing does), long
    # enough that a loaded machine's own delays per call (a few ms) do not turn the measurement over.
    latency = LatencyProfile(name="fast-lan", target=ModelTiming(ttft_base_s=0.02, tpot_s=0.02), draft=ModelTiming(ttft_base_s=0.002, tpot_s=0.002))
    provider = SimProvider(capabilities="vllm", latency=latency, seed=0)
    prompt = step(3) + "\n# 注释: 日本語のテスト 🙂\n"
    expected = await target_alone(provider, prompt=prompt, max_tokens=60)
    calls = {}
    for label, policy in (("default", "adaptive"), ("held to 10", AdaptiveDraftLength(start_length=4, max_length=10, free_max_length=10))):
        target, draft = simulated_endpoints(provider=provider)  # a client closes its endpoints' connections
        async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy=policy) as client:
            assert answer(await client.completions.create(prompt=prompt, max_tokens=60, temperature=0)) == expected
            again = await client.completions.create(prompt=prompt, max_tokens=60, temperature=0)
        assert answer(again) == expected and again.speculative.exact, label
        rounds = again.speculative.rounds
        assert rounds and all(r.drafter.startswith("suffix") for r in rounds), label
        assert max(r.drafted for r in rounds) == (32 if label == "default" else 10), label
        calls[label] = again.speculative.target.requests
    assert calls["default"] < calls["held to 10"]


async def test_a_round_sized_for_free_drafts_asks_the_draft_model_for_no_more_than_its_own_length():
    provider, _, draft = sim()
    role = RoleClient("draft", draft)
    try:
        combined = CombinedDrafter([Fixed("lookup", []), ModelDrafter(role)], paid_max_length=10)
        drafted = await combined.draft(Context(prompt="def fibonacci(n):\n", sampling=GREEDY), 32, Meter(draft), None)
        assert drafted.drafter == "draft-model" and len(drafted.tokens) == 10
        assert provider.calls.for_model("sim-draft")[-1].body["max_tokens"] == 10
    finally:
        await role.sdk.close()


# ------------------------------------------------------------------------ the combined drafter's choice


class Fixed:
    """A free drafter with a set proposal (and, optionally, confidence)."""

    def __init__(self, name: str, text: list[str], confidence: tuple[float, ...] = ()) -> None:
        self.name, self.text, self.confidence = name, text, confidence

    async def draft(self, context, k, meter, seed):  # type: ignore[no-untyped-def]
        from specapi.core.alignment import ScoredToken

        tokens = tuple(ScoredToken(text=t, logprob=0.0, top={t: 0.0}) for t in self.text[:k])
        return Draft(tokens=tokens, drafter=self.name, confidence=self.confidence[:k])


def record(drafter: str, drafted: int, accepted: int, draft_s: float, verify_s: float) -> RoundRecord:
    return RoundRecord(drafted=drafted, accepted=accepted, emitted=accepted + 1, draft_latency_s=draft_s, verify_latency_s=verify_s, drafter=drafter)


async def test_the_combined_drafter_takes_the_most_confident_free_proposal():
    combined = CombinedDrafter([Fixed("lookup", ["a", "b"]), Fixed("suffix", list("abcdefgh"), (0.99, 0.98, 0.97, 0.96, 0.95, 0.94, 0.93, 0.92))])
    chosen = await combined.draft(Context(prompt="x"), 8, Meter(None), None)  # type: ignore[arg-type]
    assert chosen.drafter == "suffix"
    # The suffix drafter's claims turn out wrong again and again: its calibration falls, lookup wins.
    for _ in range(12):
        await combined.draft(Context(prompt="x"), 8, Meter(None), None)  # type: ignore[arg-type]
        combined.record("suffix", 8, 0)
    combined.record("lookup", 2, 2)
    assert (await combined.draft(Context(prompt="x"), 8, Meter(None), None)).drafter == "lookup"  # type: ignore[arg-type]


async def test_the_combined_drafter_weighs_the_models_acceptance_against_its_cost():
    provider, _, draft = sim()
    role = RoleClient("draft", draft)
    try:
        combined = CombinedDrafter([Fixed("lookup", ["a", "b", "c", "d"]), ModelDrafter(role)])
        context = Context(prompt="def fibonacci(n):\n", sampling=GREEDY)
        # The model is cheap next to a verify call and usually right; lookup usually wrong: the model.
        for _ in range(8):
            combined.record("lookup", 4, 0)
            combined.record("draft-model", 4, 4)
            combined.observe(record("draft-model", 4, 4, 0.004, 0.050))
        combined._learnt["draft-model"].latency_s = 0.004
        assert (await combined.draft(context, 4, Meter(draft), None)).drafter == "draft-model"
        assert len(provider.calls.for_model("sim-draft")) == 1
        # The same acceptance, but a draft call costs ten verify calls (a hosted draft): lookup, no call.
        combined._learnt["draft-model"].latency_s = 0.5
        assert (await combined.draft(context, 4, Meter(draft), None)).drafter == "lookup"
        assert len(provider.calls.for_model("sim-draft")) == 1
    finally:
        await role.sdk.close()


# ------------------------------------------------------------------------------- Predicted Outputs


async def test_predicted_outputs_carry_a_confident_suffix_draft_and_no_model_call():
    provider, target, draft = sim("openai")

    def chat(n: int) -> list[dict]:
        return [{"role": "system", "content": PREAMBLE}, {"role": "user", "content": step(n)}]

    expected = await target_alone(provider, messages=chat(2), max_tokens=40)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        first = await client.chat.completions.create(messages=chat(1), max_tokens=40, temperature=0)
        sent_first = [c for c in provider.calls.for_model("sim-target") if c.path.endswith("/chat/completions")][-1]
        second = await client.chat.completions.create(messages=chat(2), max_tokens=40, temperature=0)
        sent_second = provider.calls.for_model("sim-target")[-1]
    assert "prediction" not in sent_first.body  # nothing learnt yet: no prediction billed
    assert "prediction" in sent_second.body and second.speculative.verification == "predicted-outputs"
    assert answer(second) == expected
    assert second.speculative.accepted_tokens >= 20
    assert not provider.calls.for_model("sim-draft")  # the draft model is never called on this path
    assert first.speculative.draft.requests == 0


# --------------------------------------------------------------------------------- the proxy


async def proxy_post(app, key: str, prompt: str) -> dict:  # type: ignore[no-untyped-def]
    return (await proxy_completion(app, key, prompt))["speculative"]


@pytest.mark.parametrize("scope", ["model", "api-key"])
async def test_the_proxy_shares_the_index_per_model_or_keys_it_by_api_key(scope):
    provider, target, _ = sim()
    config = ServerConfig(
        target=target, client_options={"drafter": "suffix", "policy": "fixed"}, num_speculative_tokens=16, suffix_scope=scope
    )
    app = create_app(config)
    await proxy_post(app, "tenant-a", step(1))
    again = await proxy_post(app, "tenant-a", step(2))
    other = await proxy_post(app, "tenant-b", step(3))
    assert again["accepted_tokens"] > 0  # a tenant always learns from its own requests
    if scope == "model":
        assert other["accepted_tokens"] > 0  # shared: b's drafts come from a's text
    else:
        assert other["drafted_tokens"] == 0  # isolated: a's text never shapes b's drafts


def test_the_proxy_refuses_an_unknown_suffix_scope():
    from specapi import ConfigurationError

    _, target, _ = sim()
    with pytest.raises(ConfigurationError):
        ServerConfig(target=target, suffix_scope="everyone")


def test_learn_indexes_prompt_and_output_together():
    index = SuffixIndex()
    learn(index, Context(prompt="a prompt, "), "then its output")
    assert index.sequences == 1 and index.tokens >= 6
    assert SuffixDrafter(index).name == "suffix" and LookupDrafter().name == "prompt-lookup"
