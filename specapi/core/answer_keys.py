"""The target alone's keys in a speculated answer: the fields a target's answers carry that specapi does
not write itself (`system_fingerprint`, vLLM's `stop_reason` and `kv_transfer_params`, llama-server's
`timings`, `usage.prompt_tokens_details`, ...), learnt from the target's own answers and added to the
answers specapi assembles, so that a client reading any of them finds it where the target alone puts it.

`learn(key, chat, data)` records a target answer of one endpoint (`key`: its base URL and model), and
`StreamKeys` a target stream's chunks; the latest of each kind (completions or chat, whole or streamed)
is the template. `fill` and `fill_chunk` add what an assembled answer lacks. The values, where specapi
cannot know the target alone's:

- top-level fields: the target's latest answer's (its server's `system_fingerprint`; llama-server's
  `timings` measure that call, not the speculated run); lists (vLLM's prompt scores, asked only by
  verification) become null;
- a choice's or a message's fields: null, or an empty list where the target sent one (`tool_calls: []`):
  they describe what the caller asked beyond the text (token ids, prompt logprobs), which a speculated
  request did not ask (a request that does is served by the target alone);
- usage: the target's detail objects with their counts, `prompt_tokens_details.cached_tokens` being what
  the target reported cached on the request's first call that reported it (`cached_tokens`).

In a stream, the fields the target's first chunk had go on every chunk, those only later chunks had
(llama-server's `timings`) on the last one; nothing is added to a stream before a target stream of that
kind has been seen (the capability probe streams one token of each).
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

__all__ = ["AnswerKeys", "StreamKeys", "learn", "template", "fill", "fill_chunk"]

#: What specapi writes itself, at each level of an answer.
_TOP = frozenset({"id", "object", "created", "model", "choices", "usage", "speculative"})
_CHOICE = frozenset({"index", "text", "message", "delta", "logprobs", "finish_reason"})
_MESSAGE = frozenset({"role", "content"})
_USAGE = frozenset({"prompt_tokens", "completion_tokens", "total_tokens"})
#: specapi's choice fields a server may leave out (llama-server's chat has no `logprobs` unless asked).
_OPTIONAL = frozenset({"logprobs"})
#: Endpoints remembered (each at most two templates).
_CAPACITY = 256


@dataclass(frozen=True)
class AnswerKeys:
    """The fields a target's answer of one kind carries beyond specapi's own, with the values to give them."""

    top: Mapping[str, Any]
    choice: Mapping[str, Any]
    message: Mapping[str, Any]
    usage: Mapping[str, Any]
    #: A stream's: the top-level fields only its later chunks carry (on the last chunk).
    last: Mapping[str, Any] = field(default_factory=dict)
    #: specapi's own choice fields the target's choices leave out when null (llama-server's chat: `logprobs`).
    absent: frozenset[str] = frozenset()

    @property
    def empty(self) -> bool:
        return not (self.top or self.choice or self.message or self.usage or self.last or self.absent)


_templates: OrderedDict[tuple[Hashable, bool, bool], AnswerKeys] = OrderedDict()


def _plain(value: Any) -> Any:
    """A choice's or message's own field, as a speculated answer (which asked nothing beyond the text) has it."""
    return [] if isinstance(value, list) and not value else None


def _extras(data: Any, own: frozenset[str]) -> dict[str, Any]:
    return {name: value for name, value in data.items() if name not in own} if isinstance(data, Mapping) else {}


def _keys_of(data: Mapping[str, Any], chat: bool) -> AnswerKeys:
    choices = data.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], Mapping) else {}
    message = choice.get("message") if chat else None
    return AnswerKeys(
        top={name: None if isinstance(value, list) else value for name, value in _extras(data, _TOP).items()},
        choice={name: _plain(value) for name, value in _extras(choice, _CHOICE).items()},
        message={name: _plain(value) for name, value in _extras(message, _MESSAGE).items()},
        usage={name: copy.deepcopy(value) for name, value in _extras(data.get("usage"), _USAGE).items()},
        absent=frozenset(name for name in _OPTIONAL if choice and name not in choice),
    )


def _keep(slot: tuple[Hashable, bool, bool], found: AnswerKeys) -> None:
    _templates[slot] = found
    _templates.move_to_end(slot)
    while len(_templates) > _CAPACITY:
        _templates.popitem(last=False)


def learn(key: Hashable, chat: bool, data: Any, *, logprobs: bool = False) -> None:
    """Record a target answer (a whole one, not a chunk) of the endpoint `key`; `logprobs`: its request
    asked for them (so it says nothing of a choice without them)."""
    if isinstance(data, Mapping) and "choices" in data:
        found = _keys_of(data, chat)
        if logprobs:
            known = _templates.get((key, chat, False))
            found = replace(found, absent=known.absent if known is not None else frozenset())
        _keep((key, chat, False), found)


class StreamKeys:
    """The fields of one target stream's chunks, gathered as they pass (`add`), recorded at its end (`done`)."""

    def __init__(self, key: Hashable, chat: bool, *, logprobs: bool = False) -> None:
        self.key, self.chat, self.logprobs = key, chat, logprobs
        self.first: dict[str, Any] | None = None
        self.later: dict[str, Any] = {}
        self.choice: dict[str, Any] = {}
        self.usage: dict[str, Any] = {}
        self.seen: set[str] = set()  # specapi's optional choice fields some chunk had

    def add(self, chunk: Mapping[str, Any]) -> None:
        extras = {name: None if isinstance(value, list) else value for name, value in _extras(chunk, _TOP).items()}
        if self.first is None:
            self.first = extras
        else:
            self.later.update((name, value) for name, value in extras.items() if name not in self.first)
        for choice in chunk.get("choices") or ():
            self.choice.update((name, _plain(value)) for name, value in _extras(choice, _CHOICE).items())
            self.seen.update(name for name in _OPTIONAL if name in choice)
        self.usage.update(_extras(chunk.get("usage"), _USAGE))

    def done(self) -> None:
        if self.first is not None:
            keys = AnswerKeys(
                top=self.first, choice=self.choice, message={}, usage=copy.deepcopy(self.usage), last=self.later, absent=frozenset() if self.logprobs else frozenset(_OPTIONAL - self.seen)
            )
            _keep((self.key, self.chat, True), keys)


