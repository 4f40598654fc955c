"""Helpers of the real-server tests: the server handles, the oracle (the same server answering the
same request itself) and specapi's answer collected the same way."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import subprocess
from collections.abc import Awaitable
from typing import Any, TypeVar

import httpx2

from specapi import AsyncSpeculativeOpenAI, Endpoint, SpeculativeStats

T = TypeVar("T")


@dataclasses.dataclass
class Server:
    """One server process serving one model."""

    family: str  # "llama-cpp-python", "llama-server" or "vllm"
    role: str  # "target" or "draft"
    model: str  # the name requests send (the server's alias)
    port: int
    process: subprocess.Popen[bytes] | None  # None: a server this test run did not start
    log: pathlib.Path

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        return f"{self.root}/v1"

    def endpoint(self, **options: Any) -> Endpoint:
        return Endpoint(base_url=self.base_url, model=self.model, name=f"{self.family} {self.role} @ {self.port}", **options)

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""


@dataclasses.dataclass
class ServerPair:
    target: Server
    draft: Server

    @property
    def family(self) -> str:
        return self.target.family


# -- the oracle: the same server, answering the same request itself ------------------------------


def _body(server: Server, body: dict[str, Any]) -> dict[str, Any]:
    return {"model": server.model, **body}


async def oracle_post(server: Server, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST to the server directly (path under /v1, or an absolute native path like "/completion")."""
    url = (server.root if path in ("/completion", "/tokenize", "/detokenize") else server.base_url) + path
    async with httpx2.AsyncClient(timeout=60.0) as client:
        response = await client.post(url, json=_body(server, body) if url.startswith(server.base_url) else body)
    assert response.status_code == 200, f"{server.family} refused {path} {body}: HTTP {response.status_code} {response.text[:500]}"
    return response.json()


