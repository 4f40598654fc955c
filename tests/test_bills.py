"""Every billed token is counted: the per-role figures on a response equal the server's own counters,
with pipelined drafting on (stale prefetches included), greedy and sampled, plain and streamed, directly
and through the proxy. The toy server bills each request it answers, whatever the client did since.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import pytest

from specapi import AsyncSpeculativeOpenAI, Endpoint
from test_server_support import PROXY_KEY, running_proxy
from toyserver import ToyServer


@pytest.fixture(scope="module")
def srv():
    with ToyServer() as server:
        # A draft slower than the verify call: a prefetch is still in flight when its guess turns stale.
        server.set_delay("draft", per_request=0.03)
        server.set_delay("target", per_request=0.005)
        yield server


def _roles(srv: ToyServer) -> dict[str, Any]:
    return srv.snapshot()


def _assert_matches_server(stats: dict[str, Any] | Any, before: dict[str, Any], after: dict[str, Any]) -> None:
    for role in ("target", "draft"):
        delta = after[role].minus(before[role])
        usage = stats[role] if isinstance(stats, dict) else getattr(stats, role)
        get = (lambda name: usage[name]) if isinstance(usage, dict) else (lambda name: getattr(usage, name))
        assert (get("requests"), get("prompt_tokens"), get("completion_tokens")) == (
            delta.requests,
            delta.prompt_tokens,
            delta.completion_tokens,
        ), f"{role}: response says {get('requests')} requests / {get('prompt_tokens')} + {get('completion_tokens')} tokens, server billed {delta}"


CASES = [
    pytest.param(dict(prompt="fed", temperature=0), id="greedy"),
    pytest.param(dict(prompt="ab", temperature=1.0, seed=3), id="sampled"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("request_args", CASES)
async def test_pipelined_bills_equal_the_servers_counters(srv, request_args, stream):
    target = Endpoint(base_url=srv.base_url, model="target", api_key="x")
    draft = Endpoint(base_url=srv.base_url, model="draft", api_key="x")
    discarded = 0
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy="fixed", num_speculative_tokens=3, pipeline=True) as client:
        for offset in range(4):
            args = dict(request_args)
            if "seed" in args:
                args["seed"] += offset
            before = _roles(srv)
            if stream:
                response = await client.completions.create(**args, max_tokens=24, stream=True, stream_options={"include_usage": True})
                chunks = [chunk async for chunk in response]
                stats = response.speculative
                assert chunks[-1].usage is not None and chunks[-1].usage.prompt_tokens > 0
            else:
                response = await client.completions.create(**args, max_tokens=24)
                stats = response.speculative
            after = _roles(srv)
            _assert_matches_server(stats, before, after)
            discarded += stats.discarded_draft_tokens
    assert discarded > 0, "no pipelined draft turned stale: the case this test is for never happened"


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_bills_through_the_proxy_equal_the_servers_counters(srv, stream):
    with running_proxy(srv, client_options={"policy": "fixed", "pipeline": True, "drafter": "model"}) as proxy:
        with httpx2.Client(base_url=proxy.url, headers={"authorization": f"Bearer {PROXY_KEY}"}, timeout=30) as http:
            for prompt in ("fed", "cafe", "ab"):
                body = {"model": "target", "prompt": prompt, "max_tokens": 20, "temperature": 0}
                before = _roles(srv)
                if stream:
                    body.update(stream=True, stream_options={"include_usage": True})
                    text = http.post("/v1/completions", json=body).text
                    events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
                    stats = events[-1]["speculative"]
                    assert events[-1]["usage"]["prompt_tokens"] > 0
                else:
                    stats = http.post("/v1/completions", json=body).json()["speculative"]
                after = _roles(srv)
                _assert_matches_server(stats, before, after)


@pytest.mark.parametrize("verification", ["auto", "none"])
def test_streamed_usage_through_the_proxy_reports_the_prompt_tokens(srv, verification):
    direct = openai.OpenAI(base_url=srv.base_url, api_key="x", max_retries=0)
    own = direct.completions.create(model="target", prompt="cafe dab", max_tokens=8, temperature=0)
    with running_proxy(srv, client_options={"policy": "fixed", "verification": verification}) as proxy:
        with openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as sdk:
            chunks = list(
                sdk.completions.create(
                    model="target", prompt="cafe dab", max_tokens=8, temperature=0, stream=True, stream_options={"include_usage": True}
                )
            )
    usage = chunks[-1].usage
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (own.usage.prompt_tokens, own.usage.completion_tokens)
