"""Faults on the real vLLM: the target hung (SIGSTOP) past the client's timeout, answering 503 for a while,
killed mid-stream (SIGKILL on its process group: the API server and its engine core) and restarted; the
draft answering 503 for a while, killed mid-round and restarted.

What the caller must see, from the library and from `specapi serve`: the target's own text (the oracle:
the same server answering the same request itself) or an error that names the role, never partial text
marked complete (no finish_reason after the fault); `/ready` follows the target; the draft's return
resumes speculation (rounds and drafted tokens after the restart); no task, connection or file
descriptor is left behind (counted before and after).

The servers are the session's `vllm` pair, taken over: this module runs after every other test of the
real vLLM (conftest.py orders them), and each `vllm serve` runs in its own process group. A vLLM start
costs about a minute (several under load), so the tests run in order and restart once: the draft is
killed in one test and the target in the next, and the last restarts both together. Where the session's
pair was not started by this run (`SPECAPI_VLLM_PORTS`), or `SPECAPI_VLLM_FAULT_PORTS=TARGET,DRAFT` asks
for fixed ports, the module starts a pair of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx2
import openai
import pytest

import vllm_setup
from conftest import _die_with_parent, free_port
from real_helpers import Unavailable, connections_to
from specapi import AsyncSpeculativeOpenAI, Endpoint, TargetError
from specapi.server import BackgroundServer, ServerConfig, create_app

PROMPT = "def read_lines(path):\n    with open(path) as handle:\n"
MAX_TOKENS = 200
SHORT = 40
#: Seconds a request may take when no fault is meant to stop it (a crowded machine is slow), and the
#: client's timeout that a hung target (SIGSTOP) must reach.
TIMEOUT = 300.0
HUNG_TIMEOUT = 10.0


class VllmProcess:
    """One `vllm serve` in its own process group, on a fixed port, that a test can kill, stop, continue
    and start again; `startups` keeps how long each start took."""

    def __init__(self, argv: list[str], role: str, port: int, logs: pathlib.Path) -> None:
        self.port = port
        self.argv = [a.replace("{port}", str(port)) for a in argv]
        self.role = role
        self.model = f"tiny-{role}"
        self.log = logs / f"vllm-{role}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.startups: list[float] = []
        self._started = 0.0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def spawn(self) -> None:
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(
                self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=vllm_setup.serve_env(),
                start_new_session=True, preexec_fn=_die_with_parent,
            )  # fmt: skip
        self._started = time.monotonic()

    def wait_ready(self) -> None:
        deadline = self._started + vllm_setup.STARTUP_S
        while True:
            assert self.process is not None and self.process.poll() is None, self.log.read_text(errors="replace")[-3000:]
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(self.base_url + "/models", timeout=5).status_code == 200:
                    self.startups.append(time.monotonic() - self._started)
                    return
            assert time.monotonic() < deadline, f"vllm ({self.role}) did not start:\n" + self.log.read_text(errors="replace")[-3000:]
            time.sleep(0.5)

    def signal(self, sig: int) -> None:
        """`sig` to the whole group: the API server and its engine core."""
        assert self.process is not None
        os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGCONT)
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)


def spawn_down(*servers: VllmProcess) -> list[VllmProcess]:
    """Start the servers that are down (from this thread: a child dies with the thread that started it)."""
    down = [server for server in servers if not server.running]
    for server in down:
        server.spawn()
    return down


def start_all(*servers: VllmProcess) -> None:
    """Start the servers that are down together (their compiles overlap) and wait for each."""
    for server in spawn_down(*servers):
        server.wait_ready()


@pytest.fixture(scope="module")
def pair(request: pytest.FixtureRequest, vllm_python: pathlib.Path, vllm_models: dict[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[VllmProcess, VllmProcess]]:
    """The session's pair, taken over (this module runs last), or, where it was not started by this run
    (`SPECAPI_VLLM_PORTS`) or fixed ports are asked for (`SPECAPI_VLLM_FAULT_PORTS`), a pair of its own."""
    logs = tmp_path_factory.mktemp("vllm-faults")
    fixed = os.environ.get("SPECAPI_VLLM_FAULT_PORTS")
    session = None if fixed else request.getfixturevalue("vllm")
    if session is not None and session.target.process is not None and session.draft.process is not None:
        ports, running = [session.target.port, session.draft.port], [session.target.process, session.draft.process]
    else:
        ports, running = ([int(port) for port in fixed.split(",")] if fixed else [free_port(), free_port()]), [None, None]
    target, draft = (VllmProcess(vllm_setup.serve_argv(vllm_python, vllm_models[role], f"tiny-{role}"), role, port, logs) for role, port in zip(("target", "draft"), ports))
    target.process, draft.process = running
    with contextlib.suppress(ImportError):  # libuv's process-wide signal pipe, made with the first loop: not a leak
        import uvloop

        uvloop.new_event_loop().close()
    try:
        start_all(target, draft)
        yield target, draft
    finally:
        target.kill()
        draft.kill()
        # The start-up times, for the report (`pytest -s`): each restart costs one.
        print(f"\nvLLM start-ups (s): target {[round(s, 1) for s in target.startups]}, draft {[round(s, 1) for s in draft.startups]}")


@pytest.fixture
def up(pair: tuple[VllmProcess, VllmProcess]) -> tuple[VllmProcess, VllmProcess]:
    """Both servers running (a test run alone after a failure may find one down)."""
    start_all(*pair)
    return pair


def _endpoints(target: VllmProcess, draft: VllmProcess, *, timeout: float = TIMEOUT, target_url: str | None = None, draft_url: str | None = None, retries: int = 0) -> dict[str, Endpoint]:
    return {
        "target": Endpoint(base_url=target_url or target.base_url, model="tiny-target", name="target", timeout=timeout, max_retries=retries),
        "draft": Endpoint(base_url=draft_url or draft.base_url, model="tiny-draft", name="draft", timeout=timeout, max_retries=0),
    }


def _options(drafter: str = "model") -> dict[str, Any]:
    """A fixed draft length, the draft model drafting, no pipelining: every round asks the draft. The
    token-id path: the default one (echo) has the target rewrite most answers alone on these models
    (tests/real/vllm_known_differences.py), which would leave few rounds to break."""
    return {"policy": "fixed", "num_speculative_tokens": 3, "drafter": drafter, "pipeline": False, "verification": "token-ids"}


async def _oracle(target: VllmProcess, max_tokens: int) -> str:
    """The target alone's text for the request every test sends."""
    async with httpx2.AsyncClient(timeout=TIMEOUT) as http:
        response = await http.post(target.base_url + "/completions", json={"model": "tiny-target", "prompt": PROMPT, "temperature": 0, "max_tokens": max_tokens})
    assert response.status_code == 200, response.text
    return response.json()["choices"][0]["text"]


