"""Running a scenario: the same requests through the target alone and through specapi, alternating.

The baseline is the target alone through the openai SDK, streamed (``stream=True`` with usage in the
last chunk), so its time to first token is the real one, as a user without specapi would see it.
(``AsyncSpeculativeOpenAI(verification="none")`` generates in one non-streamed call, so its first text
arrives with its last: it would overstate the gain in time to first token.) The speculative side is
``AsyncSpeculativeOpenAI`` streamed the same way. Both are timed by the same code here, from sending to
the last chunk, on the same clock.

Requests alternate: request i goes baseline-then-speculative when i is even, the other way round when
it is odd, so drifts in the conditions hit both sides alike. With ``concurrency`` c, c requests run at
once on each side, side after side. Warm-up requests go through the speculative client first (opening
connections, running the capability probe, teaching an adaptive policy); two draft calls (1 and 16
tokens) are timed alone to measure the draft's fixed and per-token cost, which a fixed draft length
cannot separate.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..client import AsyncSpeculativeOpenAI
from ..dialects.openai import format_of
from ..endpoint import Endpoint
from ..pricing import call_cost
from ..stats import RoleUsage, RoundRecord, SpeculativeStats
from .scenarios import BenchRequest, Scenario

__all__ = ["Calibration", "Sample", "ScenarioRun", "run_scenario", "steps", "stream_target_alone"]

Clock = Callable[[], float]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Sample:
    """One request on one side: what came back, how long it took, what it was billed."""

    index: int
    side: str  # "baseline" or "speculative"
    text: str = ""
    wall_s: float = 0.0
    ttft_s: float | None = None
    generated_tokens: int = 0
    target: RoleUsage = field(default_factory=RoleUsage)
    draft: RoleUsage = field(default_factory=RoleUsage)
    stats: SpeculativeStats | None = None
    error: str | None = None

    @property
    def rounds(self) -> tuple[RoundRecord, ...]:
        return self.stats.rounds if self.stats is not None else ()


@dataclass(frozen=True)
class Calibration:
    """Two draft calls made alone, as the drafter makes them (not streamed, with logprobs): one of
    ``short_tokens`` and one of ``long_tokens`` tokens. Their difference is the per-token cost."""

    short_s: float
    long_s: float
    short_tokens: int
    long_tokens: int

    @property
    def per_token_s(self) -> float:
        return max(0.0, (self.long_s - self.short_s) / (self.long_tokens - self.short_tokens))

    @property
    def fixed_s(self) -> float:
        """Cost of a call drafting K tokens = fixed_s + K * per_token_s."""
        return max(0.0, self.short_s - self.short_tokens * self.per_token_s)


@dataclass
class ScenarioRun:
    """Everything measured for one scenario (`summary.summarize` turns it into the report)."""

    scenario: Scenario
    baseline: list[Sample] = field(default_factory=list)
    speculative: list[Sample] = field(default_factory=list)
    warmup: list[Sample] = field(default_factory=list)
    calibration: Calibration | None = None
    target_label: str = ""
    draft_label: str | None = None
    elapsed_s: float = 0.0
    #: More results reported with the scenario (the seed-blog experiment), as JSON-ready data.
    extras: dict[str, Any] = field(default_factory=dict)


def _request_seed(seed: int, index: int) -> int:
    """Each request its own draws: a measured one (index 0, 1, ...) the same in both arms, a warm-up
    (index -1, -2, ...) others, so that no measured text was seen before."""
    return seed + index if index >= 0 else seed + 10_000 - index


def _body(endpoint: Endpoint, scenario: Scenario, stream: bool, index: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"max_tokens": scenario.max_tokens, "temperature": scenario.temperature}
    if scenario.seed is not None:
        body["seed"] = _request_seed(scenario.seed, index)
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    if endpoint.extra_body:
        body["extra_body"] = dict(endpoint.extra_body)
    return body


async def stream_target_alone(
    sdk: Any, endpoint: Endpoint, request: BenchRequest, scenario: Scenario, *, index: int = 0, clock: Clock = time.perf_counter
) -> Sample:
    """One request to `endpoint` alone through the openai SDK, streamed and timed."""
    body = _body(endpoint, scenario, stream=True, index=index)
    started = clock()
    pieces: list[str] = []
    ttft: float | None = None
    usage: Any = None
    try:
        if request.is_chat:
            stream = await sdk.chat.completions.create(model=endpoint.model, messages=list(request.messages or ()), **body)
        else:
            stream = await sdk.completions.create(model=endpoint.model, prompt=request.prompt, **body)
        async for chunk in stream:
            if getattr(chunk, "usage", None):
                usage = chunk.usage
            for choice in chunk.choices or ():
                piece = choice.delta.content if request.is_chat else choice.text
                if piece:
                    if ttft is None:
                        ttft = clock() - started
                    pieces.append(piece)
    except Exception as exc:  # any failure is reported per request, not fatal to the bench
        return Sample(index=index, side="baseline", wall_s=clock() - started, error=f"{type(exc).__name__}: {exc}")
    wall = clock() - started
    if usage is not None:
        details = getattr(usage, "prompt_tokens_details", None)
        cached = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
        prompt, completion = int(usage.prompt_tokens or 0), int(usage.completion_tokens or 0)
        role = RoleUsage(
            requests=1,
            prompt_tokens=prompt,
            completion_tokens=completion,
            cached_tokens=cached,
            latency_s=wall,
            cost_usd=call_cost(endpoint, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached),
        )
    else:  # the server sent no usage: tokens unknown, cost unknown (never reported as free)
        completion = len(pieces)
        role = RoleUsage(requests=1, latency_s=wall, cost_usd=None)
    return Sample(index=index, side="baseline", text="".join(pieces), wall_s=wall, ttft_s=ttft, generated_tokens=completion, target=role)


async def _speculative(client: AsyncSpeculativeOpenAI, request: BenchRequest, scenario: Scenario, *, index: int, clock: Clock) -> Sample:
    body = {"max_tokens": scenario.max_tokens, "temperature": scenario.temperature, "stream": True}
    if scenario.seed is not None:
        body["seed"] = _request_seed(scenario.seed, index)
    started = clock()
    pieces: list[str] = []
    ttft: float | None = None
    try:
        if request.is_chat:
            stream = await client.chat.completions.create(messages=list(request.messages or ()), **body)
        else:
            stream = await client.completions.create(prompt=request.prompt, **body)
        async for chunk in stream:
            for choice in chunk.choices or ():
                piece = choice.delta.content if request.is_chat else choice.text
                if piece:
                    if ttft is None:
                        ttft = clock() - started
                    pieces.append(piece)
        stats = stream.speculative
    except Exception as exc:  # reported per request
        return Sample(index=index, side="speculative", wall_s=clock() - started, error=f"{type(exc).__name__}: {exc}")
    wall = clock() - started
    if stats is None:
        return Sample(index=index, side="speculative", text="".join(pieces), wall_s=wall, ttft_s=ttft, error="the stream ended without statistics")
    return Sample(
        index=index,
        side="speculative",
        text="".join(pieces),
        wall_s=wall,
        ttft_s=ttft,
        generated_tokens=stats.generated_tokens,
        target=stats.target,
        draft=stats.draft,
        stats=stats,
    )


async def _timed_draft_call(sdk: Any, endpoint: Endpoint, request: BenchRequest, max_tokens: int, clock: Clock) -> tuple[float, int]:
    body: dict[str, Any] = {"model": endpoint.model, "max_tokens": max_tokens, "temperature": 0.0}
    if endpoint.extra_body:
        body["extra_body"] = dict(endpoint.extra_body)
    started = clock()
    body.update(format_of(request.is_chat).logprobs(1))
    if request.is_chat:
        response = await sdk.chat.completions.create(messages=list(request.messages or ()), **body)
    else:
        response = await sdk.completions.create(prompt=request.prompt, **body)
    elapsed = clock() - started
    return elapsed, int(response.usage.completion_tokens) if response.usage else max_tokens


async def _calibrate(sdk: Any, endpoint: Endpoint, request: BenchRequest, clock: Clock) -> Calibration | None:
    """Time a 1-token and a 16-token draft call: the draft's fixed and per-token cost (None if refused)."""
    try:
        short_s, short_n = await _timed_draft_call(sdk, endpoint, request, 1, clock)
        long_s, long_n = await _timed_draft_call(sdk, endpoint, request, 16, clock)
    except Exception:  # a draft that refuses this shape: the rounds alone will have to do
        return None
    if long_n <= short_n:
        return None
    return Calibration(short_s=short_s, long_s=long_s, short_tokens=short_n, long_tokens=long_n)


