"""Drafters: prompt lookup (the function and the drafter, with no draft model), per-call predictions
(OpenAI's `prediction=`), and the combined drafter's choice between a free lookup and the draft model."""

from __future__ import annotations

import pytest

from simclient import target_alone, answer
from specapi import AsyncSpeculativeOpenAI, ConfigurationError, Endpoint
from specapi.transport._calls import Meter, RoleClient
from specapi.core.acceptance import SamplingParams
from specapi.core.context import Context
from specapi.parts.drafters import CombinedDrafter, LookupDrafter, ModelDrafter, lookup_continuation
from specapi.sim import SimProvider, simulated_endpoints


pytestmark = pytest.mark.usefixtures("fresh_probe_cache")


def sim(profile: str = "vllm") -> tuple[SimProvider, Endpoint, Endpoint]:
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    return provider, target, draft






# ----------------------------------------------------------------------------- lookup_continuation


@pytest.mark.parametrize("history, sources, options, expected", [
    # what followed the history's tail in the prompt
    ("copy: the quick brown fox", ["the quick brown fox jumps over"], {}, " jumps over"),
    # the longest matching tail wins over a shorter one found earlier
    ("AAA long tail match here", ["tail match here: short", "long tail match here: long"], dict(min_match=5), ": long"),
    # within one source, the most recent occurrence
    ("zzzz hello world", ["hello world! one. hello world? two"], dict(min_match=5), "? two"),
    # sources in order before the history itself
    ("q hello world", ["hello world A", "hello world B"], dict(min_match=5), " A"),
    # the history's own earlier text (not its tail itself)
    ("hello world X hello world", [], dict(min_match=5), " X hello world"),
    # a match exactly min_match long counts, a shorter one does not
    ("..abcde", ["abcdeXYZ"], dict(min_match=5), "XYZ"),
    ("..bcde", ["abcdeXYZ"], dict(min_match=5), ""),
    # a tail found only at the very end of a source has nothing after it
    ("prefix ends with hello world", ["prefix ends with hello world"], dict(min_match=5), ""),
    # nothing in common
    ("completely different", ["the quick brown fox"], {}, ""),
    # bounded by max_chars
    ("some hello world", ["hello world" + "y" * 300], dict(min_match=5, max_chars=10), "y" * 10),
    ("some hello world", ["hello world" + "y" * 300], dict(min_match=5), "y" * 256),
])
def test_lookup_continuation(history, sources, options, expected):
    assert lookup_continuation(history, sources, **options) == expected


# ----------------------------------------------------------------------------- prompt lookup end to end

CODE = '''def moving_average(values, window):
    """Return the moving averages of values over a window."""
    if window <= 0:
        raise ValueError("window must be positive")
    total = 0.0
    result = []
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index + 1 >= window:
            result.append(total / window)
    return result
'''
PARAGRAPH = ("The quick brown fox jumps over the lazy dog. It was a bright cold day in April, and the clocks were "
             "striking thirteen. The committee will meet again on Tuesday to review the budget and the schedule.")
# editing-like prompts: the answer repeats text of the prompt (the simulated models copy, as real ones do)
EDITS = {
    "code": f"Rename the function to rolling_mean.\n\n{CODE}\nRenamed:\ndef rolling_mean(values, window):\n",
    "prose": f"Fix the spelling in this paragraph.\n\nParagraph:\n{PARAGRAPH}\n\nCorrected paragraph:\nThe quick brown fox",
}


@pytest.mark.parametrize("edit", list(EDITS))
async def test_lookup_drafter_without_a_draft_model_speeds_up_edits(edit):
    provider, target, _ = sim("vllm")
    prompt = EDITS[edit]
    expected = await target_alone(provider, prompt=prompt, max_tokens=50)
    async with AsyncSpeculativeOpenAI(target=target, drafter="lookup", policy="fixed", num_speculative_tokens=8) as client:
        await client.completions.create(prompt="warm up", max_tokens=2, temperature=0)  # probing, outside the count
        resp = await client.completions.create(prompt=prompt, max_tokens=50, temperature=0)
    s = resp.speculative
    assert answer(resp) == expected
    assert s.speculated and {r.drafter for r in s.rounds} == {"prompt-lookup"}
    assert s.draft.requests == 0 and not provider.calls.for_model("sim-draft")
    assert s.acceptance_rate >= 0.8, s.acceptance_rate
    assert s.tokens_per_target_call >= 2.5, (s.generated_tokens, s.target.requests)


