"""The openai SDK's exceptions, raised by specapi: code written with `except openai.RateLimitError` keeps
working, and the same error still says which role and endpoint failed (`specapi.TargetError`).

Each upstream answers every request with one status (an httpx2 MockTransport, no sockets); retries
sleep through a no-op, so the tests never wait.
"""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

import specapi
from specapi import AsyncSpeculativeOpenAI, ConfigurationError, Endpoint, SpeculativeOpenAI, TargetError
from specapi.transport._exceptions import sdk_error_class

STATUSES = [
    (400, openai.BadRequestError),
    (401, openai.AuthenticationError),
    (403, openai.PermissionDeniedError),
    (404, openai.NotFoundError),
    (409, openai.ConflictError),
    (422, openai.UnprocessableEntityError),
    (429, openai.RateLimitError),
    (500, openai.InternalServerError),
    (503, openai.InternalServerError),
]


async def _no_wait(_: float) -> None:
    return None


def _failing(status: int, sent: list[dict]) -> httpx2.MockTransport:
    def handler(request: httpx2.Request) -> httpx2.Response:
        sent.append(json.loads(request.content) if request.content else {})
        body = {"error": {"message": f"upstream says {status}", "type": "invalid_request_error", "param": None, "code": "nope"}}
        return httpx2.Response(status, json=body, headers={"x-request-id": f"req-{status}"})

    return httpx2.MockTransport(handler)


