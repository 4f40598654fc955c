"""Conformance on real vLLM: specapi's response to a greedy request is the target alone's.

The oracle is the same vLLM server answering the same request through the plain SDK (`openai.AsyncOpenAI`).
Compared (tests/test_conformance.py's `Observed`): text, finish_reason, usage and logprobs, on 45 prompts
(code, prose, Chinese and Japanese, emoji, trailing whitespace), completions and chat, plain and streamed,
through every verification path vLLM serves (auto and each forced one), with a fixed draft length so rounds
run; then the conformance matrix's rows and the CJK/emoji property cases through the default client, and a
share of the prompts through `specapi serve` in front of the pair. Requests run concurrently (vLLM
batches them).

Each answer the target wrote again alone because it "re-read its own output with other token boundaries"
is counted per path and printed (`pytest -s`); the default path must rewrite none.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from typing import Any

import httpx2
import openai
import pytest
import pytest_asyncio

from conformance_matrix import ROWS, Row, request_args
from real_helpers import ServerPair
from specapi import AsyncSpeculativeOpenAI
from test_conformance import Observed, compare_with, observe

TESTS = pathlib.Path(__file__).resolve().parent.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

CODE = [
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main():\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "for i in range(10):\n    print(i",
    "async def fetch(client, url):\n    response = await client.get(url)\n",
    "def read_lines(path):\n    with open(path) as handle:\n",
    "    return {k: v for k, v in items.items() if v is not None}\n",
    "try:\n    value = int(text)\nexcept ValueError:\n",
    "@dataclass(frozen=True)\nclass Point:\n    x: float\n",
    "if __name__ == \"__main__\":\n",
    "def add(a, b):\n    \"\"\"Add two numbers.\"\"\"\n",
    "result = [x * x for x in range(",
    "# Compute the mean of a list\ndef mean(values):\n",
    "raise ValueError(f\"bad value: {value!r}\")\n",
]
PROSE = [
    "The quick brown fox",
    "Speculative decoding makes generation faster because",
    "Once upon a time, in a small village by the sea,",
    "The server returned an error, so the client",
    "In summary, the results show that",
    "A good test asserts behaviour, not",
    "The weather today is",
    "She opened the door and saw",
    "To install the package, run",
    "Dear team, thank you for",
]
CJK = [
    "今天天气很好，我们",
    "这个函数接收一个列表，",
    "服务器返回了一个错误，",
    "模型先生成几个候选词，",
    "日本語の文章を書きます。",
    "東京は大きな都市です",
    "def 计算(数值):\n    return",
    "小明每天晚上都会写一点代码，",
    "# 读取文件\nwith open(路径) as f:\n",
]
EMOJI = [
    "I love pizza 🍕 and",
    "🙂🙃 smile",
    "status = \"✅ done\"  # 🎉\n",
    "Weather: ☀️ then 🌧️, so",
    "家族👨‍👩‍👧 and",
]
TRAILING = [
    "def f(x):\n    ",
    "The list is:\n\n",
    "x = 1   ",
    "Hello,\t",
    "    \n",
    "result:  ",
    "こんにちは ",
]
PROMPTS = CODE + PROSE + CJK + EMOJI + TRAILING
MAX_TOKENS = 12
#: Requests in flight at once (vLLM batches concurrent requests; the tiny models take many).
CONCURRENCY = 16

#: Every path vLLM serves: auto and each forced one (on completions prompt-logprobs is echo).
COMPLETION_PATHS = ("auto", "token-ids", "echo", "prefill-fanout")
CHAT_PATHS = ("auto", "prompt-logprobs", "prefill-fanout")
REWRITE = "re-read its own output with other token boundaries"

#: Rewrites per (format, path), filled by the tests and printed at the end of the module.
REWRITES: Counter[tuple[str, str]] = Counter()
ANSWERS: Counter[tuple[str, str]] = Counter()


def speculative(pair: ServerPair, verification: str, **options: Any) -> AsyncSpeculativeOpenAI:
    settings = {"verification": verification, "policy": "fixed", "num_speculative_tokens": 4, "drafter": "model", "pipeline": False, **options}
    # The SDK's default retries, as users run it: vLLM (uvicorn) closes a keep-alive connection idle for 5 s,
    # and without a retry a request that meets such a connection fails ("Connection error").
    return AsyncSpeculativeOpenAI(target=pair.target.endpoint(), draft=pair.draft.endpoint(), **settings)


def rewritten(observed: Observed) -> bool:
    stats = observed.speculative
    return stats is not None and REWRITE in f"{stats.fallback_reason or ''} {stats.exact_reason or ''}"


async def gather_limited(calls: list[Any], limit: int = CONCURRENCY) -> list[Any]:
    semaphore = asyncio.Semaphore(limit)

    async def run(call: Any) -> Any:
        async with semaphore:
            return await call

    return await asyncio.gather(*(run(c) for c in calls))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def alone(vllm: ServerPair) -> AsyncIterator[openai.AsyncOpenAI]:
    client = openai.AsyncOpenAI(base_url=vllm.target.base_url, api_key="sk-none", max_retries=0)
    yield client
    await client.close()
    if ANSWERS:
        lines = [f"  {fmt:<11} {path:<16} {REWRITES[(fmt, path)]:>3} of {ANSWERS[(fmt, path)]} answers rewritten" for fmt, path in sorted(ANSWERS)]
        print("\nvLLM answers the target wrote again (re-tokenization):\n" + "\n".join(lines))


def _request(prompt: str, chat: bool, **extra: Any) -> dict[str, Any]:
    base = {"messages": [{"role": "user", "content": prompt}]} if chat else {"prompt": prompt}
    return {**base, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}


async def _run_path(pair: ServerPair, alone: openai.AsyncOpenAI, chat: bool, path: str, stream: bool, extra: dict[str, Any]) -> list[str]:
    """Every prompt through `path`; the differences from the target alone (empty when all agree)."""
    fmt = "chat" if chat else "completions"
    async with contextlib.aclosing(_Closing(speculative(pair, path))) as holder:
        client = holder.client
        results = await gather_limited([compare_with(client, alone, pair.target.model, chat, stream, _request(p, chat, **extra)) for p in PROMPTS])
    problems = []
    for prompt, (got, expected) in zip(PROMPTS, results):
        ANSWERS[(fmt, path)] += 1
        REWRITES[(fmt, path)] += rewritten(got)
        assert expected.error is None, (prompt, expected.error)
        differences = got.differences(expected)
        if differences:
            stats = got.speculative
            problems.append(f"{prompt!r}: {differences} ({stats.verification if stats else None}, {stats.fallback_reason if stats else None})")
    return problems


class _Closing:
    """Closes a specapi client with `contextlib.aclosing`."""

    def __init__(self, client: AsyncSpeculativeOpenAI) -> None:
        self.client = client

    async def aclose(self) -> None:
        await self.client.close()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("path", COMPLETION_PATHS)
async def test_completions_on_every_path_equal_vllm_alone(vllm: ServerPair, alone: openai.AsyncOpenAI, path: str, stream: bool) -> None:
    problems = await _run_path(vllm, alone, False, path, stream, {"logprobs": 1} if stream else {})
    assert not problems, f"{len(problems)} of {len(PROMPTS)} differ:\n" + "\n".join(problems[:8])


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("path", CHAT_PATHS)
async def test_chat_on_every_path_equals_vllm_alone(vllm: ServerPair, alone: openai.AsyncOpenAI, path: str, stream: bool) -> None:
    problems = await _run_path(vllm, alone, True, path, stream, {"logprobs": True, "top_logprobs": 2} if stream else {})
    assert not problems, f"{len(problems)} of {len(PROMPTS)} differ:\n" + "\n".join(problems[:8])


@pytest.mark.asyncio(loop_scope="module")
async def test_the_default_path_rewrites_no_answer_because_of_re_tokenization(vllm: ServerPair, alone: openai.AsyncOpenAI) -> None:
    """The default client (auto, the adaptive policy) on every prompt, both formats: no rewrite."""
    client = AsyncSpeculativeOpenAI(target=vllm.target.endpoint(), draft=vllm.draft.endpoint())
    try:
        calls = [compare_with(client, alone, vllm.target.model, chat, False, _request(p, chat)) for chat in (False, True) for p in PROMPTS]
        results = await gather_limited(calls)
    finally:
        await client.close()
    rewrites = [got.speculative.verification for got, _ in results if rewritten(got)]
    problems = []
    for index, (got, expected) in enumerate(results):
        fmt = "chat" if index >= len(PROMPTS) else "completions"
        ANSWERS[(fmt, "default")] += 1
        REWRITES[(fmt, "default")] += rewritten(got)
        if got.differences(expected):
            problems.append((fmt, PROMPTS[index % len(PROMPTS)], got.differences(expected)))
    assert not rewrites, f"{len(rewrites)} answers rewritten on {Counter(rewrites)}"
    assert not problems, f"{len(problems)} of {len(results)} differ: {problems[:6]}"


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_caller_logprobs_speculate_on_token_ids_with_every_entry_vllm_alones(vllm: ServerPair, alone: openai.AsyncOpenAI, chat: bool) -> None:
    """With the caller's logprobs, the default path on vLLM is token ids and accepts draft tokens; every
    entry (token, logprob, top list, `text_offset`, chat `bytes`) is vLLM alone's, plain and streamed, on
    prompts whose answers hold tokens that are parts of characters."""
    prompts = PROPERTY_CASES + CJK + EMOJI + CODE[:6]
    extra = {"logprobs": True, "top_logprobs": 2} if chat else {"logprobs": 2}
    client = speculative(vllm, "auto")
    try:
        calls = [_whole_logprobs(client, alone, vllm.target.model, chat, stream, _request(p, chat, max_tokens=16, **extra)) for stream in (False, True) for p in prompts]
        results = await gather_limited(calls)
    finally:
        await client.close()
    problems = [(prompts[i % len(prompts)], got, expected) for i, (got, expected, _) in enumerate(results) if not _same(got, expected)]
    assert not problems, f"{len(problems)} of {len(results)} differ: {problems[:3]}"
    stats = [s for _, _, s in results]
    assert all(s is not None and s.verification in ("token-ids", "none") for s in stats), Counter(s.verification for s in stats if s)
    assert all(s.fallback_reason is None or not s.fallback_reason.startswith("logprobs:") for s in stats)
    assert sum(s.accepted_tokens for s in stats) > 0 and sum(s.verification == "token-ids" and s.accepted_tokens > 0 for s in stats) >= len(stats) // 2


async def _whole_logprobs(client: AsyncSpeculativeOpenAI, alone: openai.AsyncOpenAI, model: str, chat: bool, stream: bool, request: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(specapi's, vLLM alone's) text, finish_reason, usage and whole logprobs (a stream's joined), and specapi's stats."""
    async def run(create: Any, **args: Any) -> tuple[Any, Any]:
        if not stream:
            response = await create(**args)
            choice = response.choices[0]
            logprobs = choice.logprobs.model_dump() if choice.logprobs is not None else None
            text = (choice.message.content if chat else choice.text)
            return (text, choice.finish_reason, _counts(response.usage), logprobs), getattr(response, "speculative", None)
        response = await create(stream=True, stream_options={"include_usage": True}, **args)
        text, finish, usage, joined = "", None, None, {}
        async for chunk in response:
            usage = _counts(chunk.usage) if chunk.usage is not None else usage
            for choice in chunk.choices:
                text += (choice.delta.content or "") if chat else choice.text
                finish = choice.finish_reason or finish
                for key, value in (choice.logprobs.model_dump() if choice.logprobs is not None else {}).items():
                    joined[key] = joined.get(key, []) + list(value or [])
        return (text, finish, usage, joined), getattr(response, "speculative", None)

    expected, _ = await run(alone.chat.completions.create if chat else alone.completions.create, model=model, **request)
    got, stats = await run(client.chat.completions.create if chat else client.completions.create, **request)
    return got, expected, stats


