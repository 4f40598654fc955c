"""The proxy passes every route it does not speculate to the target unchanged: `/v1/embeddings`,
`/v1/responses` (plain and streamed), vLLM's `/tokenize`, `/detokenize` and `/version`, and anything else,
whatever the target answers to it (404 and 405 included). The oracle is the same request sent to the target
directly: status, headers and body (volatile ids aside) must be the same through the proxy.

The tests take the upstream from the `upstream` fixture, which runs the simulator under two profiles here;
another server (real vLLM) is one more parameter of it: an `Upstream` with its base URL, model and the
routes it serves.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx2
import openai
import pytest

from specapi import Endpoint
from specapi.server import BackgroundServer, ServerConfig, create_app
from specapi.sim import SimProvider
from specapi.sim import create_app as create_sim_app
from test_server_support import PROXY_KEY, metric, no_sleep

UPSTREAM_KEY = "sk-upstream-for-forwarding"


@dataclass
class Upstream:
    """A running target server: where it listens, its model, the routes it serves (200 expected)."""

    base_url: str  # ends with /v1
    model: str
    serves: frozenset[str]
    provider: SimProvider | None = None  # the simulator's record of the requests it received, if simulated
    extra: dict[str, Any] = field(default_factory=dict)


@contextlib.contextmanager
def simulated(profile: str) -> Iterator[Upstream]:
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    serves = {
        "vllm": {"/v1/responses", "/tokenize", "/detokenize", "/version"},
        "openai": {"/v1/embeddings", "/v1/responses"},
    }[profile]
    with BackgroundServer(create_sim_app(provider), shutdown_timeout=1) as server:
        yield Upstream(base_url=server.url + "/v1", model="sim-target", serves=frozenset(serves), provider=provider)


@pytest.fixture(scope="module", params=["sim-vllm", "sim-openai"])
def upstream(request) -> Iterator[Upstream]:
    with simulated(request.param.removeprefix("sim-")) as server:
        yield server


@contextlib.contextmanager
def proxy_for(upstream: Upstream, **overrides: Any) -> Iterator[BackgroundServer]:
    common = {"base_url": upstream.base_url, "api_key": UPSTREAM_KEY, "max_retries": 0, "timeout": 10.0}
    config = ServerConfig(
        target=Endpoint(model=upstream.model, **common),
        api_key=PROXY_KEY,
        client_options={"policy": "fixed", "sleep": no_sleep, "drafter": "lookup"},
        readiness_interval=3600.0,
        **overrides,
    )
    with BackgroundServer(create_app(config), shutdown_timeout=2) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def proxy(upstream: Upstream) -> Iterator[BackgroundServer]:
    with proxy_for(upstream) as server:
        yield server


def _cases(model: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("POST", "/v1/embeddings", {"model": model, "input": ["café 猫 🙂", "def f(x):"]}),
        ("POST", "/v1/embeddings", {"model": model, "input": "e\u0301t\u00e9", "encoding_format": "base64"}),
        ("POST", "/v1/responses", {"model": model, "input": "Write a function that adds two numbers.", "max_output_tokens": 12, "temperature": 0}),
        ("POST", "/v1/responses", {"model": model, "input": [{"role": "user", "content": "日本語で"}], "max_output_tokens": 12, "temperature": 0, "stream": True}),
        ("POST", "/tokenize", {"model": model, "prompt": "Hello 世界 🙂"}),
        ("POST", "/detokenize", {"model": model, "tokens": [9906, 1917, 11, 220]}),
        ("GET", "/version", None),
        ("POST", "/v1/no-such-route", {"model": model}),
        ("GET", "/v1/completions", None),  # a method the target does not take: its own answer
    ]


CASE_IDS = ["embeddings", "embeddings-base64", "responses", "responses-stream", "tokenize", "detokenize", "version", "unknown", "wrong-method"]
_VOLATILE = re.compile(r'"(id|item_id|created_at|created)": ?("[^"]*"|\d+)')
_CONNECTION_HEADERS = {"date", "server", "content-length", "transfer-encoding", "connection", "keep-alive"}


def _comparable(response: httpx2.Response) -> tuple[int, dict[str, str], str]:
    """Status, headers and body, less what differs between two answers to one request (ids, times, framing)."""
    headers = {name: value for name, value in response.headers.items() if name not in _CONNECTION_HEADERS}
    return response.status_code, headers, _VOLATILE.sub(r'"\1": "~"', response.text)


@pytest.mark.parametrize("case", range(len(CASE_IDS)), ids=CASE_IDS)
def test_a_route_the_proxy_does_not_speculate_gets_the_targets_own_answer(upstream: Upstream, proxy: BackgroundServer, case: int) -> None:
    method, path, body = _cases(upstream.model)[case]
    root = upstream.base_url.removesuffix("/v1")
    content = json.dumps(body).encode() if body is not None else None
    headers = {"content-type": "application/json"} if body is not None else {}
    direct = httpx2.request(method, root + path, content=content, headers={**headers, "authorization": f"Bearer {UPSTREAM_KEY}"}, timeout=30)
    proxied = httpx2.request(method, proxy.url + path, content=content, headers={**headers, "authorization": f"Bearer {PROXY_KEY}"}, timeout=30)
    if path in upstream.serves:
        assert direct.status_code == 200, direct.text  # the route is served: not a comparison of two 404s
    assert _comparable(proxied) == _comparable(direct)
    if body is not None and body.get("stream"):
        assert proxied.headers["content-type"].startswith("text/event-stream")
        assert "response.completed" in proxied.text or "response.incomplete" in proxied.text


def test_the_sdk_pointed_at_the_proxy_uses_the_routes_it_passes_on(upstream: Upstream, proxy: BackgroundServer) -> None:
    """A client that uses embeddings or the Responses API beside completions points its base URL at the proxy."""
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as sdk, \
            openai.OpenAI(base_url=upstream.base_url, api_key=UPSTREAM_KEY, max_retries=0) as direct:
        if "/v1/embeddings" in upstream.serves:
            ours = sdk.embeddings.create(model=upstream.model, input=["café 猫", "x"])
            theirs = direct.embeddings.create(model=upstream.model, input=["café 猫", "x"])
            assert [d.embedding for d in ours.data] == [d.embedding for d in theirs.data]
        else:
            with pytest.raises(openai.NotFoundError):
                sdk.embeddings.create(model=upstream.model, input="x")
        request = {"model": upstream.model, "input": "Write a function that adds two numbers.", "max_output_tokens": 12, "temperature": 0}
        assert sdk.responses.create(**request).output_text == direct.responses.create(**request).output_text
        with sdk.responses.stream(**request) as stream:
            streamed = "".join(event.delta for event in stream if event.type == "response.output_text.delta")
        assert streamed == direct.responses.create(**request).output_text


def test_what_is_sent_on_and_what_is_not() -> None:
    """The query string and the client's own headers reach the target; the client's key (the proxy's)
    does not: the target gets its own. Without the proxy's key nothing is sent on."""
    with simulated("vllm") as upstream, proxy_for(upstream) as proxy:
        assert upstream.provider is not None
        headers = {"authorization": f"Bearer {PROXY_KEY}", "x-trace": "abc-123", "content-type": "application/json"}
        body = {"model": upstream.model, "prompt": "Hello"}
        reply = httpx2.post(proxy.url + "/tokenize?trace=on&x=%E7%8C%AB", json=body, headers=headers, timeout=10)
        assert reply.status_code == 200 and reply.json()["tokens"]
        [call] = [c for c in upstream.provider.calls if c.headers.get("x-trace")]  # the proxy probes /tokenize too
        assert call.path == "/tokenize?trace=on&x=%E7%8C%AB" and call.body == body
        assert call.headers["x-trace"] == "abc-123" and call.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        before = len(upstream.provider.calls)
        refused = httpx2.post(proxy.url + "/tokenize", json=body, headers={"authorization": "Bearer wrong"}, timeout=10)
        assert refused.status_code == 401 and len(upstream.provider.calls) == before
        text = httpx2.get(proxy.url + "/metrics", timeout=10).text
        assert metric(text, "specapi_requests_total", route="passthrough", status="200") == 1
        assert metric(text, "specapi_requests_total", route="passthrough", status="401") == 1


def test_a_target_that_cannot_be_reached_gets_an_error_naming_it() -> None:
    with simulated("vllm") as upstream:
        pass  # the server is gone: its port refuses connections
    with proxy_for(upstream) as proxy:
        reply = httpx2.post(proxy.url + "/v1/embeddings", json={"model": "m", "input": "x"}, headers={"authorization": f"Bearer {PROXY_KEY}"}, timeout=10)
    assert reply.status_code == 502
    error = reply.json()["error"]
    assert error["role"] == "target" and "target endpoint" in error["message"] and UPSTREAM_KEY not in reply.text
