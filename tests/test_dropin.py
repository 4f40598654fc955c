"""Libraries that take an SDK client object, on specapi's clients: instructor, LiteLLM, LangChain, and the
SDK's own helpers (`parse`, `stream`, `with_streaming_response`).

The clients are `openai.OpenAI` / `openai.AsyncOpenAI`. Each library's result is compared with the same
library on the plain SDK client against the same target (the oracle: the target alone). The target is
the toy models in-process behind a MockTransport; a request with `response_format` (a JSON schema) or
`tools` gets a JSON answer built from the schema, which the toy's few characters cannot write. Such
requests go to the target alone (constrained output cannot be verified), and say why; plain requests
speculate.
"""

from __future__ import annotations

import json
import os
from typing import Any

import httpx2
import openai
import pytest
from pydantic import BaseModel

from specapi import AsyncSpeculativeOpenAI, Endpoint, SpeculativeOpenAI
from toyserver import TARGET, ToyServer, render_chat

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network: LiteLLM's bundled price map

BASE_URL = "http://structured-toy.test/v1"
MAX_TOKENS = 12
MESSAGES = [{"role": "user", "content": "fa c"}]


class Pet(BaseModel):
    name: str
    legs: int
    tags: list[str]


def _value(schema: dict[str, Any], defs: dict[str, Any]) -> Any:
    """A value of `schema` that depends only on the schema: the toy target's structured answer."""
    if "$ref" in schema:
        return _value(defs[schema["$ref"].rsplit("/", 1)[-1]], defs)
    for union in ("anyOf", "oneOf", "allOf"):
        if union in schema:
            return _value(schema[union][0], defs)
    kind = schema.get("type")
    if kind == "object":
        return {name: _value(sub, defs) for name, sub in schema.get("properties", {}).items()}
    if kind == "array":
        return [_value(schema.get("items", {"type": "string"}), defs)]
    if kind == "integer":
        return 4
    if kind == "number":
        return 2.5
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    return "café 猫"  # text beyond ASCII survives the trip


def _structured(body: dict[str, Any]) -> dict[str, Any]:
    """The answer to a request with a JSON schema or tools: content or a tool call built from the schema."""
    message: dict[str, Any] = {"role": "assistant", "content": None}
    finish = "stop"
    tools = body.get("tools")
    if tools:
        choice = body.get("tool_choice")
        name = choice["function"]["name"] if isinstance(choice, dict) else tools[0]["function"]["name"]
        tool = next(t for t in tools if t["function"]["name"] == name)
        parameters = tool["function"].get("parameters") or {}
        arguments = json.dumps(_value(parameters, parameters.get("$defs", {})), ensure_ascii=False)
        message["tool_calls"] = [{"id": "call_toy_1", "type": "function", "function": {"name": name, "arguments": arguments}}]
        finish = "tool_calls"
    else:
        schema = body["response_format"].get("json_schema", {}).get("schema", {"type": "object"})
        message["content"] = json.dumps(_value(schema, schema.get("$defs", {})), ensure_ascii=False)
    return {
        "id": "chatcmpl-toy", "object": "chat.completion", "created": 1, "model": body.get("model"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 7, "completion_tokens": 9, "total_tokens": 16},
    }