def _counts(usage: Any) -> tuple[int, int]:
    return (usage.prompt_tokens, usage.completion_tokens)


def _same(a: Any, b: Any) -> bool:
    """Equal, floats within the conformance tolerance (1e-4), dicts in the same key order."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, abs_tol=1e-4)
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# -- the matrix and the property cases ----------------------------------------------------------------------

MATRIX_PROMPT = "def fibonacci(n):"
MATRIX_MESSAGES = [{"role": "user", "content": "Write a function that adds two numbers."}]


def _vllm_rows() -> list[Row]:
    """The matrix's rows that run on a server (`llama` column: the rows every OpenAI-format server takes),
    without llama.cpp's own extras (vLLM's answer to them is its own, and is compared all the same)."""
    return [r for r in ROWS if r.llama is not None]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def matrix(vllm: ServerPair, alone: openai.AsyncOpenAI) -> AsyncIterator[tuple[dict[str, AsyncSpeculativeOpenAI], dict[str, Any]]]:
    clients = {
        "default": AsyncSpeculativeOpenAI(target=vllm.target.endpoint(), draft=vllm.draft.endpoint()),
        "token-ids": speculative(vllm, "token-ids"),
    }
    known = {}
    for chat in (False, True):
        base = {"messages": MATRIX_MESSAGES} if chat else {"prompt": MATRIX_PROMPT}
        create = alone.chat.completions.create if chat else alone.completions.create
        response = await create(model=vllm.target.model, max_tokens=10, temperature=0, **base)
        text = (response.choices[0].message.content or "") if chat else response.choices[0].text
        middle = text[len(text) // 2 :].strip()
        assert len(middle) >= 2, text
        known["chat" if chat else "completions"] = {"model": vllm.target.model, **base, "stop_word": middle[:2]}
    yield clients, known
    for client in clients.values():
        await client.close()


def _row_id(row: Row) -> str:
    return f"{row.resource}-{row.parameter}-{row.shown}"[:60]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("row", _vllm_rows(), ids=_row_id)
async def test_the_matrix_on_vllm(vllm: ServerPair, alone: openai.AsyncOpenAI, matrix: Any, row: Row) -> None:
    """Each row, greedy, plain and streamed, through the default client and each forced path: the target
    alone's response (text, finish_reason, usage, logprobs, the number of choices, or its own error)."""
    clients, known = matrix
    chat = row.resource == "chat"
    base = {"messages": MATRIX_MESSAGES} if chat else {"prompt": MATRIX_PROMPT}
    request = request_args(row, {**base, "max_tokens": 10, "temperature": 0}, known[row.resource])
    names = ["default"] if row.llama is not None and row.llama.kind == "target alone" else list(clients)
    calls = [compare_with(clients[name], alone, vllm.target.model, chat, stream, request) for stream in (mode == "stream" for mode in row.modes) for name in names]
    problems = []
    for (got, expected), label in zip(await asyncio.gather(*calls), [(s, n) for s in row.modes for n in names]):
        differences = got.differences(expected)
        if differences:
            problems.append((label, differences))
    assert not problems, problems


