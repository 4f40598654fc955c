"""A refused request is the caller's error; only a refused verification shape changes the path.

One caller's bad parameter (HTTP 400 from the target) must not turn speculation off for later
requests: the same request in its plain form is refused too, so the error is the caller's, passed
through as the SDK alone would raise it. A target that refuses the verification request itself (echo
with logprobs) while it serves the plain request is learnt, per target model, after a second
confirmation. On the Python client (toy models behind a MockTransport) and through `specapi serve`.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest

from specapi import AsyncSpeculativeOpenAI, Endpoint, TargetError
from test_server_support import PROXY_KEY, metric, no_sleep, proxy_pair, running_proxy
from toyserver import TARGET, ToyServer

PROMPT = "cafe"
MAX_TOKENS = 16
BAD = {"top_k": "many"}  # forwarded to the target (a truncation, neutral when greedy); the toy wants an integer


class Toy:
    """The toy models in-process: `target` and `other` are the same model under two names; `refuse`
    names the target models that answer echo with logprobs with OpenAI's 400."""

    def __init__(self, *, refuse: tuple[str, ...] = ()) -> None:
        self.toy = ToyServer()
        self.refuse = refuse
        self.sent: list[tuple[str, dict]] = []

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        model = body.get("model")
        self.sent.append((model, body))
        if model in self.refuse and body.get("echo") and body.get("logprobs") is not None:
            error = {
                "message": "Setting 'echo' and 'logprobs' at the same time is not supported for this model.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_parameter_combination",
            }
            return httpx2.Response(400, json={"error": error})
        reply = self.toy.handle("POST", request.url.path, {**body, "model": "target" if model == "other" else model}, {})
        return httpx2.Response(reply.status, json=reply.payload, headers=reply.headers)

    def http(self) -> httpx2.AsyncClient:
        return httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler))

    def endpoint(self, model: str) -> Endpoint:
        return Endpoint(model=model, base_url="http://toy.test/v1", api_key="sk-toy-key", max_retries=0, http_client=self.http())

    def echoes(self, model: str) -> int:
        return sum(1 for m, body in self.sent if m == model and body.get("echo"))


def client_for(toy: Toy) -> AsyncSpeculativeOpenAI:
    return AsyncSpeculativeOpenAI(
        target=toy.endpoint("target"), draft=toy.endpoint("draft"), verification="echo", policy="fixed", drafter="model", pipeline=False
    )


async def complete(client: AsyncSpeculativeOpenAI, prompt: str = PROMPT, **extra: Any) -> Any:
    return await client.completions.create(prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, **extra)


async def test_a_bad_request_is_the_callers_error_and_later_requests_still_speculate():
    toy = Toy()
    async with client_for(toy) as client, openai.AsyncOpenAI(base_url="http://toy.test/v1", api_key="sk-toy-key", max_retries=0, http_client=toy.http()) as sdk:
        first = await complete(client)
        assert first.speculative.speculated and first.speculative.accepted_tokens > 0
        with pytest.raises(openai.BadRequestError) as alone:
            await sdk.completions.create(model="target", prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, extra_body=BAD)
        for _ in range(3):  # more than the refusals that would write a path off
            with pytest.raises(openai.BadRequestError) as info:
                await complete(client, extra_body=BAD)
            err, oracle = info.value, alone.value
            assert isinstance(err, TargetError) and isinstance(err, type(oracle))
            assert (err.status_code, err.message, err.param, err.code, err.type, err.body) == (
                oracle.status_code, oracle.message, oracle.param, oracle.code, oracle.type, oracle.body,
            )
            assert err.param == "top_k"
        for prompt in ("ab", "fa c", PROMPT):
            later = await complete(client, prompt)
            assert (later.choices[0].text, later.choices[0].finish_reason) == TARGET.greedy(prompt, MAX_TOKENS)
            s = later.speculative
            assert s.speculated and s.accepted_tokens > 0 and s.fallback_reason is None, s.fallback_reason
            assert s.verification == "echo"


async def test_a_bad_chat_request_leaves_chat_speculating():
    toy = Toy()
    messages = [{"role": "user", "content": "ab"}]
    async with AsyncSpeculativeOpenAI(
        target=toy.endpoint("target"), draft=toy.endpoint("draft"), verification="prompt-logprobs", policy="fixed", drafter="model", pipeline=False
    ) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(messages=messages, max_tokens=MAX_TOKENS, temperature=0, extra_body=BAD)
        assert info.value.param == "top_k"
        for _ in range(2):
            later = await client.chat.completions.create(messages=messages, max_tokens=MAX_TOKENS, temperature=0)
            assert later.speculative.speculated and later.speculative.accepted_tokens > 0


