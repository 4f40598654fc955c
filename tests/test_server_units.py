"""The proxy's pure parts, without HTTP: argument preparation, error mapping, redaction, headers, metrics, SSE."""

from __future__ import annotations

import asyncio
import json
from decimal import Decimal

import httpx2
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from specapi import ConfigurationError, Endpoint, RoleUsage, RoundRecord, SpeculativeStats, TargetError
from specapi.transport._exceptions import DraftError
from specapi.server.arguments import chat_arguments, completion_arguments, parse_json_object
from specapi.server.config import ServerConfig
from specapi.server.disconnect import ClientDisconnected, run_unless_disconnected
from specapi.server.errors import ProxyError, error_from_exception, guess_param, redact
from specapi.server.headers import header_value, stats_headers
from specapi.parts.policy import LOAD_TARGET_ALONE
from specapi.server.metrics import ProxyMetrics, fallback_category
from specapi.server.sse import DONE_EVENT, encode_event

TARGET = Endpoint(base_url="http://t/v1", model="big", api_key="sk-target-secret")
DRAFT = Endpoint(base_url="http://d/v1", model="small", api_key="sk-draft-secret")

STATS = SpeculativeStats(
    rounds=(
        RoundRecord(drafted=4, accepted=2, emitted=3, accepted_by_position=(True, True, False, False)),
        RoundRecord(drafted=4, accepted=4, emitted=5, accepted_by_position=(True, True, True, True)),
    ),
    draft=RoleUsage(requests=2, prompt_tokens=10, completion_tokens=8, cost_usd=Decimal("0.001")),
    target=RoleUsage(requests=2, prompt_tokens=20, completion_tokens=8, cost_usd=Decimal("0.02")),
    generated_tokens=8,
    wall_s=0.5,
    fallback_reason="draft failed, continued with the target alone: http://user:pw@d/v1?key=k said\nno",
)


# ----------------------------------------------------------------------------- arguments


def test_unknown_fields_move_to_extra_body_and_model_is_dropped():
    kwargs = completion_arguments({"model": "big", "prompt": "x", "max_tokens": 5, "top_k": -1, "repeat_penalty": 1.0}, model="big", max_tokens_limit=10)
    assert kwargs == {"prompt": "x", "max_tokens": 5, "extra_body": {"top_k": -1, "repeat_penalty": 1.0}}


def test_chat_without_a_bound_gets_the_limit_and_one_with_a_bound_keeps_it():
    messages = [{"role": "user", "content": "x"}]
    # No limit set (the default): nothing is added, the target's own limit applies.
    assert chat_arguments({"messages": messages}, model="big", max_tokens_limit=None) == {"messages": messages}
    assert completion_arguments({"prompt": "x", "max_tokens": 10**6}, model="big", max_tokens_limit=None)["max_tokens"] == 10**6
    assert chat_arguments({"messages": messages}, model="big", max_tokens_limit=77)["max_tokens"] == 77
    kwargs = chat_arguments({"messages": messages, "max_completion_tokens": 9}, model="big", max_tokens_limit=77)
    assert kwargs["max_completion_tokens"] == 9 and "max_tokens" not in kwargs


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"prompt": None}, 400, "prompt"),
        ({"prompt": "x", "model": "other"}, 404, "model"),
        ({"prompt": "x", "max_tokens": 11}, 400, "max_tokens"),
        ({"prompt": "x", "stream": 1}, 400, "stream"),
    ],
)
def test_requests_the_proxy_refuses_itself(body, status, param):
    with pytest.raises(ProxyError) as info:
        completion_arguments(body, model="big", max_tokens_limit=10)
    assert (info.value.status, info.value.param) == (status, param)


@pytest.mark.parametrize("raw", [b"", b"  ", b"{", b"null", b'"s"', b"[]", b'{"a": Infinity}', b"\xff"])
def test_bodies_that_are_not_json_objects_are_400(raw):
    with pytest.raises(ProxyError) as info:
        parse_json_object(raw)
    assert info.value.status == 400 and info.value.body()["error"]["code"] == "invalid_json"


def test_deeply_nested_json_is_a_400_not_a_crash():
    with pytest.raises(ProxyError):
        parse_json_object(b"[" * 100_000 + b"]" * 100_000)


# ----------------------------------------------------------------------------- errors


def _status_error(status: int, headers: dict | None = None) -> openai.APIStatusError:
    request = httpx2.Request("POST", "http://t/v1/completions")
    response = httpx2.Response(status, headers=headers or {}, request=request)
    return openai.APIStatusError("upstream said no", response=response, body=None)


def _target_error(status: int | None, cause: BaseException | None = None) -> TargetError:
    error = TargetError(f"HTTP {status}: no (key sk-target-secret)", role="target", endpoint="big @ http://u:p@t/v1", status_code=status)
    error.__cause__ = cause
    return error


