"""`stream=True`: SDK chunk types, text as each round accepts it, usage and statistics at the end, and
closing early. Against the toy server over real loopback HTTP, since streams are an HTTP concern."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx2
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from specapi import AsyncSpeculativeOpenAI, Endpoint, SpeculativeOpenAI, TargetError
from toyserver import TARGET, ToyServer, render_chat, tokenize

PROMPT = "cafe"
MESSAGES = [{"role": "user", "content": "fa"}]


@pytest.fixture(scope="module")
def srv():
    with ToyServer() as s:
        yield s


def options(srv: ToyServer, **overrides: Any) -> dict:
    async def no_sleep(seconds: float) -> None:
        return None

    return {
        "target": Endpoint(model="target", base_url=srv.base_url, api_key="x", max_retries=1),
        "draft": Endpoint(model="draft", base_url=srv.base_url, api_key="x", max_retries=1),
        "num_speculative_tokens": 4,
        "policy": "fixed",
        "drafter": "model",
        "verification": "prompt-logprobs",  # echo for completions, vLLM prompt_logprobs for chat
        "sleep": no_sleep,
        **overrides,
    }


@pytest.fixture
async def client(srv):
    async with AsyncSpeculativeOpenAI(**options(srv)) as c:
        yield c


def greedy(prompt: str, max_tokens: int) -> str:
    text, finish = TARGET.greedy(prompt, max_tokens)
    assert finish == "length" and TARGET.greedy(prompt, max_tokens + 2)[1] == "length"  # a clean case
    return text


def target_requests(srv: ToyServer) -> int:
    return len(srv.requests_for("target")) + len(srv.requests_for("draft"))


async def test_completion_stream_yields_sdk_chunks_spelling_the_greedy_text(client):
    stream = await client.completions.create(prompt=PROMPT, max_tokens=20, temperature=0, stream=True)
    assert stream.speculative is None  # not before the end
    chunks = [chunk async for chunk in stream]
    assert all(isinstance(c, Completion) for c in chunks)
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == greedy(PROMPT, 20)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert sum(1 for c in chunks if c.choices and c.choices[0].text) > 1  # text arrives round by round
    s = stream.speculative
    assert s is not None and s.speculated and s.generated_tokens == 20
    assert chunks[-1].speculative is s
    plain = await client.completions.create(prompt=PROMPT, max_tokens=20, temperature=0)
    assert plain.choices[0].text == text


async def test_chat_stream_yields_sdk_chunks_spelling_the_greedy_text(client):
    stream = await client.chat.completions.create(messages=MESSAGES, max_tokens=20, temperature=0, stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    text = "".join(d.content or "" for d in deltas)
    assert text == greedy(render_chat(MESSAGES), 20)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert stream.speculative is not None and stream.speculative.speculated
    plain = await client.chat.completions.create(messages=MESSAGES, max_tokens=20, temperature=0)
    assert plain.choices[0].message.content == text


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_include_usage_adds_a_final_usage_chunk(client, chat):
    if chat:
        stream = await client.chat.completions.create(
            messages=MESSAGES, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True}
        )
        prompt_tokens = len(tokenize(render_chat(MESSAGES)))
    else:
        stream = await client.completions.create(prompt=PROMPT, max_tokens=12, temperature=0, stream=True, stream_options={"include_usage": True})
        prompt_tokens = len(tokenize(PROMPT))
    chunks = [chunk async for chunk in stream]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 12 == stream.speculative.generated_tokens
    assert last.usage.prompt_tokens == prompt_tokens
    assert last.usage.total_tokens == prompt_tokens + 12
    assert all(c.usage is None for c in chunks[:-1])
    assert chunks[-2].choices[0].finish_reason == "length"


async def test_without_include_usage_no_chunk_carries_usage(client):
    stream = await client.completions.create(prompt=PROMPT, max_tokens=8, temperature=0, stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(c.usage is None and c.choices for c in chunks)


async def test_stream_with_stop_string_ends_at_it(client):
    full = greedy(PROMPT, 20)
    stop = full[9:11]
    stream = await client.completions.create(prompt=PROMPT, max_tokens=20, temperature=0, stream=True, stop=stop)
    chunks = [chunk async for chunk in stream]
    text = "".join(c.choices[0].text for c in chunks)
    assert text == full[: full.index(stop)]
    assert chunks[-1].choices[0].finish_reason == "stop"


async def test_stop_string_across_a_chunk_boundary_is_never_streamed(srv, client):
    """Text already sent cannot be taken back: a stop string that begins in one round's text and ends in
    the next must not leak its first part (the non-streamed text is built from the same pieces)."""
    full = greedy(PROMPT, 40)
    stream = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0, stream=True)
    pieces = [c.choices[0].text async for c in stream if c.choices and c.choices[0].text]
    assert "".join(pieces) == full and len(pieces) > 2
    stop = None
    position = 0
    for piece, following in zip(pieces, pieces[1:]):
        position += len(piece)
        candidate = full[position - 1 : position + 1]  # last char of one chunk + first of the next
        if full.index(candidate) == position - 1:  # its first occurrence is across this boundary
            stop = candidate
            break
    assert stop is not None, "no chunk boundary to test across"
    want = full[: full.index(stop)]
    stream = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0, stream=True, stop=stop)
    streamed = "".join([c.choices[0].text async for c in stream if c.choices])
    assert streamed == want, (stop, pieces)
    resp = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0, stop=stop)
    assert (resp.choices[0].text, resp.choices[0].finish_reason) == (want, "stop")


async def test_closing_a_stream_before_reading_sends_nothing(srv, client):
    before = target_requests(srv)
    stream = await client.completions.create(prompt=PROMPT, max_tokens=50, temperature=0, stream=True)
    await stream.close()
    await asyncio.sleep(0.1)
    assert target_requests(srv) == before


async def test_unverifiable_stream_without_usage_does_not_claim_it_cost_nothing(srv):
    """The target's stream carries no usage unless asked: the statistics may not report 0 tokens and $0."""
    target = Endpoint(model="target", base_url=srv.base_url, api_key="x", input_price_per_mtok=5, output_price_per_mtok=15)
    async with AsyncSpeculativeOpenAI(**options(srv, target=target)) as c:
        stream = await c.completions.create(prompt=PROMPT, max_tokens=10, temperature=0, stream=True, extra_body={"repeat_penalty": 1.3})
        chunks = [chunk async for chunk in stream]
    assert all(chunk.usage is None for chunk in chunks)  # the caller did not ask for a usage chunk
    s = stream.speculative
    assert s.generated_tokens == 10, f"generated_tokens={s.generated_tokens}"
    assert s.target.cost_usd is None or s.target.cost_usd > 0, f"cost_usd={s.target.cost_usd}"