def _request(max_tokens: int, **more: Any) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, **more}


# -- leaks -----------------------------------------------------------------------------------------


def _descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


@contextlib.asynccontextmanager
async def no_leaks(*servers: VllmProcess) -> AsyncIterator[None]:
    """What the block opens it closes: asyncio tasks, connections to the servers, file descriptors."""
    ports = tuple(server.port for server in servers)
    tasks, descriptors = len(asyncio.all_tasks()), _descriptors()
    assert connections_to(*ports) == 0
    yield
    for _ in range(100):
        if len(asyncio.all_tasks()) <= tasks and connections_to(*ports) == 0 and _descriptors() <= descriptors:
            return
        await asyncio.sleep(0.1)
    assert len(asyncio.all_tasks()) <= tasks, [task.get_coro() for task in asyncio.all_tasks()]
    assert connections_to(*ports) == 0
    assert _descriptors() <= descriptors, os.listdir("/proc/self/fd")


# -- the proxy's side ------------------------------------------------------------------------------


async def _ready(http: httpx2.AsyncClient, status: int, within: float = 120.0) -> dict[str, Any]:
    """Poll `/ready` until it answers `status`; its body."""
    deadline = time.monotonic() + within
    while True:
        response = await http.get("/ready")
        if response.status_code == status:
            return response.json()
        assert time.monotonic() < deadline, f"/ready never answered {status}: {response.status_code} {response.text}"
        await asyncio.sleep(0.2)


async def _sse(response: httpx2.Response) -> AsyncIterator[dict[str, Any] | str]:
    async for line in response.aiter_lines():
        if line.startswith("data:"):
            data = line[len("data:") :].strip()
            yield data if data == "[DONE]" else json.loads(data)


