"""The proxy (`specapi.server`) over real loopback HTTP: the official openai SDK, raw HTTP and curl
against a live uvicorn server whose upstream is the toy server.

Streams, disconnects and shutdown are in `test_server_stream.py`; pure helpers in `test_server_units.py`.
"""

from __future__ import annotations

import json
import subprocess
from decimal import Decimal

import httpx2
import openai
import pytest

import specapi.server
from specapi import Endpoint
from test_server_support import PROXY_KEY, UPSTREAM_KEY, make_config, metric, proxy_pair, running_proxy
from toyserver import TARGET, ToyServer, render_chat

MAX_TOKENS = 16
PROMPTS = ["ab", "fa c", "dd e"]


@pytest.fixture(scope="module")
def upstream():
    with ToyServer(api_key=UPSTREAM_KEY) as srv:
        yield srv


@pytest.fixture(scope="module")
def proxy(upstream):
    with running_proxy(upstream, max_tokens_limit=256, max_request_bytes=4096) as server:
        yield server


@pytest.fixture
def sdk(proxy):
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as client:
        yield client


@pytest.fixture
def http(proxy):
    with httpx2.Client(base_url=proxy.url, headers={"authorization": f"Bearer {PROXY_KEY}"}, timeout=30) as client:
        yield client


def assert_openai_error(response: httpx2.Response, status: int, *, param: str | None = None, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error)
    assert isinstance(error["message"], str) and error["message"]
    if param is not None:
        assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    return error


def assert_no_addresses(response: httpx2.Response, srv: ToyServer) -> None:
    """Nothing the client got names where the upstreams are."""
    exposed = response.text + json.dumps(dict(response.headers))
    host_port = srv.base_url.split("://", 1)[1].split("/", 1)[0]
    assert host_port not in exposed, exposed


def assert_no_secrets(response: httpx2.Response) -> None:
    exposed = response.text + json.dumps(dict(response.headers))
    assert UPSTREAM_KEY not in exposed and PROXY_KEY not in exposed


# ----------------------------------------------------------------------------- exact output through the SDK


@pytest.mark.parametrize("prompt", PROMPTS)
def test_completion_through_the_sdk_is_the_targets_greedy_output(sdk, prompt):
    response = sdk.completions.create(model="target", prompt=prompt, max_tokens=MAX_TOKENS, temperature=0)
    assert (response.choices[0].text, response.choices[0].finish_reason) == TARGET.greedy(prompt, MAX_TOKENS)
    assert response.object == "text_completion" and response.model == "target"
    assert response.usage.completion_tokens == MAX_TOKENS


def test_completion_with_stop_is_the_targets_greedy_output(sdk):
    full, _ = TARGET.greedy("ab", 30)
    stop = full[5:7]
    response = sdk.completions.create(model="target", prompt="ab", max_tokens=30, temperature=0, stop=[stop])
    assert (response.choices[0].text, response.choices[0].finish_reason) == TARGET.greedy("ab", 30, stop=[stop])


@pytest.mark.parametrize("content", ["abc", "ed f"])
def test_chat_through_the_sdk_is_the_targets_greedy_output(sdk, content):
    messages = [{"role": "system", "content": "be a fab dad"}, {"role": "user", "content": content}]
    response = sdk.chat.completions.create(model="target", messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    choice = response.choices[0]
    assert (choice.message.content, choice.finish_reason) == TARGET.greedy(render_chat(messages), MAX_TOKENS)
    assert choice.message.role == "assistant" and response.object == "chat.completion"


def test_model_may_be_omitted_by_raw_clients(http):
    response = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 8, "temperature": 0})
    assert response.status_code == 200
    assert response.json()["choices"][0]["text"] == TARGET.greedy("ab", 8)[0]


def test_target_only_requests_pass_through_exactly(sdk):
    # echo cannot be reproduced by verification: the target serves the request alone, unchanged.
    response = sdk.completions.create(model="target", prompt="ab", max_tokens=6, temperature=0, logprobs=2, echo=True)
    assert response.choices[0].text == "ab" + TARGET.greedy("ab", 6)[0]
    assert response.choices[0].logprobs is not None and len(response.choices[0].logprobs.tokens) == 6 + 2
    assert response.model_extra["speculative"]["speculated"] is False
    assert response.model_extra["speculative"]["fallback_reason"]


