"""target_alone.py: the pure parts of the target-alone steps (the rest runs in test_engine.py and the
conformance suites)."""

from __future__ import annotations

from typing import Any

import pytest

from specapi.core.context import Context
from specapi.dialects.openai import openai_format
from specapi.engine.target_alone import _whole_runs

CHAT = openai_format(Context(messages=({"role": "user", "content": "x"},)))


def _choice(content: str, entries: list[tuple[str, bytes]] | None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "length"}
    if entries is not None:
        choice["logprobs"] = {"content": [{"token": token, "logprob": -0.1, "bytes": list(data), "top_logprobs": []} for token, data in entries]}
    return choice


@pytest.mark.parametrize(
    ("content", "entries", "kept"),
    [
        # llama-server, two tokens into the run 文件 (e6 96 | 87 e4 bb | b6): its content shows 文 and hides
        # the rest, and it lists no logprobs (it leaves the field out): nothing is whole yet.
        ("文", None, ""),
        ("、文", [("、", "、".encode())], "、"),
        ("文件", [("文件", "文件".encode())], "文件"),  # the run ended: all of it
        ("ab", [("a", b"a"), ("b", b"b")], "ab"),
        ("ab", [("x", b"x")], "ab"),  # listed tokens that are not the text: kept as it is
    ],
)
def test_a_step_is_cut_back_to_the_token_runs_the_server_listed(content: str, entries: list[tuple[str, bytes]] | None, kept: str) -> None:
    assert _whole_runs(CHAT, _choice(content, entries), content) == kept


def test_unreadable_logprobs_leave_the_text_as_it_is() -> None:
    choice = _choice("文", None)
    choice["logprobs"] = {"content": "not a list"}
    assert _whole_runs(CHAT, choice, "文") == "文"


def _own_text(case: str, k: int) -> str:
    """The target's text for its first k tokens of the test's answer (12 tokens): in "empty" the first 11
    end inside characters and the 12th completes "X"; in "replacement" tokens 1-4 are bytes that are
    no character, written U+FFFD once token 5 completes "X" after them, and token 12 completes "Y"."""
    if case == "empty":
        return "X" if k >= 12 else ""
    return "" if k < 5 else "\ufffdX" if k < 12 else "\ufffdXY"


def _joined_stream(chunks: list[Any]) -> Any:
    """A completions stream read as one response: text, logprobs tokens and values, usage, stats."""
    from types import SimpleNamespace

    tokens: list[str] = []
    values: list[float | None] = []
    text = ""
    for chunk in chunks:
        for choice in chunk.choices:
            text += choice.text
            if choice.logprobs is not None:
                tokens += choice.logprobs.tokens or []
                values += choice.logprobs.token_logprobs or []
    usage = next(c.usage for c in reversed(chunks) if c.usage is not None)
    logprobs = SimpleNamespace(tokens=tokens, token_logprobs=values)
    return SimpleNamespace(choices=[SimpleNamespace(text=text, logprobs=logprobs)], usage=usage, speculative=chunks[-1].speculative)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("case", ["empty", "replacement"])
async def test_a_run_of_tokens_inside_characters_is_written_whole_by_the_target_not_drawn_again(case: str, stream: bool) -> None:
    """A text prompt goes on only from whole characters the target would read back as its own bytes, so
    a step that ends inside one, or holds a U+FFFD written for bytes that are no character, is asked
    again longer. Past a few tokens the target writes the rest in one call: going on from the text so
    far would draw the same tokens again, or others, and answer other text than the target alone's. The
    caller's logprobs are then the target's own, as it sent them, streamed too: each token rendered ""
    holds its share of the text (the U+FFFD no token shows goes with the "" token before it)."""
    from specapi import AsyncSpeculativeOpenAI, Endpoint
    from wireserver import WireReply, WireServer

    answer_tokens = 12
    asked: list[int] = []
    seen: list[dict] = []

    def own_logprobs(k: int) -> dict[str, Any]:
        tokens = ["" for _ in range(k)]
        for position, char in ((4, "X" if case == "replacement" else None), (11, "X" if case == "empty" else "Y")):
            if char is not None and position < k:
                tokens[position] = char
        return {"tokens": tokens, "token_logprobs": [-1.0 - i / 10 for i in range(k)], "top_logprobs": [{t: -1.0 - i / 10} for i, t in enumerate(tokens)], "text_offset": [0] * k}

    def handler(request: Any) -> WireReply:
        if not request.path.endswith("/completions"):
            return WireReply(status=404, body={"error": {"message": "not found"}})
        body = request.json()
        seen.append(body)
        if body["model"] == "draft":
            logprobs = {"tokens": ["y", "z"], "token_logprobs": [-0.1, -0.1], "top_logprobs": [{"y": -0.1}, {"z": -0.1}], "text_offset": [0, 1]}
            return WireReply(body={"id": "d", "object": "text_completion", "model": "draft", "choices": [{"index": 0, "text": "yz", "logprobs": logprobs, "finish_reason": "length"}]})
        if body.get("echo"):  # the prompt and the draft scored: the target's pick after the prompt ends inside a character
            prompt = body["prompt"]
            logprobs = {
                "tokens": [*prompt, ""], "token_logprobs": [None, *[-1.0] * (len(prompt) - 1), -0.5],
                "top_logprobs": [None, *[{c: -1.0} for c in prompt[1:3]], *[{"": -0.5}] * (len(prompt) - 2)], "text_offset": list(range(len(prompt) + 1)),
            }  # fmt: skip
            return WireReply(body={"id": "e", "object": "text_completion", "model": "target", "choices": [{"index": 0, "text": prompt, "logprobs": logprobs, "finish_reason": "length"}],
                                   "usage": {"prompt_tokens": len(prompt), "completion_tokens": 1, "total_tokens": len(prompt) + 1}})  # fmt: skip
        k = body["max_tokens"]
        asked.append(k)
        choice = {"index": 0, "text": _own_text(case, k), "finish_reason": "length"}
        if body.get("logprobs") is not None:
            choice["logprobs"] = own_logprobs(k)
        return WireReply(body={"id": "t", "object": "text_completion", "model": "target", "choices": [choice], "usage": {"prompt_tokens": 3, "completion_tokens": k, "total_tokens": 3 + k}})

    async with WireServer(handler) as server:
        target = Endpoint(base_url=server.base_url, model="target", api_key="x", max_retries=0)
        draft = Endpoint(base_url=server.base_url, model="draft", api_key="x", max_retries=0)
        async with AsyncSpeculativeOpenAI(target=target, draft=draft, verification="echo", policy="fixed", num_speculative_tokens=4) as client:
            if stream:
                chunks = [c async for c in await client.completions.create(prompt="abc", max_tokens=answer_tokens, temperature=0, logprobs=1, stream=True, stream_options={"include_usage": True})]
                got = _joined_stream(chunks)
            else:
                got = await client.completions.create(prompt="abc", max_tokens=answer_tokens, temperature=0, logprobs=1)
    assert got.choices[0].text == _own_text(case, answer_tokens), seen
    assert got.usage.completion_tokens == answer_tokens
    assert all(body["prompt"] == "abc" for body in seen if body["model"] == "target" and not body.get("echo")), seen  # never from the text so far
    assert asked[-1] == answer_tokens and asked.count(1) == 1, asked  # never drawn again from the start
    own = own_logprobs(answer_tokens)
    assert got.choices[0].logprobs.tokens == own["tokens"] and got.choices[0].logprobs.token_logprobs == own["token_logprobs"]
    assert got.speculative.exact, got.speculative.exact_reason
