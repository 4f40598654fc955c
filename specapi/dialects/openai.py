"""The two OpenAI formats every server speaks: chat (`/chat/completions`) and legacy completions
(`/completions`). One object per format owns where a request goes, how the prompt and the text so far
are put in its body, and how text, streamed text and logprobs are read back, so the verifiers,
drafters and whole-answer paths ask the format instead of branching on chat.

`openai_format(context)` gives the format of a request: chat when it has messages.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .._wire import chat_tokens, completion_tokens
from ..alignment import ScoredToken
from ..context import Context, Prefill

__all__ = ["ChatFormat", "CompletionsFormat", "OpenAIFormat", "openai_format"]


@dataclass(frozen=True)
class ChatFormat:
    """`/chat/completions`: the text so far is a final assistant message the server continues."""

    path: str = "/chat/completions"
    chat: bool = True

    def prompt_fields(self, context: Context, extra: str = "", prefill: Prefill = Prefill()) -> dict[str, Any]:
        return {"messages": context.chat_messages(extra), **prefill.fields(bool(context.accepted or extra))}

    def text(self, choice: Mapping[str, Any], prefix: str = "", prefill: Prefill = Prefill()) -> str:
        """The generated text alone (a server that repeats the continued prefix has it cut off)."""
        content = (choice.get("message") or {}).get("content") or ""
        if not isinstance(content, str):
            raise TypeError("message.content is not a string")
        return prefill.strip(content, prefix)

    def delta(self, choice: Mapping[str, Any]) -> str:
        return (choice.get("delta") or {}).get("content") or ""

    def tokens(self, choice: Mapping[str, Any]) -> list[ScoredToken]:
        return chat_tokens((choice.get("logprobs") or {}).get("content"))

    def logprobs(self, top_k: int | None = None) -> dict[str, Any]:
        """Fields asking for the generated tokens' logprobs (and `top_k` alternatives, up to 20)."""
        return {"logprobs": True} if top_k is None else {"logprobs": True, "top_logprobs": min(top_k, 20)}

    #: The field holding the length of the alternatives' list (lowered when a server refuses it).
    list_field: str = "top_logprobs"

    def draft_fields(self, context: Context, top_k: int, prefill: Prefill = Prefill()) -> dict[str, Any]:
        """A draft request's prompt and logprob fields, `top_k` alternatives (uncapped: the caller lowers
        it on a refusal). A completions request drafted by chat continues its prompt as an assistant message."""
        if context.is_chat:
            fields = self.prompt_fields(context, prefill=prefill)
        else:
            fields = {"messages": [{"role": "assistant", "content": context.completion_prompt()}], **prefill.fields(True)}
        return {**fields, "logprobs": True, self.list_field: top_k}


@dataclass(frozen=True)
class CompletionsFormat:
    """`/completions`: the text so far is appended to the prompt."""

    path: str = "/completions"
    chat: bool = False

    def prompt_fields(self, context: Context, extra: str = "", prefill: Prefill = Prefill()) -> dict[str, Any]:
        return {"prompt": context.completion_prompt(extra)}

    def text(self, choice: Mapping[str, Any], prefix: str = "", prefill: Prefill = Prefill()) -> str:
        text = choice.get("text") or ""
        if not isinstance(text, str):
            raise TypeError("text is not a string")
        return text

    def delta(self, choice: Mapping[str, Any]) -> str:
        return choice.get("text") or ""

    def tokens(self, choice: Mapping[str, Any]) -> list[ScoredToken]:
        return completion_tokens(choice.get("logprobs"))

    def logprobs(self, top_k: int | None = None) -> dict[str, Any]:
        """`logprobs` is the list length here (OpenAI's legacy endpoint takes up to 5)."""
        return {"logprobs": 1 if top_k is None else min(top_k, 5)}

    list_field: str = "logprobs"

    def draft_fields(self, context: Context, top_k: int, prefill: Prefill = Prefill()) -> dict[str, Any]:
        """A draft request's prompt and logprob fields (`top_k` uncapped: vLLM takes 20, OpenAI 5)."""
        return {**self.prompt_fields(context), self.list_field: top_k}


OpenAIFormat = ChatFormat | CompletionsFormat

_CHAT, _COMPLETIONS = ChatFormat(), CompletionsFormat()


def openai_format(context: Context) -> OpenAIFormat:
    return _CHAT if context.is_chat else _COMPLETIONS
