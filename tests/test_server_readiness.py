"""`/ready`: 503 while the simulated target is down, 200 once it is back; checked in the background and
at once after a request fails on the target. `/health` stays 200 throughout (liveness)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import time
from collections.abc import Iterator

import httpx2
import openai
import pytest

from specapi import Endpoint
from specapi.server import BackgroundServer, ServerConfig, create_app
from specapi.server.readiness import Readiness, target_check
from specapi.sim import SimProvider
from specapi.sim import create_app as create_sim_app
from test_server_support import PROXY_KEY, metric, no_sleep, proxy_pair


@contextlib.contextmanager
def simulated_target(port: int = 0) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_sim_app(SimProvider(latency="instant")), port=port, shutdown_timeout=1) as server:
        yield server


def proxy_config(port: int, **overrides) -> ServerConfig:
    common = {"base_url": f"http://127.0.0.1:{port}/v1", "api_key": "sk-sim", "max_retries": 0, "timeout": 5.0}
    options = {
        "target": Endpoint(model="sim-target", **common),
        "draft": Endpoint(model="sim-draft", **common),
        "api_key": PROXY_KEY,
        "client_options": {"policy": "fixed", "sleep": no_sleep},
        **overrides,
    }
    return ServerConfig(**options)


def wait_for(client: httpx2.Client, status: int, timeout: float = 15.0) -> httpx2.Response:
    deadline = time.monotonic() + timeout
    while True:
        response = client.get("/ready")
        if response.status_code == status or time.monotonic() > deadline:
            return response
        time.sleep(0.02)


def test_ready_flips_when_the_target_goes_down_and_comes_back():
    with simulated_target() as target:
        port = target.port
        proxy = BackgroundServer(create_app(proxy_config(port, readiness_interval=0.05)), shutdown_timeout=1).start()
        try:
            with httpx2.Client(base_url=proxy.url, timeout=10) as client:
                assert wait_for(client, 200).json() == {"status": "ready", "roles": {"target": {"status": "ok"}, "draft": {"status": "ok"}}}
                target.stop()  # the simulated target (and draft: one server) goes away
                down = wait_for(client, 503)
                assert down.status_code == 503 and down.json()["status"] == "unready"
                assert down.json()["reason"].startswith("target endpoint") and "unreachable" in down.json()["reason"]
                assert str(port) not in down.text  # the target's address stays inside
                roles = down.json()["roles"]
                assert roles["target"]["status"] == "failing" and roles["target"]["reason"] == down.json()["reason"]
                assert client.get("/health").status_code == 200  # liveness does not depend on the target
                assert metric(client.get("/metrics").text, "specapi_ready") == 0
                with simulated_target(port):  # and comes back on the same port
                    assert wait_for(client, 200).status_code == 200
                    assert metric(client.get("/metrics").text, "specapi_ready") == 1
        finally:
            proxy.stop()


def test_a_failed_request_makes_the_proxy_unready_without_waiting_for_the_next_check():
    with simulated_target() as target:
        port = target.port
        # Background checks an hour apart: only the failed request can trigger the check that flips /ready.
        proxy = BackgroundServer(create_app(proxy_config(port, readiness_interval=3600)), shutdown_timeout=1).start()
        try:
            with httpx2.Client(base_url=proxy.url, timeout=10) as client, \
                    openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as sdk:
                assert wait_for(client, 200).status_code == 200
                sdk.completions.create(model="sim-target", prompt="def f(x):", max_tokens=4, temperature=0)
                assert client.get("/ready").status_code == 200
                target.stop()
                with pytest.raises(openai.InternalServerError):  # 502 naming the target
                    sdk.completions.create(model="sim-target", prompt="def f(x):", max_tokens=4, temperature=0)
                assert client.get("/ready").status_code == 503
                with simulated_target(port):  # while unready it re-checks often, whatever the interval
                    assert wait_for(client, 200).status_code == 200
        finally:
            proxy.stop()


def test_ready_before_startup_and_a_refused_key():
    async def ready_before_startup() -> httpx2.Response:
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=create_app(proxy_config(1))), base_url="http://proxy") as client:
            return await client.get("/ready")  # the transport runs no lifespan: nothing checked yet

    response = asyncio.run(ready_before_startup())
    assert response.status_code == 503 and response.json() == {"status": "starting"}

    def refuse(request: httpx2.Request) -> httpx2.Response:
        assert request.url.path == "/v1/models" and request.headers["authorization"] == "Bearer sk-t"
        return httpx2.Response(401, json={"error": {"message": "bad key"}})

    endpoint = Endpoint(model="m", base_url="http://t/v1", api_key="sk-t", http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(refuse)))
    check, release = target_check(endpoint)

    async def check_once() -> str | None:
        try:
            return await check()
        finally:
            await release()

    assert "credentials" in asyncio.run(check_once())


def test_suspect_checks_at_once_and_the_loop_goes_on():
    answers = iter([None, "target unreachable (ConnectError)", None])
    changes: list[bool] = []

    async def check() -> str | None:
        return next(answers)

    async def never(seconds: float) -> None:  # the interval never elapses: only suspect() can wake the loop
        await asyncio.Future()

    async def scenario() -> None:
        readiness = Readiness(check, interval=60, sleep=never, on_change=changes.append)
        task = asyncio.ensure_future(readiness.run())
        while readiness.checks < 1:
            await asyncio.sleep(0)
        assert readiness.ready
        readiness.suspect("a request failed on the target")
        assert not readiness.ready and readiness.reason == "a request failed on the target"
        while readiness.checks < 2:
            await asyncio.sleep(0)
        assert not readiness.ready and "ConnectError" in readiness.reason
        readiness.suspect("again")
        while readiness.checks < 3:
            await asyncio.sleep(0)
        assert readiness.ready and readiness.reason is None
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
    assert changes == [True, False, True]


async def test_the_proxy_loads_what_the_first_requests_would_before_it_serves(monkeypatch):
    """The suffix index's tokenizer takes 0.3 s of CPU to load: loaded by the first request, it stalled
    every stream in flight on the event loop. The app loads it at startup."""
    import specapi.parts.drafters

    monkeypatch.setattr(specapi.parts.drafters, "_ENCODING", None)
    app = create_app(proxy_config(port=9))  # nothing listens there: readiness is checked in the background
    async with app.router.lifespan_context(app):
        assert specapi.parts.drafters._ENCODING is not None


async def test_a_proxy_process_keeps_what_startup_loaded_out_of_the_collectors_passes_until_shutdown():
    """A full pass of the garbage collector walked every object the proxy loaded at startup (40-70 ms
    with the event loop stopped, under load). `specapi serve` freezes them once started; an app mounted
    in another program leaves that program's collector alone."""
    import gc

    from specapi.server.command import proxy_app, resolve_settings

    assert gc.get_freeze_count() == 0
    app = create_app(proxy_config(port=9, freeze_gc=True))
    async with app.router.lifespan_context(app):
        assert gc.get_freeze_count() > 10_000  # the modules, the tokenizer's tables, the client
    assert gc.get_freeze_count() == 0  # given back at shutdown
    mounted = create_app(proxy_config(port=9))
    async with mounted.router.lifespan_context(mounted):
        assert gc.get_freeze_count() == 0
    environ = {"SPECAPI_TARGET_BASE_URL": "http://127.0.0.1:9/v1", "SPECAPI_TARGET_MODEL": "t", "SPECAPI_VERIFICATION": "none"}
    settings = resolve_settings(argparse.Namespace(), environ)
    assert not settings.config.freeze_gc and proxy_app(settings).state.config.freeze_gc