async def oracle_stream(server: Server, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """The server's own SSE stream for this body, as a list of JSON chunks (without [DONE])."""
    chunks = []
    async with httpx2.AsyncClient(timeout=60.0) as client:
        async with client.stream("POST", server.base_url + path, json=_body(server, {**body, "stream": True})) as response:
            assert response.status_code == 200, f"{server.family} refused {path}: HTTP {response.status_code}"
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:") :].strip()
                if data == "[DONE]":
                    break
                chunks.append(json.loads(data))
    return chunks


async def oracle_text(server: Server, *, chat: bool, stream: bool, **body: Any) -> str:
    """The text the server itself returns for this request (streamed: the chunks' texts joined)."""
    path = "/chat/completions" if chat else "/completions"
    if not stream:
        data = await oracle_post(server, path, body)
        choice = data["choices"][0]
        return choice["message"]["content"] or "" if chat else choice["text"]
    pieces = []
    for chunk in await oracle_stream(server, path, body):
        for choice in chunk.get("choices") or []:
            if chat:
                pieces.append((choice.get("delta") or {}).get("content") or "")
            else:
                pieces.append(choice.get("text") or "")
    return "".join(pieces)


@dataclasses.dataclass
class Answer:
    """What specapi returned: the text (streamed: the chunks' texts joined), the finish reason and the
    statistics (`resp.speculative`, or the stream's after its end)."""

    text: str
    finish_reason: str | None
    stats: SpeculativeStats
    chunks: int = 0

    def describe(self) -> str:
        s = self.stats
        return (
            f"verification={s.verification} speculated={s.speculated} ({s.fallback_reason}) exact={s.exact} ({s.exact_reason}) "
            f"rounds={s.num_rounds} drafted={s.drafted_tokens} accepted={s.accepted_tokens} finish={self.finish_reason}"
        )


def client_for(pair: ServerPair, **options: Any) -> AsyncSpeculativeOpenAI:
    """A speculative client over the pair (target verifies, draft proposes); options as the client's."""
    return AsyncSpeculativeOpenAI(target=pair.target.endpoint(), draft=pair.draft.endpoint(), **options)


#: A speculative request on these tiny models takes well under a second or two, a few on a loaded
#: machine with a batch of them queued at the servers; one that runs this long is stuck (e.g. re-sending
#: the same verification forever), and fails instead of hanging the run.
SPECULATE_TIMEOUT_S = 60.0


async def within_deadline(request: Awaitable[T], what: str) -> T:
    """The request's result; an AssertionError naming it if it runs past SPECULATE_TIMEOUT_S."""
    try:
        return await asyncio.wait_for(request, SPECULATE_TIMEOUT_S)
    except asyncio.TimeoutError:
        raise AssertionError(f"specapi did not finish within {SPECULATE_TIMEOUT_S:.0f} s: {what}") from None


async def speculate(pair: ServerPair, *, chat: bool, stream: bool, client_options: dict[str, Any] | None = None, **request: Any) -> Answer:
    """specapi's answer to the request, through its public client only."""
    return await within_deadline(_speculate(pair, chat=chat, stream=stream, client_options=client_options, **request), f"{pair.family}, chat={chat}, stream={stream}, {request}")


async def _speculate(pair: ServerPair, *, chat: bool, stream: bool, client_options: dict[str, Any] | None = None, **request: Any) -> Answer:
    async with client_for(pair, **(client_options or {})) as client:
        create = client.chat.completions.create if chat else client.completions.create
        result = await create(stream=stream, **request)
        if not stream:
            choice = result.choices[0]
            text = (choice.message.content or "") if chat else choice.text
            return Answer(text, choice.finish_reason, result.speculative)
        pieces, finish, count = [], None, 0
        async for chunk in result:
            count += 1
            for choice in chunk.choices:
                pieces.append(((choice.delta.content or "") if chat else choice.text) or "")
                finish = choice.finish_reason or finish
        assert result.speculative is not None, "the stream ended without statistics"
        return Answer("".join(pieces), finish, result.speculative, count)


def check_equal(answer: Answer, expected: str, request: str) -> None:
    """specapi's text is the server's own, or specapi says it is not exact and why."""
    if answer.stats.exact:
        assert answer.text == expected, f"{request}: specapi {answer.text!r} != server {expected!r}; {answer.describe()}"
    else:
        assert answer.stats.exact_reason, f"{request}: exact=False without a reason; {answer.describe()}"


def connections_to(*ports: int) -> int:
    """This process's established TCP connections to the given ports (Linux /proc)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/self/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as rows:
            for row in list(rows)[1:]:
                fields = row.split()
                remote_port = int(fields[2].rsplit(":", 1)[1], 16)
                if fields[3] == "01" and remote_port in ports and fields[9] in inodes:
                    count += 1
    return count


class Unavailable:
    """A small HTTP proxy in front of one server (its port): 503 to the next `failing` requests, then the
    server's own answers. `app()` is the Starlette app to run with `BackgroundServer`."""

    def __init__(self, port: int, timeout: float) -> None:
        self.port = port
        self.timeout = timeout
        self.failing = 0
        self.refused = 0

    async def handle(self, request: Any) -> Any:
        from starlette.responses import Response

        if self.failing > 0:
            self.failing -= 1
            self.refused += 1
            return Response(json.dumps({"error": {"message": "overloaded", "type": "server_error"}}), status_code=503,
                            media_type="application/json", headers={"retry-after-ms": "20"})  # fmt: skip
        async with httpx2.AsyncClient(timeout=self.timeout) as http:
            upstream = await http.request(request.method, f"http://127.0.0.1:{self.port}{request.url.path}",
                                          content=await request.body(), headers={"content-type": "application/json"})  # fmt: skip
        return Response(upstream.content, status_code=upstream.status_code, media_type=upstream.headers.get("content-type"))

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.routing import Route

        return Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST"])])


async def greedy_text(server: Server, chat: bool, *, messages: list[dict[str, str]], prompt: str, max_tokens: int) -> str:
    """The server's own greedy text for a chat (`messages`) or a completion (`prompt`), through the SDK."""
    import openai

    alone = openai.AsyncOpenAI(base_url=server.base_url, api_key="sk-none", max_retries=0)
    try:
        if chat:
            response = await alone.chat.completions.create(model=server.model, messages=messages, max_tokens=max_tokens, temperature=0)  # type: ignore[arg-type]
            return response.choices[0].message.content or ""
        return (await alone.completions.create(model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0)).choices[0].text
    finally:
        await alone.close()
