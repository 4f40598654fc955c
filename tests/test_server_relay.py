"""`specapi serve` with verification off relays each stream the target writes (`server/relay.py`): the
target's text and usage, statistics on the last chunk, metrics, failures, disconnects. The oracle is
the toy target's own greedy output (`toyserver.TARGET`, no specapi code)."""

from __future__ import annotations

import time

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionChunk
from openai.types import Completion

from test_server_stream import leave_after_the_first_chunk
from test_server_support import PROXY_KEY, UPSTREAM_KEY, breaking_target, metric, no_sleep, parse_sse, proxy_pair, running_proxy
from toyserver import TARGET, ToyServer, render_chat

MAX_TOKENS = 16
AUTH = {"authorization": f"Bearer {PROXY_KEY}"}
OFF = {"client_options": {"verification": "none", "sleep": no_sleep}}


@pytest.fixture(scope="module")
def upstream():
    with ToyServer(api_key=UPSTREAM_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def proxy(upstream):
    with running_proxy(upstream, **OFF) as server:
        yield server


def post_stream(proxy, path: str, body: dict) -> httpx2.Response:
    with httpx2.Client(base_url=proxy.url, headers=AUTH, timeout=30) as client:
        return client.post(path, json={"model": "target", "stream": True, **body})


@pytest.mark.parametrize("prompt", ["ab", "c eda", "日本 ü\u0301 🙂"])
def test_a_relayed_completion_is_the_targets_text_usage_and_statistics(upstream, proxy, prompt):
    if any(ch not in "abcdef \n:UA" for ch in prompt):
        # The toy tokenizer refuses other characters: its own 400, passed on before any byte of a stream.
        response = post_stream(proxy, "/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS})
        assert response.status_code == 400 and response.json()["error"]["role"] == "target"
        return
    before = len(upstream.log)
    response = post_stream(proxy, "/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, "stream_options": {"include_usage": True}})
    assert response.status_code == 200 and response.text.endswith("data: [DONE]\n\n")
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = [Completion.model_validate({**e, "choices": [{**c, "finish_reason": c.get("finish_reason") or "length"} for c in e["choices"]]}) for e in events[:-1]]
    text, finish = TARGET.greedy(prompt, MAX_TOKENS)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert [c["finish_reason"] for e in events[:-1] for c in e["choices"] if c.get("finish_reason")] == [finish]
    last = events[-2]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == MAX_TOKENS
    assert [e for e in events[:-1] if "speculative" in e] == [last]
    stats = last["speculative"]
    assert (stats["speculated"], stats["verification"], stats["generated_tokens"]) == (False, "none", MAX_TOKENS)
    assert stats["target"]["requests"] == 1 and stats["draft"]["requests"] == 0
    assert stats["target"]["completion_tokens"] == MAX_TOKENS and float(stats["target"]["cost_usd"]) > 0
    assert stats["ttft_s"] is not None and 0 <= stats["ttft_s"] <= stats["wall_s"]
    sent = upstream.log[before:]
    assert len(sent) == 1 and sent[0].body["prompt"] == prompt and sent[0].body["model"] == "target"


def test_a_relayed_chat_is_openai_shaped_and_passes_no_usage_unasked(proxy):
    messages = [{"role": "user", "content": "ab"}]
    response = post_stream(proxy, "/v1/chat/completions", {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    events = parse_sse(response.text)
    chunks = [ChatCompletionChunk.model_validate(e) for e in events[:-1]]  # strict validation
    assert len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == TARGET.greedy(render_chat(messages), MAX_TOKENS)[0]
    assert not any(e.get("usage") for e in events[:-1])  # asked of the target for the statistics, not passed on
    assert "speculative" in events[-2] and events[-2]["speculative"]["generated_tokens"] == MAX_TOKENS


def test_the_sdk_reads_a_relayed_stream(proxy):
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as sdk:
        chunks = list(sdk.completions.create(model="target", prompt="fa c", max_tokens=MAX_TOKENS, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == TARGET.greedy("fa c", MAX_TOKENS)[0]
    assert chunks[-1].model_extra["speculative"]["speculated"] is False


def test_relayed_streams_are_counted_in_the_metrics():
    with proxy_pair(**OFF) as (_, proxy):
        for _ in range(2):
            assert post_stream(proxy, "/v1/completions", {"prompt": "ab", "max_tokens": 8, "temperature": 0}).status_code == 200
        metrics = httpx2.get(proxy.url + "/metrics").text
    assert metric(metrics, "specapi_requests_total", route="/v1/completions", status="200") == 2
    assert metric(metrics, "specapi_responses_total", route="/v1/completions", speculated="false", exact="true") == 2
    assert metric(metrics, "specapi_generated_tokens_total") == 16
    assert metric(metrics, "specapi_time_to_first_token_seconds_count", route="/v1/completions") == 2
    assert metric(metrics, "specapi_request_duration_seconds_count", route="/v1/completions") == 2
    assert metric(metrics, "specapi_in_flight_requests") == 0


def test_a_relayed_stream_whose_target_fails_at_once_gets_a_real_http_error():
    with proxy_pair(**OFF) as (srv, proxy), openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as client:
        srv.fail_next(100, status=500, model="target")
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model="target", prompt="ab", max_tokens=8, stream=True)
        assert info.value.status_code == 502 and info.value.body["role"] == "target"


@pytest.mark.parametrize("clean", [False, True], ids=["dropped", "ended-without-finish"])
def test_a_relayed_stream_whose_connection_breaks_midway_ends_with_an_error_event(clean):
    target = breaking_target(clean)
    with ToyServer() as unused, running_proxy(unused, target=target, draft=None, **OFF) as proxy:
        response = post_stream(proxy, "/v1/completions", {"prompt": "ab", "max_tokens": 50})
        metrics = httpx2.get(proxy.url + "/metrics").text
    events = parse_sse(response.text)
    assert [c["text"] for e in events[:-1] for c in e.get("choices", [])] == ["ab", "cd"]  # what did arrive
    assert events[-1]["error"]["role"] == "target" and "[DONE]" not in events
    assert metric(metrics, "specapi_stream_errors_total", route="/v1/completions") == 1


def test_a_client_that_leaves_a_relayed_stream_closes_the_upstream_one():
    with proxy_pair(**OFF) as (srv, proxy):
        leave_after_the_first_chunk(srv, proxy.url, AUTH)
        assert [r.path for r in srv.log if r.method == "POST"] == ["/v1/completions"]  # one call, nothing after it
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and metric(httpx2.get(proxy.url + "/metrics").text, "specapi_in_flight_requests"):
            time.sleep(0.05)
        metrics = httpx2.get(proxy.url + "/metrics").text
    assert metric(metrics, "specapi_client_disconnects_total", route="/v1/completions") == 1
    assert metric(metrics, "specapi_in_flight_requests") == 0