@pytest.mark.parametrize(
    ("status", "expected", "kind"),
    [(400, 400, "invalid_request_error"), (422, 422, "invalid_request_error"), (429, 429, "rate_limit_error"),
     (500, 502, "upstream_error"), (503, 502, "upstream_error"), (404, 502, "upstream_error"), (None, 502, "upstream_error")],
)
def test_endpoint_errors_map_to_statuses_and_name_the_role(status, expected, kind):
    error = error_from_exception(_target_error(status), secrets=["sk-target-secret"])
    body = error.body()["error"]
    assert (error.status, body["type"], body["role"]) == (expected, kind, "target")
    assert "endpoint" not in body and "t/v1" not in json.dumps(body) and "no (key" not in body["message"]
    assert body["message"].startswith("The target endpoint ")
    exposed = error_from_exception(_target_error(status), secrets=["sk-target-secret"], expose=True).body()["error"]
    assert "sk-target-secret" not in json.dumps(exposed) and "u:p@" not in json.dumps(exposed)
    assert exposed["endpoint"] == "big @ http://***@t/v1" and "HTTP" in exposed["message"]


def test_refused_upstream_credentials_are_the_proxys_problem():
    error = error_from_exception(_target_error(401), secrets=[])
    assert error.status == 502 and "credentials" in error.message


def test_upstream_timeouts_are_504():
    cause = openai.APITimeoutError(request=httpx2.Request("POST", "http://t/v1/completions"))
    assert error_from_exception(_target_error(None, cause)).status == 504


def test_retry_after_is_passed_on_with_429():
    error = error_from_exception(_target_error(429, _status_error(429, {"retry-after": "3"})))
    assert error.headers == {"retry-after": "3"}


def test_draft_errors_name_the_draft():
    error = error_from_exception(DraftError("broke", role="draft", endpoint="small @ http://d/v1", status_code=500))
    assert error.body()["error"]["role"] == "draft" and error.body()["error"]["code"] == "draft_endpoint_error"


def test_configuration_errors_are_400_with_the_param():
    error = error_from_exception(ConfigurationError("temperature must be in [0.0, 2.0], got 7"), params={"temperature", "prompt"})
    assert (error.status, error.param) == (400, "temperature")


def test_unexpected_errors_are_500_without_details():
    error = error_from_exception(RuntimeError("secret internals sk-target-secret"))
    assert error.status == 500 and "internals" not in error.message


@pytest.mark.parametrize(
    ("message", "param"),
    [("max_tokens must be an integer >= 1, got 'x'", "max_tokens"), ("each message needs a 'role', got {}", "messages"),
     ("'stream' must be a boolean", "stream"), ("stop must be a non-empty string", "stop"), ("something else", None)],
)
def test_guess_param(message, param):
    assert guess_param(message, {"max_tokens", "messages", "stream", "stop", "prompt"}) == param


@given(st.text(), st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=6, max_size=40), st.text())
def test_redact_removes_every_secret(before, secret, after):
    assert secret not in redact(before + secret + after + secret, [secret, "short"])


def test_redact_removes_url_credentials_and_queries():
    text = redact("failed: https://alice:hunter2@api.example.com/v1?api-key=abc123 and more")
    assert "hunter2" not in text and "abc123" not in text and "api.example.com/v1" in text


# ----------------------------------------------------------------------------- headers, metrics, SSE


@given(st.text(), st.integers(min_value=4, max_value=300))
def test_header_values_are_one_short_printable_line(value, limit):
    safe = header_value(value, limit=limit)
    assert len(safe) <= limit and all(" " <= ch <= "~" for ch in safe)


def test_stats_headers():
    headers = stats_headers(STATS, lambda text: redact(text))
    assert headers["x-specapi-num-rounds"] == "2"
    assert headers["x-specapi-drafted-tokens"] == "8" and headers["x-specapi-accepted-tokens"] == "6"
    assert headers["x-specapi-acceptance-rate"] == "0.75"
    assert headers["x-specapi-cost-usd"] == "0.021"
    assert headers["x-specapi-speculated"] == "true" and headers["x-specapi-exact"] == "true"
    reason = headers["x-specapi-fallback-reason"]
    assert "pw" not in reason and "key=k" not in reason and "\n" not in reason
    unpriced = stats_headers(STATS.with_(target=RoleUsage(cost_usd=None)))
    assert "x-specapi-cost-usd" not in unpriced and "x-specapi-target-cost-usd" not in unpriced  # null: left out
    assert unpriced["x-specapi-draft-cost-usd"] == headers["x-specapi-draft-cost-usd"]