def test_logprobs_through_the_proxy_are_the_targets_own(sdk, upstream):
    response = sdk.completions.create(model="target", prompt="ab", max_tokens=12, temperature=0, logprobs=2)
    with openai.OpenAI(base_url=upstream.base_url, api_key=UPSTREAM_KEY, max_retries=0) as direct:
        own = direct.completions.create(model="target", prompt="ab", max_tokens=12, temperature=0, logprobs=2)
    assert response.choices[0].text == own.choices[0].text
    mine, theirs = response.choices[0].logprobs, own.choices[0].logprobs
    assert (mine.tokens, mine.text_offset) == (theirs.tokens, theirs.text_offset)
    assert mine.token_logprobs == pytest.approx(theirs.token_logprobs, abs=1e-9)
    assert response.model_extra["speculative"]["speculated"] is True


# ----------------------------------------------------------------------------- statistics


def test_stats_headers_and_speculative_field_agree(sdk):
    raw = sdk.completions.with_raw_response.create(model="target", prompt="ab", max_tokens=MAX_TOKENS, temperature=0)
    response = raw.parse()
    stats = response.model_extra["speculative"]
    headers = raw.headers
    assert stats["speculated"] is True and stats["exact"] is True
    assert headers["x-specapi-speculated"] == "true" and headers["x-specapi-exact"] == "true"
    assert int(headers["x-specapi-num-rounds"]) == stats["num_rounds"] > 0
    assert int(headers["x-specapi-drafted-tokens"]) == stats["drafted_tokens"] >= stats["accepted_tokens"]
    assert int(headers["x-specapi-accepted-tokens"]) == stats["accepted_tokens"]
    assert float(headers["x-specapi-acceptance-rate"]) == pytest.approx(stats["acceptance_rate"], abs=1e-6)
    assert stats["acceptance_rate"] == pytest.approx(stats["accepted_tokens"] / stats["drafted_tokens"], abs=1e-6)
    assert int(headers["x-specapi-generated-tokens"]) == stats["generated_tokens"] == MAX_TOKENS
    assert int(headers["x-specapi-target-requests"]) == stats["target"]["requests"] > 0
    assert int(headers["x-specapi-draft-requests"]) == stats["draft"]["requests"] > 0
    assert headers["x-specapi-target-cost-usd"] == stats["target"]["cost_usd"]  # one money format: a decimal string
    cost = Decimal(headers["x-specapi-cost-usd"])
    assert cost == Decimal(stats["cost_usd"]) == Decimal(stats["target"]["cost_usd"]) + Decimal(stats["draft"]["cost_usd"]) > 0
    assert headers["x-request-id"]


def test_request_id_is_echoed_when_given(http):
    response = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2}, headers={"x-request-id": "lb-1234"})
    assert response.headers["x-request-id"] == "lb-1234"
    bad = http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2}, headers={"x-request-id": "no spaces allowed"})
    assert bad.headers["x-request-id"].startswith("req_")


# ----------------------------------------------------------------------------- authentication and limits


def test_requests_without_the_proxys_key_get_401(proxy):
    body = {"model": "target", "prompt": "ab", "max_tokens": 4}
    with httpx2.Client(base_url=proxy.url, timeout=10) as anonymous:
        missing = anonymous.post("/v1/completions", json=body)
        wrong = anonymous.post("/v1/completions", json=body, headers={"authorization": "Bearer sk-wrong"})
        upstream_key = anonymous.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {UPSTREAM_KEY}"})
        basic = anonymous.post("/v1/completions", json=body, headers={"authorization": f"Basic {PROXY_KEY}"})
        models = anonymous.get("/v1/models")
        health = anonymous.get("/health")
    for response in (missing, wrong, upstream_key, basic, models):
        assert_openai_error(response, 401, code="invalid_api_key")
        assert response.headers["www-authenticate"] == "Bearer"
        assert_no_secrets(response)
    assert health.status_code == 200


def test_sdk_with_a_wrong_key_gets_an_authentication_error(proxy):
    with openai.OpenAI(base_url=proxy.url + "/v1", api_key="sk-nope", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError) as info:
            client.completions.create(model="target", prompt="ab", max_tokens=4)
    assert info.value.code == "invalid_api_key"


