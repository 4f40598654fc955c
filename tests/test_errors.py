"""Every error path of a request: bad arguments, transient failures, failing roles, untrustworthy payloads,
refused verification, and requests speculation cannot serve.

The toy server's models answer in-process behind an `httpx2.MockTransport` (no sockets, no waiting):
`Provider` records every request and can rewrite any reply, and `ToyServer.handle` supplies the
fault injection (`fail_next`, `omit_logprobs_next`). Retries sleep through a recording fake, so the
tests see what the client waited without waiting.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable
from typing import Any

import httpx2
import openai
import pytest

from specapi import (
    AsyncSpeculativeOpenAI,
    ConfigurationError,
    DraftError,
    Endpoint,
    EndpointError,
    MalformedResponseError,
    SpeculativeOpenAI,
    TargetError,
)
from toyserver import TARGET, ToyServer, render_chat

PROMPT = "cafe"
MAX_TOKENS = 16
MAX_RETRIES = 3

Rewrite = Callable[[str, str, dict, int, Any], "httpx2.Response | None"]
_hosts = itertools.count()


class Provider:
    """The toy models behind a MockTransport: records (model, path, body) of every request.

    `rewrite(model, path, body, status, payload)` may return a different response; `raise_for(model,
    path, body)` may return an exception to raise instead of answering (timeouts, dropped connections).
    """

    def __init__(self) -> None:
        self.toy = ToyServer()  # never started: its request handling is called in-process
        self.requests: list[tuple[str, str, dict]] = []
        self.rewrite: Rewrite | None = None
        self.raise_for: Callable[[str, str, dict], Exception | None] | None = None
        self.host = f"provider-{next(_hosts)}.test"  # fresh per test: nothing cached per URL leaks between tests

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        model, path = body.get("model"), request.url.path
        self.requests.append((model, path, body))
        if self.raise_for is not None:
            exc = self.raise_for(model, path, body)
            if exc is not None:
                raise exc
        reply = self.toy.handle("POST", path, body, {})
        assert reply.stream is None, "streaming is tested against the real server"
        if self.rewrite is not None:
            replaced = self.rewrite(model, path, body, reply.status, reply.payload)
            if replaced is not None:
                return replaced
        return httpx2.Response(reply.status, json=reply.payload, headers=reply.headers)

    def endpoint(self, model: str, **options: Any) -> Endpoint:
        options.setdefault("max_retries", MAX_RETRIES)
        return Endpoint(
            model=model,
            base_url=f"http://{model}.{self.host}/v1",
            api_key="x",
            http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler)),
            **options,
        )

    def sent(self, model: str, *, echo: bool | None = None) -> list[dict]:
        return [b for m, _, b in self.requests if m == model and (echo is None or bool(b.get("echo")) == echo)]


class RecordingSleep:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


@pytest.fixture
def provider() -> Provider:
    return Provider()


@pytest.fixture
def sleep() -> RecordingSleep:
    return RecordingSleep()


@pytest.fixture
async def client(provider, sleep):
    async with make_client(provider, sleep) as c:
        yield c


def make_client(provider: Provider, sleep: RecordingSleep, **options: Any) -> AsyncSpeculativeOpenAI:
    # Echo verification (no capability probe), a fixed draft length, the draft model only and no
    # pipelining: the request sequence is deterministic.
    options = {"verification": "echo", "num_speculative_tokens": 4, "policy": "fixed", "drafter": "model", "pipeline": False, **options}
    return AsyncSpeculativeOpenAI(target=provider.endpoint("target"), draft=provider.endpoint("draft"), sleep=sleep, **options)


def expected(prompt: str = PROMPT, max_tokens: int = MAX_TOKENS) -> tuple[str, str]:
    text, finish = TARGET.greedy(prompt, max_tokens)
    assert TARGET.greedy(prompt, max_tokens + 2)[1] == "length"  # no end-of-text near the edge: a clean case
    return text, finish


def output(resp) -> tuple[str, str]:
    choice = resp.choices[0]
    text = choice.text if hasattr(choice, "text") else choice.message.content
    return text, choice.finish_reason


async def complete(client: AsyncSpeculativeOpenAI, **overrides: Any):
    return await client.completions.create(**{"prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0, **overrides})


async def test_the_clean_path_speculates_and_is_exact(provider, client, sleep):
    """The baseline the failure tests compare with: rounds happen, nothing is retried."""
    resp = await complete(client)
    assert output(resp) == expected()
    s = resp.speculative
    assert s.speculated and s.num_rounds > 0 and s.fallback_reason is None
    assert s.target.failed_requests == s.draft.failed_requests == 0
    assert sleep.calls == []
    assert s.target.requests == len(provider.sent("target"))
    assert s.draft.requests == len(provider.sent("draft"))


# ----------------------------------------------------------------------------- invalid arguments


COMPLETION_ARGUMENTS = [
    {"max_tokens": 0},
    {"max_tokens": -3},
    {"max_tokens": 2.5},
    {"max_tokens": True},
    {"max_tokens": "16"},
    {"temperature": -0.1},
    {"temperature": 2.5},
    {"temperature": "hot"},
    {"top_p": 0},
    {"top_p": 1.5},
    {"stop": ""},
    {"stop": [""]},
    {"stop": 5},
    {"stop": ["a"] * 17},
    {"seed": "7"},
    {"seed": True},
    {"stream_options": {"include_usage": True}},  # without stream=True
    {"prompt": None},
    {"prompt": 42},
    {"prompt": {"text": "ab"}},
    {"prompt": []},
]


@pytest.mark.parametrize("arguments", COMPLETION_ARGUMENTS, ids=repr)
async def test_invalid_completion_arguments_fail_before_any_request(provider, client, arguments):
    with pytest.raises(ConfigurationError):
        await complete(client, **arguments)
    assert provider.requests == []


CHAT_ARGUMENTS = [
    {"messages": []},
    {"messages": "hello"},
    {"messages": [{"content": "no role"}]},
    {"messages": ["ab"]},
    {"max_tokens": 0},
    {"max_completion_tokens": -1},
    {"temperature": 3},
    {"stop": [1, 2]},
]


@pytest.mark.parametrize("arguments", CHAT_ARGUMENTS, ids=repr)
async def test_invalid_chat_arguments_fail_before_any_request(provider, client, arguments):
    arguments = {"messages": [{"role": "user", "content": "ab"}], "temperature": 0, **arguments}
    with pytest.raises(ConfigurationError):
        await client.chat.completions.create(**arguments)
    assert provider.requests == []


@pytest.mark.parametrize("k", [0, -1, 2.0, None, True])
def test_invalid_draft_length_fails_at_construction(provider, sleep, k):
    with pytest.raises(ConfigurationError):
        AsyncSpeculativeOpenAI(target=provider.endpoint("target"), draft=provider.endpoint("draft"), num_speculative_tokens=k, sleep=sleep)
    assert provider.requests == []


@pytest.mark.parametrize("options", [{"target": "http://x/v1"}, {"draft": "draft"}, {"verification": "maybe"}])
def test_invalid_client_options_fail_at_construction(provider, options):
    options = {"target": provider.endpoint("target"), "draft": provider.endpoint("draft"), **options}
    with pytest.raises(ConfigurationError):
        AsyncSpeculativeOpenAI(**options)
    assert provider.requests == []


# ----------------------------------------------------------------------------- transient failures are retried


@pytest.mark.parametrize("role", ["target", "draft"])
async def test_rate_limit_retry_after_is_honoured_without_sleeping(provider, client, sleep, role):
    provider.toy.fail_next(1, 429, model=role, retry_after=7)
    started = time.perf_counter()
    resp = await complete(client)
    assert time.perf_counter() - started < 5  # the 7 s were waited through the injected sleep only
    assert output(resp) == expected()
    assert sleep.calls == [7.0]
    usage = getattr(resp.speculative, role)
    assert usage.failed_requests == 1
    assert usage.requests == len(provider.sent(role))
    assert resp.speculative.speculated and resp.speculative.fallback_reason is None


async def test_retry_after_ms_header_is_honoured(provider, client, sleep):
    served = {"n": 0}

    def rewrite(model, path, body, status, payload):
        if model == "target" and served["n"] == 0:
            served["n"] += 1
            return httpx2.Response(429, json={"error": {"message": "slow down", "type": "rate_limit_error"}}, headers={"retry-after-ms": "1500"})
        return None

    provider.rewrite = rewrite
    resp = await complete(client)
    assert output(resp) == expected()
    assert sleep.calls == [1.5]


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_server_errors_are_retried_with_backoff(provider, client, sleep, status):
    provider.toy.fail_next(2, status, model="target")
    resp = await complete(client)
    assert output(resp) == expected()
    assert len(sleep.calls) == 2 and all(0 < s <= 20 for s in sleep.calls)
    assert resp.speculative.target.failed_requests == 2
    assert resp.speculative.speculated  # a retried call is not a reason to stop speculating


@pytest.mark.parametrize(
    "error",
    [
        lambda request: httpx2.ReadTimeout("read timed out", request=request),
        lambda request: httpx2.ConnectError("connection refused", request=request),
    ],
    ids=["timeout", "connection"],
)
async def test_timeouts_and_dropped_connections_are_retried(provider, client, sleep, error):
    failures = {"left": 2}

    def raise_for(model, path, body):
        if model == "target" and failures["left"]:
            failures["left"] -= 1
            return error(httpx2.Request("POST", f"http://target.test{path}"))
        return None

    provider.raise_for = raise_for
    resp = await complete(client)
    assert output(resp) == expected()
    assert len(sleep.calls) == 2
    assert resp.speculative.target.failed_requests == 2


# ----------------------------------------------------------------------------- a failing draft degrades


async def test_draft_that_keeps_failing_degrades_to_the_target_alone(provider, client, sleep):
    provider.toy.fail_next(1000, 503, model="draft")
    resp = await complete(client)
    assert output(resp) == expected()
    s = resp.speculative
    assert "draft" in (s.fallback_reason or "")
    assert s.draft.requests == len(provider.sent("draft")) == 1 + MAX_RETRIES
    assert s.draft.failed_requests == 1 + MAX_RETRIES
    assert len(sleep.calls) == MAX_RETRIES
    assert not s.speculated and s.num_rounds == 0
    assert s.exact


@pytest.mark.parametrize("broken", ["no-logprobs", "truncated-json", "not-json"])
async def test_draft_with_unusable_responses_degrades_to_the_target_alone(provider, client, broken):
    if broken == "no-logprobs":
        provider.toy.omit_logprobs_next(1000, model="draft")
    elif broken == "truncated-json":
        provider.rewrite = lambda model, path, body, status, payload: _truncate(payload) if model == "draft" else None
    else:
        provider.rewrite = lambda model, path, body, status, payload: (
            httpx2.Response(200, text="<html>gateway</html>", headers={"content-type": "text/html"}) if model == "draft" else None
        )
    resp = await complete(client)
    assert output(resp) == expected()
    assert "draft" in (resp.speculative.fallback_reason or "")
    assert resp.speculative.exact


# ----------------------------------------------------------------------------- a failing target raises


async def test_failing_target_raises_target_error_naming_role_and_endpoint(provider, client, sleep):
    provider.toy.fail_next(1000, 500, model="target")
    with pytest.raises(TargetError) as info:
        await complete(client)
    err = info.value
    assert err.role == "target"
    assert err.endpoint == client.target.label and provider.host in err.endpoint
    assert err.status_code == 500
    assert "target" in str(err) and err.endpoint in str(err)
    assert isinstance(err.__cause__, openai.InternalServerError)
    assert len(provider.sent("target")) == 1 + MAX_RETRIES
    assert len(sleep.calls) == MAX_RETRIES


async def test_target_failing_mid_generation_raises_instead_of_returning_partial_text(provider, client):
    answered = {"n": 0}

    def rewrite(model, path, body, status, payload):
        if model != "target":
            return None
        answered["n"] += 1
        if answered["n"] > 2:  # two rounds succeed, then the target is gone for good
            return httpx2.Response(503, json={"error": {"message": "overloaded", "type": "server_error"}})
        return None

    provider.rewrite = rewrite
    with pytest.raises(TargetError) as info:
        await complete(client, max_tokens=40)
    assert info.value.status_code == 503
    assert isinstance(info.value.__cause__, openai.APIStatusError)


async def test_client_errors_from_the_target_are_not_retried(provider, client, sleep):
    provider.toy.fail_next(1000, 401, model="target")
    with pytest.raises(TargetError) as info:
        await complete(client)
    assert info.value.status_code == 401
    assert isinstance(info.value.__cause__, openai.AuthenticationError)
    assert len(provider.sent("target")) == 1 and sleep.calls == []


async def test_target_timing_out_every_time_raises_target_error_from_the_timeout(provider, client, sleep):
    provider.raise_for = lambda model, path, body: httpx2.ReadTimeout("timed out", request=httpx2.Request("POST", "http://t")) if model == "target" else None
    with pytest.raises(TargetError) as info:
        await complete(client)
    assert isinstance(info.value.__cause__, openai.APITimeoutError)
    assert len(provider.sent("target")) == 1 + MAX_RETRIES


def test_draft_and_target_errors_are_endpoint_errors():
    assert issubclass(TargetError, EndpointError) and issubclass(DraftError, EndpointError)


# ----------------------------------------------------------------------------- untrustworthy target payloads


def _first_echo_only(mutate: Callable[[dict], httpx2.Response | dict]) -> Rewrite:
    done = {"n": 0}

    def rewrite(model, path, body, status, payload):
        if model == "target" and body.get("echo") and status == 200 and done["n"] == 0:
            done["n"] += 1
            result = mutate(payload)
            return result if isinstance(result, httpx2.Response) else httpx2.Response(200, json=result)
        return None

    return rewrite


def _drop_one_logprob(payload: dict) -> dict:
    payload["choices"][0]["logprobs"]["token_logprobs"].pop()
    return payload


def _truncate(payload: dict) -> httpx2.Response:
    raw = json.dumps(payload).encode()
    return httpx2.Response(200, content=raw[: len(raw) // 2], headers={"content-type": "application/json"})


def _respell(payload: dict) -> dict:
    # Well-formed, but the echoed tokens no longer spell the draft text.
    tokens = payload["choices"][0]["logprobs"]["tokens"]
    tokens[-2] = "e" if tokens[-2] != "e" else "f"
    return payload


@pytest.mark.parametrize("mutate", [_drop_one_logprob, _truncate, _respell], ids=["mismatched-arrays", "truncated-json", "wrong-tokens"])
async def test_untrustworthy_verify_payload_never_produces_wrong_text(provider, client, mutate):
    provider.rewrite = _first_echo_only(mutate)
    resp = await complete(client)
    assert output(resp) == expected()
    s = resp.speculative
    assert s.fallback_reason and "verif" in s.fallback_reason
    assert s.exact


async def test_missing_target_logprobs_fall_back_and_say_so(provider, client):
    provider.toy.omit_logprobs_next(1, model="target", endpoint="completions")
    resp = await complete(client)
    assert output(resp) == expected()
    assert resp.speculative.fallback_reason and "verif" in resp.speculative.fallback_reason


async def test_every_later_response_says_why_it_did_not_speculate(provider, client):
    """After the target once answered unverifiably, later requests skip speculation: they must say why."""
    provider.toy.omit_logprobs_next(1, model="target", endpoint="completions")
    await complete(client)
    later = await complete(client, prompt="ab")
    assert output(later) == expected("ab")
    s = later.speculative
    assert s.speculated or s.fallback_reason, "a response that did not speculate gives no reason"


async def test_target_answering_garbage_everywhere_raises_malformed_response_error(provider, client):
    provider.rewrite = lambda model, path, body, status, payload: _truncate(payload) if model == "target" else None
    with pytest.raises(MalformedResponseError) as info:
        await complete(client)
    assert info.value.role == "target"
    assert info.value.endpoint == client.target.label


# ----------------------------------------------------------------------------- refused verification


def _refuse_echo(model, path, body, status, payload):
    if model == "target" and body.get("echo") and body.get("logprobs") is not None:
        return httpx2.Response(
            400,
            json={
                "error": {
                    "message": "Setting 'echo' and 'logprobs' at the same time is not supported for this model.",
                    "type": "invalid_request_error",
                    "param": None,
                    "code": "invalid_parameter_combination",
                }
            },
        )
    return None


async def test_target_refusing_echo_falls_back_to_the_target_alone(provider, client, sleep):
    provider.rewrite = _refuse_echo
    resp = await complete(client)
    assert output(resp) == expected()
    s = resp.speculative
    assert s.fallback_reason and "refused" in s.fallback_reason
    assert not s.speculated
    assert len(provider.sent("target", echo=True)) == 1  # asked once, not retried
    assert sleep.calls == []
    assert s.target.failed_requests == 1


async def test_a_refused_echo_is_not_asked_again_once_confirmed(provider, client):
    """A refusal whose plain request was accepted counts against the shape; the second such writes the
    path off (one request's refusal may be that request's fault), and echo is never asked again."""
    provider.rewrite = _refuse_echo
    first = await complete(client)
    assert first.speculative.verification_refused is None
    second = await complete(client, prompt="ab")
    assert second.speculative.verification_refused == "echo"
    later = await complete(client, prompt="fac")
    assert output(later) == expected("fac")
    assert len(provider.sent("target", echo=True)) == 2
    assert "refused" in later.speculative.fallback_reason, "a response that did not speculate gives no reason"
    assert later.speculative.verification_refused is None  # said once, by the response that learnt it


# ----------------------------------------------------------------------------- requests speculation cannot serve


def _canned_reply(model, path, body, status, payload):
    """Answer what the toy refuses (n > 1, logit_bias, penalties, tools) with a plausible response."""
    if model != "target":
        return None
    n = body.get("n") or 1
    usage = {"prompt_tokens": 4, "completion_tokens": 2 * n, "total_tokens": 4 + 2 * n}
    if path.endswith("/chat/completions"):
        choices = [{"index": i, "message": {"role": "assistant", "content": f"r{i}"}, "logprobs": None, "finish_reason": "stop"} for i in range(n)]
        obj = {"id": "chatcmpl-x", "object": "chat.completion", "created": 0, "model": "target", "choices": choices, "usage": usage}
    else:
        choices = [{"index": i, "text": f"r{i}", "logprobs": None, "finish_reason": "stop"} for i in range(n)]
        obj = {"id": "cmpl-x", "object": "text_completion", "created": 0, "model": "target", "choices": choices, "usage": usage}
    return httpx2.Response(200, json=obj)


@pytest.mark.parametrize(
    "arguments",
    [
        {"logit_bias": {"50256": -100}},
        {"presence_penalty": 0.5},
        {"frequency_penalty": 0.3},
        {"echo": True, "logprobs": 2},
        {"echo": True},
        {"extra_body": {"repeat_penalty": 1.1}},
    ],
    ids=repr,
)
async def test_unverifiable_completion_requests_go_to_the_target_unchanged(provider, client, arguments):
    provider.rewrite = _canned_reply
    resp = await client.completions.create(prompt=PROMPT, max_tokens=7, temperature=0.7, **arguments)
    assert provider.sent("draft") == []
    [body] = provider.sent("target")
    sent_arguments = {k: v for k, v in arguments.items() if k != "extra_body"} | arguments.get("extra_body", {})
    assert body == {"model": "target", "prompt": PROMPT, "max_tokens": 7, "temperature": 0.7, **sent_arguments}
    s = resp.speculative
    assert s.speculated is False and s.fallback_reason
    assert len(resp.choices) == (arguments.get("n") or 1)
    assert resp.choices[0].text == "r0"


async def test_chat_with_tools_goes_to_the_target_unchanged(provider, client):
    provider.rewrite = _canned_reply
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}}}]
    messages = [{"role": "user", "content": "ab"}]
    resp = await client.chat.completions.create(messages=messages, tools=tools, tool_choice="auto", max_tokens=9, temperature=0)
    assert provider.sent("draft") == []
    [body] = provider.sent("target")
    assert body == {"model": "target", "messages": messages, "tools": tools, "tool_choice": "auto", "max_tokens": 9, "temperature": 0}
    assert resp.speculative.speculated is False and "tool" in resp.speculative.fallback_reason
    assert resp.choices[0].message.content == "r0"


async def test_zero_penalties_still_speculate(provider, client):
    resp = await complete(client, presence_penalty=0, frequency_penalty=0.0)
    assert output(resp) == expected()
    assert resp.speculative.speculated


async def test_passthrough_failure_is_a_target_error(provider, client, sleep):
    provider.toy.fail_next(1000, 500, model="target")
    with pytest.raises(TargetError) as info:
        await client.completions.create(prompt=PROMPT, max_tokens=5, logit_bias={"50256": -100})
    assert isinstance(info.value.__cause__, openai.APIStatusError)
    assert len(sleep.calls) == MAX_RETRIES


# ----------------------------------------------------------------------------- chat verification paths

MESSAGES = [{"role": "user", "content": "fa"}]


async def chat(provider: Provider, sleep: RecordingSleep, **overrides: Any):
    async with make_client(provider, sleep, verification="prompt-logprobs") as c:
        return await c.chat.completions.create(**{"messages": MESSAGES, "max_tokens": MAX_TOKENS, "temperature": 0, **overrides})


def expected_chat() -> tuple[str, str]:
    return expected(render_chat(MESSAGES), MAX_TOKENS)


async def test_chat_speculates_exactly_through_prompt_logprobs(provider, sleep):
    resp = await chat(provider, sleep)
    assert output(resp) == expected_chat()
    assert resp.speculative.speculated and resp.speculative.verification == "prompt-logprobs"


async def test_chat_missing_prompt_logprobs_fall_back_and_say_so(provider, sleep):
    provider.toy.omit_logprobs_next(1, model="target", endpoint="chat")
    resp = await chat(provider, sleep)
    assert output(resp) == expected_chat()
    assert resp.speculative.fallback_reason and "verif" in resp.speculative.fallback_reason


async def test_chat_failing_target_raises_target_error(provider, sleep):
    provider.toy.fail_next(1000, 503, model="target", endpoint="chat")
    with pytest.raises(TargetError) as info:
        await chat(provider, sleep)
    assert info.value.role == "target" and isinstance(info.value.__cause__, openai.APIStatusError)


async def test_chat_failing_draft_degrades_to_the_target_alone(provider, sleep):
    provider.toy.fail_next(1000, 500, model="draft")
    resp = await chat(provider, sleep)
    assert output(resp) == expected_chat()
    assert "draft" in (resp.speculative.fallback_reason or "")


# ----------------------------------------------------------------------------- the sync client raises the same


def test_sync_client_raises_configuration_error_before_any_request(provider, sleep):
    with SpeculativeOpenAI(target=provider.endpoint("target"), draft=provider.endpoint("draft"), verification="echo", sleep=sleep) as c:
        with pytest.raises(ConfigurationError):
            c.completions.create(prompt=PROMPT, max_tokens=0)
        with pytest.raises(ConfigurationError):
            c.chat.completions.create(messages=[], max_tokens=3)
    assert provider.requests == []


def test_sync_client_raises_target_error_chained_to_the_sdk_error(provider, sleep):
    provider.toy.fail_next(1000, 500, model="target")
    with SpeculativeOpenAI(target=provider.endpoint("target"), draft=provider.endpoint("draft"), verification="echo", sleep=sleep) as c:
        with pytest.raises(TargetError) as info:
            c.completions.create(prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert isinstance(info.value.__cause__, openai.InternalServerError)
    assert len(sleep.calls) == MAX_RETRIES


def test_sync_client_retries_transient_errors_and_stays_exact(provider, sleep):
    provider.toy.fail_next(1, 429, model="target", retry_after=3)
    with SpeculativeOpenAI(target=provider.endpoint("target"), draft=provider.endpoint("draft"), verification="echo", sleep=sleep) as c:
        resp = c.completions.create(prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0)
    assert output(resp) == expected()
    assert sleep.calls == [3.0]


# ----------------------------------------------------------------------------- transient failures while choosing a path


async def test_rate_limited_capability_probe_does_not_downgrade_verification(provider, sleep):
    """With verification="auto" the first request probes the target. A 429 there is a transient failure
    (retried up to max_retries like any call), not evidence that echo scoring is unsupported."""
    async with make_client(provider, sleep, verification="auto") as clean_client:
        clean = await complete(clean_client)
    assert clean.speculative.verification == "echo"  # what auto picks for this target when nothing fails

    limited = Provider()
    limited.toy.fail_next(2, 429, model="target", retry_after=1)  # within MAX_RETRIES
    async with make_client(limited, sleep, verification="auto") as c:
        resp = await complete(c)
    assert output(resp) == expected()
    assert resp.speculative.verification == "echo", (
        f"two 429s while probing switched verification to {resp.speculative.verification!r}"
    )
