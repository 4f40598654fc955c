"""A misconfigured endpoint is loud: `check_endpoints()` names the role, the endpoint and what is wrong
(a model the server does not serve, a dead port, a refused key), and a client whose draft fails logs one
warning per endpoint and failure (not one per request) while its answers stay the target's."""

from __future__ import annotations

import logging
import socket
from dataclasses import replace

import httpx2
import pytest

from simclient import target_alone
from specapi import AsyncSpeculativeOpenAI, Endpoint, EndpointStatus, SpeculativeOpenAI
from specapi.transport._calls import RoleClient
from specapi.surface.checks import EndpointChecker, check_endpoint
from specapi.sim import SimProvider, SimTransport, simulated_endpoints

CODE = "def fibonacci(n):\n    if n < 2:\n        return n\n"


def _dead_url() -> str:
    with socket.socket() as sock:  # bound, never listening, then closed: connections are refused
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"


def _endpoints(provider: SimProvider, *, draft_model: str = "sim-draft") -> tuple[Endpoint, Endpoint]:
    target, draft = simulated_endpoints(provider=provider)
    return target, replace(draft, model=draft_model, name=None)


async def test_a_draft_model_the_server_does_not_serve_is_named_with_what_it_serves() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = _endpoints(provider, draft_model="sim-draft-typo")
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        statuses = await client.check_endpoints()
    assert [s.role for s in statuses] == ["target", "draft"] and statuses[0].ok
    problem = statuses[1].problem
    assert not statuses[1].ok and problem is not None
    assert problem.startswith("draft endpoint sim-draft-typo @ http://sim/v1: the model 'sim-draft-typo' is not served there (HTTP 404")
    assert "it lists sim-target, sim-draft" in problem and "Check the draft model's name" in problem


async def test_a_dead_endpoint_is_unreachable_and_says_what_to_check() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, _ = simulated_endpoints(provider=provider)
    draft = Endpoint(model="small", base_url=_dead_url(), max_retries=0)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        target_status, draft_status = await client.check_endpoints(timeout=5)
    assert target_status == EndpointStatus("target", target.label, None)
    assert draft_status.problem is not None and f"draft endpoint small @ {draft.base_url} is unreachable" in draft_status.problem
    assert "is its server running" in draft_status.problem and "/v1" in draft_status.problem


def _server(models: list[str] | None, *, answers: bool, status: int = 200) -> httpx2.AsyncClient:
    """A server listing `models` (None: no /models route) that answers generation requests or not."""

    def handle(request: httpx2.Request) -> httpx2.Response:
        if status != 200:
            return httpx2.Response(status, json={"error": {"message": "no", "type": "auth", "param": None, "code": None}})
        if request.url.path.endswith("/models"):
            if models is None:
                return httpx2.Response(404, json={"detail": "Not Found"})
            return httpx2.Response(200, json={"object": "list", "data": [{"id": m, "object": "model"} for m in models]})
        if answers:
            return httpx2.Response(200, json={"id": "x", "object": "text_completion", "choices": [{"index": 0, "text": "!", "finish_reason": "length"}]})
        return httpx2.Response(404, json={"error": {"message": "model 'typo' not found", "type": "not_found", "param": None, "code": None}})

    return httpx2.AsyncClient(transport=httpx2.MockTransport(handle))


@pytest.mark.parametrize(
    ("models", "answers", "status", "expected"),
    [
        (["typo"], False, 200, None),  # listed: nothing asked
        (["/models/tiny.gguf"], True, 200, None),  # llama.cpp's way: another name listed, any name served
        (None, True, 200, None),  # no listing: one token asked
        (["other"], False, 200, "the model 'typo' is not served there (HTTP 404: model 'typo' not found); it lists other"),
        (None, False, 200, "the model 'typo' is not served there"),
        (["typo"], True, 401, "refused the credentials (HTTP 401): check the draft's API key"),
        (["typo"], True, 503, "answered HTTP 503"),
    ],
)
async def test_what_a_server_answers_decides_the_check(models, answers, status, expected) -> None:
    http = _server(models, answers=answers, status=status)
    role = RoleClient("draft", Endpoint(model="typo", base_url="http://llm.test/v1", api_key="k", max_retries=0, http_client=http))
    problem = await check_endpoint(role)
    if expected is None:
        assert problem is None
    else:
        assert problem is not None and problem.startswith("draft endpoint typo @ http://llm.test/v1") and expected in problem


async def test_a_checker_asks_for_a_token_until_the_model_has_answered_once() -> None:
    """A server that lists its one model under another name (a file's) and answers for the name asked."""
    http = _server(["/models/tiny.gguf"], answers=True)
    seen: list[str] = []

    async def record(request: httpx2.Request) -> None:
        seen.append(f"{request.method} {request.url.path}")

    http.event_hooks["request"].append(record)
    role = RoleClient("target", Endpoint(model="tiny", base_url="http://llm.test/v1", api_key="k", http_client=http))
    usages = []
    checker = EndpointChecker(role, on_usage=usages.append)
    assert await checker() is None and await checker() is None
    assert seen == ["GET /v1/models", "POST /v1/completions", "GET /v1/models"]
    assert [u.requests for u in usages] == [1, 0]  # the one-token request is metered, the listings are not


async def test_a_failing_draft_is_logged_once_and_the_answers_stay_the_targets(caplog) -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = _endpoints(provider, draft_model="sim-draft-typo")
    caplog.set_level(logging.WARNING, logger="specapi")
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy="fixed") as client:
        answers = [await client.completions.create(prompt=CODE, max_tokens=12, temperature=0) for _ in range(3)]
        copy = client.with_options(num_speculative_tokens=2)
        answers.append(await copy.completions.create(prompt=CODE, max_tokens=12, temperature=0))
    expected, _ = await target_alone(provider, prompt=CODE, max_tokens=12)
    for answer in answers:
        assert answer.choices[0].text == expected
        assert answer.speculative.fallback_reason.startswith("draft failed, continued with the target alone: draft endpoint sim-draft-typo")
    warnings = [r for r in caplog.records if r.name == "specapi" and r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert "draft endpoint sim-draft-typo @ http://sim/v1: HTTP 404" in message and "the target alone" in message


async def test_another_failure_of_the_same_endpoint_is_logged_too(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="specapi")
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    for draft in (Endpoint(model="small", base_url=_dead_url(), max_retries=0), _endpoints(provider, draft_model="nope")[1]):
        target, _ = simulated_endpoints(provider=provider)
        async with AsyncSpeculativeOpenAI(target=target, draft=draft, drafter="model", policy="fixed") as client:
            for _ in range(2):
                await client.completions.create(prompt=CODE, max_tokens=6, temperature=0)
    messages = [r.getMessage() for r in caplog.records if r.name == "specapi"]
    assert len(messages) == 2 and "APIConnectionError" in messages[0] and "HTTP 404" in messages[1]


def test_the_sync_client_checks_too() -> None:
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = _endpoints(provider, draft_model="missing")
    with SpeculativeOpenAI(target=target, draft=draft) as client:
        target_status, draft_status = client.check_endpoints()
    assert target_status.ok and not draft_status.ok and "'missing' is not served" in (draft_status.problem or "")