async def test_a_target_that_refuses_the_verification_shape_is_learnt_per_model():
    toy = Toy(refuse=("target",))
    async with client_for(toy) as client:
        first = await complete(client)
        assert (first.choices[0].text, first.choices[0].finish_reason) == TARGET.greedy(PROMPT, MAX_TOKENS)
        assert not first.speculative.speculated and "refused the verification" in first.speculative.fallback_reason
        assert first.speculative.verification_refused is None  # one refusal may be one request's fault
        second = await complete(client, "ab")
        assert second.speculative.verification_refused == "echo"  # confirmed: written off for this model
        assert toy.echoes("target") == 2
        for prompt in ("fa c", PROMPT):
            later = await complete(client, prompt)
            assert (later.choices[0].text, later.choices[0].finish_reason) == TARGET.greedy(prompt, MAX_TOKENS)
            assert not later.speculative.speculated and "refused the verification" in later.speculative.fallback_reason
        assert toy.echoes("target") == 2, "a written-off path is not asked again"
        # Another model on the same server keeps its own path, and speculates.
        other = await complete(client, "ab", model="other")
        assert other.speculative.speculated and other.speculative.accepted_tokens > 0
        assert other.choices[0].text == TARGET.greedy("ab", MAX_TOKENS)[0]


async def test_a_success_between_two_refusals_forgets_the_first():
    """Refusals count against the shape only in a row: a verification that works in between resets them."""
    toy = Toy(refuse=("target",))
    async with client_for(toy) as client:
        await complete(client)
        toy.refuse = ()
        assert (await complete(client, "ab")).speculative.speculated
        toy.refuse = ("target",)
        third = await complete(client, "fa c")
        assert third.speculative.verification_refused is None, "the refusal before the success was forgotten"
        fourth = await complete(client, "dd e")
        assert fourth.speculative.verification_refused == "echo"


# ----------------------------------------------------------------------------- through the proxy


def test_a_bad_request_through_the_proxy_leaves_speculation_on_for_everyone():
    with proxy_pair() as (srv, proxy), openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as sdk:
        with openai.OpenAI(base_url=srv.base_url, api_key="sk-upstream-secret-4242", max_retries=0) as alone:
            with pytest.raises(openai.BadRequestError) as direct:
                alone.completions.create(model="target", prompt="ab", max_tokens=MAX_TOKENS, temperature=0, extra_body=BAD)
        for _ in range(3):
            with pytest.raises(openai.BadRequestError) as info:
                sdk.completions.create(model="target", prompt="ab", max_tokens=MAX_TOKENS, temperature=0, extra_body=BAD)
            assert info.value.status_code == 400
            assert {k: info.value.body[k] for k in ("message", "type", "param", "code")} == direct.value.body
        for prompt in ("ab", "fa c", "dd e"):
            response = sdk.completions.create(model="target", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
            stats = response.model_extra["speculative"]
            assert response.choices[0].text == TARGET.greedy(prompt, MAX_TOKENS)[0]
            assert stats["speculated"] is True and stats["accepted_tokens"] > 0 and stats["fallback_reason"] is None
        with httpx2.Client(base_url=proxy.url) as anonymous:
            text = anonymous.get("/metrics").text
    assert metric(text, "specapi_verification_refused_total", model_name="target", verification="echo") == 0


def test_the_proxy_learns_a_refused_verification_shape_and_counts_it():
    toy = Toy(refuse=("target",))
    options = {"policy": "fixed", "sleep": no_sleep, "verification": "echo", "drafter": "model"}
    with ToyServer() as unused, running_proxy(unused, target=toy.endpoint("target"), draft=toy.endpoint("draft"), client_options=options) as proxy:
        with openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as sdk:
            answers = [sdk.completions.create(model="target", prompt=p, max_tokens=MAX_TOKENS, temperature=0) for p in ("ab", "fa c", "dd e")]
            with httpx2.Client(base_url=proxy.url) as anonymous:
                text = anonymous.get("/metrics").text
    for prompt, answer in zip(("ab", "fa c", "dd e"), answers):
        assert answer.choices[0].text == TARGET.greedy(prompt, MAX_TOKENS)[0]
    stats = [answer.model_extra["speculative"] for answer in answers]
    assert [s["verification_refused"] for s in stats] == [None, "echo", None]
    assert all("refused the verification" in s["fallback_reason"] for s in stats)
    assert toy.echoes("target") == 2
    assert metric(text, "specapi_verification_refused_total", model_name="target", verification="echo") == 1
    assert metric(text, "specapi_fallbacks_total", reason="verification_refused") == 3
