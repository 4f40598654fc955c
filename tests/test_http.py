"""The lean transport (`specapi.transport._http`, under `RoleClient`): over real sockets (aiohttp, the default) it
keeps what the SDK path gave: retries with backoff and Retry-After, timeouts, pooled connections, the
SDK's error classes and messages, streams, per-call options; and an injected httpx2 client is honoured."""

from __future__ import annotations

import gc
import json
import warnings

import httpx2
import openai
import pytest

from specapi import AsyncSpeculativeOpenAI, Endpoint, TargetError
from specapi.transport._calls import Meter, RoleClient
from specapi.transport._http import SSEDecoder, Timeout, timeout_of
from wireserver import WireReply, WireServer, sse


def _completion(text: str = "hi") -> dict:
    return {
        "id": "cmpl-1", "object": "text_completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 1, "total_tokens": 3},
    }


class Sleeps:
    def __init__(self) -> None:
        self.calls: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)


def _role(base_url: str, sleep: Sleeps | None = None, **endpoint: object) -> RoleClient:
    options = {"model": "m", "base_url": base_url, "api_key": "k", **endpoint}
    return RoleClient("target", Endpoint(**options), sleep=sleep or Sleeps())  # type: ignore[arg-type]


def _script(*replies: WireReply):
    """A handler answering with `replies` in turn, then with the last one."""
    queue = list(replies)

    def handler(request):
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return handler


async def test_a_rate_limit_waits_what_retry_after_asks_then_succeeds():
    sleep = Sleeps()
    limited = WireReply(429, {"error": {"message": "slow down", "type": "rate_limit_error"}}, headers={"retry-after": "2.5"})
    async with WireServer(_script(limited, WireReply(body=_completion()))) as server:
        role = _role(server.base_url, sleep)
        meter = Meter(role.endpoint)
        result = await role.post("/completions", {"prompt": "a"}, meter)
        await role.aclose()
    assert result["choices"][0]["text"] == "hi"
    assert sleep.calls == [2.5]
    assert (meter.requests, meter.failed_requests) == (2, 1)
    assert len(server.requests) == 2


async def test_server_errors_back_off_exponentially_until_one_succeeds():
    sleep = Sleeps()
    failing = WireReply(503, {"error": {"message": "overloaded"}})
    async with WireServer(_script(failing, failing, failing, WireReply(body=_completion()))) as server:
        role = _role(server.base_url, sleep, max_retries=3)
        await role.post("/completions", {"prompt": "a"}, Meter(role.endpoint))
        await role.aclose()
    assert len(sleep.calls) == 3
    # Full jitter within a doubling ceiling: 0.2 s, then 0.4 s, then 0.8 s (each at least half of it).
    for wait, ceiling in zip(sleep.calls, (0.2, 0.4, 0.8)):
        assert ceiling / 2 <= wait <= ceiling


async def test_retries_stop_after_max_retries_with_the_sdks_class_and_message():
    async with WireServer(lambda request: WireReply(500, {"error": {"message": "boom"}})) as server:
        base_url = server.base_url
        role = _role(base_url, max_retries=2)
        with pytest.raises(openai.InternalServerError) as caught:
            await role.post("/completions", {"prompt": "a"}, Meter(role.endpoint))
        await role.aclose()
    err = caught.value
    assert isinstance(err, TargetError) and err.status_code == 500
    # The SDK's own message for that answer (openai 3.3 shows the whole body, later versions its message).
    with openai.OpenAI(api_key="x", base_url=base_url) as sdk:
        answer = httpx2.Response(500, json={"error": {"message": "boom"}}, request=httpx2.Request("POST", base_url))
        sdk_message = sdk._make_status_error_from_response(answer).message
    assert sdk_message.startswith("Error code: 500 - ") and "boom" in sdk_message
    assert str(err) == f"target endpoint m @ {base_url}: HTTP 500: {sdk_message}" and err.message == sdk_message
    assert len(server.requests) == 3


async def test_client_errors_are_not_retried():
    async with WireServer(lambda request: WireReply(404, {"error": {"message": "no such model"}})) as server:
        role = _role(server.base_url)
        with pytest.raises(openai.NotFoundError):
            await role.post("/completions", {"prompt": "a"}, Meter(role.endpoint))
        await role.aclose()
    assert len(server.requests) == 1


