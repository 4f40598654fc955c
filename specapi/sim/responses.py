"""OpenAI-format JSON bodies, built from token records: completions, chat, stream chunks, usage, errors.

Pure functions from data to dicts; the provider decides which to send. Shapes follow the OpenAI API
(``text_completion``, ``chat.completion``, ``chat.completion.chunk``) and vLLM's raw ``prompt_logprobs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .corpus import EOS_TOKEN_ID, token_bytes, token_str
from .generation import TokenRecord

__all__ = [
    "chat_logprob_items",
    "completion_logprobs",
    "error_body",
    "raw_prompt_logprobs",
    "usage_body",
]


def error_body(message: str, *, type: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    """``{"error": {message, type, param, code}}``."""
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def usage_body(
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int,
    prediction: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """``usage``; with ``prediction = (accepted, rejected)``, ``completion_tokens_details`` too."""
    usage: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }
    if prediction is not None:
        usage["completion_tokens_details"] = {
            "accepted_prediction_tokens": prediction[0],
            "rejected_prediction_tokens": prediction[1],
            "reasoning_tokens": 0,
        }
    return usage


def completion_logprobs(
    records: Sequence[TokenRecord],
    offsets: Sequence[int],
    *,
    include_chosen: bool,
    render: Callable[[int], str] = token_str,
) -> dict[str, Any]:
    """Legacy completions ``logprobs``: ``{tokens, token_logprobs, top_logprobs, text_offset}``.

    A record without a logprob (the first echoed prompt token) gives ``null`` entries. With
    ``include_chosen`` (vLLM), the chosen token joins its top list when it is not already in it.
    """
    tops: list[dict[str, float] | None] = []
    for record in records:
        if record.top is None:
            tops.append(None)
            continue
        top = {render(i): lp for i, lp in record.top}
        if include_chosen and record.logprob is not None:
            top.setdefault(render(record.token_id), record.logprob)
        tops.append(top)
    return {
        "tokens": [render(r.token_id) for r in records],
        "token_logprobs": [r.logprob for r in records],
        "top_logprobs": tops,
        "text_offset": list(offsets),
    }


def _token_bytes_list(token_id: int) -> list[int]:
    raw = token_str(token_id).encode() if token_id == EOS_TOKEN_ID else token_bytes(token_id)
    return list(raw)


def chat_logprob_items(
    records: Sequence[TokenRecord], *, render: Callable[[int], str] = token_str
) -> list[dict[str, Any]]:
    """Chat ``logprobs.content`` items: ``{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}``
    (``render`` names the tokens; the bytes stay the token's)."""
    return [
        {
            "token": render(r.token_id),
            "logprob": r.logprob,
            "bytes": _token_bytes_list(r.token_id),
            "top_logprobs": [
                {"token": render(i), "logprob": lp, "bytes": _token_bytes_list(i)} for i, lp in (r.top or ())
            ],
        }
        for r in records
    ]


def raw_prompt_logprobs(records: Sequence[TokenRecord]) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's raw ``prompt_logprobs``: ``null`` first, then ``{token_id: {logprob, rank, decoded_token}}``
    per position, holding the top alternatives and the actual prompt token."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for record in records:
        if record.logprob is None:
            out.append(None)
            continue
        entries: dict[str, dict[str, Any]] = {}
        top = record.top or ()
        for index, (token, lp) in enumerate(top):
            rank = 1 + sum(1 for _, other in top[:index] if other > lp)
            entries[str(token)] = {"logprob": lp, "rank": rank, "decoded_token": token_str(token)}
        entries.setdefault(
            str(record.token_id),
            {"logprob": record.logprob, "rank": record.rank, "decoded_token": token_str(record.token_id)},
        )
        out.append(entries)
    return out