def _proxy(target: VllmProcess, draft: VllmProcess, *, drafter: str = "model", **endpoint_options: Any) -> BackgroundServer:
    interval = endpoint_options.pop("readiness_interval", 0.5)
    options = _options(drafter)
    config = ServerConfig(**_endpoints(target, draft, **endpoint_options), num_speculative_tokens=options.pop("num_speculative_tokens"), client_options=options, readiness_interval=interval)
    return BackgroundServer(create_app(config))


# -- the target hung ---------------------------------------------------------------------------------


async def test_target_hung_past_the_timeout_is_a_timeout_naming_the_target_and_it_serves_again(up: tuple[VllmProcess, VllmProcess]) -> None:
    target, draft = up
    expected = await _oracle(target, SHORT)
    async with no_leaks(target, draft):
        async with AsyncSpeculativeOpenAI(**_endpoints(target, draft, timeout=HUNG_TIMEOUT), **_options()) as client:
            warm = await client.completions.create(**_request(SHORT))
            assert warm.choices[0].text == expected and warm.speculative.drafted_tokens > 0
            target.signal(signal.SIGSTOP)
            try:
                with pytest.raises(TargetError) as info:
                    await client.completions.create(**_request(SHORT))
            finally:
                target.signal(signal.SIGCONT)
            assert isinstance(info.value, openai.APITimeoutError) and info.value.role == "target"
            again = await client.completions.create(**_request(SHORT))
            assert again.choices[0].text == expected


async def _served_again(http: httpx2.AsyncClient, within: float = 180.0) -> httpx2.Response:
    """The proxy's answer once the resumed target answers within the proxy's short timeout: a target just
    resumed first finishes the request it held, so on a loaded machine the next one may still time out;
    each such answer must be the 504 naming the target, never text."""
    deadline = time.monotonic() + within
    while True:
        response = await http.post("/v1/completions", json=_request(SHORT))
        if response.status_code != 504 or time.monotonic() > deadline:
            return response
        assert response.json()["error"]["role"] == "target" and "choices" not in response.json()
        await asyncio.sleep(2.0)


async def test_the_proxy_answers_a_hung_target_with_a_504_naming_it_and_ready_follows(up: tuple[VllmProcess, VllmProcess]) -> None:
    target, draft = up
    expected = await _oracle(target, SHORT)
    async with no_leaks(target, draft):
        with _proxy(target, draft, timeout=HUNG_TIMEOUT) as proxy:
            async with httpx2.AsyncClient(base_url=proxy.url, timeout=TIMEOUT) as http:
                await _ready(http, 200)
                target.signal(signal.SIGSTOP)
                try:
                    hung = await http.post("/v1/completions", json=_request(SHORT))
                    down = await _ready(http, 503)  # the check's own timeout (5 s) decides it
                finally:
                    target.signal(signal.SIGCONT)
                await _ready(http, 200)
                again = await _served_again(http)
    assert hung.status_code == 504 and hung.json()["error"]["code"] == "target_timeout" and hung.json()["error"]["role"] == "target"
    assert "choices" not in hung.json() and str(target.port) not in hung.text
    assert "target" in down["reason"] and str(target.port) not in json.dumps(down)
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == expected


# -- a server answering 503 for a while --------------------------------------------------------------


async def test_a_target_answering_503_for_a_while_is_retried_then_named(up: tuple[VllmProcess, VllmProcess]) -> None:
    target, draft = up
    expected = await _oracle(target, SHORT)
    front = Unavailable(target.port, TIMEOUT)
    async with no_leaks(target, draft):
        with BackgroundServer(front.app()) as server:
            endpoints = _endpoints(target, draft, target_url=server.url + "/v1", retries=3)
            async with AsyncSpeculativeOpenAI(**endpoints, **_options()) as client:
                front.failing = 2  # fewer than the retries: the caller gets the target's text
                result = await client.completions.create(**_request(SHORT))
                assert result.choices[0].text == expected and front.refused == 2
                front.failing = 1000  # for longer: an error naming the target, no text
                with pytest.raises(TargetError) as info:
                    await client.completions.create(**_request(SHORT))
                assert isinstance(info.value, openai.InternalServerError) and info.value.status_code == 503 and info.value.role == "target"
                front.failing = 0
                back = await client.completions.create(**_request(SHORT))
                assert back.choices[0].text == expected and back.speculative.drafted_tokens > 0