def _chunks(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The structured answer as a stream: the content in three pieces (or the tool call), then the end."""
    base = {key: answer[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    message, finish = answer["choices"][0]["message"], answer["choices"][0]["finish_reason"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("tool_calls"):
        deltas.append({"tool_calls": [{"index": 0, **message["tool_calls"][0]}]})
    else:
        text = message["content"]
        third = max(1, len(text) // 3)
        deltas += [{"content": text[i : i + third]} for i in range(0, len(text), third)]
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "finish_reason": None, "logprobs": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish, "logprobs": None}]})
    return chunks


def _sse(chunks: Any) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


class StructuredToy:
    """The toy models (`target`, `draft`), answering JSON schemas and tools as above; records requests."""

    def __init__(self) -> None:
        self.toy = ToyServer()
        self.requests: list[dict[str, Any]] = []

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content) if request.content else {}
        self.requests.append(body)
        if request.url.path.endswith("/chat/completions") and (body.get("tools") or body.get("response_format")):
            answer = _structured(body)
            if body.get("stream"):
                return httpx2.Response(200, content=_sse(_chunks(answer)), headers={"content-type": "text/event-stream"})
            return httpx2.Response(200, json=answer)
        reply = self.toy.handle(request.method, request.url.path, body, {})
        if reply.stream is not None:
            return httpx2.Response(200, content=_sse(chunk for _, chunk in reply.stream), headers={"content-type": "text/event-stream"})
        return httpx2.Response(reply.status, json=reply.payload, headers=reply.headers)

    def drafts(self) -> int:
        return sum(1 for body in self.requests if body.get("model") == "draft")

    def endpoint(self, model: str) -> Endpoint:
        return Endpoint(model=model, base_url=BASE_URL, api_key="sk-toy", max_retries=0, http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler)))

    def options(self) -> dict[str, Any]:
        # Chat verified by prompt logprobs (no probe), the draft model only, fixed length: requests are deterministic.
        return {"target": self.endpoint("target"), "draft": self.endpoint("draft"), "verification": "prompt-logprobs",
                "policy": "fixed", "drafter": "model", "pipeline": False}

    def sdk(self) -> openai.OpenAI:
        """The plain SDK on the same target: the oracle."""
        return openai.OpenAI(base_url=BASE_URL, api_key="sk-toy", max_retries=0, http_client=httpx2.Client(transport=httpx2.MockTransport(self.handler)))

    def async_sdk(self) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=BASE_URL, api_key="sk-toy", max_retries=0, http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler)))


EXPECTED = TARGET.greedy(render_chat(MESSAGES), MAX_TOKENS)[0]
#: A question the target answers in 17 tokens, ending with its end of text: the SDK's parsing helpers
#: refuse an answer cut at the length limit (`LengthFinishReasonError`), whoever wrote it.
STOPPING = [{"role": "user", "content": "ac"}]
STOPPING_ANSWER, _finish = TARGET.greedy(render_chat(STOPPING), 40)
assert _finish == "stop"


@pytest.fixture
def toy() -> StructuredToy:
    return StructuredToy()


@pytest.fixture
def sync(toy):
    client = SpeculativeOpenAI(**toy.options())
    yield client
    client.close()


@pytest.fixture
async def aclient(toy):
    async with AsyncSpeculativeOpenAI(**toy.options()) as client:
        yield client


# ----------------------------------------------------------------------------- the SDK's client surface


def test_the_clients_are_the_sdks_clients_with_its_attributes(sync, aclient):
    assert isinstance(sync, openai.OpenAI) and isinstance(aclient, openai.AsyncOpenAI)
    for client in (sync, aclient):
        assert client.api_key == "sk-toy" and str(client.base_url) == BASE_URL + "/"
        assert client.max_retries == 0 and client.timeout == 60.0
        copy = client.with_options(timeout=7.5, max_retries=2)
        assert (copy.timeout, copy.max_retries) == (7.5, 2)
        assert (copy.copy(max_retries=1).max_retries, copy.copy().timeout) == (1, 7.5)


async def test_with_options_max_retries_retries_each_upstream_request(toy):
    failures = {"left": 2}

    def flaky(request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        if body.get("model") == "target" and failures["left"]:
            failures["left"] -= 1
            return httpx2.Response(503, json={"error": {"message": "busy", "type": "server_error", "param": None, "code": None}})
        return toy.handler(request)

    async def no_wait(seconds: float) -> None:
        pass

    target = Endpoint(model="target", base_url=BASE_URL, api_key="k", max_retries=0, http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(flaky)))
    async with AsyncSpeculativeOpenAI(target=target, verification="none", sleep=no_wait) as client:
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
        answer = await client.with_options(max_retries=1).chat.completions.create(messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    assert answer.choices[0].message.content == EXPECTED and failures["left"] == 0


async def test_with_options_timeout_bounds_every_call(toy):
    import asyncio

    async def slow(request: httpx2.Request) -> httpx2.Response:
        await asyncio.sleep(5)
        return toy.handler(request)

    target = Endpoint(model="target", base_url=BASE_URL, api_key="k", max_retries=0, http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(slow)))
    async with AsyncSpeculativeOpenAI(target=target, verification="none") as client:
        with pytest.raises(openai.APITimeoutError):
            await client.with_options(timeout=0.05).chat.completions.create(messages=MESSAGES, max_tokens=4)


async def test_other_sdk_resources_go_to_the_target(aclient, toy):
    """What specapi does not speculate (here the SDK's low-level `get`) goes to the target as the SDK
    sends it, on the target's connections."""
    models = await aclient.get("/models", cast_to=object)
    assert {m["id"] for m in models["data"]} >= {"target", "draft"}


# ----------------------------------------------------------------------------- the SDK's helpers


def test_parse_returns_what_the_sdk_parses_from_the_target_alone(sync, toy):
    with toy.sdk() as sdk:
        direct = sdk.chat.completions.parse(model="target", messages=MESSAGES, response_format=Pet)
    ours = sync.chat.completions.parse(messages=MESSAGES, response_format=Pet)
    assert ours.choices[0].message.parsed == direct.choices[0].message.parsed == Pet(name="café 猫", legs=4, tags=["café 猫"])
    assert isinstance(ours, openai.types.chat.ParsedChatCompletion)
    stats = ours.speculative
    assert not stats.speculated and "response_format" in stats.fallback_reason
    sent = [b for b in toy.requests if b.get("response_format")]
    assert sent[0]["response_format"] == sent[1]["response_format"]  # the same JSON schema as the SDK sends
    tools = (tool for tool in [openai.pydantic_function_tool(Pet)])  # any iterable, as the SDK takes
    with toy.sdk() as sdk:
        direct_call = sdk.chat.completions.parse(model="target", messages=MESSAGES, tools=[openai.pydantic_function_tool(Pet)])
    call = sync.chat.completions.parse(messages=MESSAGES, tools=tools).choices[0].message.tool_calls[0]
    assert call.function.parsed_arguments == direct_call.choices[0].message.tool_calls[0].function.parsed_arguments
    assert isinstance(call.function.parsed_arguments, Pet) and call.function.parsed_arguments.legs == 4


async def test_async_parse_without_a_schema_speculates(aclient, toy):
    ours = await aclient.chat.completions.parse(messages=STOPPING, max_tokens=40, temperature=0)
    assert ours.choices[0].message.content == STOPPING_ANSWER and ours.choices[0].message.parsed is None
    assert ours.speculative.speculated and ours.speculative.accepted_tokens > 0
    raw = await aclient.chat.completions.with_raw_response.parse(messages=MESSAGES, response_format=Pet)
    assert raw.parse().choices[0].message.parsed == Pet(name="café 猫", legs=4, tags=["café 猫"])


def test_stream_helper_gives_the_sdks_events_on_a_speculative_stream(sync, toy):
    before = toy.drafts()
    with sync.chat.completions.stream(messages=STOPPING, max_tokens=40, temperature=0) as stream:
        deltas = [event.delta for event in stream if event.type == "content.delta"]
        final = stream.get_final_completion()
    assert "".join(deltas) == final.choices[0].message.content == STOPPING_ANSWER
    assert toy.drafts() > before  # the draft proposed: the stream speculated
    with toy.sdk() as sdk, sdk.chat.completions.stream(model="target", messages=MESSAGES, response_format=Pet) as direct:
        expected = direct.get_final_completion().choices[0].message.parsed
    with sync.chat.completions.stream(messages=MESSAGES, response_format=Pet) as stream:
        assert stream.get_final_completion().choices[0].message.parsed == expected


async def test_async_stream_helper_and_beta_namespace(aclient, toy):
    async with aclient.beta.chat.completions.stream(messages=STOPPING, max_tokens=40, temperature=0) as stream:
        final = await stream.get_final_completion()
    assert final.choices[0].message.content == STOPPING_ANSWER
    async with aclient.chat.completions.stream(messages=MESSAGES, response_format=Pet) as stream:
        assert (await stream.get_final_completion()).choices[0].message.parsed == Pet(name="café 猫", legs=4, tags=["café 猫"])


def test_with_streaming_response_sync_and_raw_parse(sync):
    with sync.chat.completions.with_streaming_response.create(messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0) as response:
        assert response.headers["x-specapi-speculated"] == "true"
        chat = response.parse()
    assert chat.choices[0].message.content == EXPECTED and chat.speculative.accepted_tokens > 0
    with sync.completions.with_streaming_response.create(prompt="fa c", max_tokens=MAX_TOKENS, temperature=0, stream=True) as response:
        text = "".join(chunk.choices[0].text for chunk in response.parse() if chunk.choices)
    assert text == TARGET.greedy("fa c", MAX_TOKENS)[0]
    raw = sync.chat.completions.with_raw_response.parse(messages=MESSAGES, response_format=Pet)
    assert isinstance(raw, openai._legacy_response.LegacyAPIResponse)
    assert raw.parse().choices[0].message.parsed.legs == 4


async def test_with_streaming_response_async(aclient):
    async with aclient.chat.completions.with_streaming_response.create(messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0) as response:
        chat = await response.parse()
    assert chat.choices[0].message.content == EXPECTED and chat.speculative.speculated


# ----------------------------------------------------------------------------- instructor


def test_instructor_sync_gives_the_target_alones_model(sync, toy):
    import instructor

    client = instructor.from_openai(sync)
    pet, completion = client.chat.completions.create_with_completion(response_model=Pet, messages=MESSAGES)
    with toy.sdk() as sdk:
        direct = instructor.from_openai(sdk).chat.completions.create(model="target", response_model=Pet, messages=MESSAGES)
    assert pet.model_dump() == direct.model_dump() == {"name": "café 猫", "legs": 4, "tags": ["café 猫"]}
    assert not completion.speculative.speculated and "tool" in completion.speculative.fallback_reason
    plain = client.chat.completions.create(response_model=None, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0)
    assert plain.choices[0].message.content == EXPECTED and plain.speculative.speculated  # no schema: it speculates


async def test_instructor_async_gives_the_target_alones_model(aclient, toy):
    import instructor

    client = instructor.from_openai(aclient)
    pet = await client.chat.completions.create(response_model=Pet, messages=MESSAGES)
    async with toy.async_sdk() as sdk:
        direct = await instructor.from_openai(sdk).chat.completions.create(model="target", response_model=Pet, messages=MESSAGES)
    assert pet.model_dump() == direct.model_dump() == {"name": "café 猫", "legs": 4, "tags": ["café 猫"]}


# ----------------------------------------------------------------------------- LiteLLM


# LiteLLM's own stream handling warns (its TypedDicts, and pydantic attributes it reads on instances),
# whoever the client is; warnings are errors here.
@pytest.mark.filterwarnings("ignore:Item '.*' on TypedDict class '.*' is using the .ReadOnly. qualifier:UserWarning")
@pytest.mark.filterwarnings("ignore:Accessing the '.*' attribute on the instance is deprecated")
def test_litellm_completion_with_the_client_speculates_and_gives_the_targets_text(sync, toy):
    import litellm

    before = toy.drafts()
    response = litellm.completion(model="openai/target", messages=MESSAGES, client=sync, max_tokens=MAX_TOKENS, temperature=0)
    assert response.choices[0].message.content == EXPECTED
    assert toy.drafts() > before  # speculation ran
    with toy.sdk() as sdk:
        direct = litellm.completion(model="openai/target", messages=MESSAGES, client=sdk, max_tokens=MAX_TOKENS, temperature=0)
    assert direct.choices[0].message.content == EXPECTED
    streamed = litellm.completion(model="openai/target", messages=MESSAGES, client=sync, max_tokens=MAX_TOKENS, temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed) == EXPECTED


@pytest.mark.filterwarnings("ignore:Item '.*' on TypedDict class '.*' is using the .ReadOnly. qualifier:UserWarning")
@pytest.mark.filterwarnings("ignore:Accessing the '.*' attribute on the instance is deprecated")
async def test_litellm_acompletion_with_the_async_client(aclient, toy):
    import litellm

    before = toy.drafts()
    response = await litellm.acompletion(model="openai/target", messages=MESSAGES, client=aclient, max_tokens=MAX_TOKENS, temperature=0)
    assert response.choices[0].message.content == EXPECTED and toy.drafts() > before
    streamed = await litellm.acompletion(model="openai/target", messages=MESSAGES, client=aclient, max_tokens=MAX_TOKENS, temperature=0, stream=True)
    assert "".join([chunk.choices[0].delta.content or "" async for chunk in streamed]) == EXPECTED


# ----------------------------------------------------------------------------- LangChain


def _chat_models(toy: StructuredToy, sync: SpeculativeOpenAI, aclient: AsyncSpeculativeOpenAI) -> tuple[Any, Any]:
    from langchain_openai import ChatOpenAI

    ours = ChatOpenAI(
        model="target", api_key="unused", temperature=0, max_tokens=MAX_TOKENS,
        root_client=sync, client=sync.chat.completions, root_async_client=aclient, async_client=aclient.chat.completions,
    )
    direct = ChatOpenAI(
        model="target", api_key="sk-toy", base_url=BASE_URL, temperature=0, max_tokens=MAX_TOKENS, max_retries=0,
        http_client=httpx2.Client(transport=httpx2.MockTransport(toy.handler)),
        http_async_client=httpx2.AsyncClient(transport=httpx2.MockTransport(toy.handler)),
    )
    return ours, direct


async def test_langchain_with_structured_output_and_bind_tools(toy, sync, aclient):
    ours, direct = _chat_models(toy, sync, aclient)
    question = [("user", "fa c")]
    expected_pet = direct.with_structured_output(Pet).invoke(question)
    assert ours.with_structured_output(Pet).invoke(question) == expected_pet == Pet(name="café 猫", legs=4, tags=["café 猫"])
    assert await ours.with_structured_output(Pet).ainvoke(question) == expected_pet
    expected_calls = direct.bind_tools([Pet]).invoke(question).tool_calls
    assert ours.bind_tools([Pet]).invoke(question).tool_calls == expected_calls
    assert (await ours.bind_tools([Pet]).ainvoke(question)).tool_calls == expected_calls
    assert expected_calls[0]["args"] == {"name": "café 猫", "legs": 4, "tags": ["café 猫"]}
    before = toy.drafts()
    assert ours.invoke(question).content == EXPECTED and toy.drafts() > before  # plain: it speculates
