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

Load: with ``request_rate`` R the requests of a side arrive as a Poisson process of R per second (the
same seeded schedule on both sides, one side after the other; ``concurrency`` above 1 then caps the
requests in flight). Path: with ``via="serve"`` the speculative side goes through `specapi serve`'s app,
started on a loopback port in this process, read with the openai SDK as any client would. With
``fresh_prompts`` every measured speculative request starts with an empty suffix index (with the proxy:
its suffix scope per API key, and a new key per request).

Every streamed text chunk's arrival is kept (`Sample.chunk_s`): time to first token is the first, and the
gaps between the others are the inter-token latencies (a speculative chunk may carry several tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from ..surface.client import AsyncSpeculativeOpenAI
from ..dialects.openai import format_of
from ..transport.endpoint import Endpoint
from ..transport.pricing import call_cost
from ..core.stats import RoleUsage, RoundRecord, SpeculativeStats
from ..parts.suffix import SuffixIndex
from .scenarios import BenchRequest, Scenario
from .spread import poisson_arrivals

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
    #: Seconds from sending to each text chunk's arrival (the first is the time to first token).
    chunk_s: tuple[float, ...] = ()
    #: Through the proxy, whose responses carry totals but no per-round records: (rounds, drafted, accepted).
    totals: tuple[int, int, int] | None = None

    @property
    def rounds(self) -> tuple[RoundRecord, ...]:
        return self.stats.rounds if self.stats is not None else ()

    @property
    def num_rounds(self) -> int:
        return self.totals[0] if self.totals is not None else len(self.rounds)

    @property
    def drafted_tokens(self) -> int:
        return self.totals[1] if self.totals is not None else sum(r.drafted for r in self.rounds)

    @property
    def accepted_tokens(self) -> int:
        return self.totals[2] if self.totals is not None else sum(r.accepted for r in self.rounds)

    @property
    def itl_s(self) -> list[float]:
        """Gaps between successive text chunks (inter-token latency, as serving benchmarks measure it)."""
        return [b - a for a, b in itertools.pairwise(self.chunk_s)]


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
    #: Seconds each side took from its first request sent to its last answered (throughput under load).
    baseline_span_s: float = 0.0
    speculative_span_s: float = 0.0


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
    chunks: list[float] = []
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
                    chunks.append(clock() - started)
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
    return Sample(
        index=index, side="baseline", text="".join(pieces), wall_s=wall, ttft_s=chunks[0] if chunks else None,
        generated_tokens=completion, target=role, chunk_s=tuple(chunks),
    )


async def _speculative(client: AsyncSpeculativeOpenAI, request: BenchRequest, scenario: Scenario, *, index: int, clock: Clock) -> Sample:
    body = {"max_tokens": scenario.max_tokens, "temperature": scenario.temperature, "stream": True}
    if scenario.seed is not None:
        body["seed"] = _request_seed(scenario.seed, index)
    started = clock()
    pieces: list[str] = []
    chunks: list[float] = []
    try:
        if request.is_chat:
            stream = await client.chat.completions.create(messages=list(request.messages or ()), **body)
        else:
            stream = await client.completions.create(prompt=request.prompt, **body)
        async for chunk in stream:
            for choice in chunk.choices or ():
                piece = choice.delta.content if request.is_chat else choice.text
                if piece:
                    chunks.append(clock() - started)
                    pieces.append(piece)
        stats = stream.speculative
    except Exception as exc:  # reported per request
        return Sample(index=index, side="speculative", wall_s=clock() - started, error=f"{type(exc).__name__}: {exc}")
    wall = clock() - started
    ttft = chunks[0] if chunks else None
    if stats is None:
        return Sample(index=index, side="speculative", text="".join(pieces), wall_s=wall, ttft_s=ttft, error="the stream ended without statistics")
    return Sample(
        index=index,
        side="speculative",
        text="".join(pieces),
        wall_s=wall,
        ttft_s=ttft,
        chunk_s=tuple(chunks),
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


def _stats_from_proxy(data: dict[str, Any]) -> tuple[SpeculativeStats, tuple[int, int, int]]:
    """The proxy's `"speculative"` field (`SpeculativeStats.to_dict()`, no rounds) as statistics and totals."""

    def usage(role: dict[str, Any]) -> RoleUsage:
        cost = role.get("cost_usd")
        return RoleUsage(
            requests=int(role.get("requests", 0)),
            failed_requests=int(role.get("failed_requests", 0)),
            prompt_tokens=int(role.get("prompt_tokens", 0)),
            completion_tokens=int(role.get("completion_tokens", 0)),
            cached_tokens=int(role.get("cached_tokens", 0)),
            latency_s=float(role.get("latency_s", 0.0)),
            cost_usd=None if cost is None else Decimal(cost),
        )

    stats = SpeculativeStats(
        draft=usage(data.get("draft") or {}),
        target=usage(data.get("target") or {}),
        exact=bool(data.get("exact", True)),
        exact_reason=data.get("exact_reason"),
        speculated=bool(data.get("speculated", True)),
        fallback_reason=data.get("fallback_reason"),
        verification=str(data.get("verification", "")),
        generated_tokens=int(data.get("generated_tokens", 0)),
        wall_s=float(data.get("wall_s", 0.0)),
        ttft_s=data.get("ttft_s"),
        load_reason=data.get("load_reason"),
    )
    return stats, (int(data.get("num_rounds", 0)), int(data.get("drafted_tokens", 0)), int(data.get("accepted_tokens", 0)))


async def _through_proxy(sdk: Any, model: str, request: BenchRequest, scenario: Scenario, *, index: int, clock: Clock, key: str | None) -> Sample:
    """One request through `specapi serve`, streamed with the openai SDK; statistics from its last chunk."""
    body: dict[str, Any] = {"model": model, "max_tokens": scenario.max_tokens, "temperature": scenario.temperature, "stream": True}
    if scenario.seed is not None:
        body["seed"] = _request_seed(scenario.seed, index)
    if key is not None:
        body["extra_headers"] = {"Authorization": f"Bearer {key}"}
    started = clock()
    pieces: list[str] = []
    chunks: list[float] = []
    found: dict[str, Any] | None = None
    try:
        if request.is_chat:
            stream = await sdk.chat.completions.create(messages=list(request.messages or ()), **body)
        else:
            stream = await sdk.completions.create(prompt=request.prompt, **body)
        async for chunk in stream:
            extra = getattr(chunk, "model_extra", None) or {}
            if isinstance(extra.get("speculative"), dict):
                found = extra["speculative"]
            for choice in chunk.choices or ():
                piece = choice.delta.content if request.is_chat else choice.text
                if piece:
                    chunks.append(clock() - started)
                    pieces.append(piece)
    except Exception as exc:  # reported per request
        return Sample(index=index, side="speculative", wall_s=clock() - started, error=f"{type(exc).__name__}: {exc}")
    wall = clock() - started
    ttft = chunks[0] if chunks else None
    if found is None:
        return Sample(index=index, side="speculative", text="".join(pieces), wall_s=wall, ttft_s=ttft, error="the proxy's stream ended without statistics")
    stats, totals = _stats_from_proxy(found)
    return Sample(
        index=index, side="speculative", text="".join(pieces), wall_s=wall, ttft_s=ttft, chunk_s=tuple(chunks),
        generated_tokens=stats.generated_tokens, target=stats.target, draft=stats.draft, stats=stats, totals=totals,
    )


@contextlib.asynccontextmanager
async def _serving(scenario: Scenario, target: Endpoint, draft: Endpoint | None) -> AsyncIterator[str]:
    """`specapi serve`'s app for this scenario on a free loopback port, in this event loop: its base URL."""
    import uvicorn

    from ..server.app import create_app
    from ..server.config import ServerConfig

    options = dict(scenario.client)
    k = int(options.pop("num_speculative_tokens", 4))
    config = ServerConfig(
        target=target, draft=draft, num_speculative_tokens=k, client_options=options,
        suffix_scope="api-key" if scenario.fresh_prompts else "model",
        max_tenants=max(256, 2 * len(scenario.requests) + scenario.warmup + 2),
    )
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(config), log_level="warning", access_log=False, lifespan="on", ws="none"))
    task = asyncio.ensure_future(server.serve(sockets=[listener]))
    try:
        while not server.started:
            if task.done():
                task.result()  # raises what stopped it
                raise RuntimeError("the proxy stopped while starting")
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        with contextlib.suppress(Exception):
            await task
        listener.close()


