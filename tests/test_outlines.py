"""Outlines' OpenAI models built on specapi's clients (`outlines.models.openai.OpenAI(client, model_name)` and
`AsyncOpenAI(...)`): generate and stream, sync and async, give the target's own text, and the calls speculate.

The models are built with their constructors: `outlines.from_openai` only accepts `openai.OpenAI`/`openai.AsyncOpenAI`
instances (an isinstance check), while the models themselves only call `client.chat.completions.create(...)`."""

from __future__ import annotations

from outlines.models.openai import AsyncOpenAI as OutlinesAsyncOpenAI
from outlines.models.openai import OpenAI as OutlinesOpenAI

from simclient import target_alone
from specapi import AsyncSpeculativeOpenAI, SpeculativeOpenAI
from specapi.sim import SimProvider, simulated_endpoints

QUESTION = "Write a function that returns the area of a circle."
MAX_TOKENS = 24


def _posts(calls, model: str) -> list:  # type: ignore[no-untyped-def]
    """The requests to `model` about the question (not the capability probe's, on a prompt of its own)."""
    return [call.body for call in calls if call.method == "POST" and (call.body or {}).get("model") == model and QUESTION in str(call.body)]


def _speculated(calls) -> bool:  # type: ignore[no-untyped-def]
    """The target never generated the answer in one go: every target request asked for fewer tokens than the
    caller did (verification rounds, the answer assembled from proposed and verified tokens)."""
    # vLLM's token-id path: the question goes once to /tokenize (a lookup, no generation), then as ids.
    target = [
        call.body for call in calls
        if call.method == "POST" and (call.body or {}).get("model") == "sim-target" and not call.path.startswith("/tokenize")
        and (QUESTION in str(call.body) or isinstance((call.body or {}).get("prompt"), list))
    ]
    return bool(target) and all((body.get("max_tokens") or body.get("max_completion_tokens") or MAX_TOKENS) < MAX_TOKENS for body in target)


async def test_outlines_generates_and_streams_with_the_targets_text():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    expected, _ = await target_alone(provider, messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS)
    # A fixed draft length: at "instant" latency the adaptive policy rightly finds the target alone faster
    # (a verify call costs what 20 of the target's tokens do), and this test is about speculating through Outlines.
    sync = SpeculativeOpenAI(target=simulated_endpoints(provider=provider)[0], draft=simulated_endpoints(provider=provider)[1], policy="fixed")
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed") as client:
        model = OutlinesOpenAI(sync, "sim-target")
        amodel = OutlinesAsyncOpenAI(client, "sim-target")
        marks = [len(provider.calls)]
        generated = model(QUESTION, max_tokens=MAX_TOKENS, temperature=0)
        marks.append(len(provider.calls))
        streamed = "".join(model.stream(QUESTION, max_tokens=MAX_TOKENS, temperature=0))
        marks.append(len(provider.calls))
        agenerated = await amodel(QUESTION, max_tokens=MAX_TOKENS, temperature=0)
        marks.append(len(provider.calls))
        astreamed = "".join([chunk async for chunk in amodel.stream(QUESTION, max_tokens=MAX_TOKENS, temperature=0)])
        marks.append(len(provider.calls))
        calls = list(provider.calls)
    sync.close()
    segments = [calls[a:b] for a, b in zip(marks, marks[1:])]
    assert isinstance(generated, str) and generated.strip()
    assert generated == streamed == agenerated == astreamed == expected
    # the draft proposed for the first call of each client (later identical calls may draft from the learned suffix
    # index instead), and every call was answered through speculation rounds, not one plain target generation
    assert _posts(segments[0], "sim-draft") and _posts(segments[2], "sim-draft")
    assert all(_speculated(segment) for segment in segments)