def test_a_proxy_without_a_key_is_open(upstream):
    with running_proxy(upstream, api_key=None) as open_proxy:
        with openai.OpenAI(base_url=open_proxy.url + "/v1", api_key="anything", max_retries=0) as client:
            response = client.completions.create(model="target", prompt="ab", max_tokens=5, temperature=0)
    assert response.choices[0].text == TARGET.greedy("ab", 5)[0]


def test_oversized_bodies_get_413(http):
    big = {"model": "target", "prompt": "a" * 5000, "max_tokens": 4}
    assert_openai_error(http.post("/v1/completions", json=big), 413, code="request_too_large")

    def chunked():  # no Content-Length: the limit is enforced while reading
        yield b'{"model": "target", "prompt": "'
        for _ in range(10):
            yield b"a" * 1000
        yield b'"}'

    response = http.post("/v1/completions", content=chunked(), headers={"content-type": "application/json"})
    assert_openai_error(response, 413, code="request_too_large")


def test_max_tokens_over_the_limit_gets_400(sdk, http):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.completions.create(model="target", prompt="ab", max_tokens=257)
    assert info.value.body["param"] == "max_tokens" and "256" in info.value.message
    response = http.post("/v1/chat/completions", json={"model": "target", "messages": [{"role": "user", "content": "ab"}], "max_completion_tokens": 1000})
    assert_openai_error(response, 400, param="max_completion_tokens", code="max_tokens_exceeded")


@pytest.mark.parametrize(
    ("path", "content", "param"),
    [
        ("/v1/completions", b"{not json", None),
        ("/v1/completions", b"", None),
        ("/v1/completions", b"[1, 2]", None),
        ("/v1/completions", b'{"prompt": "ab", "temperature": NaN}', None),
        ("/v1/chat/completions", b"\xff\xfe", None),
        ("/v1/completions", b'{"model": "target"}', "prompt"),
        ("/v1/chat/completions", b'{"model": "target", "prompt": "ab"}', "messages"),
        ("/v1/completions", b'{"prompt": "ab", "temperature": 7}', "temperature"),
        ("/v1/completions", b'{"prompt": "ab", "max_tokens": "many"}', "max_tokens"),
        ("/v1/completions", b'{"prompt": "ab", "stream": "yes"}', "stream"),
        ("/v1/completions", b'{"prompt": "ab", "stop": 3}', "stop"),
        ("/v1/completions", b'{"prompt": "ab", "stream_options": {"include_usage": true}}', "stream_options"),
        ("/v1/chat/completions", b'{"messages": []}', "messages"),
        ("/v1/chat/completions", b'{"messages": [{"content": "no role"}]}', "messages"),
    ],
)
def test_invalid_requests_get_400_with_openai_error_shape(http, path, content, param):
    error = assert_openai_error(http.post(path, content=content, headers={"content-type": "application/json"}), 400)
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param


