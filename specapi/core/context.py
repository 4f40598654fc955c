"""What a round works on: the request (prompt or messages), the text accepted so far, the sampling.

How a context is put in a request body is the dialects' business (`dialects/openai.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .acceptance import SamplingParams

__all__ = ["Context", "PENALTIES"]

#: The penalties and their neutral values. A server that counts the prompt's tokens in them (llama-server:
#: `Capabilities.penalties_over_prompt`) penalises a verification call on prompt + draft exactly as the
#: target alone at that position (docs/verification.md); elsewhere they keep the target alone (plan.py).
PENALTIES: dict[str, float] = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}


@dataclass(frozen=True)
class Context:
    """One request's state at the start of a round. `messages` is set for chat requests, else `prompt`."""

    prompt: str | None = None
    messages: Sequence[Mapping[str, Any]] | None = None
    accepted: str = ""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    #: The caller's other request fields (`extra_body` included): sent on every target request, so the
    #: target samples exactly as it would for the caller's own request.
    extras: Mapping[str, Any] = field(default_factory=dict)
    #: Per-call transport options (`extra_headers`, `extra_query`, `timeout`) for every upstream request.
    options: Mapping[str, Any] = field(default_factory=dict)
    #: The target's token ids of the prompt and the accepted text, when the target is spoken to in ids
    #: (token-id verification); None when unknown.
    token_ids: tuple[int, ...] | None = None
    #: The caller asked for the generated tokens' logprobs, with top lists this long; None: not asked.
    logprobs: int | None = None

    @property
    def is_chat(self) -> bool:
        return self.messages is not None

    def completion_prompt(self, extra: str = "") -> str:
        assert self.prompt is not None
        return self.prompt + self.accepted + extra

    def chat_messages(self, extra: str = "") -> list[dict[str, Any]]:
        """The messages with the accepted text (plus `extra`) as a final assistant message to continue."""
        assert self.messages is not None
        messages = [dict(m) for m in self.messages]
        prefix = self.accepted + extra
        if prefix:
            messages.append({"role": "assistant", "content": prefix})
        return messages

    def advanced(self, text: str, ids: Sequence[int] | None = None) -> Context:
        """The context after `text`; its token ids follow only when the ids of `text` are known."""
        token_ids = self.token_ids + tuple(ids) if self.token_ids is not None and ids is not None else None
        # A copy with two fields changed, made directly: called once per streamed chunk, where
        # `dataclasses.replace` (which re-runs `__init__` over every field) took five times as long.
        copy = object.__new__(type(self))
        fields = copy.__dict__
        fields.update(self.__dict__)
        fields["accepted"] = self.accepted + text
        fields["token_ids"] = token_ids
        return copy
