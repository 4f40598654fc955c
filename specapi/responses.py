"""The response objects `create` returns, assembled as the SDK's types from the engine's text or a
target's JSON, with the statistics attached (`response.speculative`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from openai._models import construct_type

from ._calls import RoleClient
from ._exceptions import MalformedResponseError
from .request import Finished
from .stats import SpeculativeStats
from .types import SpeculativeChatCompletion, SpeculativeCompletion

__all__ = ["build", "choice", "completion_data", "response_id", "usage"]


def response_id(chat: bool) -> str:
    """A fresh id for one response, in OpenAI's shape (`chatcmpl-...` or `cmpl-...`)."""
    return f"{'chatcmpl' if chat else 'cmpl'}-spec-{os.urandom(12).hex()}"


def build(target: RoleClient, chat: bool, data: Any, stats: SpeculativeStats) -> Any:
    """The response object, built as the SDK builds it: without validating the fields (a target's
    echo puts null first in `token_logprobs`, which the SDK's types do not allow, and passes on)."""
    if not isinstance(data, Mapping):
        raise MalformedResponseError(f"response is not a JSON object: {str(data)[:200]!r}", role=target.role, endpoint=target.endpoint.label)
    cls = SpeculativeChatCompletion if chat else SpeculativeCompletion
    response = construct_type(type_=cls, value=dict(data))
    response.speculative = stats
    return response


def choice(chat: bool, text: str, finish_reason: str) -> dict[str, Any]:
    """The one choice of a speculated response."""
    if chat:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish_reason}
    return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


def usage(finished: Finished) -> dict[str, Any]:
    """The response's usage: the target's own when one target call wrote the answer, else the counts."""
    if finished.usage is not None:
        return dict(finished.usage)  # one target call wrote the answer: its usage, every field
    prompt = finished.prompt_tokens or 0
    return {"prompt_tokens": prompt, "completion_tokens": finished.completion_tokens, "total_tokens": prompt + finished.completion_tokens}


def completion_data(chat: bool, model: str, text: str, finished: Finished) -> dict[str, Any]:
    """The JSON object of a speculated, collected response."""
    return {
        "id": response_id(chat),
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": [choice(chat, text, finished.finish_reason)],
        "usage": usage(finished),
    }
