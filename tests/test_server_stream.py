"""The proxy's streams (SSE through the official SDK and raw HTTP), client disconnects, graceful shutdown."""

from __future__ import annotations

import concurrent.futures
import time

import httpx2
import openai
import pytest
from openai.types.chat import ChatCompletionChunk

from test_server_support import PROXY_KEY, UPSTREAM_KEY, metric, parse_sse, proxy_pair, running_proxy
from toyserver import TARGET, ToyServer, render_chat

MAX_TOKENS = 16
AUTH = {"authorization": f"Bearer {PROXY_KEY}"}


@pytest.fixture(scope="module")
def upstream():
    with ToyServer(api_key=UPSTREAM_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def proxy(upstream):
    with running_proxy(upstream) as server:
        yield server


@pytest.fixture
def sdk(proxy):
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as client:
        yield client


def slow(srv: ToyServer, seconds: float = 0.02) -> None:
    srv.set_delay("target", per_request=seconds)
    srv.set_delay("draft", per_request=seconds)


def leave_after_the_first_chunk(srv: ToyServer, proxy_url: str, auth: dict[str, str]) -> None:
    """A client that opens a long, slow stream through the proxy, reads its first chunk and leaves;
    returns once the upstream has had no new request for a while."""
    slow(srv)
    srv.set_delay("target", per_token=0.01)
    body = {"model": "target", "prompt": "ab", "max_tokens": 400, "temperature": 0, "stream": True}
    with httpx2.Client(base_url=proxy_url, headers=auth, timeout=30) as client:
        with client.stream("POST", "/v1/completions", json=body) as response:
            assert next(line for line in response.iter_lines() if line.startswith("data: "))
    settled_request_count(srv)


def settled_request_count(srv: ToyServer, quiet: float = 0.4, timeout: float = 10.0) -> int:
    """The number of upstream requests once no new one has arrived for `quiet` seconds."""
    deadline = time.monotonic() + timeout
    count = len(srv.log)
    while time.monotonic() < deadline:
        time.sleep(quiet)
        now = len(srv.log)
        if now == count:
            return count
        count = now
    raise AssertionError("upstream requests never stopped")


# ----------------------------------------------------------------------------- exact streams through the SDK


@pytest.mark.parametrize("prompt", ["ab", "c eda"])
def test_streamed_completion_is_the_targets_greedy_output(sdk, prompt):
    stream = sdk.completions.create(
        model="target", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert (text, finish) == (TARGET.greedy(prompt, MAX_TOKENS)[0], [TARGET.greedy(prompt, MAX_TOKENS)[1]])
    last = chunks[-1]
    assert last.choices == [] and last.usage.completion_tokens == MAX_TOKENS
    stats = last.model_extra["speculative"]
    assert stats["speculated"] is True and stats["generated_tokens"] == MAX_TOKENS
    assert all("speculative" not in (c.model_extra or {}) for c in chunks[:-1])


@pytest.mark.parametrize("content", ["abc", "f f"])
def test_streamed_chat_is_the_targets_greedy_output(sdk, content):
    messages = [{"role": "user", "content": content}]
    chunks = list(sdk.chat.completions.create(model="target", messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == TARGET.greedy(render_chat(messages), MAX_TOKENS)[0]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == TARGET.greedy(render_chat(messages), MAX_TOKENS)[1]
    assert chunks[-1].model_extra["speculative"]["exact"] is True


def test_streamed_target_only_request_carries_stats_in_its_last_chunk(sdk):
    chunks = list(sdk.completions.create(model="target", prompt="ab", max_tokens=6, temperature=0, logprobs=1, echo=True, stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == "ab" + TARGET.greedy("ab", 6)[0]
    assert chunks[-1].model_extra["speculative"]["speculated"] is False


def test_raw_event_stream_is_openai_shaped(proxy):
    messages = [{"role": "user", "content": "ab"}]
    body = {"model": "target", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    with httpx2.Client(base_url=proxy.url, headers=AUTH, timeout=30) as client:
        response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-request-id"]
    assert response.text.endswith("data: [DONE]\n\n")
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]" and "[DONE]" not in events[:-1]
    chunks = [ChatCompletionChunk.model_validate(e) for e in events[:-1]]  # strict validation, not just parsing
    assert len({c.id for c in chunks}) == 1
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == TARGET.greedy(render_chat(messages), MAX_TOKENS)[0]
    with_stats = [e for e in events[:-1] if "speculative" in e]
    assert with_stats == [events[-2]]
    stats = with_stats[0]["speculative"]
    assert stats["generated_tokens"] == MAX_TOKENS and stats["num_rounds"] > 0
    assert stats["accepted_tokens"] <= stats["drafted_tokens"]


# ----------------------------------------------------------------------------- failures in streams


def test_stream_whose_target_fails_at_once_gets_a_real_http_error():
    with proxy_pair() as (srv, proxy), openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as client:
        srv.fail_next(100, status=500, model="target")
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model="target", prompt="ab", max_tokens=8, stream=True)
        assert info.value.status_code == 502
        # The role, never the upstream's address (that goes to the log only).
        assert info.value.body["role"] == "target" and srv.base_url not in info.value.message


def test_stream_whose_target_fails_midway_ends_with_an_error_event():
    with proxy_pair() as (srv, proxy), openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as client:
        slow(srv)
        stream = client.completions.create(model="target", prompt="ab", max_tokens=200, temperature=0, stream=True)
        first = next(iter(stream))
        srv.fail_next(10_000, status=500, model="target")
        text = first.choices[0].text
        with pytest.raises(openai.APIError) as info:
            for chunk in stream:
                text += chunk.choices[0].text
        assert "target" in info.value.message and info.value.body["role"] == "target"
        assert TARGET.greedy("ab", 200)[0].startswith(text)  # what did arrive was the target's
        srv.clear_faults()
        metrics = httpx2.get(proxy.url + "/metrics").text
    assert metric(metrics, "specapi_stream_errors_total", route="/v1/completions") == 1


# ----------------------------------------------------------------------------- disconnects cancel upstream work


def test_a_streaming_client_that_disconnects_stops_the_upstream_calls():
    with proxy_pair() as (srv, proxy):
        slow(srv)
        body = {"model": "target", "prompt": "ab", "max_tokens": 400, "temperature": 0, "stream": True}
        with httpx2.Client(base_url=proxy.url, headers=AUTH, timeout=30) as client:
            with client.stream("POST", "/v1/completions", json=body) as response:
                lines = response.iter_lines()
                assert next(line for line in lines if line.startswith("data: "))
                at_disconnect = len(srv.log)
            # leaving the block closes the connection mid-stream
        after = settled_request_count(srv)
        time.sleep(0.3)
        assert len(srv.log) == after  # nothing more was asked upstream
        # At most the round in flight completes; 400 tokens would have needed hundreds of requests.
        assert after - at_disconnect <= 4
        metrics = httpx2.get(proxy.url + "/metrics").text
    assert metric(metrics, "specapi_client_disconnects_total", route="/v1/completions") == 1
    assert metric(metrics, "specapi_in_flight_requests") == 0


def test_a_waiting_client_that_disconnects_stops_the_upstream_calls():
    with proxy_pair() as (srv, proxy):
        slow(srv)
        body = {"model": "target", "messages": [{"role": "user", "content": "ab"}], "max_tokens": 400, "temperature": 0}
        with httpx2.Client(base_url=proxy.url, headers=AUTH, timeout=httpx2.Timeout(10, read=0.5)) as client:
            with pytest.raises(httpx2.ReadTimeout):
                client.post("/v1/chat/completions", json=body)
            at_disconnect = len(srv.log)
        after = settled_request_count(srv)
        time.sleep(0.3)
        assert len(srv.log) == after and after - at_disconnect <= 4
        metrics = httpx2.get(proxy.url + "/metrics").text
    assert metric(metrics, "specapi_requests_total", route="/v1/chat/completions", status="499") == 1
    assert metric(metrics, "specapi_client_disconnects_total", route="/v1/chat/completions") == 1
    assert metric(metrics, "specapi_in_flight_requests") == 0


# ----------------------------------------------------------------------------- graceful shutdown


def test_shutdown_lets_in_flight_requests_finish():
    with ToyServer(api_key=UPSTREAM_KEY) as srv:
        slow(srv, 0.03)
        proxy = running_proxy(srv, shutdown_timeout=20)
        server = proxy.__enter__()
        client = openai.OpenAI(base_url=server.url + "/v1", api_key=PROXY_KEY, max_retries=0)

        def plain() -> str:
            return client.completions.create(model="target", prompt="ab", max_tokens=12, temperature=0).choices[0].text

        def streamed() -> str:
            stream = client.chat.completions.create(
                model="target", messages=[{"role": "user", "content": "ab"}], max_tokens=12, temperature=0, stream=True
            )
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            futures = [pool.submit(plain), pool.submit(streamed)]
            deadline = time.monotonic() + 10
            while metric(httpx2.get(server.url + "/metrics").text, "specapi_in_flight_requests") < 2:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            proxy.__exit__(None, None, None)  # like SIGTERM: stop accepting, drain, exit
            results = [f.result(timeout=30) for f in futures]
        client.close()
        assert results == [TARGET.greedy("ab", 12)[0], TARGET.greedy(render_chat([{"role": "user", "content": "ab"}]), 12)[0]]
        with pytest.raises(httpx2.ConnectError):
            httpx2.get(server.url + "/health")