@pytest.mark.parametrize(
    ("path", "content", "param"),
    [
        ("/v1/completions", b'{"prompt": "\\ud800x", "max_tokens": 5}', "prompt"),
        ("/v1/completions", b'{"prompt": "ab", "max_tokens": 5, "stream": true, "stop": ["\\udc00"]}', "stop"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\\ud800x"}], "max_tokens": 5}', "messages"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "ab"}], "max_tokens": 5, "top_k": "\\ud800"}', "top_k"),
    ],
)
def test_a_lone_surrogate_gets_400_naming_the_field_and_nothing_goes_upstream(http, upstream, path, content, param):
    before = len(upstream.log)
    error = assert_openai_error(http.post(path, content=content, headers={"content-type": "application/json"}), 400, param=param)
    assert "surrogate" in error["message"] and error["type"] == "invalid_request_error"
    assert len(upstream.log) == before
    assert http.post("/v1/completions", json={"prompt": "ab", "max_tokens": 2}).status_code == 200  # still serving


def test_a_surrogate_pair_in_json_is_one_character_and_goes_upstream(http, upstream):
    before = len(upstream.log)
    response = http.post("/v1/completions", content=b'{"prompt": "ab\\ud83d\\ude00", "max_tokens": 2}', headers={"content-type": "application/json"})
    assert response.status_code in (200, 400) and "surrogate" not in response.text  # the toy's tokenizer may refuse the emoji
    assert len(upstream.log) > before and any(record.body.get("prompt") == "ab\U0001f600" for record in upstream.log[before:])


def test_sdk_raises_bad_request_for_invalid_arguments(sdk):
    with pytest.raises(openai.BadRequestError) as info:
        sdk.chat.completions.create(model="target", messages=[{"role": "user", "content": "ab"}], temperature=3)
    assert info.value.body["param"] == "temperature"


def test_unknown_model_gets_404(sdk):
    with pytest.raises(openai.NotFoundError) as info:
        sdk.completions.create(model="gpt-4o", prompt="ab", max_tokens=4)
    assert info.value.code == "model_not_found" and "target" in info.value.message


def test_routes_and_methods_the_proxy_does_not_serve_get_the_targets_own_answer(http, upstream):
    """Passed to the target unchanged (`tests/test_server_forward.py` has one test per route)."""
    for method, path in (("GET", "/v1/embeddings"), ("GET", "/v1/completions")):
        direct = httpx2.request(method, upstream.base_url + path.removeprefix("/v1"), headers={"authorization": f"Bearer {UPSTREAM_KEY}"})
        proxied = http.request(method, path)
        assert direct.status_code >= 400 and (proxied.status_code, proxied.json()) == (direct.status_code, direct.json())


def test_middleware_added_to_the_app_wraps_the_generation_routes_too(upstream):
    """The generation routes go straight to their handlers, past Starlette's own stack: middleware
    someone adds to the app still sees them, and their answers, as it sees every other route."""
    from specapi.server.background import BackgroundServer

    app = specapi.server.create_app(make_config(upstream))
    seen: list[str] = []

    class Tagging:
        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            if scope["type"] != "http":
                await self.inner(scope, receive, send)
                return
            seen.append(scope["path"])

            async def tagged(message):
                if message["type"] == "http.response.start":
                    message = {**message, "headers": [*message["headers"], (b"x-tagged", b"yes")]}
                await send(message)

            await self.inner(scope, receive, tagged)

    app.add_middleware(Tagging)
    with BackgroundServer(app) as server, openai.OpenAI(base_url=server.url + "/v1", api_key=PROXY_KEY, max_retries=0) as client:
        raw = client.completions.with_raw_response.create(model="target", prompt="ab", max_tokens=5, temperature=0)
        stream = client.chat.completions.with_raw_response.create(
            model="target", messages=[{"role": "user", "content": "fa c"}], max_tokens=5, temperature=0, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream.parse() if chunk.choices)
    assert raw.headers["x-tagged"] == "yes" and raw.parse().choices[0].text == TARGET.greedy("ab", 5)[0]
    assert stream.headers["x-tagged"] == "yes" and text == TARGET.greedy(render_chat([{"role": "user", "content": "fa c"}]), 5)[0]
    assert seen.count("/v1/completions") == 1 and seen.count("/v1/chat/completions") == 1


# ----------------------------------------------------------------------------- upstream failures


def test_target_failure_gives_502_naming_the_target_never_partial_text():
    with proxy_pair() as (srv, proxy), httpx2.Client(base_url=proxy.url, timeout=30) as client:
        srv.fail_next(100, status=500, model="target")
        response = client.post(
            "/v1/completions",
            json={"model": "target", "prompt": "ab", "max_tokens": 10, "temperature": 0},
            headers={"authorization": f"Bearer {PROXY_KEY}"},
        )
        error = assert_openai_error(response, 502, code="target_endpoint_error")
        assert error["type"] == "upstream_error"
        assert error["role"] == "target" and "endpoint" not in error
        assert error["message"] == "The target endpoint failed (HTTP 500)."
        assert "choices" not in response.json()
        assert_no_addresses(response, srv)
        assert_no_secrets(response)


def test_upstream_errors_are_exposed_only_when_asked():
    with proxy_pair(expose_upstream_errors=True) as (srv, proxy), httpx2.Client(base_url=proxy.url, timeout=30) as client:
        srv.fail_next(100, status=500, model="target")
        response = client.post(
            "/v1/completions", json={"model": "target", "prompt": "ab", "max_tokens": 10, "temperature": 0},
            headers={"authorization": f"Bearer {PROXY_KEY}"},
        )
    error = assert_openai_error(response, 502, code="target_endpoint_error")
    assert error["role"] == "target" and error["endpoint"] == f"target @ {srv.base_url}"
    assert "target" in error["message"] and srv.base_url in error["message"] and "500" in error["message"]
    assert_no_secrets(response)


def test_no_upstream_address_reaches_clients_in_errors_statistics_or_readiness(caplog):
    # The draft fails (absorbed: the answer is the target's, its reason in the statistics and headers);
    # then the target does (an error naming the role); /ready then reports the target down.
    with proxy_pair() as (srv, proxy), httpx2.Client(base_url=proxy.url, timeout=30, headers={"authorization": f"Bearer {PROXY_KEY}"}) as client:
        srv.fail_next(100, status=503, model="draft")
        absorbed = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 6, "temperature": 0})
        assert absorbed.status_code == 200, absorbed.text
        assert_no_addresses(absorbed, srv)
        srv.fail_next(100, status=503, model="target")
        with caplog.at_level("INFO", logger="specapi.server"):
            failed = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "ab"}], "max_tokens": 6, "stream": True})
        assert failed.status_code == 502 and failed.json()["error"]["role"] == "target"
        assert_no_addresses(failed, srv)
        assert srv.base_url in caplog.text  # the log has what the client was not told
        assert_no_addresses(client.get("/ready"), srv)


