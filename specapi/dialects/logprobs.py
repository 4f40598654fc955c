"""Reading the logprob payloads of OpenAI-format answers, in every shape providers.md lists, into `ScoredToken`s.

Chat answers list `logprobs.content` (`{token, logprob, bytes, top_logprobs: [...]}`, llama.cpp adding `id`);
OpenAI's legacy completions list parallel arrays (`tokens`, `token_logprobs`, `top_logprobs` as dicts), which
llama-server replaces with the chat shape; vLLM's `prompt_logprobs` score the prompt, position by position.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..alignment import ScoredToken

__all__ = ["completion_tokens", "chat_tokens", "prompt_logprob_tokens", "WireError"]


class WireError(ValueError):
    """A payload lacks or contradicts the fields verification needs."""


def _spelling(item: Mapping[str, Any]) -> str:
    """A token as specapi spells it: its text, or "bytes:\\x.." where the server's `bytes` show it
    holds part of a character (its text is then "", U+FFFD or another lossy rendering)."""
    token = str(item["token"])
    raw = item.get("bytes")
    if isinstance(raw, list) and raw and all(isinstance(b, int) and 0 <= b < 256 for b in raw):
        data = bytes(raw)
        if data != token.encode("utf-8"):
            return "bytes:" + "".join(f"\\x{b:02x}" for b in data)
    return token


def _top_from_list(items: Any) -> dict[str, float] | None:
    if items is None:
        return None
    if isinstance(items, Mapping):
        return {str(k): float(v) for k, v in items.items() if v is not None}
    result: dict[str, float] = {}
    for item in items:
        if isinstance(item, Mapping) and "token" in item and item.get("logprob") is not None:
            result.setdefault(_spelling(item), float(item["logprob"]))
    return result


def chat_tokens(content: Any) -> list[ScoredToken]:
    """`logprobs.content` of a chat response (also llama.cpp's completions logprobs)."""
    if not isinstance(content, Sequence):
        raise WireError("logprobs.content is missing")
    tokens = []
    for item in content:
        if not isinstance(item, Mapping) or "token" not in item:
            raise WireError("a logprobs.content item has no token")
        logprob = item.get("logprob")
        token_id = item.get("id")
        tokens.append(
            ScoredToken(
                text=_spelling(item),
                logprob=None if logprob is None else float(logprob),
                top=_top_from_list(item.get("top_logprobs")),
                id=token_id if isinstance(token_id, int) and not isinstance(token_id, bool) else None,
            )
        )
    return tokens


def completion_tokens(logprobs: Any) -> list[ScoredToken]:
    """`choices[i].logprobs` of a completions response: OpenAI's parallel arrays or the chat shape."""
    if not isinstance(logprobs, Mapping):
        raise WireError("choices[0].logprobs is missing")
    if "content" in logprobs and "tokens" not in logprobs:
        return chat_tokens(logprobs["content"])
    tokens = logprobs.get("tokens")
    values = logprobs.get("token_logprobs")
    tops = logprobs.get("top_logprobs")
    if not isinstance(tokens, Sequence) or not isinstance(values, Sequence):
        raise WireError("logprobs.tokens or logprobs.token_logprobs is missing")
    if tops is None:
        tops = [None] * len(tokens)
    if not (len(tokens) == len(values) == len(tops)):
        raise WireError(f"logprobs arrays disagree in length ({len(tokens)}, {len(values)}, {len(tops)})")
    return [
        ScoredToken(text=str(t), logprob=None if v is None else float(v), top=_top_from_list(top))
        for t, v, top in zip(tokens, values, tops)
    ]


def prompt_logprob_tokens(entries: Any, token_ids: Any) -> list[ScoredToken]:
    """vLLM's raw `prompt_logprobs` (null, then `{token_id: {logprob, rank, decoded_token}}` per position).

    The actual token at each position is only known from `prompt_token_ids` (ask with `return_token_ids`).
    """
    if not isinstance(entries, Sequence) or not isinstance(token_ids, Sequence):
        raise WireError("prompt_logprobs or prompt_token_ids is missing")
    if len(entries) != len(token_ids):
        raise WireError(f"prompt_logprobs has {len(entries)} entries for {len(token_ids)} prompt tokens")
    tokens = []
    for position, (entry, token_id) in enumerate(zip(entries, token_ids)):
        if entry is None:
            if position != 0:
                raise WireError(f"prompt_logprobs has no entry at position {position}")
            tokens.append(ScoredToken(text="", logprob=None, top=None))
            continue
        if not isinstance(entry, Mapping):
            raise WireError("a prompt_logprobs entry is not an object")
        actual = entry.get(str(token_id))
        if not isinstance(actual, Mapping) or "decoded_token" not in actual:
            raise WireError(f"prompt_logprobs lacks the prompt token {token_id} at position {position}")
        top = {
            str(value["decoded_token"]): float(value["logprob"])
            for key, value in entry.items()
            if isinstance(value, Mapping) and value.get("logprob") is not None and key != str(token_id)
        }
        tokens.append(ScoredToken(text=str(actual["decoded_token"]), logprob=float(actual["logprob"]), top=top))
    return tokens