PROPERTY_CASES = [
    "今天天气很好",
    "😀😃😄😁",
    "naïve café résumé",
    "e\u0301 combining a\u0308",
    "中文 and English 混合",
    "🇯🇵🇫🇷 flags",
    "👩‍💻 writes code",
    "한국어 문장입니다",
]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_cjk_and_emoji_property_cases_equal_vllm_alone(vllm: ServerPair, alone: openai.AsyncOpenAI, chat: bool) -> None:
    """Multi-byte characters split across tokens, combining marks and emoji sequences, each path, plain
    and streamed, with logprobs: the target alone's answer."""
    paths = CHAT_PATHS if chat else COMPLETION_PATHS
    clients = {path: speculative(vllm, path) for path in paths}
    try:
        logprobs = {"logprobs": True, "top_logprobs": 1} if chat else {"logprobs": 1}
        calls, labels = [], []
        for path, client in clients.items():
            for stream in (False, True):
                for text in PROPERTY_CASES:
                    calls.append(compare_with(client, alone, vllm.target.model, chat, stream, _request(text, chat, max_tokens=16, **logprobs)))
                    labels.append((path, stream, text))
        results = await gather_limited(calls)
    finally:
        for client in clients.values():
            await client.close()
    problems = [(label, got.differences(expected)) for label, (got, expected) in zip(labels, results) if got.differences(expected)]
    assert not problems, f"{len(problems)} of {len(calls)} differ: {problems[:6]}"