def test_target_failure_through_the_sdk_raises_an_api_error():
    with proxy_pair() as (srv, proxy), openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as client:
        srv.fail_next(100, status=503, model="target")
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model="target", messages=[{"role": "user", "content": "ab"}], max_tokens=5)
    assert info.value.status_code == 502 and info.value.body["role"] == "target"


def test_upstream_rate_limit_is_passed_through_with_retry_after():
    with proxy_pair() as (srv, proxy), httpx2.Client(base_url=proxy.url, timeout=30) as client:
        srv.fail_next(100, status=429, model="target", retry_after=7)
        response = client.post(
            "/v1/completions", json={"prompt": "ab", "max_tokens": 5}, headers={"authorization": f"Bearer {PROXY_KEY}"}
        )
    error = assert_openai_error(response, 429, code="rate_limit_exceeded")
    assert error["type"] == "rate_limit_error" and error["role"] == "target"
    assert response.headers["retry-after"] == "7"


def test_upstream_refusal_of_the_request_is_the_targets_own_400_naming_the_target(http, upstream):
    # The toy tokenizer refuses "z": both models answer 400; the draft's is absorbed, the target's is the
    # answer: its error object as the target alone sends it (not wrapped), plus the role that refused.
    body = {"prompt": "xyz", "max_tokens": 5, "temperature": 0}
    response = http.post("/v1/completions", json=body)
    direct = httpx2.post(upstream.base_url + "/completions", json={**body, "model": "target"}, headers={"authorization": f"Bearer {UPSTREAM_KEY}"})
    error = assert_openai_error(response, 400)
    assert {k: error[k] for k in ("message", "type", "param", "code")} == direct.json()["error"]
    assert error["role"] == "target"
    assert_no_secrets(response)


def test_wrong_upstream_credentials_are_a_502_not_a_401():
    with ToyServer(api_key="sk-other") as srv, running_proxy(srv) as proxy:
        with httpx2.Client(base_url=proxy.url, timeout=30) as client:
            response = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 5}, headers={"authorization": f"Bearer {PROXY_KEY}"})
    error = assert_openai_error(response, 502)
    assert "credentials" in error["message"] and error["role"] == "target"
    assert_no_secrets(response)


def test_unreachable_target_is_a_502_naming_it():
    with ToyServer() as dead:
        base_url = dead.base_url
    with ToyServer(api_key=UPSTREAM_KEY) as srv:
        target = Endpoint(base_url=base_url, model="target", api_key=UPSTREAM_KEY, max_retries=0, timeout=5)
        with running_proxy(srv, target=target) as proxy, httpx2.Client(base_url=proxy.url, timeout=30) as client:
            response = client.post("/v1/completions", json={"prompt": "ab", "max_tokens": 5}, headers={"authorization": f"Bearer {PROXY_KEY}"})
    error = assert_openai_error(response, 502, code="target_endpoint_error")
    assert error["message"] == "The target endpoint could not be reached, or broke off its answer." and base_url not in response.text