async def test_the_proxy_in_front_of_a_target_answering_503_says_502_naming_it_and_ready_follows(up: tuple[VllmProcess, VllmProcess]) -> None:
    target, draft = up
    expected = await _oracle(target, SHORT)
    front = Unavailable(target.port, TIMEOUT)
    async with no_leaks(target, draft):
        with BackgroundServer(front.app()) as server, _proxy(target, draft, target_url=server.url + "/v1") as proxy:
            async with httpx2.AsyncClient(base_url=proxy.url, timeout=TIMEOUT) as http:
                await _ready(http, 200)
                front.failing = 10_000
                failed = await http.post("/v1/completions", json=_request(SHORT))
                streamed = await http.post("/v1/completions", json=_request(SHORT, stream=True))
                down = await _ready(http, 503)
                front.failing = 0
                await _ready(http, 200)
                again = await http.post("/v1/completions", json=_request(SHORT))
    for answer in (failed, streamed):  # a stream that fails before its first chunk gets a status too
        assert answer.status_code == 502 and answer.json()["error"]["role"] == "target" and "choices" not in answer.json()
        assert "503" in answer.json()["error"]["message"] and str(target.port) not in answer.text and str(server.port) not in answer.text
    assert "target" in down["reason"]
    assert again.status_code == 200 and again.json()["choices"][0]["text"] == expected


async def test_a_draft_answering_503_for_a_while_leaves_the_targets_text_then_speculation_resumes(up: tuple[VllmProcess, VllmProcess]) -> None:
    target, draft = up
    expected = await _oracle(target, SHORT)
    front = Unavailable(draft.port, TIMEOUT)
    async with no_leaks(target, draft):
        with BackgroundServer(front.app()) as server:
            async with AsyncSpeculativeOpenAI(**_endpoints(target, draft, draft_url=server.url + "/v1"), **_options()) as client:
                front.failing = 10_000
                down = await client.completions.create(**_request(SHORT))
                assert down.choices[0].text == expected and front.refused > 0
                assert "draft" in (down.speculative.fallback_reason or "") and down.speculative.exact
                front.failing = 0
                back = await client.completions.create(**_request(SHORT))
                assert back.choices[0].text == expected and back.speculative.drafted_tokens > 0 and not back.speculative.fallback_reason


# -- the draft killed --------------------------------------------------------------------------------


async def test_draft_killed_mid_round_leaves_the_targets_text_and_the_proxy_ready_degraded(up: tuple[VllmProcess, VllmProcess]) -> None:
    """The draft stays down after this test: the last one restarts it (with the target)."""
    target, draft = up
    expected, short = await _oracle(target, MAX_TOKENS), await _oracle(target, SHORT)
    async with no_leaks(target, draft):
        async with AsyncSpeculativeOpenAI(**_endpoints(target, draft), **_options()) as client:
            stream = await client.completions.create(**_request(MAX_TOKENS, stream=True))
            pieces, finishes = [], []
            async for chunk in stream:
                pieces.append(chunk.choices[0].text)
                finishes.append(chunk.choices[0].finish_reason)
                if len(pieces) == 1:
                    draft.kill()
            stats = stream.speculative
            assert "".join(pieces) == expected and finishes[-1] is not None and stats is not None and stats.exact
            assert stats.rounds and stats.fallback_reason and "draft" in stats.fallback_reason
            down = await client.completions.create(**_request(SHORT))
            assert down.choices[0].text == short and "draft" in (down.speculative.fallback_reason or "")
        with _proxy(target, draft) as proxy:
            async with httpx2.AsyncClient(base_url=proxy.url, timeout=TIMEOUT) as http:
                ready = await _ready(http, 200)
                served = await http.post("/v1/completions", json=_request(SHORT))
    assert served.status_code == 200 and served.json()["choices"][0]["text"] == short
    assert "draft" in served.json()["speculative"]["fallback_reason"]
    assert ready["status"] == "degraded" and ready["roles"]["draft"]["status"] == "failing" and str(draft.port) not in json.dumps(ready), ready


# -- the target killed -------------------------------------------------------------------------------


