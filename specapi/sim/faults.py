"""Failures the simulated provider can inject, per request, from a seeded generator.

``Faults`` is the set of switches (rates in [0, 1], optionally restricted to one model or one path);
``FaultInjector`` turns it into one ``FaultPlan`` per request. Every request draws the same number of
random values whatever fires, so a seed always gives the same sequence of faults. The ``*_logprobs`` and
``truncate`` helpers apply a plan to a response body.

What each switch does:

* ``fail_first``: the first N matching requests fail with ``fail_first_status`` (for retry tests);
* ``error_rate`` / ``unavailable_rate`` / ``rate_limit_rate``: HTTP 500 / 503 / 429 (with ``Retry-After``);
* ``spike_rate``: ``spike_s`` more latency before the response;
* ``truncate_rate``: the body is cut in the middle of its JSON (streams end inside a chunk, no ``[DONE]``);
* ``drop_logprobs_rate``: ``logprobs`` is ``null`` in every choice;
* ``mismatch_logprobs_rate``: the logprob arrays disagree in length (completions: ``top_logprobs`` and
  ``text_offset`` lose their last entry; chat: ``content`` loses its last item).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .params import route_path

__all__ = [
    "FaultInjector",
    "FaultPlan",
    "Faults",
    "drop_logprobs",
    "mismatch_logprobs",
    "truncate",
]


@dataclass(frozen=True, kw_only=True)
class Faults:
    """Fault switches; all off by default. ``model`` / ``path``: only requests for that model or path
    (``"/completions"``, ``"/chat/completions"``; a ``/v1`` prefix is ignored)."""

    fail_first: int = 0
    fail_first_status: int = 503
    error_rate: float = 0.0
    unavailable_rate: float = 0.0
    rate_limit_rate: float = 0.0
    retry_after_s: float = 1.0
    spike_rate: float = 0.0
    spike_s: float = 2.0
    truncate_rate: float = 0.0
    drop_logprobs_rate: float = 0.0
    mismatch_logprobs_rate: float = 0.0
    model: str | None = None
    path: str | None = None
    seed: int = 0

    def applies_to(self, *, model: str | None, path: str) -> bool:
        """Whether a request for ``model`` at ``path`` is subject to these faults."""
        if self.model is not None and model != self.model:
            return False
        return self.path is None or route_path(path) == route_path(self.path)


@dataclass(frozen=True)
class FaultPlan:
    """What goes wrong with one request. ``status``: answer with this error instead (``None`` = serve)."""

    status: int | None = None
    retry_after_s: float | None = None
    extra_latency_s: float = 0.0
    truncate: bool = False
    drop_logprobs: bool = False
    mismatch_logprobs: bool = False

    @property
    def any(self) -> bool:
        return self != FaultPlan()


class FaultInjector:
    """Draws a ``FaultPlan`` per request from ``Faults`` (deterministic for a seed)."""

    def __init__(self, faults: Faults | None) -> None:
        self.faults = faults or Faults()
        self._rng = np.random.default_rng(self.faults.seed & ((1 << 64) - 1))
        self.matched = 0

    def plan(self, *, model: str | None, path: str) -> FaultPlan:
        """The faults of the next request for ``model`` at ``path``."""
        f = self.faults
        if not f.applies_to(model=model, path=path):
            return FaultPlan()
        self.matched += 1
        draws = self._rng.random(7).tolist()
        status = None
        retry_after = None
        if self.matched <= f.fail_first:
            status = f.fail_first_status
        elif draws[0] < f.error_rate:
            status = 500
        elif draws[1] < f.unavailable_rate:
            status = 503
        elif draws[2] < f.rate_limit_rate:
            status = 429
        if status == 429:
            retry_after = f.retry_after_s
        return FaultPlan(
            status=status,
            retry_after_s=retry_after,
            extra_latency_s=f.spike_s if draws[3] < f.spike_rate else 0.0,
            truncate=draws[4] < f.truncate_rate,
            drop_logprobs=draws[5] < f.drop_logprobs_rate,
            mismatch_logprobs=draws[6] < f.mismatch_logprobs_rate,
        )


def drop_logprobs(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` with ``logprobs`` set to null in every choice."""
    choices = [{**choice, "logprobs": None} for choice in body.get("choices", [])]
    return {**body, "choices": choices}


def mismatch_logprobs(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` whose logprob arrays no longer line up (see the module docstring)."""
    choices = []
    for choice in body.get("choices", []):
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            if "content" in logprobs and isinstance(logprobs["content"], list):
                logprobs = {**logprobs, "content": logprobs["content"][:-1]}
            else:
                logprobs = {
                    **logprobs,
                    "top_logprobs": (logprobs.get("top_logprobs") or [])[:-1],
                    "text_offset": (logprobs.get("text_offset") or [])[:-1],
                }
        choices.append({**choice, "logprobs": logprobs})
    return {**body, "choices": choices}


def truncate(data: bytes) -> bytes:
    """The first half of ``data`` (cut inside the JSON)."""
    return data[: max(1, len(data) // 2)]
