"""The openai SDK against the simulator: in-process through httpx2, and over real HTTP through uvicorn."""

import asyncio
import socket
import threading
import time

import httpx2
import openai
import pytest
import uvicorn

from specapi.sim import SimProvider, SimTransport, create_app
from specapi.sim.latency import RecordingSleep


@pytest.fixture
def provider():
    return SimProvider(capabilities="vllm", latency="instant", sleep=RecordingSleep())


@pytest.fixture
async def client(provider):
    http = httpx2.AsyncClient(transport=SimTransport(provider))
    sdk = openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", http_client=http, max_retries=0)
    yield sdk
    await sdk.close()


async def test_sdk_parses_completions_with_echo_logprobs(client, provider):
    result = await client.completions.create(
        model="sim-target", prompt="for item in items:\n", max_tokens=5, temperature=0, echo=True, logprobs=3
    )
    choice = result.choices[0]
    assert choice.text.startswith("for item in items:\n")
    assert choice.logprobs.token_logprobs[0] is None
    assert len(choice.logprobs.tokens) == result.usage.prompt_tokens + 5
    assert result.usage.completion_tokens == 5
    assert provider.calls.last.body["echo"] is True
    assert provider.usage["sim-target"].completion_tokens == result.usage.completion_tokens


async def test_sdk_sends_extra_body_parameters(client):
    result = await client.completions.create(
        model="sim-target", prompt="x = 1\n", max_tokens=2, extra_body={"prompt_logprobs": 1}
    )
    assert result.choices[0].model_extra["prompt_logprobs"][0] is None


async def test_sdk_parses_chat(client):
    result = await client.chat.completions.create(
        model="sim-draft",
        messages=[{"role": "user", "content": "List three colours."}],
        max_tokens=6,
        logprobs=True,
        top_logprobs=3,
        seed=1,
    )
    choice = result.choices[0]
    assert choice.message.role == "assistant"
    assert len(choice.logprobs.content) == 6
    assert len(choice.logprobs.content[0].top_logprobs) == 3
    assert "".join(t.token for t in choice.logprobs.content) == choice.message.content


async def test_sdk_streams_completions_and_chat(client, provider):
    stream = await client.completions.create(
        model="sim-target", prompt="import os\n", max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True},
    )
    texts, usage = [], None
    async for chunk in stream:
        if chunk.choices:
            texts.append(chunk.choices[0].text)
        else:
            usage = chunk.usage
    whole = await client.completions.create(model="sim-target", prompt="import os\n", max_tokens=6, temperature=0)
    assert "".join(texts) == whole.choices[0].text
    assert usage.completion_tokens == 6

    chat = await client.chat.completions.create(
        model="sim-target", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0,
        stream=True, logprobs=True,
    )
    pieces, finish = [], None
    async for chunk in chat:
        pieces.append(chunk.choices[0].delta.content or "")
        finish = chunk.choices[0].finish_reason or finish
    plain = await client.chat.completions.create(
        model="sim-target", messages=[{"role": "user", "content": "hi"}], max_tokens=4, temperature=0
    )
    assert "".join(pieces) == plain.choices[0].message.content
    assert finish == "length"
    assert provider.usage["sim-target"].completion_tokens == 6 + 6 + 4 + 4


async def test_sdk_closing_a_stream_early_bills_what_was_read(client, provider):
    stream = await client.completions.create(model="sim-draft", prompt="x", max_tokens=50, stream=True)
    read = 0
    async for _ in stream:
        read += 1
        if read == 3:
            break
    await stream.close()
    assert provider.usage["sim-draft"].completion_tokens == 3


async def test_sdk_maps_errors(client):
    with pytest.raises(openai.NotFoundError) as not_found:
        await client.completions.create(model="gpt-404", prompt="x")
    assert not_found.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        await client.completions.create(model="sim-target", prompt="x", logprobs=99)


async def test_sdk_lists_models(client):
    models = await client.models.list()
    assert "sim-target" in [m.id for m in models.data]


class _ServerThread:
    """uvicorn serving an app on a free loopback port, in a background thread."""

    def __init__(self, app):
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind(("127.0.0.1", 0))
        self.port = self.socket.getsockname()[1]
        config = uvicorn.Config(app, log_level="warning", lifespan="off", ws="none", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        asyncio.run(self.server.serve(sockets=[self.socket]))

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.socket.close()


async def test_asgi_app_over_real_http():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=3)
    with _ServerThread(create_app(provider)) as server:
        sdk = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key="x", max_retries=0)
        try:
            result = await sdk.completions.create(model="sim-target", prompt="def f():\n", max_tokens=4,
                                                  temperature=0, logprobs=2)
            assert len(result.choices[0].logprobs.tokens) == 4
            stream = await sdk.chat.completions.create(
                model="sim-draft", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True,
                stream_options={"include_usage": True},
            )
            chunks = [chunk async for chunk in stream]
            assert chunks[-1].usage.completion_tokens == 3
            with pytest.raises(openai.NotFoundError):
                await sdk.completions.create(model="nope", prompt="x")
        finally:
            await sdk.close()
    assert [c.status for c in provider.calls] == [200, 200, 404]