@pytest.mark.parametrize("status, body", [(429, {"error": {"message": "slow"}}), (400, {"error": {"message": "bad field"}}), (502, b"<html>gateway</html>")])
async def test_errors_match_the_injected_httpx2_path_class_for_class_and_word_for_word(status, body):
    """The same upstream answer raises the same class with the same message on aiohttp as through an
    injected httpx2 client (which is what the tests' mock transports and the simulator use)."""
    async with WireServer(lambda request: WireReply(status, body)) as server:
        lean = _role(server.base_url, max_retries=0)
        injected = _role(server.base_url, max_retries=0, http_client=httpx2.AsyncClient())
        errors = []
        for role in (lean, injected):
            with pytest.raises(TargetError) as caught:
                await role.post("/completions", {"prompt": "a"}, Meter(role.endpoint))
            errors.append(caught.value)
            await role.aclose()
        await injected.endpoint.http_client.aclose()
    assert type(errors[0]) is type(errors[1])
    assert str(errors[0]) == str(errors[1])
    assert errors[0].body == errors[1].body  # type: ignore[attr-defined]


async def test_a_slow_answer_times_out_as_the_sdks_timeout_error_and_is_retried():
    sleep = Sleeps()
    async with WireServer(lambda request: WireReply(body=_completion(), delay=0.5)) as server:
        role = _role(server.base_url, sleep, timeout=0.05, max_retries=1)
        with pytest.raises(openai.APITimeoutError) as caught:
            await role.post("/completions", {"prompt": "a"}, Meter(role.endpoint))
        await role.aclose()
    assert isinstance(caught.value, TargetError)
    assert "APITimeoutError: Request timed out." in str(caught.value)
    assert len(server.requests) == 2 and len(sleep.calls) == 1


async def test_a_per_call_timeout_overrides_the_endpoints():
    async with WireServer(lambda request: WireReply(body=_completion(), delay=0.3)) as server:
        role = _role(server.base_url, timeout=0.05, max_retries=0)
        result = await role.post("/completions", {"prompt": "a"}, Meter(role.endpoint), options={"timeout": 5.0})
        await role.aclose()
    assert result["choices"][0]["text"] == "hi"


async def test_a_dropped_connection_is_a_connection_error_and_is_retried():
    sleep = Sleeps()
    async with WireServer(_script(WireReply(drop=True), WireReply(body=_completion()))) as server:
        role = _role(server.base_url, sleep)
        result = await role.post("/completions", {"prompt": "a"}, Meter(role.endpoint))
        await role.aclose()
    assert result["choices"][0]["text"] == "hi" and len(sleep.calls) == 1


async def test_a_refused_connection_is_the_sdks_connection_error():
    async with WireServer(lambda request: WireReply()) as server:
        base_url = server.base_url
    role = _role(base_url, max_retries=0)  # the server is gone: nothing listens there now
    with pytest.raises(openai.APIConnectionError) as caught:
        await role.post("/completions", {"prompt": "a"}, Meter(role.endpoint))
    await role.aclose()
    assert "APIConnectionError: Connection error." in str(caught.value) and caught.value.role == "target"


async def test_calls_share_pooled_connections():
    import asyncio

    async with WireServer(lambda request: WireReply(body=_completion())) as server:
        role = _role(server.base_url)
        meter = Meter(role.endpoint)
        for _ in range(10):
            await role.post("/completions", {"prompt": "a"}, meter)
        sequential = server.connections
        await asyncio.gather(*(role.post("/completions", {"prompt": "a"}, meter) for _ in range(8)))
        await asyncio.gather(*(role.post("/completions", {"prompt": "a"}, meter) for _ in range(8)))
        await role.aclose()
    assert sequential == 1
    assert server.connections <= 8  # the second burst reuses the first one's connections


async def test_per_call_headers_query_and_the_endpoints_extras_reach_the_wire():
    async with WireServer(lambda request: WireReply(body=_completion())) as server:
        role = _role(server.base_url, headers={"X-Team": "infra"}, extra_body={"repeat_penalty": 1.0})
        options = {"headers": {"X-Call": "7", "x-team": "override"}, "params": {"tenant": "a b"}}
        await role.post("/completions", {"prompt": "ü"}, Meter(role.endpoint), options=options)
        await role.aclose()
    request = server.requests[-1]
    assert request.path == "/v1/completions?tenant=a+b"
    assert request.headers["x-call"] == "7" and request.headers["x-team"] == "override"
    assert request.headers["authorization"] == "Bearer k" and request.headers["content-type"] == "application/json"
    assert request.json() == {"repeat_penalty": 1.0, "prompt": "ü", "model": "m"}
    assert "ü".encode() in request.body  # UTF-8, as the SDK sends it (not \\u escapes)


