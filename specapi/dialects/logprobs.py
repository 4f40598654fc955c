"""Reading the logprob payloads of OpenAI-format answers, in every shape providers.md lists, into `ScoredToken`s.

Chat answers list `logprobs.content` (`{token, logprob, bytes, top_logprobs: [...]}`, llama.cpp adding `id`);
OpenAI's legacy completions list parallel arrays (`tokens`, `token_logprobs`, `top_logprobs` as dicts), which
llama-server replaces with the chat shape; vLLM's `prompt_logprobs` score the prompt, position by position.

The caller's own logprobs go the other way: `caller_logprobs` reads what a `create` call asked for,
`caller_fields` asks a target call for the same, and `render` writes the target's scores of the kept
tokens in the shape the target alone answers (`LogprobShape`).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ..transport._exceptions import ConfigurationError
from ..core.acceptance import Emitted
from ..core.alignment import Listed, ScoredToken, held_text, token_bytes

if TYPE_CHECKING:
    from .base import Generated, Pick

__all__ = [
    "completion_tokens", "chat_tokens", "prompt_logprob_tokens", "WireError",
    "caller_logprobs", "caller_fields", "chat_listed", "pick_for_caller", "step_entries", "LogprobShape", "TokenScore", "joined", "learnt_offsets", "render", "top_list",
]

#: The longest top list a chat request may ask (OpenAI's and vLLM's cap).
CHAT_MAX_TOP = 20


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


def caller_logprobs(chat: bool, kwargs: MutableMapping[str, Any]) -> int | None:
    """The length of the top lists the caller asked for (0: the tokens' own logprobs only), None when it
    asked for no logprobs; the fields are taken out of `kwargs`. Chat: `logprobs=True` with
    `top_logprobs` 0..20; completions: `logprobs` an integer."""
    if not chat:
        value = kwargs.pop("logprobs", None)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigurationError(f"logprobs must be an integer >= 0, got {value!r}")
        return value
    asked, top = kwargs.pop("logprobs", None), kwargs.pop("top_logprobs", None)
    if asked is not None and not isinstance(asked, bool):
        raise ConfigurationError(f"logprobs must be a boolean, got {asked!r}")
    if top is not None and (isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= CHAT_MAX_TOP):
        raise ConfigurationError(f"top_logprobs must be an integer in [0, {CHAT_MAX_TOP}], got {top!r}")
    if top is not None and not asked:
        raise ConfigurationError("top_logprobs needs logprobs=True")
    return (top or 0) if asked else None


def caller_fields(chat: bool, count: int) -> dict[str, Any]:
    """The fields asking a target call for the caller's logprobs (`count` alternatives per token). Chat
    without alternatives sends `logprobs` alone, as the caller did: llama-server reads `top_logprobs: 0`
    as "no logprobs" and answers `logprobs: null`."""
    if not chat:
        return {"logprobs": count}
    return {"logprobs": True, "top_logprobs": count} if count else {"logprobs": True}


@dataclass(frozen=True)
class TokenScore:
    """One token of the answer with the target's scores: `text` as the server spells it, `data` its
    bytes, `offset` where it starts in the answer (code points; a token inside a character sits where
    that character starts)."""

    text: str
    data: bytes
    logprob: float | None
    top: Mapping[str, float] | None
    offset: int
    #: The entry's top list as the server rendered it (`Emitted.listed`), and where the token starts
    #: counted in the lengths of the rendered tokens before it (vLLM's `text_offset`).
    listed: Listed | None = None
    spelled: int = 0


@dataclass(frozen=True)
class LogprobShape:
    """How the target alone writes the caller's logprobs: chat items or completions arrays, `top`
    alternatives each; completions add `offset_base` to each token's offset (None: the server sends -1
    for every offset, as SGLang does) and, with `with_chosen`, list the chosen token among its
    alternatives as vLLM does."""

    chat: bool
    top: int
    offset_base: int | None = 0
    with_chosen: bool = False
    #: The server's convention is not known: it is read from the first target-alone step's own offsets
    #: (`learnt_offsets`), and `offset_base` holds the prompt's length until then.
    learn_offsets: bool = False
    #: Offsets count the lengths of the tokens as rendered before each (vLLM's), not the text's characters
    #: (they differ where a token holding part of a character renders as "" and the text shows U+FFFD).
    offsets_spelled: bool = False


def learnt_offsets(shape: LogprobShape, logprobs: Any, prompt_chars: int) -> LogprobShape:
    """The shape with the offset convention a target-alone step showed for its first token, which sits at
    the answer's start: the prompt's length (OpenAI), 0 (vLLM) or -1 (SGLang). Unchanged when the step
    shows none (no token, or the chat shape)."""
    offsets = logprobs.get("text_offset") if isinstance(logprobs, Mapping) else None
    if not isinstance(offsets, Sequence) or not offsets or not isinstance(offsets[0], int) or isinstance(offsets[0], bool):
        return shape
    first = offsets[0]
    base = None if first < 0 else (prompt_chars if first == prompt_chars else 0)
    return LogprobShape(chat=shape.chat, top=shape.top, offset_base=base, with_chosen=shape.with_chosen, offsets_spelled=shape.offsets_spelled)


def top_list(score: TokenScore, count: int) -> list[tuple[str, float]]:
    """The `count` likeliest alternatives at the token's position, the server's order kept among equals:
    its list together with the token itself (some lists leave the token out)."""
    listed = dict(score.top or {})
    if score.logprob is not None:
        listed.setdefault(score.text, score.logprob)
    ranked = sorted(listed.items(), key=lambda item: -item[1])
    return ranked[:count]


def _spelled_bytes(text: str) -> list[int]:
    data = token_bytes(text)
    return list(data if data is not None else text.encode("utf-8"))


def chat_listed(listed: Listed, token: str, logprob: float | None, count: int) -> Listed | None:
    """A chat item's top list (the `count` likeliest, every one) from a greedy pick's completions entry:
    the top object holds the chosen token first, then the others by rank, entries rendered alike under
    one key with the last one's value. Whole where no entries merged, or where two did and only two are
    asked (the chosen one's value is its own); None where merged entries hide values."""
    pairs = listed.pairs
    if not listed.collapsed or len(pairs) >= max(count, 1):
        return Listed(pairs[:count])
    if count == 2 and len(pairs) == 1 and pairs[0][0] == token and logprob is not None:
        return Listed(((token, logprob), pairs[0]))
    return None


def _chat_top(s: TokenScore, count: int) -> list[tuple[str, float]]:
    return list(s.listed.pairs[:count]) if s.listed is not None else top_list(s, count)


def _completion_top(s: TokenScore, shape: LogprobShape) -> dict[str, float]:
    if s.listed is not None:
        # The server's own object: the chosen token first, then its entries in order (alike ones merge).
        top = {s.text: s.logprob} if s.logprob is not None else {}
        top.update(s.listed.pairs)
        return top
    top = dict(top_list(s, shape.top))
    if shape.with_chosen and s.logprob is not None:
        top.setdefault(s.text, s.logprob)
    return top


def render(shape: LogprobShape, scores: Sequence[TokenScore]) -> dict[str, Any]:
    """The `logprobs` object of a choice (or of one chunk) holding `scores`. A token rendered by the server
    (`listed`) keeps its rendering: its bytes are the ones its spelling shows (vLLM's chat shows `[]` for a
    token holding part of a character, which it renders as "")."""
    if shape.chat:
        return {
            "content": [
                {
                    "token": s.text, "logprob": s.logprob, "bytes": _spelled_bytes(s.text) if s.listed is not None else list(s.data),
                    "top_logprobs": [{"token": t, "logprob": v, "bytes": _spelled_bytes(t)} for t, v in _chat_top(s, shape.top)],
                }
                for s in scores
            ]
        }  # fmt: skip
    base = shape.offset_base
    return {
        "tokens": [s.text for s in scores],
        "token_logprobs": [s.logprob for s in scores],
        "top_logprobs": [_completion_top(s, shape) for s in scores],
        "text_offset": [-1 if base is None else base + (s.spelled if shape.offsets_spelled else s.offset) for s in scores],
    }


def joined(objects: Sequence[Any]) -> Any:
    """Several `logprobs` objects of one choice (a stream's chunks) as one, in order: the chat shape's
    items, or the completions arrays, one after the other. None when there are none."""
    parts = [o for o in objects if isinstance(o, Mapping)]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    keys = [k for k in parts[0] if all(isinstance(p.get(k), list) for p in parts)]
    return {**parts[0], **{k: [item for p in parts for item in p[k]] for k in keys}}


def step_entries(generated: Generated, chat: bool, count: int) -> tuple[Emitted, ...] | None:
    """A target-alone step's tokens one by one, each with its logprobs entry as the server rendered it
    and the share of the server's text it holds (`alignment.held_text`; the end of text or a token past a
    stop string holds what is left). None where the entries do not spell the text so, or a chat list
    cannot be told whole (`chat_listed`)."""
    logprobs = generated.logprobs if isinstance(generated.logprobs, Mapping) else {}
    tokens, values, tops = logprobs.get("tokens"), logprobs.get("token_logprobs"), logprobs.get("top_logprobs")
    ids = generated.ids or ()
    if not isinstance(tokens, list) or not isinstance(values, list) or not isinstance(tops, list) or min(len(tokens), len(values), len(tops)) < len(ids):
        return None
    shown = [token_bytes(token) if isinstance(token, str) else None for token in tokens[: len(ids)]]
    if any(piece is None for piece in shown):
        return None
    pieces = held_text(shown, generated.data, last_holds_rest=generated.finish_reason != "length")  # type: ignore[arg-type]
    if pieces is None:
        return None
    emitted = []
    for index, (token, piece) in enumerate(zip(tokens, pieces)):
        top = tops[index] if isinstance(tops[index], Mapping) else {}
        value = values[index]
        listed: Listed | None = Listed(tuple((str(t), float(v)) for t, v in top.items() if v is not None), collapsed=True)
        if chat:
            listed = chat_listed(listed, token, value, count)  # type: ignore[arg-type]
            if listed is None:
                return None
        emitted.append(Emitted(token=token, data=piece, logprob=None if value is None else float(value), ids=(ids[index],), listed=listed))
    return tuple(emitted)


def pick_for_caller(pick: Pick, is_chat: bool, top: int) -> Pick:
    """A pick whose logprobs entry is written for the caller: a chat item lists every one of its top
    entries, which a completions object may have merged (`chat_listed`); where it did past recovery, or
    the pick shows no entry, its bytes count as unknown, so the round ends before it and the target alone
    writes that position (with its own entry)."""
    if pick.listed is None or pick.token is None:
        return pick if pick.end else replace(pick, data=None)
    if not is_chat:
        return pick
    listed = chat_listed(pick.listed, pick.token, pick.logprob, top)
    if listed is None:
        return replace(pick, listed=None) if pick.end else replace(pick, data=None)
    return replace(pick, listed=listed)