async def test_unverifiable_request_streams_the_target_own_stream(srv, client):
    before = len(srv.requests_for("draft"))
    stream = await client.completions.create(
        prompt=PROMPT, max_tokens=10, temperature=0, stream=True, stream_options={"include_usage": True}, extra_body={"repeat_penalty": 1.3}
    )
    chunks = [chunk async for chunk in stream]
    assert all(isinstance(c, Completion) for c in chunks)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == greedy(PROMPT, 10)  # the toy ignores repeat_penalty
    s = stream.speculative
    assert s is not None and s.speculated is False and "repeat_penalty" in s.fallback_reason
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 10
    assert len(srv.requests_for("draft")) == before
    [body] = [b for b in srv.requests_for("target")[-1:]]
    assert body["stream"] is True and body["repeat_penalty"] == 1.3


async def test_closing_a_stream_early_stops_upstream_requests(srv, client):
    long = 300
    assert TARGET.greedy(PROMPT, long)[1] == "length"
    before = target_requests(srv)
    stream = await client.completions.create(prompt=PROMPT, max_tokens=long, temperature=0, stream=True)
    first = await stream.__anext__()
    assert first.choices[0].text
    await stream.close()
    at_close = target_requests(srv)
    await asyncio.sleep(0.3)  # anything still scheduled would have reached the server by now
    assert target_requests(srv) == at_close
    assert at_close - before < 10  # a full 300-token run needs dozens of rounds
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()