async def test_a_stream_yields_every_chunk_across_split_events_and_counts_usage():
    chunks = [{"choices": [{"index": 0, "text": t, "finish_reason": None}]} for t in ("a", "b", "c")]
    usage = {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}}
    reply = sse(*chunks, usage, "[DONE]")
    whole = b"".join(reply.chunks or [])
    reply.chunks = [whole[i : i + 7] for i in range(0, len(whole), 7)]  # events cut mid-line
    async with WireServer(lambda request: reply) as server:
        role = _role(server.base_url)
        meter = Meter(role.endpoint)
        received = [chunk async for chunk in role.stream("/completions", {"prompt": "a"}, meter)]
        await role.aclose()
    assert [c["choices"][0]["text"] for c in received if c["choices"]] == ["a", "b", "c"]
    assert server.requests[-1].json()["stream"] is True
    assert (meter.requests, meter.prompt_tokens, meter.completion_tokens) == (1, 3, 3)


async def test_an_error_event_in_a_stream_raises_the_sdks_error_naming_the_role():
    reply = sse({"choices": [{"index": 0, "text": "a", "finish_reason": None}]}, {"error": {"message": "engine died"}})
    async with WireServer(lambda request: reply) as server:
        role = _role(server.base_url)
        with pytest.raises(openai.APIError) as caught:
            async for _ in role.stream("/completions", {"prompt": "a"}, Meter(role.endpoint)):
                pass
        await role.aclose()
    assert isinstance(caught.value, TargetError) and "stream broke: engine died" in str(caught.value)


async def test_a_stream_that_fails_to_open_is_retried_like_a_post():
    sleep = Sleeps()
    limited = WireReply(429, {"error": {"message": "slow"}}, headers={"retry-after-ms": "1500"})
    ok = sse({"choices": [{"index": 0, "text": "a", "finish_reason": "stop"}]}, "[DONE]")
    async with WireServer(_script(limited, ok)) as server:
        role = _role(server.base_url, sleep)
        received = [c async for c in role.stream("/completions", {"prompt": "a"}, Meter(role.endpoint))]
        await role.aclose()
    assert len(received) == 1 and sleep.calls == [1.5]


async def test_a_stream_that_never_opens_stops_after_its_retries_with_backoff_and_names_the_role():
    sleep = Sleeps()
    down = WireReply(503, {"error": {"message": "overloaded"}})
    async with WireServer(_script(down)) as server:
        role = _role(server.base_url, sleep, max_retries=2)
        meter = Meter(role.endpoint)
        with pytest.raises(openai.APIStatusError) as caught:
            async for _ in role.stream("/completions", {"prompt": "a"}, meter):
                pass
        await role.aclose()
    assert len(server.requests) == 3 and meter.failed_requests == 3
    # Exponential backoff with full jitter, from 0.2 s: the first wait in [0.1, 0.2], the second in [0.2, 0.4].
    assert len(sleep.calls) == 2 and 0.1 <= sleep.calls[0] <= 0.2 and 0.2 <= sleep.calls[1] <= 0.4
    assert isinstance(caught.value, TargetError) and caught.value.status_code == 503 and "target" in str(caught.value)


async def test_a_stream_refused_for_good_is_not_retried():
    sleep = Sleeps()
    refused = WireReply(400, {"error": {"message": "bad prompt"}})
    async with WireServer(_script(refused)) as server:
        role = _role(server.base_url, sleep, max_retries=2)
        with pytest.raises(openai.BadRequestError):
            async for _ in role.stream("/completions", {"prompt": "a"}, Meter(role.endpoint)):
                pass
        await role.aclose()
    assert len(server.requests) == 1 and sleep.calls == []


async def test_the_client_end_to_end_over_aiohttp_streams_and_gives_raw_headers_and_closes_cleanly():
    def handler(request):
        body = request.json()
        if body.get("stream"):
            return sse({"id": "c", "object": "text_completion", "created": 0, "model": "m",
                        "choices": [{"index": 0, "text": "hi", "logprobs": None, "finish_reason": "stop"}]}, "[DONE]")
        return WireReply(body=_completion(), headers={"x-request-id": "req-42"})

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        async with WireServer(handler) as server:
            async with AsyncSpeculativeOpenAI(target=Endpoint(model="m", base_url=server.base_url, api_key="k"), verification="none") as client:
                raw = await client.completions.with_raw_response.create(prompt="a", max_tokens=2, temperature=0)
                stream = await client.completions.create(prompt="a", max_tokens=2, temperature=0, stream=True)
                texts = [chunk.choices[0].text async for chunk in stream if chunk.choices]
        gc.collect()
    assert raw.headers["x-request-id"] == "req-42" and raw.parse().choices[0].text == "hi"
    assert "".join(texts) == "hi"
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaked


