"""Fuzzing the proxy and the library's `create` with request bodies built from the OpenAI schema's fields
and then broken: wrong types, numbers out of range, NaN and Infinity, huge numbers, deep nesting,
bytes that are not UTF-8 and lone surrogates, unknown fields, other content types, huge bodies, and the
shapes of `n`, `stop`, `logit_bias`, `tools`, `messages`.

The oracle is the simulated target answering the same bytes itself. Properties, for every body:

- the proxy never answers 5xx, and answers 200 exactly where the target alone does (a 4xx where it
  refuses), except where the proxy's own limit refuses first (a body over `max_request_bytes`: 413) or
  where the target's refusal is a 5xx of its own for bytes no JSON parser takes (llama-server's);
- a refusal the proxy makes itself (no `role` in its error) sent nothing upstream;
- the proxy still serves afterwards;
- the library's `create`, given the body's fields (unknown ones in `extra_body`, as the SDK sends them),
  returns or raises an error of the SDK's classes (`openai.APIError`) or specapi's; one raised before any
  request (`InvalidRequestError`, an `openai.BadRequestError`) sent nothing, and it refuses nothing the
  target alone accepts.

Examples are derandomized (seeded) and bounded (SPECAPI_FUZZ_EXAMPLES, default 30 per test);
`SPECAPI_FUZZ_EXAMPLES=2000 python -m pytest -q tests/test_fuzz.py -s` runs longer and prints the
statuses seen.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specapi import AsyncSpeculativeOpenAI, Endpoint, SpecAPIError
from specapi.transport._exceptions import InvalidRequestError
from specapi.server import BackgroundServer, ServerConfig, create_app
from specapi.sim import SimProvider, SimTransport

EXAMPLES = int(os.environ.get("SPECAPI_FUZZ_EXAMPLES", "30"))
#: The proxy's body limit here: small, so that huge bodies are cheap to make.
MAX_REQUEST_BYTES = 64 * 1024
FUZZ = settings(max_examples=EXAMPLES, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck), database=None)
#: What the runs saw, printed at the end of the module (`-s`).
SEEN: collections.Counter[str] = collections.Counter()


class Counting(SimTransport):
    """The simulator's transport, counting the requests that reach it."""

    def __init__(self, provider: SimProvider) -> None:
        super().__init__(provider)
        self.requests = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.requests += 1
        return await super().handle_async_request(request)


# -- bodies ------------------------------------------------------------------------------------------

TEXT = st.sampled_from(["def f(n):", "Hello", "中文测试", "😀 ok", "e\u0301", "", " ", "a" * 300])
SMALL_TOKENS = st.integers(1, 6)
MESSAGE = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]), "content": TEXT})
TOOL = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({"name": st.just("area"), "parameters": st.just({"type": "object", "properties": {}})})})

#: Valid values per field, and shapes that are not (wrong types, out of range, odd shapes).
VALID = {
    "max_tokens": SMALL_TOKENS,
    "temperature": st.sampled_from([0, 0.0, 0.5, 1, 2]),
    "top_p": st.sampled_from([0.1, 0.9, 1]),
    "n": st.sampled_from([1, 2]),
    "stop": st.one_of(st.just("\n"), st.lists(st.sampled_from(["\n", "x", "return"]), min_size=1, max_size=3)),
    "seed": st.integers(0, 2**31 - 1),
    "stream": st.booleans(),
    "logprobs": st.none(),
    "presence_penalty": st.sampled_from([0, 0.5, -1]),
    "frequency_penalty": st.sampled_from([0, 0.5]),
    "user": st.just("fuzz"),
}
BROKEN = st.one_of(
    st.sampled_from([
        -1, 0, 2**31, 2**63, 10**30, -(10**30), 1e308, -1e-320, 3.5, 99, 1000,
        "", "many", "NaN", "\ud800", [], [1, "a"], {}, {"a": {"b": None}}, True, False, None,
    ]),
    st.text(max_size=8),
    st.lists(st.integers(-5, 5), max_size=4),
)
LOGIT_BIAS = st.one_of(
    st.dictionaries(st.sampled_from(["1", "50256", "x", "-3", "\ud800"]), st.sampled_from([-100, 0, 5, 100, 101, "a", None]), max_size=3),
    st.lists(st.integers(), max_size=2),
    st.just("bias"),
)
#: Raw JSON literals Python's encoder writes for special floats (which JSON has not), and numbers too big.
SPECIAL = st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1" + "0" * 400, "1e-400", "0.1e"])