async def test_leaving_an_async_with_block_closes_the_stream(srv, client):
    before = target_requests(srv)
    stream = await client.chat.completions.create(messages=MESSAGES, max_tokens=300, temperature=0, stream=True)
    async with stream:
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                break
    at_close = target_requests(srv)
    await asyncio.sleep(0.3)
    assert target_requests(srv) == at_close and at_close - before < 10


async def test_target_failing_mid_stream_raises_after_only_correct_text(srv):
    async with AsyncSpeculativeOpenAI(**options(srv)) as c:
        stream = await c.completions.create(prompt=PROMPT, max_tokens=40, temperature=0, stream=True)
        received = ""
        with pytest.raises(TargetError) as info:
            async for chunk in stream:
                received += chunk.choices[0].text
                if received:
                    srv.fail_next(1000, 500, model="target")
        srv.clear_faults()
    assert received and greedy(PROMPT, 40).startswith(received)
    assert info.value.role == "target" and isinstance(info.value.__cause__, openai.APIStatusError)


def test_sync_client_stream(srv):
    with SpeculativeOpenAI(**options(srv)) as c:
        stream = c.completions.create(prompt=PROMPT, max_tokens=16, temperature=0, stream=True)
        chunks = list(stream)
        assert all(isinstance(ch, Completion) for ch in chunks)
        assert "".join(ch.choices[0].text for ch in chunks) == greedy(PROMPT, 16)
        assert stream.speculative is not None and stream.speculative.generated_tokens == 16
        chat = c.chat.completions.create(messages=MESSAGES, max_tokens=10, temperature=0, stream=True)
        assert "".join(ch.choices[0].delta.content or "" for ch in chat) == greedy(render_chat(MESSAGES), 10)


def test_sync_stream_closed_early_stops_upstream_requests(srv):
    with SpeculativeOpenAI(**options(srv)) as c:
        before = target_requests(srv)
        with c.completions.create(prompt=PROMPT, max_tokens=300, temperature=0, stream=True) as stream:
            assert next(stream).choices[0].text
        at_close = target_requests(srv)
        time.sleep(0.3)
        assert target_requests(srv) == at_close and at_close - before < 10


async def test_default_options_stream_exactly_too(srv):
    async with AsyncSpeculativeOpenAI(target=options(srv)["target"], draft=options(srv)["draft"]) as c:
        stream = await c.completions.create(prompt=PROMPT, max_tokens=20, temperature=0, stream=True)
        text = "".join([chunk.choices[0].text async for chunk in stream])
    assert text == greedy(PROMPT, 20)
    assert stream.speculative is not None


# ----------------------------------------------------------------------------- the target's own stream (pass-through)


class _EndlessSSE(httpx2.AsyncByteStream):
    """A long completion stream that records how much was sent and whether the client closed it."""

    def __init__(self) -> None:
        self.sent = 0
        self.closed = False

    async def __aiter__(self):
        for _ in range(500):
            self.sent += 1
            chunk = {"id": "c", "object": "text_completion", "created": 0, "model": "target",
                     "choices": [{"index": 0, "text": "a", "logprobs": None, "finish_reason": None}]}
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
            await asyncio.sleep(0)
        yield b"data: [DONE]\n\n"

    async def aclose(self) -> None:
        self.closed = True


