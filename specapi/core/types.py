"""Response types: the openai SDK's own classes, with the speculation statistics attached.

`speculative` is always set on what specapi returns. It is left out of `model_dump()` /
`model_dump_json()` (so the dump is the SDK's shape and serialises as JSON, as frameworks built on the
SDK expect); `resp.speculative.to_dict()` is its JSON form.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from openai.types import Completion
from openai.types.chat import ChatCompletion, ParsedChatCompletion
from pydantic import ConfigDict, Field

from .stats import SpeculativeStats

__all__ = ["SpeculativeCompletion", "SpeculativeChatCompletion", "SpeculativeParsedChatCompletion"]

ContentT = TypeVar("ContentT")


class SpeculativeCompletion(Completion):
    """An `openai.types.Completion` with `speculative`: what speculation did for this response."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")
    speculative: SpeculativeStats = Field(default_factory=SpeculativeStats, exclude=True)


class SpeculativeChatCompletion(ChatCompletion):
    """An `openai.types.chat.ChatCompletion` with `speculative`: what speculation did for this response."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")
    speculative: SpeculativeStats = Field(default_factory=SpeculativeStats, exclude=True)


class SpeculativeParsedChatCompletion(ParsedChatCompletion[ContentT], Generic[ContentT]):
    """What `chat.completions.parse` returns: the SDK's `ParsedChatCompletion` (`message.parsed`), with `speculative`."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")
    speculative: SpeculativeStats = Field(default_factory=SpeculativeStats, exclude=True)