def test_the_proxy_probes_the_target_before_it_serves_and_bills_the_probe_in_its_metrics():
    """A cold burst's requests all waited for the first one's probe (under `--workers 2`, 50 streams each
    240 ms late to their first token). The proxy probes at startup; no response carries the probe's
    calls, so `/metrics` does: its upstream totals stay what the target billed."""
    with proxy_pair() as (srv, proxy):
        posts = lambda: [r for r in srv.log if r.method == "POST"]  # noqa: E731 (GETs ask the server's kind: unbilled)
        probe_calls = len(posts())
        assert probe_calls >= 1, "probed before the first request"
        with httpx2.Client(base_url=proxy.url, timeout=10) as client:
            text = client.get("/metrics").text
            assert metric(text, "specapi_upstream_requests_total", role="target") == probe_calls
            assert metric(text, "specapi_upstream_tokens_total", role="target", kind="prompt") > 0
            assert metric(text, "specapi_workers") == 1
            body = {"model": "target", "prompt": "a b c d e f a b c d e f", "max_tokens": 8, "temperature": 0}
            reply = client.post("/v1/completions", json=body, headers={"authorization": f"Bearer {PROXY_KEY}"})
            assert reply.status_code == 200
            stats = reply.json()["speculative"]
            after = posts()
            request_calls = [r for r in after[probe_calls:] if r.model == "target"]
            assert stats["target"]["requests"] == len(request_calls) >= 1, "the request's own calls, no probe"
            text = client.get("/metrics").text
            assert metric(text, "specapi_upstream_requests_total", role="target") == probe_calls + len(request_calls)