LOOKUP_PROMPTS = ["def fibonacci(n):\n", "for i in range(10):\n", "import os\nimport sys\n\n", EDITS["code"]]
LOOKUP_CHATS = ["hello", "Explain what a decorator is.", "List three colours.", EDITS["code"]]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_lookup_drafter_output_is_the_targets(chat):
    """Lookup proposals often split text differently from the target's tokenizer (e.g. a run of spaces):
    whatever the split, the output is the target's own."""
    provider, target, _ = sim("vllm")
    mismatches = []
    async with AsyncSpeculativeOpenAI(target=target, drafter="lookup", policy="fixed", num_speculative_tokens=8) as client:
        for prompt in LOOKUP_CHATS if chat else LOOKUP_PROMPTS:
            if chat:
                messages = [{"role": "user", "content": prompt}]
                expected = await target_alone(provider, messages=messages, max_tokens=40)
                resp = await client.chat.completions.create(messages=messages, max_tokens=40, temperature=0)
            else:
                expected = await target_alone(provider, prompt=prompt, max_tokens=40)
                resp = await client.completions.create(prompt=prompt, max_tokens=40, temperature=0)
            if answer(resp) != expected:
                mismatches.append((prompt[:30], expected, answer(resp), resp.speculative.generated_tokens,
                                   resp.speculative.exact))
    assert not mismatches, "lookup-drafted output != the target's (prompt, expected, got, generated_tokens, exact):\n" + \
        "\n".join(map(repr, mismatches))


async def test_a_lookup_drafter_with_nothing_to_propose_costs_a_few_target_calls_not_one_a_token():
    """A text the prompt holds nothing of: each empty lookup is followed by a longer step of the target
    alone (1, 2, 4, ... tokens), so 40 tokens take a handful of target requests, and the text is the
    target's own."""
    provider, target, _ = sim("vllm")
    prompt = "Q"
    expected = await target_alone(provider, prompt=prompt, max_tokens=40)
    async with AsyncSpeculativeOpenAI(target=target, drafter="lookup", policy="fixed", num_speculative_tokens=8) as client:
        await client.completions.create(prompt="warm up", max_tokens=2, temperature=0)  # probing, outside the count
        resp = await client.completions.create(prompt=prompt, max_tokens=40, temperature=0)
    s = resp.speculative
    assert answer(resp) == expected and s.generated_tokens == 40 and s.exact
    # Nothing proposed: steps of 1, 1, 2, 4, 8, 16 and the last 8 (one call), plus the prompt's tokenize
    # call; a round whenever the text repeats itself adds one request each.
    assert s.target.requests <= 8 + len(s.rounds), (s.target.requests, len(s.rounds), s.fallback_reason)


# ----------------------------------------------------------------------------- per-call predictions


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_a_matching_prediction_saves_target_calls_and_keeps_the_output(chat):
    provider, target, _ = sim("vllm")
    prompt, messages = "Explain what a decorator is.", [{"role": "user", "content": "Explain what a decorator is."}]
    expected = await target_alone(provider, max_tokens=60, **({"messages": messages} if chat else {"prompt": prompt}))
    prediction = {"type": "content", "content": expected[0]}
    async with AsyncSpeculativeOpenAI(target=target, policy="fixed", num_speculative_tokens=8) as client:
        await client.completions.create(prompt="warm up", max_tokens=2, temperature=0)  # probing, outside the count
        if chat:
            resp = await client.chat.completions.create(messages=messages, max_tokens=60, temperature=0, prediction=prediction)
        else:
            resp = await client.completions.create(prompt=prompt, max_tokens=60, temperature=0, prediction=prediction)
    s = resp.speculative
    assert answer(resp) == expected
    assert "prediction" in {r.drafter for r in s.rounds}
    assert s.target.requests * 3 <= s.generated_tokens, (s.target.requests, s.generated_tokens)
    assert s.accepted_tokens >= 0.8 * s.generated_tokens


async def test_a_wrong_prediction_costs_no_exactness():
    provider, target, _ = sim("vllm")
    prompt = "def fibonacci(n):\n"
    expected = await target_alone(provider, prompt=prompt, max_tokens=40)
    async with AsyncSpeculativeOpenAI(target=target, policy="fixed") as client:
        resp = await client.completions.create(prompt=prompt, max_tokens=40, temperature=0,
                                               prediction={"type": "content", "content": "SELECT * FROM users;\n" * 5})
    assert answer(resp) == expected