async def test_closing_an_unverifiable_stream_early_closes_the_upstream_response():
    """A pass-through stream closed by the caller must close the target's response (else the connection
    stays checked out and a hosted target keeps generating, and billing, to the end)."""
    body = _EndlessSSE()
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=body))
    target = Endpoint(model="target", base_url="http://sse.test/v1", api_key="x", http_client=httpx2.AsyncClient(transport=transport))
    async with AsyncSpeculativeOpenAI(target=target, verification="none") as c:
        stream = await c.completions.create(prompt="x", max_tokens=500, stream=True, extra_body={"top_k": 3})
        received = 0
        async for _ in stream:
            received += 1
            if received == 3:
                break
        await stream.close()
        await asyncio.sleep(0.05)
        assert body.sent < 500
        assert body.closed, "the upstream response was left open"


class _GatedSSE(httpx2.AsyncByteStream):
    """A completion stream that sends `before` text chunks, then waits for `gate` before the rest: a
    relay that holds a chunk back until the next one arrives never hands the first ones over."""

    def __init__(self, before: int, after: list[dict], gate: asyncio.Event) -> None:
        self.before, self.after, self.gate = before, after, gate

    async def __aiter__(self):
        for i in range(self.before):
            yield _sse({"choices": [{"index": 0, "text": f"t{i} ", "logprobs": None, "finish_reason": None}]})
        await self.gate.wait()
        for chunk in self.after:
            yield _sse(chunk)
        yield b"data: [DONE]\n\n"


def _sse(fields: dict) -> bytes:
    return b"data: " + json.dumps({"id": "c", "object": "text_completion", "created": 0, "model": "target", **fields}).encode() + b"\n\n"


def _gated_client(body: _GatedSSE) -> AsyncSpeculativeOpenAI:
    transport = httpx2.MockTransport(lambda request: httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=body))
    target = Endpoint(model="target", base_url="http://sse.test/v1", api_key="x", http_client=httpx2.AsyncClient(transport=transport))
    return AsyncSpeculativeOpenAI(target=target, verification="none")


async def test_a_passed_through_stream_hands_each_text_chunk_on_before_the_next_arrives():
    """Requests served by the target alone as they are (here `logit_bias`) relay the target's own
    stream: its text must not wait for the next chunk, which may be a whole token's time away."""
    gate = asyncio.Event()
    usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
    after = [
        {"choices": [{"index": 0, "text": "t2", "logprobs": None, "finish_reason": "length"}]},
        {"choices": [], "usage": usage},
    ]
    async with _gated_client(_GatedSSE(2, after, gate)) as c:
        stream = await c.completions.create(prompt="x", max_tokens=3, stream=True, logit_bias={"1": 5})
        first = await asyncio.wait_for(stream.__anext__(), timeout=5)
        second = await asyncio.wait_for(stream.__anext__(), timeout=5)
        assert [first.choices[0].text, second.choices[0].text] == ["t0 ", "t1 "]
        assert stream.speculative is None
        gate.set()
        rest = [chunk async for chunk in stream]
    assert [chunk.choices[0].text for chunk in rest] == ["t2"]  # the usage chunk was not asked for
    assert rest[-1].choices[0].finish_reason == "length"
    assert rest[-1].speculative is stream.speculative  # the statistics ride on the last chunk
    assert stream.speculative.speculated is False and "logit_bias" in stream.speculative.fallback_reason
    assert stream.speculative.generated_tokens == 3


async def test_a_passed_through_stream_that_ends_without_a_finish_gets_one_more_chunk_for_the_statistics():
    gate = asyncio.Event()
    gate.set()
    async with _gated_client(_GatedSSE(3, [], gate)) as c:
        stream = await c.completions.create(prompt="x", max_tokens=3, stream=True, logit_bias={"1": 5})
        chunks = [chunk async for chunk in stream]
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == "t0 t1 t2 "
    assert chunks[-1].choices == [] and chunks[-1].id == "c" and chunks[-1].model == "target"
    assert chunks[-1].speculative is stream.speculative and stream.speculative.speculated is False