@st.composite
def body(draw: st.DrawFn) -> tuple[bool, dict[str, Any]]:
    """A body of the schema's fields, valid or not, for completions (False) or chat (True)."""
    chat = draw(st.booleans())
    fields: dict[str, Any] = {"model": "sim-target"}
    if chat:
        fields["messages"] = draw(st.one_of(st.lists(MESSAGE, min_size=1, max_size=3), BROKEN, st.lists(BROKEN, max_size=2)) if draw(st.integers(0, 4)) == 0 else st.lists(MESSAGE, min_size=1, max_size=3))
    else:
        fields["prompt"] = draw(st.one_of(TEXT, st.lists(TEXT, min_size=1, max_size=2), st.lists(st.integers(0, 50000), max_size=4), BROKEN) if draw(st.integers(0, 4)) == 0 else TEXT)
    fields["max_tokens"] = draw(SMALL_TOKENS)
    for name in draw(st.lists(st.sampled_from(sorted(VALID)), max_size=4, unique=True)):
        fields[name] = draw(VALID[name])
    for name in draw(st.lists(st.sampled_from(sorted(VALID) + ["echo", "best_of", "suffix", "top_logprobs", "response_format", "tool_choice"]), max_size=2, unique=True)):
        fields[name] = draw(BROKEN)
    if draw(st.integers(0, 5)) == 0:
        fields["logit_bias"] = draw(LOGIT_BIAS)
    if chat and draw(st.integers(0, 6)) == 0:
        fields["tools"] = draw(st.one_of(st.lists(TOOL, max_size=2), BROKEN))
    if draw(st.integers(0, 6)) == 0:
        fields[draw(st.sampled_from(["frobnicate", "top_k", "min_p", "__proto__", "ignore_eos", "\u00e9t\u00e9"]))] = draw(BROKEN)
    if fields.get("stream") is True and draw(st.booleans()):
        fields["stream_options"] = draw(st.one_of(st.just({"include_usage": True}), BROKEN))
    return chat, fields


@st.composite
def wire(draw: st.DrawFn) -> tuple[str, bytes, str | None, str, dict[str, Any] | None]:
    """(path, raw body, content type, what was broken, the fields when the body is a JSON object of them)."""
    chat, fields = draw(body())
    path = "/v1/chat/completions" if chat else "/v1/completions"
    raw = json.dumps(fields).encode()  # ensure_ascii: a lone surrogate travels as its escape
    kind = draw(st.sampled_from(["fields", "fields", "fields", "special", "nesting", "utf8", "surrogate", "syntax", "huge", "content-type", "not-object"]))
    parsed: dict[str, Any] | None = fields
    if kind == "special":
        raw = raw[:-1] + b', "temperature": ' + draw(SPECIAL).encode() + b"}"
        parsed = None
    elif kind == "nesting":
        depth = draw(st.sampled_from([50, 500, 100_000]))
        raw = raw[:-1] + b', "stop": ' + b"[" * depth + b"]" * depth + b"}"
        parsed = None
    elif kind == "utf8":
        raw = raw.replace(b'"model": "sim-target"', b'"model": "sim-target", "user": "\xff\xfe\xc3"')
        parsed = None
    elif kind == "surrogate":
        raw = raw.replace(b'"model": "sim-target"', b'"model": "sim-target", "user": "ok\\udc80"')
        parsed = None
    elif kind == "syntax":
        raw = raw[: draw(st.integers(0, max(0, len(raw) - 1)))]
        parsed = None
    elif kind == "huge":
        raw = raw[:-1] + b', "user": "' + b"x" * (MAX_REQUEST_BYTES + 10) + b'"}'
        parsed = None
    elif kind == "not-object":
        raw = draw(st.sampled_from([b"[]", b"null", b"3", b'"prompt"', b"true"]))
        parsed = None
    content_type = draw(st.sampled_from(["application/json", "text/plain", "application/x-www-form-urlencoded", None])) if kind == "content-type" else "application/json"
    return path, raw, content_type, kind, parsed


# -- the proxy ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def setup() -> Iterator[tuple[SimProvider, Counting, httpx2.Client]]:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    transport = Counting(provider)
    endpoints = [
        Endpoint(model=model, base_url="http://sim/v1", api_key="sim", max_retries=0, http_client=httpx2.AsyncClient(transport=transport))
        for model in ("sim-target", "sim-draft")
    ]
    config = ServerConfig(
        target=endpoints[0], draft=endpoints[1], num_speculative_tokens=3, max_request_bytes=MAX_REQUEST_BYTES,
        client_options={"policy": "fixed"}, readiness_interval=3600.0,
    )
    with BackgroundServer(create_app(config)) as proxy, httpx2.Client(base_url=proxy.url, timeout=30) as http:
        yield provider, transport, http
    print(f"\nfuzzed bodies by kind and status (proxy / target alone): {dict(sorted(SEEN.items()))}")


def _alone(provider: SimProvider, path: str, raw: bytes, content_type: str | None) -> int:
    async def post() -> int:
        async with httpx2.AsyncClient(transport=SimTransport(provider), base_url="http://sim") as client:
            headers = {"content-type": content_type} if content_type else {}
            return (await client.post(path, content=raw, headers=headers)).status_code

    return asyncio.run(post())


