"""What a round works on: the request (prompt or messages), the text accepted so far, the sampling."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .acceptance import SamplingParams

__all__ = ["Context", "Prefill"]


@dataclass(frozen=True)
class Prefill:
    """How an endpoint continues a partial assistant message.

    `style` "continue_final_message" sends vLLM/SGLang's flags (`continue_final_message: true`,
    `add_generation_prompt: false`); "trailing" relies on the server continuing a final assistant
    message by itself (llama.cpp). `echoes_prefix`: the reply's content repeats the prefix (llama-server).
    """

    style: str = "continue_final_message"
    echoes_prefix: bool = False

    def fields(self, has_prefix: bool) -> dict[str, Any]:
        if has_prefix and self.style == "continue_final_message":
            return {"continue_final_message": True, "add_generation_prompt": False}
        return {}

    def strip(self, content: str, prefix: str) -> str:
        """The continuation alone. None of it is trusted if an echoing server did not echo."""
        if self.echoes_prefix and prefix:
            if not content.startswith(prefix):
                raise ValueError("the reply does not repeat the continued prefix")
            return content[len(prefix) :]
        return content


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

    def sampling_body(self, seed: int | None, *, target: bool = True) -> dict[str, Any]:
        """The sampling fields of a request: the target also gets every extra field of the caller's
        request; the draft (another server, maybe of another kind) only temperature, top_p and seed."""
        body: dict[str, Any] = dict(self.extras) if target else {}
        if not target and self.sampling.point_mass_draft:
            body["temperature"] = 0.0  # the draft's most likely tokens (see SamplingParams.point_mass_draft)
        else:
            body["temperature"] = self.sampling.temperature
            if self.sampling.top_p < 1.0:
                body["top_p"] = self.sampling.top_p
        if seed is not None:
            body["seed"] = seed
        return body

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
