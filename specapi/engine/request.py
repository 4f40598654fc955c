"""One request's life in the engine: what was asked (`GenerationRequest`), what comes out (`Piece`,
`Finished`), and a draft made ahead of its round (`Prefetched`). The state the request's rounds share
is `state.RequestState`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..core.context import Context
from ..parts.drafters import Draft
from ..core.stats import SpeculativeStats

__all__ = ["GenerationRequest", "Piece", "Finished", "Prefetched"]


@dataclass(frozen=True)
class GenerationRequest:
    context: Context
    max_tokens: int | None  # None: the caller set none, so the server's own limit applies
    stop: tuple[str, ...] = ()
    stream: bool = False  # the caller streams: a final target-alone step is streamed too


@dataclass(frozen=True)
class Piece:
    """Text the target accepted, ready to hand out (with the caller's logprobs of its tokens, if asked)."""

    text: str
    logprobs: Any = None


@dataclass(frozen=True)
class Finished:
    finish_reason: str
    stats: SpeculativeStats
    prompt_tokens: int | None
    completion_tokens: int
    #: The target's own usage object (every field it sent: cached tokens, details) when the whole answer
    #: is one target call; None when the answer was assembled from several calls.
    usage: Mapping[str, Any] | None = None
    #: The target alone's stream would carry the usage unasked, on its last chunk (llama-server's completions).
    stream_usage: bool = False
    #: The caller's logprobs (the `logprobs` object of the choice; of a stream, that of the tokens not yet out).
    logprobs: Any = None
    #: The prompt tokens the target reported cached on the request's first call that reported it.
    prompt_cached_tokens: int | None = None


@dataclass(frozen=True)
class Prefetched:
    """A draft of the next round started while the current one is verified (pipelined drafting)."""

    task: asyncio.Task[Draft]
    assumed: str  # the accepted text the prefetched draft continues