def _serving(http: httpx2.Client) -> None:
    response = http.post("/v1/completions", json={"prompt": "def f(n):", "max_tokens": 3, "temperature": 0})
    assert response.status_code == 200, response.text
    assert http.get("/health").status_code == 200


@FUZZ
@given(case=wire())
def test_the_proxy_answers_broken_bodies_as_the_target_alone_and_never_5xx(setup: tuple[SimProvider, Counting, httpx2.Client], case: Any) -> None:
    provider, transport, http = setup
    path, raw, content_type, kind, _ = case
    expected = _alone(provider, path, raw, content_type)
    before = transport.requests
    headers = {"content-type": content_type} if content_type else {}
    response = http.post(path, content=raw, headers=headers)
    status = response.status_code
    SEEN[f"proxy {kind} {status}/{expected}"] += 1
    assert status < 500, (kind, raw[:300], response.text[:500])
    if status != 200:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"], response.text
        if "role" not in error:  # refused by the proxy itself: nothing went upstream
            assert transport.requests == before, (kind, raw[:300], response.text[:300])
    if kind == "huge":
        assert status == 413
    elif expected >= 500:
        assert status == 400, (kind, raw[:300], expected, response.text[:300])  # bytes no JSON parser takes
    else:
        assert (status == 200) == (expected == 200), (kind, raw[:300], expected, response.text[:500])
    if status == 200 and b'"stream": true' not in raw:
        assert "choices" in response.json()


def test_the_proxy_still_serves_after_the_fuzzing(setup: tuple[SimProvider, Counting, httpx2.Client]) -> None:
    _serving(setup[2])


# -- the library --------------------------------------------------------------------------------------

#: `create`'s own parameters (the rest go in `extra_body`, as the SDK sends unknown fields).
_COMPLETION_PARAMS = {"prompt", "model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "stream", "logprobs", "presence_penalty",
                      "frequency_penalty", "user", "echo", "best_of", "suffix", "logit_bias", "stream_options"}
_CHAT_PARAMS = (_COMPLETION_PARAMS - {"prompt", "echo", "best_of", "suffix"}) | {"messages", "tools", "tool_choice", "top_logprobs", "response_format"}


def _arguments(chat: bool, fields: dict[str, Any]) -> dict[str, Any]:
    own = _CHAT_PARAMS if chat else _COMPLETION_PARAMS
    arguments = {name: value for name, value in fields.items() if name in own}
    extra = {name: value for name, value in fields.items() if name not in own}
    if extra:
        arguments["extra_body"] = extra
    return arguments


async def _library(provider: SimProvider, chat: bool, fields: dict[str, Any]) -> tuple[str, int]:
    """What `create` did with these fields (its outcome's name) and how many requests it sent."""
    transport = Counting(provider)
    target, draft = (
        Endpoint(model=model, base_url="http://sim/v1", api_key="sim", max_retries=0, http_client=httpx2.AsyncClient(transport=transport))
        for model in ("sim-target", "sim-draft")
    )
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=3) as client:
        warm = await client.completions.create(prompt="a", max_tokens=1)  # the probe's calls are not this body's
        assert warm.choices
        before = transport.requests
        try:
            result = await (client.chat.completions if chat else client.completions).create(**_arguments(chat, fields))
            if fields.get("stream") is True:
                async for _ in result:
                    pass
            outcome = "ok"
        except InvalidRequestError as exc:
            assert isinstance(exc, openai.BadRequestError) and exc.status_code == 400 and str(exc)
            outcome = "invalid"
        except (openai.APIError, SpecAPIError) as exc:
            assert str(exc)
            outcome = type(exc).__name__
    return outcome, transport.requests - before


@FUZZ
@given(chat_fields=body())
def test_create_raises_only_the_sdks_errors_and_refuses_before_sending(chat_fields: tuple[bool, dict[str, Any]]) -> None:
    chat, fields = chat_fields
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    expected = _alone(provider, path, json.dumps(fields).encode(), "application/json")
    outcome, sent = asyncio.run(_library(provider, chat, fields))
    SEEN[f"create {outcome}/{expected}"] += 1
    if outcome == "invalid":
        assert sent == 0, fields
        assert expected != 200, ("refused what the target alone accepts", fields)
    if expected == 200:
        assert outcome == "ok", (outcome, fields)
    if outcome == "ok":
        assert expected == 200, ("accepted what the target alone refuses", fields)


def test_special_numbers_are_refused_before_any_request() -> None:
    # Python floats the JSON the target reads cannot hold: refused by the library, never sent.
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    for value in (math.nan, math.inf, -math.inf):
        outcome, sent = asyncio.run(_library(provider, False, {"prompt": "a", "max_tokens": 2, "temperature": value}))
        assert (outcome, sent) == ("invalid", 0), value
