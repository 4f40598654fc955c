"""`specapi serve` as a pass-through: what the target alone answers reaches the caller unchanged.

Every usage field the target sends (`prompt_tokens_details.cached_tokens`, `completion_tokens_details`,
a vendor's own), every field of its error object, echo with logprobs (a null first logprob) and
`max_tokens=0` with echo. The oracle is the same request sent to the target directly; the target is
the toy models behind a MockTransport that adds those fields to every answer.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import pytest

from test_server_support import PROXY_KEY, no_sleep, parse_sse, running_proxy
from toyserver import ToyServer

BASE_URL = "http://billing.test/v1"


class BillingToy:
    """The toy models, whose answers carry OpenAI's detailed usage and a vendor's field, and whose
    400s carry a vendor's field in the error object."""

    def __init__(self) -> None:
        self.toy = ToyServer()

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        reply = self.toy.handle("POST", request.url.path, body, {})
        if reply.status != 200:
            payload = reply.payload
            if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
                payload = {"error": {**payload["error"], "vendor_detail": "toy-tokenizer"}}
            return httpx2.Response(reply.status, json=payload, headers=reply.headers)
        if reply.stream is not None:
            return httpx2.Response(200, content=b"".join(self._billed_events(reply.stream)), headers={"content-type": "text/event-stream"})
        return httpx2.Response(200, json=self._billed(reply.payload), headers=reply.headers)

    @staticmethod
    def _billed(payload: dict[str, Any]) -> dict[str, Any]:
        usage = payload.get("usage")
        if isinstance(usage, dict):
            prompt, completion = usage["prompt_tokens"], usage["completion_tokens"]
            usage["prompt_tokens_details"] = {"cached_tokens": prompt // 2, "audio_tokens": 0}
            usage["completion_tokens_details"] = {
                "reasoning_tokens": completion // 3, "audio_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0,
            }
            usage["queue_time_s"] = 0.25
        return payload

    def _billed_events(self, stream: Any) -> Any:
        for _delay, chunk in stream:
            yield b"data: " + json.dumps(self._billed(chunk)).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"

    def endpoint(self, model: str) -> Any:
        from specapi import Endpoint

        return Endpoint(model=model, base_url=BASE_URL, api_key="sk-billing-toy-key", max_retries=0, http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler)))

    def direct(self, path: str, body: dict[str, Any]) -> httpx2.Response:
        with httpx2.Client(transport=httpx2.MockTransport(self.handler), base_url=BASE_URL) as client:
            return client.post(path, json={"model": "target", **body})


@pytest.fixture(scope="module", params=["auto", "none"])
def setup(request):
    """The proxy speculating (auto), and the proxy with verification off (every answer one target call)."""
    toy = BillingToy()
    options = {"policy": "fixed", "sleep": no_sleep, "verification": request.param}
    with ToyServer() as unused, running_proxy(unused, target=toy.endpoint("target"), draft=toy.endpoint("draft"), client_options=options) as proxy:
        with httpx2.Client(base_url=proxy.url, headers={"authorization": f"Bearer {PROXY_KEY}"}, timeout=30) as http:
            yield toy, http, request.param


def _same_answer(proxied: dict[str, Any], direct: dict[str, Any]) -> None:
    """The same answer, fields that name one response (`id`, `created`) aside."""
    for name in ("id", "created", "speculative"):
        proxied.pop(name, None)
        direct.pop(name, None)
    assert proxied == direct


TARGET_ALONE = [
    ("/completions", {"prompt": "fa c", "max_tokens": 4, "temperature": 0, "echo": True, "logprobs": 1}),
    ("/completions", {"prompt": "dd e", "max_tokens": 0, "echo": True, "logprobs": 1}),
    ("/completions", {"prompt": "dd e", "max_tokens": 0, "echo": True}),
]
#: Requests whose logprobs speculate (test_logprobs.py): the choices are the target's all the same.
WITH_LOGPROBS = [
    ("/completions", {"prompt": "ab", "max_tokens": 6, "temperature": 0, "logprobs": 2}),
    ("/chat/completions", {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 6, "temperature": 0, "logprobs": True, "top_logprobs": 2}),
]


@pytest.mark.parametrize(("path", "body"), WITH_LOGPROBS)
def test_a_request_with_logprobs_gets_the_targets_choices(setup, path, body):
    data, direct = _both_answers(setup, path, body)
    [mine], [theirs] = _rounded(data["choices"]), _rounded(direct["choices"])
    for name in ("text", "message", "finish_reason", "logprobs"):
        if name == "message" and name in theirs:
            assert mine[name]["content"] == theirs[name]["content"]
        else:
            assert mine.get(name) == theirs.get(name)


def _both_answers(setup, path: str, body: dict) -> tuple[dict, dict]:  # type: ignore[no-untyped-def]
    """The proxy's answer to `body` on `path`, and the toy target's own for the same request (both 200)."""
    toy, http, _ = setup
    direct = toy.direct(path, body)
    assert direct.status_code == 200, direct.text
    response = http.post("/v1" + path, json=body)
    assert response.status_code == 200, response.text
    return response.json(), direct.json()