async def test_unverifiable_stream_request_is_retried_on_transient_errors(srv):
    """Opening the target's stream is a request like any other: a 429 is retried after Retry-After."""
    sleeps: list[float] = []

    async def recording_sleep(seconds: float) -> None:
        sleeps.append(seconds)

    srv.fail_next(1, 429, model="target", retry_after=2)
    try:
        async with AsyncSpeculativeOpenAI(**options(srv, sleep=recording_sleep)) as c:
            stream = await c.completions.create(prompt=PROMPT, max_tokens=10, temperature=0, stream=True, extra_body={"repeat_penalty": 1.3})
            text = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
    finally:
        srv.clear_faults()
    assert text == greedy(PROMPT, 10)
    assert sleeps == [2.0]


@pytest.mark.parametrize("kind", ["completions", "chat"])
async def test_a_target_alone_stream_arrives_token_by_token(srv, kind):
    """When nothing is speculated (here: verification="none"), the target's own stream is relayed as it
    comes, not collected into one piece at the end. The server paces its tokens, as a real one does:
    chunks that arrive together in one read are relayed together."""
    srv.set_delay(TARGET.name, per_token=0.01)
    async with AsyncSpeculativeOpenAI(**options(srv, verification="none")) as c:
        if kind == "chat":
            stream = await c.chat.completions.create(messages=MESSAGES, max_tokens=12, temperature=0, stream=True)
            pieces = [ch.choices[0].delta.content for ch in [x async for x in stream] if ch.choices and ch.choices[0].delta.content]
            expected = TARGET.greedy(render_chat(MESSAGES), 12)[0]
        else:
            stream = await c.completions.create(prompt=PROMPT, max_tokens=12, temperature=0, stream=True)
            pieces = [ch.choices[0].text for ch in [x async for x in stream] if ch.choices and ch.choices[0].text]
            expected = TARGET.greedy(PROMPT, 12)[0]
    assert "".join(pieces) == expected
    assert len(pieces) > 1  # token by token, not one piece
    assert stream.speculative is not None and not stream.speculative.speculated
    assert stream.speculative.generated_tokens == len(tokenize(expected))
    assert srv.requests_for("target")[-1].get("stream") is True


async def test_chunks_that_arrive_together_are_relayed_together_and_still_counted_one_by_one(srv):
    """An unpaced server's chunks come in one read: they go on as fewer pieces (the work per piece
    done once), with the same text and the same token count."""
    async with AsyncSpeculativeOpenAI(**options(srv, verification="none")) as c:
        stream = await c.completions.create(prompt=PROMPT, max_tokens=12, temperature=0, stream=True)
        pieces = [ch.choices[0].text for ch in [x async for x in stream] if ch.choices and ch.choices[0].text]
    expected = TARGET.greedy(PROMPT, 12)[0]
    assert "".join(pieces) == expected and len(pieces) <= len(tokenize(expected))
    assert stream.speculative.generated_tokens == len(tokenize(expected))


async def test_next_data_gives_the_chunks_as_json_objects_with_the_statistics_set_at_the_end():
    """What the proxy sends on: the same chunks as the SDK objects, as plain JSON objects."""
    from specapi.engine.engine import Finished, Piece
    from specapi.surface.streaming import SpeculativeStream, completion_chunks, parse_completion

    class _Stats:
        pass

    stats = _Stats()

    async def events():
        yield 0, Piece(text="Hel")
        yield 0, Piece(text="lo")
        yield 0, Finished(finish_reason="stop", stats=stats, completion_tokens=2, prompt_tokens=3)

    stream = SpeculativeStream(completion_chunks(events(), "m", include_usage=False), parse_completion)
    chunks = []
    while (data := await stream.next_data()) is not None:
        chunks.append(data)
    assert [c["choices"][0]["text"] for c in chunks] == ["Hel", "lo", ""]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and "_speculative" not in chunks[-1]
    assert stream.speculative is stats
    json.dumps(chunks)  # JSON as it is
