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
