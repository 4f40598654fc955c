"""Conformance: one request through specapi and the same request to the target alone give the same response.

The oracle is the target alone, asked through the plain SDK (`openai.AsyncOpenAI`), which shares no code
with specapi. For each case (a set of `create` arguments) and each verification path, the response's
text, finish_reason, usage and number of choices must be the target's, plain and streamed, completions
and chat. The target is the toy server (tests/toyserver.py) on a socket.

Every parameter of the SDK's `create` (both resources) and the llama.cpp extras has a row in the
matrix (tests/conformance_matrix.py), which `test_the_matrix_on_the_toy_server` runs on every path,
plain and streamed, comparing logprobs, tool calls and errors too; docs/verification.md shows the same
table. The `Case`s below add stop strings and limits on the toy's text, every path and both stream modes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import openai
import pytest
import pytest_asyncio

from conformance_matrix import DOC, LLAMA_EXTRAS, ROWS, Row, documented, render, request_args, sdk_parameters
from specapi import AsyncSpeculativeOpenAI, Endpoint
from toyserver import ToyServer

PROMPT = "ab cafe"  # greedy: "Ab:Udfedfcfa:Ub \nU d : " then end of text
MESSAGES = [{"role": "user", "content": "fa c"}]
#: Completion paths the toy server serves; "none" is the target-alone path.
PATHS = ("echo", "prefill-fanout", "none")
#: Chat paths: the toy renders chat with vLLM's continue_final_message, so prefill-fanout verifies chat.
CHAT_PATHS = ("prefill-fanout", "none")


@dataclass(frozen=True)
class Case:
    name: str
    args: dict[str, Any] = field(default_factory=dict)


CASES = (
    Case("max_tokens", {"max_tokens": 30, "temperature": 0}),
    # The stop string ends inside the text: the target counts the tokens up to the one completing it.
    Case("stop-mid-text", {"max_tokens": 40, "temperature": 0, "stop": "fa:"}),
    Case("stop-list", {"max_tokens": 40, "temperature": 0, "stop": ["zz", " \n"]}),
    Case("stop-one-char", {"max_tokens": 40, "temperature": 0, "stop": "c"}),
)
CHAT_CASES = (
    Case("max_tokens", {"max_tokens": 30, "temperature": 0}),
    Case("stop-mid-text", {"max_tokens": 40, "temperature": 0, "stop": " "}),
    Case("stop-list", {"max_tokens": 40, "temperature": 0, "stop": ["zz", "d"]}),
)


@pytest.fixture(scope="module")
def toy():
    with ToyServer() as server:
        yield server


def sdk(toy: ToyServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=toy.base_url, api_key="sk-toy", max_retries=0)


def speculative(toy: ToyServer, verification: str) -> AsyncSpeculativeOpenAI:
    return AsyncSpeculativeOpenAI(
        target=Endpoint(model="target", base_url=toy.base_url, api_key="sk-toy", max_retries=0),
        draft=Endpoint(model="draft", base_url=toy.base_url, api_key="sk-toy", max_retries=0),
        verification=verification, policy="fixed", drafter="model", pipeline=False,
    )


@dataclass(frozen=True)
class Observed:
    """What a caller can see of one response, as compared here: per choice its text, finish_reason,
    logprobs ((token, logprob) pairs) and tool calls ((name, arguments) pairs); the usage; or the error
    the request raised (its class, HTTP status and message)."""

    texts: tuple[str, ...]
    finish_reasons: tuple[str | None, ...]
    usage: tuple[int | None, int | None] | None  # (prompt_tokens, completion_tokens)
    logprobs: tuple[tuple[tuple[str, float | None], ...] | None, ...] = ()
    tool_calls: tuple[tuple[tuple[str, str], ...], ...] = ()
    error: tuple[str, int | None, str] | None = None
    #: specapi's `speculative` statistics (None for the SDK's responses); not compared.
    speculative: Any = field(default=None, compare=False)

    def differences(self, other: Observed) -> list[str]:
        """What differs from `other` (logprobs within float rounding); empty when the same."""
        found = [f"{name}: {getattr(self, name)!r} != {getattr(other, name)!r}" for name in ("texts", "finish_reasons", "usage", "tool_calls") if getattr(self, name) != getattr(other, name)]
        # specapi's errors are the SDK's classes, and name the role and endpoint before the target's message.
        mine, theirs = self.error, other.error
        if (mine is None) != (theirs is None) or (mine and theirs and (mine[:2] != theirs[:2] or theirs[2] not in mine[2])):
            found.append(f"error: {mine!r} != {theirs!r}")
        if not _close_logprobs(self.logprobs, other.logprobs):
            found.append(f"logprobs: {self.logprobs!r} != {other.logprobs!r}")
        return found


def _close_logprobs(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if x is None or y is None:
            if x is not y:
                return False
            continue
        if len(x) != len(y) or any(tx != ty or (lx is None) != (ly is None) or (lx is not None and not math.isclose(lx, ly, abs_tol=1e-4)) for (tx, lx), (ty, ly) in zip(x, y)):
            return False
    return True


def _usage(usage: Any) -> tuple[int | None, int | None] | None:
    return None if usage is None else (usage.prompt_tokens, usage.completion_tokens)


def _logprob_pairs(logprobs: Any, chat: bool) -> list[tuple[str, float | None]] | None:
    if logprobs is None:
        return None
    if chat:
        return [(item.token, item.logprob) for item in logprobs.content or []]
    return list(zip(logprobs.tokens or [], logprobs.token_logprobs or []))


def _error(exc: openai.APIError) -> tuple[str, int | None, str]:
    """The SDK's class of the error (specapi's subclasses name the role), its status and message."""
    sdk = next(c for c in type(exc).__mro__ if c.__module__.startswith("openai"))
    return (sdk.__name__, getattr(exc, "status_code", None), str(exc))


async def observe(create: Any, chat: bool, stream: bool, **args: Any) -> Observed:
    """Call `create` (the SDK's or specapi's) and read the response, collecting a stream; an API error
    the call raises is what is observed."""
    try:
        return await _observe(create, chat, stream, **args)
    except openai.APIError as exc:
        return Observed((), (), None, error=_error(exc))


async def _observe(create: Any, chat: bool, stream: bool, **args: Any) -> Observed:
    if not stream:
        response = await create(**args)
        texts = tuple((c.message.content or "") if chat else c.text for c in response.choices)
        logprobs = tuple(_tuple(_logprob_pairs(c.logprobs, chat)) for c in response.choices)
        calls = tuple(tuple((t.function.name, t.function.arguments) for t in (c.message.tool_calls or [])) if chat else () for c in response.choices)
        finishes = tuple(c.finish_reason for c in response.choices)
        return Observed(texts, finishes, _usage(response.usage), logprobs, calls, speculative=getattr(response, "speculative", None))
    stream_response = await create(stream=True, **args)
    chunks = [chunk async for chunk in stream_response]
    pieces: dict[int, list[str]] = {}
    finishes: dict[int, str | None] = {}
    logprobs: dict[int, list[tuple[str, float | None]] | None] = {}
    calls: dict[int, dict[int, list[str]]] = {}
    usage = None
    for chunk in chunks:
        usage = _usage(chunk.usage) if chunk.usage is not None else usage
        for choice in chunk.choices:
            piece = (choice.delta.content or "") if chat else choice.text
            pieces.setdefault(choice.index, []).append(piece)
            finishes[choice.index] = choice.finish_reason or finishes.get(choice.index)
            pairs = _logprob_pairs(choice.logprobs, chat)
            logprobs[choice.index] = logprobs.get(choice.index) if pairs is None else [*(logprobs.get(choice.index) or []), *pairs]
            for call in (choice.delta.tool_calls or []) if chat else []:
                parts = calls.setdefault(choice.index, {}).setdefault(call.index, ["", ""])
                parts[0] += (call.function.name or "") if call.function else ""
                parts[1] += (call.function.arguments or "") if call.function else ""
    order = sorted(pieces)
    return Observed(
        tuple("".join(pieces[i]) for i in order), tuple(finishes[i] for i in order), usage,
        tuple(_tuple(logprobs.get(i)) for i in order),
        tuple(tuple((name, arguments) for _, (name, arguments) in sorted(calls.get(i, {}).items())) for i in order),
        speculative=getattr(stream_response, "speculative", None),
    )


def _tuple(pairs: list[tuple[str, float | None]] | None) -> tuple[tuple[str, float | None], ...] | None:
    return None if pairs is None else tuple(pairs)


async def compare(toy: ToyServer, verification: str, chat: bool, stream: bool, args: dict[str, Any]) -> tuple[Observed, Observed]:
    """(specapi's, the target alone's) for one request, with clients of its own."""
    alone = sdk(toy)
    client = speculative(toy, verification)
    try:
        return await compare_with(client, alone, "target", chat, stream, {**({"messages": MESSAGES} if chat else {"prompt": PROMPT}), **args})
    finally:
        await client.close()
        await alone.close()


async def compare_with(
    client: AsyncSpeculativeOpenAI, alone: openai.AsyncOpenAI, model: str, chat: bool, stream: bool, request: dict[str, Any], *, ask_usage: bool = True
) -> tuple[Observed, Observed]:
    """(specapi's, the target alone's) for `request`, through `client` and the SDK's `alone` (`model`:
    the target's, unless the request names one). A stream asks for usage unless `ask_usage` is False."""
    request = dict(request)
    if stream and ask_usage and "stream_options" not in request:
        request["stream_options"] = {"include_usage": True}
    alone_create = alone.chat.completions.create if chat else alone.completions.create
    spec_create = client.chat.completions.create if chat else client.completions.create
    expected = await observe(alone_create, chat, stream, **{"model": model, **request})
    got = await observe(spec_create, chat, stream, **request)
    return got, expected


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("verification", PATHS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
async def test_completions_match_the_target_alone(toy: ToyServer, case: Case, verification: str, stream: bool) -> None:
    got, expected = await compare(toy, verification, False, stream, case.args)
    assert not got.differences(expected)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("verification", CHAT_PATHS)
@pytest.mark.parametrize("case", CHAT_CASES, ids=lambda c: c.name)
async def test_chat_matches_the_target_alone(toy: ToyServer, case: Case, verification: str, stream: bool) -> None:
    got, expected = await compare(toy, verification, True, stream, case.args)
    assert not got.differences(expected)


async def test_a_stop_string_ends_a_speculated_round_and_usage_counts_the_targets_tokens(toy: ToyServer) -> None:
    """The stop case really speculates (a round's tokens run past the stop) and the count is the target's."""
    client = speculative(toy, "echo")
    alone = sdk(toy)
    try:
        response = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0, stop="fa:")
        expected = await alone.completions.create(model="target", prompt=PROMPT, max_tokens=40, temperature=0, stop="fa:")
    finally:
        await client.close()
        await alone.close()
    assert response.speculative.rounds, response.speculative.fallback_reason
    assert response.choices[0].text == expected.choices[0].text == "Ab:Udfedfc"
    assert expected.usage.completion_tokens == 13  # ten characters and the three of the stop string
    assert response.usage.completion_tokens == 13