def template(key: Hashable, chat: bool, stream: bool = False) -> AnswerKeys | None:
    """The fields the endpoint's answers (`stream`: chunks) of this kind carry beyond specapi's own
    (None: none seen yet)."""
    found = _templates.get((key, chat, stream))
    whole = _templates.get((key, chat, False)) if stream else None
    if found is not None and whole is not None and not found.usage and whole.usage:
        found = replace(found, usage=whole.usage)  # streams asked without usage: the usage of whole answers
    return None if found is None or found.empty else found


def _usage_extras(keys: AnswerKeys, cached_tokens: int | None) -> dict[str, Any]:
    extras = copy.deepcopy(dict(keys.usage))
    details = extras.get("prompt_tokens_details")
    if isinstance(details, dict) and "cached_tokens" in details:
        details["cached_tokens"] = cached_tokens or 0
    return extras


def fill(data: dict[str, Any], keys: AnswerKeys | None, *, cached_tokens: int | None = None) -> dict[str, Any]:
    """`data` (an assembled answer) with the template's fields it lacks, at every level."""
    if keys is None:
        return data
    for name, value in keys.top.items():
        data.setdefault(name, copy.deepcopy(value))
    for choice in data.get("choices") or ():
        for name, value in keys.choice.items():
            choice.setdefault(name, copy.copy(value))
        for name in keys.absent:
            if choice.get(name, 0) is None:
                del choice[name]
        message = choice.get("message")
        if isinstance(message, dict):
            for name, value in keys.message.items():
                message.setdefault(name, copy.copy(value))
    _fill_usage(data, keys, cached_tokens)
    return data


def fill_chunk(chunk: dict[str, Any], keys: AnswerKeys | None, *, cached_tokens: int | None = None) -> dict[str, Any]:
    """The last chunk of an assembled stream with a stream template's fields: the top-level ones the
    target's later chunks carry, a choice's, the usage's (`_chunker` puts the rest on every chunk)."""
    if keys is None:
        return chunk
    for name, value in {**keys.top, **keys.last}.items():
        chunk.setdefault(name, copy.deepcopy(value))
    for choice in chunk.get("choices") or ():
        for name, value in keys.choice.items():
            choice.setdefault(name, copy.copy(value))
    _fill_usage(chunk, keys, cached_tokens)
    return chunk


def _fill_usage(payload: dict[str, Any], keys: AnswerKeys, cached_tokens: int | None) -> None:
    """The usage's fields the target's answers carry beyond specapi's own (an answer or a last chunk)."""
    usage = payload.get("usage")
    if isinstance(usage, dict):
        for name, value in _usage_extras(keys, cached_tokens).items():
            usage.setdefault(name, value)
