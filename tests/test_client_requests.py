"""The caller's request, all of it: every field the caller sends reaches the target on every target
request, transport options reach every upstream request, and no limit is invented. Checked on the
simulator's record of the requests it received, against the target's own answer for the same request.
"""

from __future__ import annotations

import openai
import pytest

import httpx2
from simclient import answer, target_alone
from specapi import AsyncSpeculativeOpenAI
from specapi.sim import SimProvider, SimTransport, simulated_endpoints

CODE = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def _client(provider: SimProvider, **options) -> AsyncSpeculativeOpenAI:  # type: ignore[no-untyped-def]
    target, draft = simulated_endpoints(provider=provider)
    return AsyncSpeculativeOpenAI(target=target, draft=draft, **{"policy": "fixed", **options})


@pytest.mark.parametrize("profile", ["vllm", "llamacpp"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_extra_body_reaches_every_target_request(profile: str, chat: bool) -> None:
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    extra = {"repeat_penalty": 1.0, "top_k": 40}
    async with _client(provider) as client:
        if chat:
            messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
            resp = await client.chat.completions.create(messages=messages, max_tokens=30, temperature=0, extra_body=extra)
        else:
            resp = await client.completions.create(prompt=CODE, max_tokens=30, temperature=0, extra_body=extra)
        # A last token is always a target-alone step (nothing left to draft for).
        one = dict(messages=messages) if chat else dict(prompt=CODE)
        await (client.chat.completions if chat else client.completions).create(**one, max_tokens=1, temperature=0, extra_body=extra)
    asked = "Write a function" if chat else "def fibonacci(n):"
    # Not the probe's; token-id paths send the prompt as ids, on the server's native generation path.
    native = ("/completion", "/generate")
    # Tokenizing (a lookup, no generation) takes no sampling settings.
    lookups = ("/tokenize", "/detokenize")
    target_calls = [
        c for c in provider.calls
        if c.model == "sim-target" and c.path.split("?")[0] not in lookups
        and (asked in str(c.body) or c.path.split("?")[0] in native or _token_id_prompt(c.body))
    ]
    assert resp.speculative.speculated and len(target_calls) > 1
    for call in target_calls:
        assert {k: call.body.get(k) for k in extra} == extra, f"{call.path} dropped the caller's extra_body: {call.body}"
    plain = [c for c in target_calls if not c.body.get("echo") and "prompt_logprobs" not in c.body]
    assert plain, "no target-alone step was checked"


def _token_id_prompt(body: object) -> bool:
    """A completions body whose prompt is token ids (vLLM's token-id path), one prompt or several."""
    prompt = body.get("prompt") if isinstance(body, dict) else None
    prompts = prompt if isinstance(prompt, list) and prompt and isinstance(prompt[0], list) else [prompt]
    return all(isinstance(p, list) and p and all(isinstance(i, int) for i in p) for p in prompts)


async def test_transport_options_reach_every_upstream_request_and_speculation_stays_on() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    async with _client(provider, drafter="model") as client:
        resp = await client.completions.create(
            prompt=CODE, max_tokens=20, temperature=0, extra_headers={"x-trace": "abc"}, extra_query={"tenant": "t1"}, timeout=30.0
        )
    assert resp.speculative.speculated and resp.speculative.draft.requests > 0
    # The capability probe (once per endpoint, shared by the requests after it, on a prompt of its own)
    # goes with the endpoint's settings, not with one request's: every call that carries the request's
    # prompt carries its options.
    calls = [call for call in provider.calls if "def fibonacci" in str(call.body) or _token_id_prompt(call.body)]
    assert len(calls) > 2 and any(call.path.startswith("/tokenize") for call in calls)
    for call in calls:
        assert call.headers.get("x-trace") == "abc", f"{call.model} {call.path} lacks the caller's header"
        assert "tenant=t1" in call.path, f"{call.model} {call.path} lacks the caller's query"
    expected, _ = await target_alone(provider, prompt=CODE, max_tokens=20)
    assert resp.choices[0].text == expected


async def test_chat_without_max_tokens_sends_none_and_a_long_prompt_works() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    messages = [{"role": "user", "content": "word " * 7700}]  # near the simulated 8,192-token window
    async with _client(provider, verification="none") as client:
        resp = await client.chat.completions.create(messages=messages, temperature=0)
    [call] = [c for c in provider.calls if c.model == "sim-target"]
    assert "max_tokens" not in call.body and "max_completion_tokens" not in call.body
    http = httpx2.AsyncClient(transport=SimTransport(provider))
    async with openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", http_client=http, max_retries=0) as sdk:
        own = await sdk.chat.completions.create(model="sim-target", messages=messages, temperature=0)
    assert answer(resp) == (own.choices[0].message.content, own.choices[0].finish_reason)


async def test_chat_without_max_tokens_speculates_up_to_the_servers_own_end() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    messages = [{"role": "user", "content": "Say hello."}]  # the simulated target ends this one by itself
    async with _client(provider) as client:
        resp = await client.chat.completions.create(messages=messages, temperature=0)
    http = httpx2.AsyncClient(transport=SimTransport(provider))
    async with openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", http_client=http, max_retries=0) as sdk:
        own = await sdk.chat.completions.create(model="sim-target", messages=messages, temperature=0)
    assert resp.speculative.speculated
    assert answer(resp) == (own.choices[0].message.content, own.choices[0].finish_reason)


async def test_logprobs_zero_is_served_not_dropped() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    async with _client(provider) as client:
        resp = await client.completions.create(prompt=CODE, max_tokens=5, temperature=0, logprobs=0)
    http = httpx2.AsyncClient(transport=SimTransport(provider))
    async with openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", http_client=http, max_retries=0) as sdk:
        own = await sdk.completions.create(model="sim-target", prompt=CODE, max_tokens=5, temperature=0, logprobs=0)
    assert resp.choices[0].logprobs is not None and len(resp.choices[0].logprobs.tokens) == 5
    assert resp.choices[0].logprobs.model_dump() == own.choices[0].logprobs.model_dump()  # speculated or not (test_logprobs.py)


@pytest.mark.parametrize("profile", ["vllm", "llamacpp"])
@pytest.mark.parametrize("prompt,max_tokens", [("    y\t", 2), ("    y\t", 6), ("x = 1\n\n", 4)])
async def test_a_last_step_on_re_tokenized_text_is_checked(profile: str, prompt: str, max_tokens: int) -> None:
    """The target's first token merges with the prompt's end when sent back as text: the last step
    must not continue from that other split; greedy text is the target's own."""
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    async with _client(provider) as client:
        resp = await client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=0)
    assert (resp.choices[0].text, resp.choices[0].finish_reason) == await target_alone(provider, prompt=prompt, max_tokens=max_tokens)
    assert resp.speculative.exact


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_several_greedy_choices_are_answered_as_the_target_alone_answers_them(chat: bool) -> None:
    """vLLM refuses `n` above 1 with greedy sampling (400, "n must be 1 when using greedy sampling"):
    specapi raises the same error, from the target, instead of answering. A server that takes it (the
    simulated llama-server) still gets each choice speculated."""
    base = {"messages": [{"role": "user", "content": "Say hi."}]} if chat else {"prompt": CODE}
    request = {**base, "max_tokens": 8, "temperature": 0, "n": 2}
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    alone = openai.AsyncOpenAI(base_url="http://sim/v1", api_key="k", http_client=httpx2.AsyncClient(transport=SimTransport(provider)))
    resource = alone.chat.completions if chat else alone.completions
    with pytest.raises(openai.BadRequestError) as own:
        await resource.create(model="sim-target", **request)
    async with _client(provider) as client:
        with pytest.raises(openai.BadRequestError) as got:
            await (client.chat.completions if chat else client.completions).create(**request)
    assert got.value.status_code == own.value.status_code == 400
    assert "n must be 1 when using greedy sampling" in str(got.value) and "target" in str(got.value)
    await alone.close()
    llama = SimProvider(capabilities="llamacpp", latency="instant", seed=0)
    async with _client(llama) as client:
        resp = await (client.chat.completions if chat else client.completions).create(**request)
    assert len(resp.choices) == 2 and resp.speculative.speculated


async def test_token_id_verification_learns_the_targets_facts_once_per_client() -> None:
    """Whether the draft shares the target's tokenizer, and the target's prefix cache, are asked once:
    a later request's only target tokenize call is its own prompt's, and no /metrics call is made."""
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    async with _client(provider) as client:
        await client.completions.create(prompt=CODE, max_tokens=12, temperature=0)
        start = len(provider.calls)
        resp = await client.completions.create(prompt="import os\n", max_tokens=12, temperature=0)
    later = provider.calls[start:]
    assert resp.speculative.verification == "token-ids" and resp.speculative.num_rounds > 0
    target_tokenize = [c.body.get("prompt") for c in later if c.model == "sim-target" and c.path.startswith("/tokenize")]
    assert target_tokenize == ["import os\n"]
    assert not any(c.path.startswith("/metrics") for c in later)
