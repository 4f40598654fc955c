"""Response types: the openai SDK's own classes, with the speculation statistics attached."""

from __future__ import annotations

from openai.types import Completion
from openai.types.chat import ChatCompletion
from pydantic import ConfigDict

from .stats import SpeculativeStats

__all__ = ["SpeculativeCompletion", "SpeculativeChatCompletion"]


class SpeculativeCompletion(Completion):
    """An `openai.types.Completion` with `speculative`: what speculation did for this response."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")
    speculative: SpeculativeStats | None = None


class SpeculativeChatCompletion(ChatCompletion):
    """An `openai.types.chat.ChatCompletion` with `speculative`: what speculation did for this response."""

    model_config = ConfigDict(arbitrary_types_allowed=True, extra="allow")
    speculative: SpeculativeStats | None = None
