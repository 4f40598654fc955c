"""What one request asks the simulated engine for, and what it computed: plain data shared by the
provider and the native dialects (``vllm_api``, ``sglang_api``, ``llamacpp_api``).

A request holds one or more prompts (``PromptWork``); the engine answers each with a ``Job``: its prompt,
how much of it the prefix cache served, the generations, the scored prompt tokens, and the timing of
the whole request. The dialect modules read requests into ``PromptWork`` and build answers from ``Job``s;
the provider runs them (limits, faults, cache, generation, timing), so the dialects never import it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .generation import Generation, TokenRecord
from .latency import RequestTiming
from .models import ModelSpec
from .responses import usage_body

__all__ = ["Job", "PromptWork", "total_usage"]


@dataclass(frozen=True)
class PromptWork:
    """One prompt of a request: its token ids, whether and from where its tokens are scored
    (``prompt_k`` alternatives from position ``score_start``; ``None`` = not scored), and how many of its
    tokens may be read from the prefix cache (``cache_limit``: ``None`` = all it holds, ``0`` = none)."""

    prompt_ids: Sequence[int]
    prompt_k: int | None = None
    score_start: int = 1
    cache_limit: int | None = None


@dataclass
class Job:
    """Everything computed for one prompt of a successful generation request."""

    spec: ModelSpec
    prompt_ids: list[int]
    cached_tokens: int
    choices: list[Generation]
    prompt_records: list[TokenRecord] | None = None
    prediction: tuple[int, int] | None = None
    predicted_flags: list[bool] = field(default_factory=list)
    timing: RequestTiming | None = None  # of the whole request (every prompt of it)

    @property
    def completion_tokens(self) -> int:
        rejected = self.prediction[1] if self.prediction else 0
        return sum(len(c.tokens) for c in self.choices) + rejected

    def usage(self) -> dict[str, Any]:
        return usage_body(
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            prediction=self.prediction,
        )


def total_usage(jobs: Sequence[Job]) -> dict[str, Any]:
    """``usage`` of a request holding several prompts: every count summed."""
    if len(jobs) == 1:
        return jobs[0].usage()
    return usage_body(
        prompt_tokens=sum(len(j.prompt_ids) for j in jobs),
        completion_tokens=sum(j.completion_tokens for j in jobs),
        cached_tokens=sum(j.cached_tokens for j in jobs),
    )