async def test_target_killed_mid_stream_is_an_error_naming_it_never_text_marked_complete(pair: tuple[VllmProcess, VllmProcess]) -> None:
    """The library's stream and the proxy's, both speculating, in flight when the target's process group
    is killed. The draft server is down since the test before: the drafts come from the suffix index
    (each learns the answer from a first request), so the rounds go on without it. The target stays
    down after this test."""
    target, draft = pair
    start_all(target)
    expected = await _oracle(target, MAX_TOKENS)
    pieces: list[str] = []
    finishes: list[str | None] = []
    events: list[dict[str, Any] | str] = []
    async with no_leaks(target, draft):
        with _proxy(target, draft, drafter="suffix", readiness_interval=0.5) as proxy:
            async with httpx2.AsyncClient(base_url=proxy.url, timeout=TIMEOUT) as http, AsyncSpeculativeOpenAI(**_endpoints(target, draft), **_options("suffix")) as client:
                await _ready(http, 200)
                learnt = await client.completions.create(**_request(MAX_TOKENS))
                taught = await http.post("/v1/completions", json=_request(MAX_TOKENS))
                assert learnt.choices[0].text == expected and taught.json()["choices"][0]["text"] == expected
                drafted = await client.completions.create(**_request(SHORT))  # the index drafts the answer now
                assert drafted.speculative.rounds and drafted.speculative.accepted_tokens > 0
                async with http.stream("POST", "/v1/completions", json=_request(MAX_TOKENS, stream=True)) as response:
                    assert response.status_code == 200
                    served = _sse(response)
                    events.append(await anext(served))
                    stream = await client.completions.create(**_request(MAX_TOKENS, stream=True))
                    with pytest.raises(TargetError) as info:
                        async for chunk in stream:
                            pieces.append(chunk.choices[0].text)
                            finishes.append(chunk.choices[0].finish_reason)
                            if len(pieces) == 1:
                                target.kill()
                    events.extend([event async for event in served])
                down = await _ready(http, 503)
                failed = await http.post("/v1/completions", json=_request(SHORT))
                with pytest.raises(TargetError) as refused:
                    await client.completions.create(**_request(SHORT))
    assert info.value.role == "target" and isinstance(info.value, openai.APIError)
    assert not any(finishes)  # nothing after the kill said the text was complete
    assert expected.startswith("".join(pieces)) and len("".join(pieces)) < len(expected)
    texts = [event for event in events if isinstance(event, dict) and "choices" in event]
    errors = [event for event in events if isinstance(event, dict) and "error" in event]
    assert "[DONE]" not in events and not any(choice.get("finish_reason") for event in texts for choice in event["choices"]), events[-3:]
    assert len(errors) == 1 and errors[0]["error"]["role"] == "target" and str(target.port) not in json.dumps(errors), errors
    assert expected.startswith("".join(event["choices"][0]["text"] for event in texts))
    assert "target" in down["reason"] and str(target.port) not in json.dumps(down)
    assert failed.status_code == 502 and failed.json()["error"]["role"] == "target" and "choices" not in failed.json()
    assert refused.value.role == "target" and isinstance(refused.value, openai.APIConnectionError)


# -- both restarted ----------------------------------------------------------------------------------


async def test_both_restarted_ready_follows_the_target_and_the_drafts_return_resumes_speculation(pair: tuple[VllmProcess, VllmProcess]) -> None:
    """A client and a proxy made while both are down: the proxy is not ready, the client's request names
    the target; after the restart (both at once) the proxy is ready, both answer the target's own text,
    and both speculate again."""
    target, draft = pair
    for server in pair:  # down after the tests before (alone, this test kills them itself)
        server.kill()
    async with no_leaks(target, draft):
        with _proxy(target, draft, readiness_interval=0.5) as proxy:
            async with httpx2.AsyncClient(base_url=proxy.url, timeout=TIMEOUT) as http, AsyncSpeculativeOpenAI(**_endpoints(target, draft), **_options()) as client:
                down = await _ready(http, 503)
                with pytest.raises(TargetError) as info:
                    await client.completions.create(**_request(SHORT))
                for server in spawn_down(target, draft):
                    await asyncio.to_thread(server.wait_ready)
                await _ready(http, 200)
                expected = await _oracle(target, SHORT)
                served = await http.post("/v1/completions", json=_request(SHORT))
                back = await client.completions.create(**_request(SHORT))
    assert "target" in down["reason"] and down["roles"]["draft"]["status"] == "failing" and info.value.role == "target"
    assert served.status_code == 200 and served.json()["choices"][0]["text"] == expected
    assert served.json()["speculative"]["drafted_tokens"] > 0 and not served.json()["speculative"].get("fallback_reason")
    assert back.choices[0].text == expected and back.speculative.rounds and back.speculative.drafted_tokens > 0
    assert not back.speculative.fallback_reason