def _rounded(value):  # type: ignore[no-untyped-def]
    """The JSON with its floats to 9 places: logprobs equal within float rounding."""
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return round(value, 9) if isinstance(value, float) else value


@pytest.mark.parametrize(("path", "body"), TARGET_ALONE)
def test_a_request_served_by_the_target_alone_is_its_answer_every_field(setup, path, body):
    data, direct = _both_answers(setup, path, body)
    assert data["speculative"]["speculated"] is False
    assert data["usage"]["prompt_tokens_details"]["cached_tokens"] == direct["usage"]["prompt_tokens_details"]["cached_tokens"]
    _same_answer(data, direct)


@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_usage_of_an_answer_the_target_wrote_in_one_call_is_its_own(setup, path):
    """With verification off (or a request the engine hands to the target), one target call writes the
    answer: its usage object goes on with every field; a speculated answer counts its own tokens."""
    toy, http, verification = setup
    body = {"prompt": "cafe"} if path == "/completions" else {"messages": [{"role": "user", "content": "cafe"}]}
    body = {**body, "max_tokens": 12, "temperature": 0}
    direct = toy.direct(path, body).json()
    data = http.post("/v1" + path, json=body).json()
    text = (lambda d: d["choices"][0].get("text") or d["choices"][0]["message"]["content"])
    assert text(data) == text(direct)
    usage, expected = data["usage"], direct["usage"]
    if verification == "none":
        assert data["speculative"]["speculated"] is False
        assert usage == expected  # details and the vendor's field included
    else:
        assert data["speculative"]["speculated"] is True
        assert {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
            k: expected[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
        }
        assert data["speculative"]["target"]["cached_tokens"] > 0  # the cached tokens it billed, summed over its calls


def test_a_streamed_answer_carries_the_usage_the_json_answer_does(setup):
    toy, http, verification = setup
    body = {"messages": [{"role": "user", "content": "fa c"}], "max_tokens": 10, "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    direct = toy.direct("/chat/completions", {**body, "stream": False}).json()
    response = http.post("/v1/chat/completions", json=body)
    events = [e for e in parse_sse(response.text) if e != "[DONE]"]
    assert "".join(c["delta"].get("content") or "" for e in events for c in e["choices"]) == direct["choices"][0]["message"]["content"]
    usage = [e["usage"] for e in events if e.get("usage")]
    assert len(usage) == 1
    if verification == "none":  # one target call wrote it: its usage, every field
        assert usage == [direct["usage"]]
    else:  # speculated: the answer's own token counts
        assert {k: usage[0][k] for k in ("prompt_tokens", "completion_tokens")} == {k: direct["usage"][k] for k in ("prompt_tokens", "completion_tokens")}


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/completions", {"prompt": "xyz", "max_tokens": 4, "temperature": 0}),
        ("/completions", {"prompt": "ab", "max_tokens": 4, "temperature": 0, "top_k": "many"}),
        ("/chat/completions", {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 4, "temperature": 0, "top_k": "many"}),
        ("/completions", {"prompt": "ab", "max_tokens": 4, "logprobs": 99}),
        ("/chat/completions", {"messages": [{"role": "user", "content": "ab"}], "max_tokens": 4, "temperature": 0, "top_k": "many", "stream": True}),
    ],
)
def test_an_upstream_400_is_its_own_error_object(setup, path, body):
    toy, http, _ = setup
    direct = toy.direct(path, {**body, "stream": False})
    assert direct.status_code == 400
    response = http.post("/v1" + path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error.pop("role") == "target" and "endpoint" not in error  # the upstream's address stays inside
    assert error == direct.json()["error"]  # message, type, param, code and the vendor's field, unchanged


def test_the_simulators_refusal_of_tools_reaches_the_caller_as_it_sent_it():
    """The issue's case: the simulator refuses `tools` with `param: "tools"`; through the proxy the caller
    gets that error object, not one wrapped in the proxy's words."""
    import asyncio
    from dataclasses import replace

    from specapi.sim import SimProvider, SimTransport, simulated_endpoints

    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = (replace(e, api_key="sk-sim-test-key") for e in simulated_endpoints(provider=provider))
    tool = {"type": "function", "function": {"name": "area", "parameters": {"type": "object", "properties": {}}}}
    body = {"messages": [{"role": "user", "content": "Area of a circle?"}], "max_tokens": 8, "tools": [tool]}

    async def direct() -> httpx2.Response:
        async with httpx2.AsyncClient(transport=SimTransport(provider), base_url="http://sim/v1") as client:
            return await client.post("/chat/completions", json={**body, "model": target.model})

    expected = asyncio.run(direct())
    assert expected.status_code == 400 and expected.json()["error"]["param"] == "tools"
    options = {"policy": "fixed", "sleep": no_sleep}
    with ToyServer() as unused, running_proxy(unused, target=target, draft=draft, client_options=options) as proxy:
        with httpx2.Client(base_url=proxy.url, headers={"authorization": f"Bearer {PROXY_KEY}"}, timeout=30) as http:
            response = http.post("/v1/chat/completions", json={**body, "model": target.model})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error.pop("role") == "target" and "endpoint" not in error
    assert error == expected.json()["error"]