# -- specapi serve in front of the pair ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def proxy_url(vllm: ServerPair) -> Iterator[str]:
    """`specapi serve` with its defaults in front of the pair, on a free port of 127.0.0.1; stopped at the end."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = [
        sys.executable, "-c", "from specapi.cli import cli; cli()", "serve", "--host", "127.0.0.1", "--port", str(port),
        "--target-base-url", vllm.target.base_url, "--target-model", vllm.target.model,
        "--draft-base-url", vllm.draft.base_url, "--draft-model", vllm.draft.model, "--shutdown-timeout", "2", "--ready-interval", "0.5",
    ]  # fmt: skip
    env = {**os.environ, "SPECAPI_LOG_LEVEL": "warning"}
    process = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, process.communicate()[1][-3000:]
            try:
                if httpx2.get(f"http://127.0.0.1:{port}/ready", timeout=2).status_code == 200:
                    break
            except httpx2.TransportError:
                pass
            assert time.monotonic() < deadline, "specapi serve did not become ready in 60 s"
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_specapi_serve_answers_as_vllm_alone(vllm: ServerPair, alone: openai.AsyncOpenAI, proxy_url: str, chat: bool) -> None:
    """`specapi serve` (a subprocess on 127.0.0.1, default settings) in front of the pair: through the SDK,
    plain and streamed, every prompt's answer is the target alone's."""
    through = openai.AsyncOpenAI(base_url=proxy_url, api_key="sk-none", max_retries=0)
    try:
        calls = []
        for stream in (False, True):
            for prompt in PROMPTS:
                request = _request(prompt, chat)
                create = through.chat.completions.create if chat else through.completions.create
                calls.append(_pair(observe(create, chat, stream, **_with_usage(stream, {"model": vllm.target.model, **request})),
                                   observe(alone.chat.completions.create if chat else alone.completions.create, chat, stream, **_with_usage(stream, {"model": vllm.target.model, **request}))))
        results = await gather_limited(calls)
    finally:
        await through.close()
    problems = [(PROMPTS[i % len(PROMPTS)], got.differences(expected)) for i, (got, expected) in enumerate(results) if got.differences(expected)]
    assert not problems, f"{len(problems)} of {len(results)} differ: {problems[:6]}"


def _with_usage(stream: bool, request: dict[str, Any]) -> dict[str, Any]:
    return {**request, "stream_options": {"include_usage": True}} if stream else request


async def _pair(first: Any, second: Any) -> tuple[Observed, Observed]:
    got = await first
    expected = await second
    return replace(got, speculative=None), expected