async def test_completions_without_max_tokens_leave_the_limit_to_the_server(toy: ToyServer) -> None:
    """No `max_tokens`: speculation ends where the server's default would (the toy's 16, as vLLM's and
    OpenAI's), and the target alone is sent none at all."""
    for verification in PATHS:
        before = len(toy.log)
        got, expected = await compare(toy, verification, False, False, {"temperature": 0, "prompt": "c"})
        assert not got.differences(expected), verification
        assert expected.usage[1] == 16 and expected.finish_reasons == ("length",)
        bodies = [r.body for r in toy.log[before:] if r.body.get("model") == "target"]
        if verification == "none":
            assert bodies and all("max_tokens" not in b for b in bodies)
        else:
            assert any(b.get("echo") or b.get("max_tokens") == 1 for b in bodies)  # speculated


_NEVER_CLOSED = """
import asyncio, sys
sys.path[:0] = [{tests!r}]
import openai
from specapi import AsyncSpeculativeOpenAI, Endpoint, SpeculativeOpenAI
from toyserver import ToyServer

server = ToyServer().start()
kind = sys.argv[1]
if kind == "sync":
    client = SpeculativeOpenAI(target=Endpoint(model="target", base_url=server.base_url, api_key="x"),
                               draft=Endpoint(model="draft", base_url=server.base_url, api_key="x"))
    print(client.completions.create(prompt="ab cafe", max_tokens=8, temperature=0).choices[0].text)
else:
    if kind == "sdk":
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x")
        create = lambda: client.completions.create(model="target", prompt="ab cafe", max_tokens=8, temperature=0)
    else:
        client = AsyncSpeculativeOpenAI(target=Endpoint(model="target", base_url=server.base_url, api_key="x"),
                                        draft=Endpoint(model="draft", base_url=server.base_url, api_key="x"))
        create = lambda: client.completions.create(prompt="ab cafe", max_tokens=8, temperature=0)

    async def main():
        print((await create()).choices[0].text)
        stream = await client.chat.completions.create(
            model="target", messages=[{{"role": "user", "content": "fa c"}}], max_tokens=4, temperature=0, stream=True)
        async for _ in stream:
            pass

    asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["sdk", "async", "sync"])
def test_a_client_never_closed_exits_silently(kind: str, tmp_path: Any) -> None:
    """As a script uses `openai.AsyncOpenAI`: requests, no close, the end of the program. With warnings
    as errors, nothing is printed (the SDK's client is the reference, run the same way)."""
    import pathlib
    import subprocess
    import sys

    script = tmp_path / "never_closed.py"
    script.write_text(_NEVER_CLOSED.format(tests=str(pathlib.Path(__file__).parent)))
    done = subprocess.run([sys.executable, "-W", "error", str(script), kind], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert done.stdout.strip() == "Ab:Udfed"


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_a_request_past_the_context_window_ends_as_the_target_alone(chat: bool) -> None:
    """The toy, as vLLM, refuses a request whose prompt and max_tokens overflow its window (it lists the
    window as `max_model_len` in /v1/models), even when its text would end before the window: specapi's
    answer is that refusal too, not speculated text. (The probe learns the window: "auto".)"""
    with ToyServer(max_model_len=40) as small:
        args = {"max_tokens": 38, "temperature": 0}  # the greedy text ends (end of text) after 24 tokens
        for verification in ("auto", "echo" if not chat else "prefill-fanout"):  # probed, and forced (the window from /models)
            got, expected = await compare(small, verification, chat, False, args)
            assert expected.error is not None and expected.error[:2] == ("BadRequestError", 400)
            assert "maximum context length" in expected.error[2]
            assert not got.differences(expected), verification
        # Within the window the same requests speculate as before.
        got, expected = await compare(small, "auto", chat, False, {"max_tokens": 24, "temperature": 0})
        assert not got.differences(expected)


# -- the matrix: every parameter of `create` (tests/conformance_matrix.py, docs/verification.md) ---------

#: What the matrix's callables read of the toy (`conformance_matrix.request_args`).
TOY_KNOWN = {
    "completions": {"model": "target", "prompt": PROMPT, "stop_word": "fa:"},
    "chat": {"model": "target", "messages": MESSAGES, "stop_word": "d"},
}
TOY_BASE = {"completions": {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}, "chat": {"messages": MESSAGES, "max_tokens": 12, "temperature": 0}}


def _row_id(row: Row) -> str:
    return f"{row.resource}-{row.parameter}-{row.shown}"[:60]


def test_the_matrix_covers_every_parameter_of_the_sdks_create_and_the_llama_cpp_extras() -> None:
    """The installed SDK's signature is the list: a parameter a new SDK adds fails here until it has a row."""
    for resource in ("completions", "chat"):
        covered = {row.parameter for row in ROWS if row.resource == resource}
        assert sdk_parameters(resource) - covered == set(), resource
        assert {f"extra_body.{name}" for name in LLAMA_EXTRAS} - covered == set(), resource
        assert all(row.toy is not None and row.llama is not None for row in ROWS if row.resource == resource and row.toy is None or row.toy.kind != "clear error")


def test_the_documented_matrix_is_the_tested_one() -> None:
    """docs/verification.md shows the table the tests run (`python tests/conformance_matrix.py` rewrites it)."""
    assert documented(DOC.read_text()) == render(), "run: python tests/conformance_matrix.py"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def toy_clients(toy: ToyServer) -> Any:
    """The matrix's clients, shared by its rows (a client's setup costs more than a toy request): the
    SDK's, and specapi's on each path."""
    clients = {verification: speculative(toy, verification) for verification in {*PATHS, *CHAT_PATHS}}
    alone = sdk(toy)
    yield alone, clients
    for client in clients.values():
        await client.close()
    await alone.close()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("row", [r for r in ROWS if r.toy is not None], ids=_row_id)
async def test_the_matrix_on_the_toy_server(toy: ToyServer, toy_clients: Any, row: Row) -> None:
    """Each row, plain and streamed, on every path the toy serves: the outcome the matrix shows. A row
    the target alone answers before any path is chosen is the same on every path: checked on one."""
    chat = row.resource == "chat"
    request = request_args(row, TOY_BASE[row.resource], TOY_KNOWN[row.resource])
    outcome = row.toy
    assert outcome is not None
    if outcome.kind == "clear error":
        await _raises_before_any_request(toy, chat, request, outcome)
        return
    alone, clients = toy_clients
    paths = CHAT_PATHS if chat else PATHS
    for stream in (mode == "stream" for mode in row.modes):
        for verification in paths:
            got, expected = await compare_with(clients[verification], alone, "target", chat, stream, request)
            assert not got.differences(expected), (verification, stream, got.differences(expected))
            if outcome.kind == "target alone" and verification != "none":  # "none": the caller's own reason
                stats = got.speculative
                assert stats is not None and not stats.rounds, (verification, stream)
                assert outcome.detail in (stats.fallback_reason or ""), (verification, stream)


async def _raises_before_any_request(toy: ToyServer, chat: bool, request: dict[str, Any], outcome: Any) -> None:
    client = speculative(toy, "echo")
    before = len(toy.log)
    try:
        create = client.chat.completions.create if chat else client.completions.create
        with pytest.raises(outcome.error) as raised:
            await create(**request)
    finally:
        await client.close()
    assert outcome.detail in str(raised.value)
    assert len(toy.log) == before  # nothing was sent


# -- the proxy: a chat request without max_tokens ------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_the_proxy_answers_a_chat_request_without_max_tokens_as_the_target_alone(stream: bool) -> None:
    """`specapi serve` adds no limit of its own by default: the toy (a 64-token window, as vLLM refusing a
    request whose prompt and max_tokens overflow it) writes on to its end of text, and the proxy's answer
    is that one. The old bound (4096 sent with every chat request without one) made the same request
    overflow the window. With the opt-in cap (`max_tokens_limit`), the answer ends at the cap with
    "length", as documented."""
    from test_server_support import PROXY_KEY, running_proxy

    messages = [{"role": "user", "content": "ab"}]
    with ToyServer(max_model_len=64) as upstream:
        alone = sdk(upstream)
        try:
            for limit in (None, 4096, 5):
                with running_proxy(upstream, max_tokens_limit=limit) as proxy:
                    through = openai.AsyncOpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0)
                    try:
                        request = {"model": "target", "messages": messages, "temperature": 0}
                        got, expected = await compare_with(through, alone, "target", True, stream, request)  # type: ignore[arg-type]
                    finally:
                        await through.close()
                assert expected.finish_reasons == ("stop",) and expected.usage is not None and expected.usage[1] > 5
                if limit is None:
                    assert not got.differences(expected)
                elif limit == 4096:
                    assert got.error is not None and "maximum context length" in got.error[2]
                else:
                    assert got.finish_reasons == ("length",) and got.usage is not None and got.usage[1] == 5
                    assert expected.texts[0].startswith(got.texts[0])
        finally:
            await alone.close()