# ----------------------------------------------------------------------------- other routes, metrics, curl


def test_models_lists_the_target_then_every_other_model_of_its_server(sdk):
    models = sdk.models.list()
    assert [m.id for m in models.data] == ["target", "draft"]  # the toy server serves both
    assert sdk.models.retrieve("target").id == "target" and sdk.models.retrieve("draft").id == "draft"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("gpt-4o")


def test_health_needs_no_key_and_no_upstream(proxy):
    with httpx2.Client(base_url=proxy.url) as client:
        response = client.get("/health")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_metrics_count_requests_and_speculation():
    with proxy_pair() as (srv, proxy), openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as client:
        raw = client.completions.with_raw_response.create(model="target", prompt="ab", max_tokens=12, temperature=0)
        client.chat.completions.create(model="target", messages=[{"role": "user", "content": "ab"}], max_tokens=12, temperature=0)
        with pytest.raises(openai.BadRequestError):
            client.completions.create(model="target", prompt="ab", max_tokens=12, temperature=9)
        with httpx2.Client(base_url=proxy.url) as anonymous:
            text = anonymous.get("/metrics").text  # no key needed for scraping
    stats = raw.parse().model_extra["speculative"]
    assert metric(text, "specapi_requests_total", route="/v1/completions", status="200") == 1
    assert metric(text, "specapi_requests_total", route="/v1/chat/completions", status="200") == 1
    assert metric(text, "specapi_requests_total", route="/v1/completions", status="400") == 1
    assert metric(text, "specapi_responses_total", route="/v1/completions", speculated="true", exact="true") == 1
    assert metric(text, "specapi_rounds_total") >= stats["num_rounds"] > 0
    drafted, accepted = metric(text, "specapi_drafted_tokens_total"), metric(text, "specapi_accepted_tokens_total")
    assert drafted >= stats["drafted_tokens"] and 0 <= accepted <= drafted
    assert metric(text, "specapi_drafted_tokens_by_position_total", position="0") > 0
    assert metric(text, "specapi_generated_tokens_total") == 24
    assert metric(text, "specapi_request_duration_seconds_count", route="/v1/completions") == 1
    assert metric(text, "specapi_time_to_first_token_seconds_count", route="/v1/chat/completions") == 1
    assert metric(text, "specapi_cost_usd_total", role="target") > 0
    assert metric(text, "specapi_cost_usd_total", role="draft") > 0
    assert metric(text, "specapi_upstream_requests_total", role="target") >= stats["target"]["requests"]
    assert metric(text, "specapi_in_flight_requests") == 0


def test_fallbacks_are_counted_by_category():
    with proxy_pair() as (srv, proxy), openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as client:
        client.completions.create(model="target", prompt="ab", max_tokens=4, temperature=0, logprobs=1, echo=True)
        with httpx2.Client(base_url=proxy.url) as anonymous:
            text = anonymous.get("/metrics").text
    assert metric(text, "specapi_fallbacks_total", reason="target_only_request") == 1


def test_two_apps_keep_separate_metrics(upstream):
    first = specapi.server.create_app(make_config(upstream))
    second = specapi.server.create_app(make_config(upstream))
    assert first.state.metrics.registry is not second.state.metrics.registry


@pytest.mark.usefixtures("curl_installed")
def test_curl_gets_a_completion(proxy):
    body = json.dumps({"model": "target", "prompt": "ab", "max_tokens": 10, "temperature": 0})
    result = subprocess.run(
        ["curl", "-s", "-S", "--max-time", "20", proxy.url + "/v1/completions",
         "-H", "Content-Type: application/json", "-H", f"Authorization: Bearer {PROXY_KEY}", "-d", body],
        capture_output=True, text=True, timeout=30, check=True,
    )
    response = json.loads(result.stdout)
    assert response["choices"][0]["text"] == TARGET.greedy("ab", 10)[0]
    assert response["speculative"]["exact"] is True


def test_public_surface():
    assert set(specapi.server.__all__) == {"create_app", "ServerConfig", "BackgroundServer"}
    for name in specapi.server.__all__:
        assert getattr(specapi.server, name) is not None