@pytest.mark.parametrize("prediction", [
    {"type": "bogus", "content": "x"},
    {"content": "x"},
    {"type": "content", "content": 5},
    {"type": "content"},
    42,
    ["x"],
])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_a_bad_prediction_is_refused_before_any_request(prediction, chat):
    provider, target, draft = sim("vllm")
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        with pytest.raises(ConfigurationError):
            if chat:
                await client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                                     prediction=prediction)
            else:
                await client.completions.create(prompt="hi", max_tokens=5, prediction=prediction)
    assert len(provider.calls) == 0


# ----------------------------------------------------------------------------- combined drafter

REPEATING = "alpha beta gamma delta epsilon zeta eta theta\nAgain: alpha beta gamma delta"
NOVEL = "def fibonacci(n):\n"
GREEDY = SamplingParams(temperature=0.0)


def combined(draft: Endpoint) -> tuple[CombinedDrafter, RoleClient]:
    role = RoleClient("draft", draft)
    return CombinedDrafter([LookupDrafter(), ModelDrafter(role)]), role


async def test_combined_drafter_uses_lookup_when_it_matches_and_the_model_otherwise():
    provider, _, draft = sim("vllm")
    drafter, role = combined(draft)
    meter = Meter(draft)
    try:
        proposal = await drafter.draft(Context(prompt=REPEATING, sampling=GREEDY), 4, meter, None)
        assert proposal.drafter == "prompt-lookup"
        assert proposal.text.startswith(" epsilon")
        assert len(proposal.tokens) <= 4
        assert meter.requests == 0 and not provider.calls  # a lookup costs no call

        proposal = await drafter.draft(Context(prompt=NOVEL, sampling=GREEDY), 4, meter, None)
        assert proposal.drafter == "draft-model"
        assert 0 < len(proposal.tokens) <= 4
        assert meter.requests == 1 and len(provider.calls.for_model("sim-draft")) == 1
    finally:
        await role.sdk.close()


async def test_combined_drafter_stops_trusting_a_lookup_whose_proposals_fail():
    provider, _, draft = sim("vllm")
    drafter, role = combined(draft)
    for _ in range(6):
        drafter.record("prompt-lookup", 8, 0)
        drafter.record("draft-model", 8, 7)
    try:
        proposal = await drafter.draft(Context(prompt=REPEATING, sampling=GREEDY), 4, Meter(draft), None)
    finally:
        await role.sdk.close()
    assert proposal.drafter == "draft-model"
    assert len(provider.calls.for_model("sim-draft")) == 1


async def test_default_drafter_mixes_lookup_and_model_rounds_and_stays_exact():
    provider, target, draft = sim("vllm")
    prompt = EDITS["code"]
    expected = await target_alone(provider, prompt=prompt, max_tokens=50)
    novel = await target_alone(provider, prompt=NOVEL, max_tokens=30)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed") as client:
        edit = await client.completions.create(prompt=prompt, max_tokens=50, temperature=0)
        fresh = await client.completions.create(prompt=NOVEL, max_tokens=30, temperature=0)
    assert answer(edit) == expected and answer(fresh) == novel
    assert "prompt-lookup" in {r.drafter for r in edit.speculative.rounds}
    assert {r.drafter.removesuffix("+pipelined") for r in fresh.speculative.rounds} >= {"draft-model"}


async def test_a_draft_answer_that_ends_inside_a_character_without_logprobs_proposes_nothing():
    """llama-server answers `"logprobs": null` while its text ends inside a UTF-8 character."""
    import httpx2

    from specapi import Endpoint
    from specapi.transport._calls import Meter, RoleClient
    from specapi.core.context import Context
    from specapi.parts.drafters import ModelDrafter

    def handler(request: httpx2.Request) -> httpx2.Response:
        body = {"choices": [{"text": "\ufffd", "index": 0, "logprobs": None, "finish_reason": "length"}],
                "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}}
        return httpx2.Response(200, json=body)

    endpoint = Endpoint(model="draft", base_url="http://draft.test/v1", api_key="x",
                        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)))
    client = RoleClient("draft", endpoint)
    meter = Meter(endpoint)
    draft = await ModelDrafter(client).draft(Context(prompt="今天天气很好，"), 2, meter, None)
    assert draft.tokens == () and meter.prompt_tokens == 9  # billed, counted, and no error