def _client(transport: httpx2.AsyncBaseTransport, **options: object) -> AsyncSpeculativeOpenAI:
    target = Endpoint(base_url="http://target.test/v1", model="big", api_key="x", max_retries=1,
                      http_client=httpx2.AsyncClient(transport=transport))
    return AsyncSpeculativeOpenAI(target=target, drafter="lookup", sleep=_no_wait, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize("status, sdk_class", STATUSES)
@pytest.mark.parametrize("stream", [False, True])
async def test_an_upstream_status_raises_the_sdks_class_and_specapis(status, sdk_class, stream):
    sent: list[dict] = []
    async with _client(_failing(status, sent), verification="none") as client:
        with pytest.raises(sdk_class) as info:
            if stream:
                chunks = await client.completions.create(prompt="hello", max_tokens=4, stream=True)
                async for _ in chunks:
                    pass
            else:
                await client.completions.create(prompt="hello", max_tokens=4)
    err = info.value
    assert isinstance(err, TargetError) and isinstance(err, specapi.SpecAPIError)
    assert err.role == "target" and "target.test" in err.endpoint and "big" in err.endpoint
    assert err.status_code == status and err.response.status_code == status
    assert err.request_id == f"req-{status}" and err.code == "nope"
    assert f"upstream says {status}" in str(err) and "target endpoint" in str(err)
    assert isinstance(err.__cause__, sdk_class)
    assert sent  # the request went out: this is an upstream failure


async def test_except_rate_limit_error_catches_a_429_from_the_target_on_chat():
    async with _client(_failing(429, [])) as client:
        try:
            await client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        except openai.RateLimitError as err:
            caught = err
    assert isinstance(caught, TargetError) and type(caught).__name__ == "TargetRateLimitError"


async def test_timeouts_and_refused_connections_are_the_sdks_connection_errors():
    def timeout(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ReadTimeout("slow", request=request)

    def refused(request: httpx2.Request) -> httpx2.Response:
        raise httpx2.ConnectError("refused", request=request)

    async with _client(httpx2.MockTransport(timeout), verification="none") as client:
        with pytest.raises(openai.APITimeoutError) as info:
            await client.completions.create(prompt="hello", max_tokens=4)
    assert isinstance(info.value, TargetError) and info.value.status_code is None
    async with _client(httpx2.MockTransport(refused), verification="none") as client:
        with pytest.raises(openai.APIConnectionError) as refused_info:
            await client.completions.create(prompt="hello", max_tokens=4)
    assert isinstance(refused_info.value, TargetError) and not isinstance(refused_info.value, openai.APITimeoutError)


def test_the_classes_are_made_once_per_pair():
    assert sdk_error_class(TargetError, openai.RateLimitError) is sdk_error_class(TargetError, openai.RateLimitError)
    assert sdk_error_class(specapi.DraftError, openai.RateLimitError) is not sdk_error_class(TargetError, openai.RateLimitError)
    assert issubclass(sdk_error_class(specapi.DraftError, openai.NotFoundError), specapi.DraftError)


def test_the_sync_client_raises_the_same_classes():
    client = SpeculativeOpenAI(
        target=Endpoint(base_url="http://target.test/v1", model="big", api_key="x", max_retries=0,
                        http_client=httpx2.AsyncClient(transport=_failing(404, []))),
        drafter="lookup",
    )
    with client:
        with pytest.raises(openai.NotFoundError) as info:
            client.completions.create(prompt="hello", max_tokens=4)
        assert isinstance(info.value, TargetError)
        with pytest.raises(openai.NotFoundError):
            for _ in client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True):
                pass
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("nope")


@pytest.mark.parametrize(
    "arguments, param",
    [
        ({"max_tokens": -1}, "max_tokens"),
        ({"temperature": 3.0}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"stop": [""]}, "stop"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"timeout": -2}, "timeout"),
        ({"temperature": float("nan")}, "temperature"),  # JSON has no NaN: never sent
        ({"stream": "yes"}, "stream"),  # a truthy string is no stream (the target alone refuses it too)
        ({"extra_body": {"min_p": float("inf")}}, "extra_body"),
    ],
)
async def test_bad_arguments_are_a_bad_request_and_a_configuration_error_before_any_request(arguments, param):
    sent: list[dict] = []
    async with _client(_failing(500, sent)) as client:
        with pytest.raises(openai.BadRequestError) as info:
            await client.completions.create(prompt="hello", **arguments)
        with pytest.raises(ConfigurationError):
            await client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], **arguments)
    err = info.value
    assert isinstance(err, ConfigurationError) and isinstance(err, ValueError) and isinstance(err, specapi.InvalidRequestError)
    assert err.status_code == 400 and err.param == param and err.type == "invalid_request_error"
    assert sent == []  # nothing was sent


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("verification", ["auto", "none"])
async def test_a_lone_surrogate_is_a_bad_request_naming_the_argument_before_any_request(chat, stream, verification):
    # "\ud800" is valid JSON but no character: UTF-8 cannot carry it, so no server can be sent it.
    sent: list[dict] = []
    async with _client(_failing(500, sent), verification=verification) as client:
        with pytest.raises(openai.BadRequestError) as info:
            if chat:
                await client.chat.completions.create(messages=[{"role": "user", "content": "ok"}, {"role": "user", "content": "\ud800x"}], max_tokens=4, stream=stream)
            else:
                await client.completions.create(prompt="\ud800x", max_tokens=4, stream=stream)
    err = info.value
    assert isinstance(err, specapi.InvalidRequestError) and err.status_code == 400
    assert err.param == ("messages" if chat else "prompt")
    assert ("messages[1].content" if chat else "prompt") in err.message and "surrogate" in err.message
    assert sent == []


async def test_a_lone_surrogate_anywhere_in_the_arguments_is_refused():
    # In a Python string even a high-low pair is two lone surrogates (only JSON's escapes join them).
    sent: list[dict] = []
    async with _client(_failing(500, sent)) as client:
        for arguments in ({"stop": ["ok", "\udc00"]}, {"extra_body": {"grammar": "a\udfff"}}, {"logit_bias": {"\ud801": 1}}, {"prompt": "\ud83d\ude00"}):
            with pytest.raises(openai.BadRequestError, match="surrogate"):
                await client.completions.create(**{"prompt": "hello", **arguments}, max_tokens=4)
        assert sent == []
        with pytest.raises(openai.InternalServerError):  # the emoji itself is sent, and the 500 is the target's
            await client.completions.create(prompt="\U0001f600", max_tokens=4)
    assert any(body.get("prompt") == "\U0001f600" for body in sent)
