"""Faults on the real llama-server: the target killed mid-stream, hung (SIGSTOP) past the timeout and
restarted; the draft killed mid-request and restarted; a server answering 503 for a while (a small
proxy in front of the target, in the test).

What the caller must see: the target's own text (the oracle: the same server answering the same request
before the fault) or an error that names the role, never partial text marked complete (no finish_reason
after the fault); `/ready` of `specapi serve` follows the target; the draft's return resumes
speculation; no task or connection is left behind (counted before and after).

The servers here are this module's own (the session's `ls` pair is never killed): one target and one
draft process on fixed ports, restarted on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import openai
import pytest

from conftest import _die_with_parent, free_port
from real_helpers import Unavailable, connections_to
from specapi import AsyncSpeculativeOpenAI, DraftError, Endpoint, TargetError
from specapi.server import BackgroundServer, ServerConfig, create_app

PROMPT = "The model"  # greedy: about 420 tokens before the end of text
MAX_TOKENS = 200


class Process:
    """One llama-server on a fixed port that a test can kill, stop, continue and start again."""

    def __init__(self, binary: str, model: str, alias: str, logs: Any) -> None:
        self.port = free_port()
        self.argv = [
            binary, "--model", model, "--alias", alias, "--host", "127.0.0.1", "--port", str(self.port), "--ctx-size", "4096",
            "--parallel", "4", "--threads", "1", "--threads-batch", "1", "--threads-http", "16", "--no-webui",
        ]  # fmt: skip
        self.alias = alias
        self.log = logs / f"{alias}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
        deadline = time.monotonic() + 60
        while True:
            assert self.process.poll() is None, self.log.read_text(errors="replace")[-2000:]
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(f"http://127.0.0.1:{self.port}/health", timeout=2).status_code == 200:
                    return
            assert time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.1)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
            self.process.wait(timeout=15)

    def signal(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def ensure(self) -> None:
        if self.process is None or self.process.poll() is not None:
            self.start()


@pytest.fixture(scope="module")
def servers(real_build, tiny_models, tmp_path_factory) -> Iterator[tuple[Process, Process]]:  # type: ignore[no-untyped-def]
    logs = tmp_path_factory.mktemp("faults")
    target = Process(str(real_build), str(tiny_models[0]), "tiny-target", logs)
    draft = Process(str(real_build), str(tiny_models[1]), "tiny-draft", logs)
    try:
        target.start()
        draft.start()
        yield target, draft
    finally:
        target.kill()
        draft.kill()


@pytest.fixture
def up(servers: tuple[Process, Process]) -> tuple[Process, Process]:
    """Both servers running (a test before may have left one down)."""
    for server in servers:
        server.ensure()
    return servers


def _endpoints(target: Process, draft: Process, *, timeout: float = 30.0, target_url: str | None = None, retries: int = 0) -> dict[str, Endpoint]:
    return {
        "target": Endpoint(base_url=target_url or target.base_url, model="tiny-target", name="target", timeout=timeout, max_retries=retries),
        "draft": Endpoint(base_url=draft.base_url, model="tiny-draft", name="draft", timeout=timeout, max_retries=0),
    }


async def _oracle(target: Process, **request: Any) -> str:
    async with httpx2.AsyncClient(timeout=60) as http:
        response = await http.post(target.base_url + "/completions", json={"model": "tiny-target", "prompt": PROMPT, "temperature": 0, **request})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


async def _settled(ports: tuple[int, ...], tasks: int) -> None:
    """No task and no connection left: what was open before the test is open after it."""
    for _ in range(50):
        if len(asyncio.all_tasks()) <= tasks and connections_to(*ports) == 0:
            return
        await asyncio.sleep(0.1)
    assert len(asyncio.all_tasks()) <= tasks, [t.get_coro() for t in asyncio.all_tasks()]
    assert connections_to(*ports) == 0


# -- the target --------------------------------------------------------------------------------------


async def test_target_killed_mid_stream_is_an_error_naming_the_target_never_complete_text(up: tuple[Process, Process]) -> None:
    target, draft = up
    tasks = len(asyncio.all_tasks())
    expected = await _oracle(target, max_tokens=MAX_TOKENS)
    pieces: list[str] = []
    finish = None
    async with AsyncSpeculativeOpenAI(**_endpoints(target, draft), policy="fixed", num_speculative_tokens=2) as client:
        stream = await client.completions.create(prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True)
        with pytest.raises(TargetError) as info:
            async for chunk in stream:
                pieces.append(chunk.choices[0].text)
                finish = chunk.choices[0].finish_reason or finish
                if len(pieces) == 1:
                    target.kill()
    assert info.value.role == "target" and isinstance(info.value, openai.APIError)
    assert finish is None  # nothing after the kill said the text was complete
    assert expected.startswith("".join(pieces)) and len("".join(pieces)) < len(expected)
    await _settled((target.port, draft.port), tasks)


async def test_target_restarted_serves_its_own_text_again_and_ready_follows_it(up: tuple[Process, Process]) -> None:
    target, draft = up
    expected = await _oracle(target, max_tokens=40)
    config = ServerConfig(**_endpoints(target, draft), client_options={"policy": "fixed"}, readiness_interval=0.2)
    with BackgroundServer(create_app(config)) as proxy:
        async with httpx2.AsyncClient(base_url=proxy.url, timeout=30) as http:
            assert (await http.get("/ready")).status_code == 200
            target.kill()
            down = await _poll(http, 503)
            assert "target" in down["reason"] and str(target.port) not in json.dumps(down)
            failed = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 40, "temperature": 0})
            assert failed.status_code == 502 and failed.json()["error"]["role"] == "target" and "choices" not in failed.json()
            target.start()
            await _poll(http, 200)
            again = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 40, "temperature": 0})
            assert again.status_code == 200 and again.json()["choices"][0]["text"] == expected


async def _poll(http: httpx2.AsyncClient, status: int) -> dict[str, Any]:
    for _ in range(100):
        response = await http.get("/ready")
        if response.status_code == status:
            return response.json()
        await asyncio.sleep(0.1)
    raise AssertionError(f"/ready never answered {status}: {response.status_code} {response.text}")


async def test_target_hung_past_the_timeout_is_a_timeout_naming_the_target(up: tuple[Process, Process]) -> None:
    target, draft = up
    tasks = len(asyncio.all_tasks())
    expected = await _oracle(target, max_tokens=40)
    async with AsyncSpeculativeOpenAI(**_endpoints(target, draft, timeout=2.0), policy="fixed") as client:
        warm = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0)
        assert warm.choices[0].text == expected
        target.signal(signal.SIGSTOP)
        try:
            with pytest.raises(TargetError) as info:
                await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0)
        finally:
            target.signal(signal.SIGCONT)
        assert isinstance(info.value, openai.APITimeoutError) and info.value.role == "target"
        again = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0)
        assert again.choices[0].text == expected
    await _settled((target.port, draft.port), tasks)


async def test_the_proxy_answers_a_hung_target_with_a_504_naming_it(up: tuple[Process, Process]) -> None:
    target, draft = up
    config = ServerConfig(**_endpoints(target, draft, timeout=2.0), client_options={"policy": "fixed"}, readiness_interval=3600.0)
    with BackgroundServer(create_app(config)) as proxy:
        async with httpx2.AsyncClient(base_url=proxy.url, timeout=30) as http:
            assert (await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0})).status_code == 200
            target.signal(signal.SIGSTOP)
            try:
                hung = await http.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 8, "temperature": 0})
            finally:
                target.signal(signal.SIGCONT)
    assert hung.status_code == 504 and hung.json()["error"]["code"] == "target_timeout" and str(target.port) not in hung.text


# -- the draft ---------------------------------------------------------------------------------------


async def test_draft_killed_mid_request_leaves_the_targets_text_and_its_return_resumes_speculation(up: tuple[Process, Process]) -> None:
    target, draft = up
    tasks = len(asyncio.all_tasks())
    expected, short = await _oracle(target, max_tokens=MAX_TOKENS), await _oracle(target, max_tokens=40)
    async with AsyncSpeculativeOpenAI(**_endpoints(target, draft), policy="fixed", num_speculative_tokens=2, drafter="model", pipeline=False) as client:
        stream = await client.completions.create(prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, stream=True)
        pieces = []
        async for chunk in stream:
            pieces.append(chunk.choices[0].text)
            if len(pieces) == 1:
                draft.kill()
        stats = stream.speculative
        assert "".join(pieces) == expected and stats is not None and stats.exact
        assert stats.fallback_reason and "draft" in stats.fallback_reason
        down = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0)
        assert down.choices[0].text == short and "draft" in (down.speculative.fallback_reason or "")
        draft.start()
        back = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0)
        assert back.choices[0].text == short
        assert back.speculative.speculated and back.speculative.drafted_tokens > 0 and not back.speculative.fallback_reason
    await _settled((target.port, draft.port), tasks)


# -- a server answering 503 for a while ------------------------------------------------------------


async def test_a_target_answering_503_for_a_while_is_retried_then_named(up: tuple[Process, Process]) -> None:
    target, draft = up
    expected = await _oracle(target, max_tokens=40)
    front = Unavailable(target.port, 60)
    with BackgroundServer(front.app()) as server:
        endpoints = _endpoints(target, draft, target_url=server.url + "/v1", retries=3)
        async with AsyncSpeculativeOpenAI(**endpoints, policy="fixed") as client:
            front.failing = 2  # shorter than the retries: the caller gets the target's text
            result = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0)
            assert result.choices[0].text == expected and front.refused == 2
            front.failing = 1000  # longer: an error naming the target, no text
            with pytest.raises(TargetError) as info:
                await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0, stream=False)
            assert isinstance(info.value, openai.InternalServerError) and info.value.status_code == 503 and info.value.role == "target"
            front.failing = 0
            assert (await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0)).choices[0].text == expected