async def test_a_target_that_does_not_answer_at_startup_does_not_hold_the_proxy_back(monkeypatch):
    """A target that accepts connections and never answers: startup waits a bounded time for the probe,
    then serves; the probe goes on (a request would wait for it, as before) and is cancelled at shutdown,
    its calls counted in `/metrics`."""
    import specapi.server.app

    async def never_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await reader.read(-1)
        writer.close()

    server = await asyncio.start_server(never_answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    monkeypatch.setattr(specapi.server.app, "STARTUP_PROBE_WAIT_S", 0.3)
    app = create_app(proxy_config(port))
    started = time.monotonic()
    try:
        async with app.router.lifespan_context(app):
            waited = time.monotonic() - started
            assert waited < 3.0, f"startup waited {waited:.2f} s for a target that never answers"
            assert metric(app.state.metrics.render().decode(), "specapi_workers") == 1
        text = app.state.metrics.render().decode()
        assert metric(text, "specapi_workers") == 0
        # The call cut short at shutdown was sent all the same: counted, as failed.
        assert metric(text, "specapi_upstream_failed_requests_total", role="target") >= 1
    finally:
        server.close()


@pytest.mark.parametrize("failure", ["wrong-model", "dead-endpoint"])
def test_ready_reports_a_failing_draft_and_the_proxy_serves_with_the_target_alone(failure, caplog):
    """A draft that does not answer leaves the proxy ready ("degraded"): its answers are the target's.
    `/ready` names the draft's problem, by its role (its address stays inside); the log says it once, with the address."""
    import logging

    caplog.set_level(logging.INFO, logger="specapi")
    with simulated_target() as target:
        if failure == "wrong-model":
            draft = Endpoint(model="sim-draft-typo", base_url=f"http://127.0.0.1:{target.port}/v1", api_key="sk-sim", max_retries=0, timeout=5.0)
            expected = "draft endpoint sim-draft-typo @ http://127.0.0.1:{port}/v1: the model 'sim-draft-typo' is not served there"
            public = "draft endpoint: the model 'sim-draft-typo' is not served there"
        else:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                dead = sock.getsockname()[1]
            draft = Endpoint(model="sim-draft", base_url=f"http://127.0.0.1:{dead}/v1", max_retries=0, timeout=5.0)
            expected = "draft endpoint sim-draft @ http://127.0.0.1:{port}/v1 is unreachable".replace("{port}", str(dead))
            public = "draft endpoint is unreachable"
        expected = expected.replace("{port}", str(target.port))
        config = proxy_config(target.port, draft=draft, readiness_interval=0.05, client_options={"policy": "fixed", "sleep": no_sleep, "drafter": "model"})
        with BackgroundServer(create_app(config), shutdown_timeout=1) as proxy, \
                httpx2.Client(base_url=proxy.url, timeout=10) as client, \
                openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as sdk:
            ready = wait_for(client, 200)
            while ready.json()["status"] == "starting":
                ready = wait_for(client, 200)
            assert ready.json()["status"] == "degraded" and ready.json()["roles"]["target"] == {"status": "ok"}
            draft_state = ready.json()["roles"]["draft"]
            assert draft_state["status"] == "failing" and draft_state["reason"].startswith(public), draft_state
            assert str(target.port) not in ready.text and "127.0.0.1" not in ready.text
            answer = sdk.completions.create(model="sim-target", prompt="def f(x):", max_tokens=6, temperature=0)
            assert not answer.speculative["speculated"] and answer.speculative["fallback_reason"].startswith("draft failed")
            time.sleep(0.3)  # a few more checks: the state is said once, not at every check
    said = [r.getMessage() for r in caplog.records if r.name == "specapi.server" and "the proxy serves with the target alone" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(expected)