@pytest.mark.parametrize(
    ("reason", "category"),
    [(None, None), ("draft failed, continued with the target alone: x", "draft_failed"),
     ("target refused the verification request, continued", "verification_refused"),
     ("target response could not be verified against, continued", "unverifiable_response"),
     ("the target would not tokenize the prompt, continued with the target alone: x", "tokenize_refused"),
     ("adaptive policy: speculation predicted slower than the target alone", "policy_off"),
     ("adaptive policy: " + LOAD_TARGET_ALONE, "under_load"),
     ("the draft-length policy turned speculation off", "policy_off"),
     ("verification='none': the target alone", "verification_off"),
     ("n > 1 is served by the target alone", "target_only_request")],
)
def test_fallback_categories(reason, category):
    assert fallback_category(reason) == category


def test_metrics_add_up_the_statistics():
    metrics = ProxyMetrics()
    metrics.observe("/v1/completions", STATS)
    metrics.observe("/v1/completions", STATS)
    value = metrics.registry.get_sample_value
    assert value("specapi_rounds_total") == 4
    assert value("specapi_drafted_tokens_total") == 16 and value("specapi_accepted_tokens_total") == 12
    assert value("specapi_drafted_tokens_by_position_total", {"position": "2"}) == 4
    assert value("specapi_accepted_tokens_by_position_total", {"position": "2"}) == 2
    assert value("specapi_cost_usd_total", {"role": "target"}) == pytest.approx(0.04)
    assert value("specapi_upstream_tokens_total", {"role": "draft", "kind": "completion"}) == 16
    assert value("specapi_fallbacks_total", {"reason": "draft_failed"}) == 2
    assert b"specapi_requests_total" in metrics.render() or b"specapi_requests" in metrics.render()


def test_sse_events():
    event = encode_event({"text": "line\nbreak", "é": 1})
    assert event.startswith(b"data: ") and event.endswith(b"\n\n") and event.count(b"\n") == 2
    assert json.loads(event[len(b"data: "):]) == {"text": "line\nbreak", "é": 1}
    assert DONE_EVENT == b"data: [DONE]\n\n"


# ----------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    "overrides",
    [{"num_speculative_tokens": 0}, {"max_request_bytes": -1}, {"max_tokens_limit": True}, {"api_key": ""}, {"target": "url"}],
)
def test_invalid_configuration_is_refused(overrides):
    with pytest.raises(ConfigurationError):
        ServerConfig(**{"target": TARGET, "draft": DRAFT, **overrides})


def test_configuration_is_immutable_and_knows_its_secrets():
    config = ServerConfig(target=TARGET, draft=DRAFT, api_key="sk-proxy", client_options={"policy": "fixed"})
    with pytest.raises(TypeError):
        config.client_options["policy"] = "adaptive"  # type: ignore[index]
    assert set(config.secrets) == {"sk-proxy", "sk-target-secret", "sk-draft-secret"}
    assert "sk-proxy" not in repr(config)


# ----------------------------------------------------------------------------- racing work against a disconnect


class _Connection:
    """An ASGI `receive` whose client leaves when `leave()` is called."""

    def __init__(self) -> None:
        self._left = asyncio.Event()

    def leave(self) -> None:
        self._left.set()

    async def receive(self) -> dict[str, str]:
        await self._left.wait()
        return {"type": "http.disconnect"}


async def test_the_raced_work_starts_before_the_steps_already_waiting_and_gives_its_result():
    order: list[str] = []

    async def other() -> None:
        order.append("a step that was waiting")

    async def work() -> str:
        order.append("the work")
        await asyncio.sleep(0)
        return "done"

    waiting = asyncio.ensure_future(other())
    assert await run_unless_disconnected(work(), _Connection().receive) == "done"
    await waiting
    assert order == ["the work", "a step that was waiting"]
    assert {t for t in asyncio.all_tasks() if t is not asyncio.current_task()} == set()  # no watcher left behind


async def test_a_client_that_leaves_cancels_the_work_which_unwinds_before_the_error():
    connection = _Connection()
    unwound: list[str] = []

    async def work() -> str:
        try:
            await asyncio.sleep(30)
        finally:
            unwound.append("closed its upstream calls")
        return "never"

    asyncio.get_running_loop().call_later(0.01, connection.leave)
    with pytest.raises(ClientDisconnected):
        await run_unless_disconnected(work(), connection.receive)
    assert unwound == ["closed its upstream calls"]
    assert await asyncio.sleep(0, "the task goes on") == "the task goes on"  # its cancellation was handled, not left pending


async def test_a_cancellation_from_elsewhere_stays_a_cancellation():
    connection = _Connection()
    started = asyncio.Event()

    async def work() -> None:
        started.set()
        await asyncio.sleep(30)

    racing = asyncio.ensure_future(run_unless_disconnected(work(), connection.receive))
    await started.wait()
    racing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await racing
    assert racing.cancelled()


async def test_an_error_in_the_work_is_raised_as_it_is():
    async def work() -> None:
        raise TargetError("HTTP 500: boom", role="target", endpoint="http://127.0.0.1:9/v1", status_code=500)

    with pytest.raises(TargetError, match="boom"):
        await run_unless_disconnected(work(), _Connection().receive)
