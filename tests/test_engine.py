"""Engine behaviour that only shows end to end: text-API token boundaries and honest exactness flags."""

from __future__ import annotations

import pytest

import specapi
import specapi.parts.probe
from specapi import AsyncSpeculativeOpenAI
from specapi.sim import SimProvider, encode_text, simulated_endpoints

# The prompt's last token ("`.\n") merges with the target's first generated token ("\n") when the two
# are sent back as text: the target then reads its own output split differently than it generated it.
MERGING_PROMPT = 'def dedent(text):\n    """Remove any common leading whitespace from every line in `text`.\n'


pytestmark = pytest.mark.usefixtures("fresh_probe_cache")


async def _both(prompt: str, max_tokens: int):
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=5) as client:
        spec = await client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=0)
    target, _ = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, verification="none") as alone:
        plain = await alone.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=0)
    return spec, plain


async def test_a_retokenized_boundary_is_reported_not_hidden():
    first = encode_text(MERGING_PROMPT)
    spec, plain = await _both(MERGING_PROMPT, 40)
    merged = encode_text(MERGING_PROMPT + plain.choices[0].text)
    assert merged[: len(first) - 1] == first[:-1] and merged[len(first) - 1] != first[-1]  # the merge exists
    s = spec.speculative
    if spec.choices[0].text != plain.choices[0].text:
        # Text differs from a single target call: the response must not claim exactness.
        assert not s.exact and "re-tokenized" in (s.exact_reason or "")
    assert s.rounds, "the request speculated"


@pytest.mark.parametrize(
    "prompt",
    ["class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n", "def __repr__(self):\n        return"],
)
async def test_prompts_without_merges_stay_exact_and_say_so(prompt):
    spec, plain = await _both(prompt, 40)
    assert spec.choices[0].text == plain.choices[0].text
    assert spec.speculative.exact and spec.speculative.exact_reason is None


HONESTY_PROMPTS = [
    "def fibonacci(n):\n",
    "import json\n\n\ndef load(path):\n    with open(path) as f:\n",
    "The history of the",
    "Once upon a time, there was a",
    "class Queue:\n    def __init__(self):",
    "    for i in range(10):\n        if i % 2 == 0:\n",
    "SELECT name, count(*) FROM users",
    "Dear colleagues,\n\nThank you for",
    MERGING_PROMPT,
]


@pytest.mark.parametrize("profile", ["vllm", "llamacpp"])
async def test_greedy_text_is_the_targets_or_the_response_says_otherwise(profile):
    """The guarantee behind every path: never silently different text."""
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    alone_target, _ = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed") as client, AsyncSpeculativeOpenAI(
        target=alone_target, verification="none"
    ) as alone:
        differing = 0
        for prompt in HONESTY_PROMPTS:
            spec = await client.completions.create(prompt=prompt, max_tokens=30, temperature=0)
            plain = await alone.completions.create(prompt=prompt, max_tokens=30, temperature=0)
            assert spec.speculative.rounds, prompt
            if spec.choices[0].text != plain.choices[0].text:
                differing += 1
                assert not spec.speculative.exact and spec.speculative.exact_reason, prompt
    assert differing < len(HONESTY_PROMPTS) // 2  # the flag is the exception, not the rule


async def test_model_argument_overrides_the_target_model():
    """`model=` names another model on the target's server: speculation verifies against it."""
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    prompt = "def area(radius):\n"
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed") as client:
        start = len(provider.calls)
        resp = await client.completions.create(prompt=prompt, model="sim-target-clone", max_tokens=20, temperature=0)
        sent = [c.body.get("model") for c in provider.calls[start:] if c.method == "POST"]
    alone_target, _ = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=alone_target, verification="none") as alone:
        plain = await alone.completions.create(prompt=prompt, model="sim-target-clone", max_tokens=20, temperature=0)
    assert resp.model == "sim-target-clone" and resp.speculative.speculated
    assert resp.choices[0].text == plain.choices[0].text
    assert "sim-target-clone" in sent and "sim-target" not in sent  # the configured target was never asked
    assert resp.speculative.target.requests == sent.count("sim-target-clone")


async def test_with_options_changes_options_and_shares_connections():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=2) as client:
        longer = client.with_options(num_speculative_tokens=6)
        baseline = client.with_options(verification="none")
        short = await client.completions.create(prompt="def area(radius):\n", max_tokens=30, temperature=0)
        long = await longer.completions.create(prompt="def area(radius):\n", max_tokens=30, temperature=0)
        plain = await baseline.completions.create(prompt="def area(radius):\n", max_tokens=30, temperature=0)
        await longer.close()  # a copy does not close the connections it shares
        again = await client.completions.create(prompt="def area(radius):\n", max_tokens=30, temperature=0)
    assert max(r.drafted for r in short.speculative.rounds) <= 2
    assert max(r.drafted for r in long.speculative.rounds) > 2
    assert not plain.speculative.speculated
    assert short.choices[0].text == long.choices[0].text == plain.choices[0].text == again.choices[0].text
    assert longer.target is target and longer._runtime.target.sdk is client._runtime.target.sdk
    with pytest.raises(specapi.ConfigurationError):
        client.with_options(temperature=0)


async def test_a_server_capping_logprobs_lower_still_speculates_when_sampling():
    """An echo-capable server whose logprob lists stop at 5 (like OpenAI's base models): the probe finds
    the cap, and sampled requests ask for no more, instead of being refused and giving up speculating."""
    from toyserver import ToyServer

    with ToyServer(max_logprobs=5) as srv:
        target = specapi.Endpoint(base_url=srv.base_url, model="target", api_key="x", name="toy target (cap 5)")
        draft = specapi.Endpoint(base_url=srv.base_url, model="draft", api_key="x", name="toy draft (cap 5)")
        async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed") as client:
            resps = [await client.completions.create(prompt="cafe", max_tokens=6, temperature=1.0, seed=s) for s in range(3)]
        verify_calls = [b for b in srv.requests_for("target", "/completions") if b.get("echo") and b.get("max_tokens") == 1]
    assert all(r.speculative.speculated and r.speculative.verification == "echo" for r in resps)
    assert max(b["logprobs"] for b in verify_calls[-3:]) == 5
    assert all(r.speculative.fallback_reason is None for r in resps)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_an_answer_written_again_alone_is_the_targets_with_its_logprobs_and_prompt_count(stream):
    """When the target re-reads its own output with other token boundaries and writes the answer again
    alone, the response is that answer in full: its text, the prompt as the target counts it and the
    caller's logprobs of every token (also of those after what a stream already handed out)."""
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    request = dict(prompt=MERGING_PROMPT, max_tokens=40, temperature=0, logprobs=1)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=5, verification="echo") as client:
        if stream:
            chunks = [c async for c in await client.completions.create(**request, stream=True, stream_options={"include_usage": True})]
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
            usage, stats = chunks[-1].usage, chunks[-1].speculative
        else:
            spec = await client.completions.create(**request)
            text, tokens, usage, stats = spec.choices[0].text, spec.choices[0].logprobs.tokens, spec.usage, spec.speculative
    target, _ = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, verification="none") as alone:
        plain = await alone.completions.create(**request)
    assert "re-read its own output" in (stats.fallback_reason or ""), "the answer was written again: the case under test"
    assert text == plain.choices[0].text
    assert tokens == plain.choices[0].logprobs.tokens and "".join(tokens) == text
    assert (usage.prompt_tokens, usage.completion_tokens) == (plain.usage.prompt_tokens, plain.usage.completion_tokens)