async def test_an_injected_httpx2_client_carries_the_calls():
    seen = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(json.loads(request.content))
        return httpx2.Response(200, json=_completion())

    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    role = _role("http://mocked.test/v1", http_client=http)
    await role.post("/completions", {"prompt": "a"}, Meter(role.endpoint))
    await role.aclose()
    assert seen == [{"prompt": "a", "model": "m"}]


async def test_an_injected_sdk_clients_http_client_and_headers_are_used():
    seen = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return httpx2.Response(200, json=_completion())

    sdk = openai.AsyncOpenAI(base_url="http://sdk.test/v1", api_key="sk-sdk", http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)))
    role = RoleClient("target", Endpoint(model="m", client=sdk))
    await role.post("/completions", {"prompt": "a"}, Meter(role.endpoint))
    await role.aclose()
    await sdk.close()
    assert str(seen[0].url) == "http://sdk.test/v1/completions"
    assert seen[0].headers["authorization"] == "Bearer sk-sdk"


# ----------------------------------------------------------------------------- pure parts


def test_sse_decoder_handles_split_lines_crlf_comments_and_multiline_data():
    decoder = SSEDecoder()
    stream = b": keep-alive\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\ndata: [DONE]\n\n"
    events = []
    for i in range(len(stream)):
        events += decoder.feed(stream[i : i + 1])
    events += decoder.end()
    assert events == ['{"a":\n1}', "[DONE]"]


@pytest.mark.parametrize("size", [1, 2, 7, 1000])
def test_sse_decoder_reads_events_written_every_way_however_the_bytes_are_split(size):
    stream = (
        'data: {"t":"日本"}\n\n: keep-alive\n\nevent: x\ndata: {"a":\ndata: 1}\n\n\n\ndata:no-space\n\n'
        'data: 🙂 ü\u0301\n\ndata: [DONE]\n\n'
    ).encode()
    decoder = SSEDecoder()
    events = []
    for i in range(0, len(stream), size):
        events += decoder.feed_raw(stream[i : i + size])
    events += decoder.end_raw()
    assert events == ['{"t":"日本"}'.encode(), b'{"a":\n1}', b"no-space", "🙂 ü\u0301".encode(), b"[DONE]"]


def test_sse_decoder_flushes_a_last_event_without_a_blank_line():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: x") == []
    assert decoder.end() == ["x"]


def test_timeouts_are_read_as_the_sdk_takes_them():
    assert timeout_of(3) == Timeout(3.0, 3.0)
    assert timeout_of(None) == Timeout(None, None)
    assert timeout_of(httpx2.Timeout(10.0, connect=2.0, pool=1.0)) == Timeout(3.0, 10.0)


async def test_a_pooled_connection_is_let_go_before_the_server_may_close_it():
    """A server closes a keep-alive connection left idle for its timeout; a request that meets the close
    fails (a POST is not retried). The pool drops idle connections first: below the 5 s that uvicorn
    (vLLM, SGLang) and llama.cpp's server wait, and in the scaled-down run below, below the server's."""
    import asyncio
    import time

    from specapi.transport._http import KEEPALIVE_S, AiohttpTransport

    server_idle = 0.4
    opened = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal opened
        opened += 1
        last = time.monotonic()
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if time.monotonic() - last >= server_idle:
                    return  # the server's idle timer fired as the request came in: closed, no answer
                body = json.dumps(_completion()).encode()
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                last = time.monotonic()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/completions"
    timeout = Timeout(connect=5.0, read=5.0)

    async def twice(keepalive_s: float) -> None:
        transport = AiohttpTransport(keepalive_s=keepalive_s)
        try:
            for _ in range(2):
                reply = await transport.send("POST", url, {"content-type": "application/json"}, b"{}", timeout)
                assert reply.status == 200
                await asyncio.sleep(server_idle + 0.1)
        finally:
            await transport.aclose()

    try:
        await twice(keepalive_s=server_idle / 2)
        assert opened == 2  # the idle connection was dropped, the second request took a new one
        with pytest.raises(openai.APIConnectionError):
            await twice(keepalive_s=server_idle * 10)  # kept past the server's timeout: the request meets the close
    finally:
        server.close()
        await server.wait_closed()
    assert KEEPALIVE_S < 5.0