Call = Callable[[BenchRequest, int], Awaitable[Sample]]


async def _side(call: Call, wave: list[tuple[int, BenchRequest]]) -> list[Sample]:
    return list(await asyncio.gather(*(call(r, i) for i, r in wave)))


async def _scheduled(call: Call, requests: tuple[BenchRequest, ...], arrivals: list[float], cap: int | None, clock: Clock) -> tuple[list[Sample], float]:
    """Each request sent at its arrival time (at most `cap` in flight): the samples, and the side's span."""
    gate = asyncio.Semaphore(cap) if cap else None
    started = clock()

    async def one(index: int, request: BenchRequest, at: float) -> Sample:
        await asyncio.sleep(max(0.0, at - (clock() - started)))
        if gate is None:
            return await call(request, index)
        async with gate:
            return await call(request, index)

    samples = await asyncio.gather(*(one(i, r, at) for (i, r), at in zip(enumerate(requests), arrivals)))
    return list(samples), clock() - started


async def _measure(run: ScenarioRun, baseline: Call, speculative: Call, step: Progress, clock: Clock, order: int) -> None:
    """The measured requests: in waves of `concurrency`, alternating which side goes first, or (with a
    request rate) one whole side after the other on the same Poisson schedule, `order` choosing the first."""
    scenario = run.scenario
    requests = scenario.requests
    if scenario.request_rate is not None:
        arrivals = poisson_arrivals(len(requests), scenario.request_rate, seed=scenario.seed or 0)
        cap = scenario.concurrency if scenario.concurrency > 1 else None
        sides = [("target alone", baseline, "baseline"), ("speculative", speculative, "speculative")]
        for label, call, name in sides[::-1] if order % 2 else sides:
            samples, span = await _scheduled(call, requests, arrivals, cap, clock)
            setattr(run, name, samples)
            setattr(run, f"{name}_span_s", span)
            step(label)
        return
    width = max(1, scenario.concurrency)
    for start in range(0, len(requests), width):
        wave = list(enumerate(requests[start : start + width], start=start))
        sides = [("target alone", baseline, run.baseline, "baseline"), ("speculative", speculative, run.speculative, "speculative")]
        if (start // width + order) % 2:
            sides.reverse()
        for label, call, into, name in sides:
            began = clock()
            into += await _side(call, wave)
            setattr(run, f"{name}_span_s", getattr(run, f"{name}_span_s") + clock() - began)
            step(label)


async def run_scenario(
    scenario: Scenario,
    target: Endpoint,
    draft: Endpoint | None,
    *,
    progress: Progress | None = None,
    clock: Clock = time.perf_counter,
    order: int = 0,
) -> ScenarioRun:
    """Run `scenario` against `target` (and `draft`): warm-up, calibration, then the measured requests.

    `progress` is called with a short label after each step (a warm-up request, a calibration, a
    measured wave or side). `order` (the repetition's number) alternates which side goes first.
    """
    step = progress or (lambda label: None)
    use_draft = draft if scenario.use_draft else None
    started = clock()
    run = ScenarioRun(scenario=scenario, target_label=target.label, draft_label=use_draft.label if use_draft else None)
    sdk = target.build_client()
    draft_sdk = use_draft.build_client() if use_draft is not None else None
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(_close, sdk, target, draft_sdk, use_draft)
        if scenario.via == "serve":
            base_url = await stack.enter_async_context(_serving(scenario, target, use_draft))
            proxy = Endpoint(base_url=base_url, model=target.model, api_key="bench", max_retries=0).build_client()
            stack.push_async_callback(proxy.close)
            fresh = itertools.count()

            async def speculative(request: BenchRequest, index: int, s: Scenario = scenario) -> Sample:
                key = f"bench-{next(fresh)}" if scenario.fresh_prompts and index >= 0 else None
                return await _through_proxy(proxy, target.model, request, s, index=index, clock=clock, key=key)
        else:
            client = AsyncSpeculativeOpenAI(target=target, draft=use_draft, **dict(scenario.client))
            stack.push_async_callback(client.close)

            async def speculative(request: BenchRequest, index: int, s: Scenario = scenario) -> Sample:
                own = client.with_options(suffix_index=SuffixIndex()) if scenario.fresh_prompts and index >= 0 else client
                return await _speculative(own, request, s, index=index, clock=clock)

        requests = scenario.requests
        warm = replace(scenario, max_tokens=scenario.warmup_max_tokens or scenario.max_tokens)
        for i in range(scenario.warmup):
            run.warmup.append(await speculative(requests[i % len(requests)], -1 - i, warm))
            step("warm-up")
        # One target-alone request too, so both sides start with open connections.
        await stream_target_alone(sdk, target, requests[0], replace(scenario, max_tokens=2), clock=clock)
        if use_draft is not None:
            run.calibration = await _calibrate(draft_sdk, use_draft, requests[0], clock)
        step("calibration")

        async def baseline(request: BenchRequest, index: int) -> Sample:
            return await stream_target_alone(sdk, target, request, scenario, index=index, clock=clock)

        await _measure(run, baseline, speculative, step, clock, order)
    run.elapsed_s = clock() - started
    return run


async def _close(sdk: Any, target: Endpoint, draft_sdk: Any, draft: Endpoint | None) -> None:
    """Simulated endpoints share one http client per role: close only the SDK clients made here."""
    for own, endpoint in ((sdk, target), (draft_sdk, draft)):
        if own is not None and endpoint is not None and endpoint.client is None:
            await own.close()


def steps(scenario: Scenario) -> int:
    """How many times `run_scenario` calls `progress` (for a progress bar's total)."""
    if scenario.request_rate is not None:
        return scenario.warmup + 1 + 2
    waves = -(-len(scenario.requests) // max(1, scenario.concurrency))
    return scenario.warmup + 1 + 2 * waves