async def run_scenario(
    scenario: Scenario,
    target: Endpoint,
    draft: Endpoint | None,
    *,
    progress: Progress | None = None,
    clock: Clock = time.perf_counter,
) -> ScenarioRun:
    """Run `scenario` against `target` (and `draft`): warm-up, calibration, then alternating measurement.

    `progress` is called with a short label after each step (a warm-up request, a calibration, a
    measured request on either side).
    """
    step = progress or (lambda label: None)
    use_draft = draft if scenario.use_draft else None
    started = clock()
    run = ScenarioRun(scenario=scenario, target_label=target.label, draft_label=use_draft.label if use_draft else None)
    client = AsyncSpeculativeOpenAI(target=target, draft=use_draft, **dict(scenario.client))
    sdk = target.build_client()
    draft_sdk = use_draft.build_client() if use_draft is not None else None
    try:
        requests = scenario.requests
        warm = replace(scenario, max_tokens=scenario.warmup_max_tokens or scenario.max_tokens)
        for i in range(scenario.warmup):
            run.warmup.append(await _speculative(client, requests[i % len(requests)], warm, index=-1 - i, clock=clock))
            step("warm-up")
        # One target-alone request too, so both sides start with open connections.
        await stream_target_alone(sdk, target, requests[0], replace(scenario, max_tokens=2), clock=clock)
        if use_draft is not None:
            run.calibration = await _calibrate(draft_sdk, use_draft, requests[0], clock)
        step("calibration")
        width = max(1, scenario.concurrency)
        for start in range(0, len(requests), width):
            wave = list(enumerate(requests[start : start + width], start=start))

            async def baseline_side() -> list[Sample]:
                return list(await asyncio.gather(*(stream_target_alone(sdk, target, r, scenario, index=i, clock=clock) for i, r in wave)))

            async def speculative_side() -> list[Sample]:
                return list(await asyncio.gather(*(_speculative(client, r, scenario, index=i, clock=clock) for i, r in wave)))

            if (start // width) % 2 == 0:
                run.baseline += await baseline_side()
                step("target alone")
                run.speculative += await speculative_side()
                step("speculative")
            else:
                run.speculative += await speculative_side()
                step("speculative")
                run.baseline += await baseline_side()
                step("target alone")
    finally:
        # Simulated endpoints share one http client per role: close everything once, at the end.
        await client.close()
        for own, endpoint in ((sdk, target), (draft_sdk, use_draft)):
            if own is not None and endpoint is not None and endpoint.client is None:
                await own.close()
    run.elapsed_s = clock() - started
    return run


def steps(scenario: Scenario) -> int:
    """How many times `run_scenario` calls `progress` (for a progress bar's total)."""
    waves = -(-len(scenario.requests) // max(1, scenario.concurrency))
    return scenario.warmup + 1 + 2 * waves
