"""How long a simulated request takes, what it costs, and the state behind it (prefix cache, rate limit).

The timing of one request is a pure function of its shape (``request_timing``): a network round trip,
then time to first token ``ttft_base_s + uncached prompt tokens / prefill_tokens_per_s``, then ``tpot_s``
per further output token (tokens accepted from a Predicted Output are processed at prefill speed instead).
Jitter multiplies every part by ``1 + jitter * u`` with ``u`` uniform in [-1, 1] from a seeded generator.

A ``LatencyProfile`` names the timing and prices of the two tiers of models (target and draft); the
built-in ones are in ``LATENCY_PROFILES`` (``"lan"``, ``"hosted"``, ``"vllm-cpu"``: a tiny model on a real
vLLM on 2 CPU cores, ``"instant"``). Prices are ``Decimal``
USD per million tokens.

``PrefixCache`` remembers which token prefixes a provider has already processed, in blocks as servers do
(vLLM: 16 tokens; OpenAI: 128-token steps from 1,024 tokens). ``RateLimiter`` enforces requests per second
and concurrency per model on an injectable clock. ``RecordingSleep`` is a sleep for tests: it returns at
once and records what it was asked to wait (optionally advancing a ``ManualClock``).
"""

from __future__ import annotations

import asyncio
import math
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal

import numpy as np

__all__ = [
    "LATENCY_PROFILES",
    "LatencyProfile",
    "ManualClock",
    "ModelTiming",
    "Pricing",
    "PrefixCache",
    "RateLimiter",
    "RecordingSleep",
    "RequestTiming",
    "Sleep",
    "batch_timing",
    "get_latency_profile",
    "jittered",
    "request_timing",
]

Sleep = Callable[[float], Awaitable[None]]
"""An async sleep: ``await sleep(seconds)``; ``asyncio.sleep`` by default."""


@dataclass(frozen=True, kw_only=True)
class Pricing:
    """USD per million tokens. ``cached_input``: price of prompt tokens served from the prefix cache."""

    input: Decimal = Decimal(0)
    output: Decimal = Decimal(0)
    cached_input: Decimal = Decimal(0)

    def cost(self, *, prompt_tokens: int, cached_tokens: int, completion_tokens: int) -> Decimal:
        """Price of one request (``prompt_tokens`` includes the cached ones, as APIs report it)."""
        per_token = Decimal(1_000_000)
        return (
            (prompt_tokens - cached_tokens) * self.input
            + cached_tokens * self.cached_input
            + completion_tokens * self.output
        ) / per_token


@dataclass(frozen=True, kw_only=True)
class ModelTiming:
    """Timing, caching, rate limits and prices of one model tier.

    ``rtt_s``: network round trip added to every request. ``ttft_base_s``: fixed time to first token.
    ``prefill_tokens_per_s``: speed on uncached prompt tokens (``math.inf`` = free). ``tpot_s``: time per
    output token after the first. ``jitter``: relative spread of every part. ``cache_block_tokens`` /
    ``cache_min_tokens``: the prefix cache's granularity and threshold (``cache_block_tokens = 0`` turns it
    off). ``requests_per_s`` / ``max_concurrency``: limits beyond which requests get 429 (``None`` = none).
    """

    rtt_s: float = 0.0
    ttft_base_s: float = 0.0
    prefill_tokens_per_s: float = math.inf
    tpot_s: float = 0.0
    jitter: float = 0.0
    cache_block_tokens: int = 16
    cache_min_tokens: int = 0
    requests_per_s: float | None = None
    max_concurrency: int | None = None
    pricing: Pricing = field(default_factory=Pricing)
    #: A request that scores its prompt (prompt logprobs, echo with logprobs): this much more, plus
    #: ``prompt_logprob_token_s`` per scored token (vLLM computes and detokenizes the top list of each).
    prompt_logprobs_s: float = 0.0
    prompt_logprob_token_s: float = 0.0
    #: Each decoding step costs this much more per sequence beyond the first (``n`` choices, several prompts).
    tpot_per_sequence_s: float = 0.0
    #: A request holding several prompts costs this much more per prompt beyond the first.
    batch_prompt_s: float = 0.0


@dataclass(frozen=True)
class RequestTiming:
    """When the tokens of one request arrive: ``first_token_s`` after sending, then ``gaps_s`` apart."""

    first_token_s: float
    gaps_s: tuple[float, ...] = ()

    @property
    def total_s(self) -> float:
        return self.first_token_s + sum(self.gaps_s)

    def less(self, seconds: float) -> RequestTiming:
        """The same arrivals `seconds` sooner, none before the request's start: taken from the time to first
        token, then from the gaps in order (time already spent computing the answer, which a real server
        spends while it decodes)."""
        first = self.first_token_s - seconds
        gaps = list(self.gaps_s)
        for index, gap in enumerate(gaps):
            if first >= 0.0:
                break
            gaps[index] = max(0.0, gap + first)
            first = min(0.0, gap + first)
        return RequestTiming(max(0.0, first), tuple(gaps))


def request_timing(
    timing: ModelTiming,
    *,
    prompt_tokens: int,
    cached_tokens: int = 0,
    completion_tokens: int = 0,
    predicted: Sequence[bool] = (),
) -> RequestTiming:
    """Timing of one request, without jitter.

    The first output token (or, with ``completion_tokens = 0``, the response) arrives after the round
    trip, the fixed time to first token and the prefill of the uncached prompt. Each later token takes
    ``tpot_s``, except tokens flagged in ``predicted`` (accepted Predicted-Output tokens, by position among
    the output tokens), which cost a prefill token each.
    """
    uncached = max(0, prompt_tokens - cached_tokens)
    first = timing.rtt_s + timing.ttft_base_s + _prefill_s(timing, uncached)
    gaps = []
    for index in range(1, completion_tokens):
        is_predicted = index < len(predicted) and predicted[index]
        gaps.append(_prefill_s(timing, 1) if is_predicted else timing.tpot_s)
    return RequestTiming(first, tuple(gaps))


def batch_timing(
    timing: ModelTiming,
    *,
    prompt_tokens: Sequence[int],
    cached_tokens: Sequence[int],
    completion_tokens: int = 0,
    predicted: Sequence[bool] = (),
    scored_tokens: int = 0,
    sequences: int = 1,
) -> RequestTiming:
    """Timing of one request holding several prompts (vLLM's and SGLang's prompt lists, llama-server's
    multi-prompt ``/completion``), without jitter.

    The prompts run as one forward batch: one round trip and one fixed time to first token, the prefill
    of every prompt's uncached tokens (prefill is compute-bound, so tokens add up whatever prompt they
    belong to), then as many decoding steps as the longest generation needs, each ``tpot_s`` (a decoding
    step is memory-bound: a few sequences more cost about the same as one). With one prompt this is
    ``request_timing``. ``scored_tokens``: prompt tokens scored (prompt logprobs), which cost
    ``prompt_logprobs_s`` and ``prompt_logprob_token_s`` each; ``sequences``: sequences decoding together
    (every prompt's ``n`` choices), each beyond the first adding ``tpot_per_sequence_s`` to every step.
    """
    uncached = sum(max(0, p - c) for p, c in zip(prompt_tokens, cached_tokens, strict=True))
    plain = request_timing(
        timing, prompt_tokens=uncached, cached_tokens=0, completion_tokens=completion_tokens, predicted=predicted
    )
    extra = (timing.prompt_logprobs_s + scored_tokens * timing.prompt_logprob_token_s) if scored_tokens else 0.0
    extra += max(0, len(prompt_tokens) - 1) * timing.batch_prompt_s
    per_step = max(0, sequences - 1) * timing.tpot_per_sequence_s
    return RequestTiming(plain.first_token_s + extra, tuple(gap + per_step for gap in plain.gaps_s))


def _prefill_s(timing: ModelTiming, tokens: int) -> float:
    if tokens <= 0 or math.isinf(timing.prefill_tokens_per_s):
        return 0.0
    return tokens / timing.prefill_tokens_per_s


def jittered(request: RequestTiming, jitter: float, rng: np.random.Generator) -> RequestTiming:
    """``request`` with each part scaled by ``1 + jitter * u``, ``u`` uniform in [-1, 1]."""
    if jitter <= 0.0:
        return request
    factors = 1.0 + jitter * rng.uniform(-1.0, 1.0, size=1 + len(request.gaps_s))
    return RequestTiming(
        request.first_token_s * float(factors[0]),
        tuple(g * float(f) for g, f in zip(request.gaps_s, factors[1:].tolist())),
    )


@dataclass(frozen=True, kw_only=True)
class LatencyProfile:
    """Timings of the target tier and the draft tier, with optional per-model overrides."""

    name: str
    target: ModelTiming
    draft: ModelTiming
    overrides: Mapping[str, ModelTiming] = field(default_factory=dict)

    def timing_for(self, model: str, tier: str) -> ModelTiming:
        """The timing of ``model`` (an override if one is named, else its tier's)."""
        if model in self.overrides:
            return self.overrides[model]
        return self.target if tier == "target" else self.draft

    def with_overrides(self, **timings: ModelTiming) -> LatencyProfile:
        """A copy with per-model timings added (keyword = model name)."""
        return replace(self, overrides={**self.overrides, **timings})


_GPT_4O = Pricing(input=Decimal("2.50"), output=Decimal("10.00"), cached_input=Decimal("1.25"))
_GPT_4O_MINI = Pricing(input=Decimal("0.15"), output=Decimal("0.60"), cached_input=Decimal("0.075"))

#: The tests' tiny target on a real vLLM (vllm-cpu 0.32.0, 2 cores, served as tests/real/vllm_setup.py
#: serves it), as `benchmarks/vllm_costs.py` measured it: a 1-token request 7.0 ms, a decode step 2.95 ms,
#: prefill 0.11 ms a token, prompt logprobs 0.062 ms a scored token, a 128-token KV block, 0.56 ms more per
#: step per further sequence. tests/test_sim_calibration.py checks the ratios it gives against the measured ones.
_VLLM_CPU = ModelTiming(
    rtt_s=0.0002, ttft_base_s=0.0067, prefill_tokens_per_s=9_100.0, tpot_s=0.00295, jitter=0.0, cache_block_tokens=128,
    prompt_logprob_token_s=0.000062, tpot_per_sequence_s=0.00056, batch_prompt_s=0.0005,
)

LATENCY_PROFILES: Mapping[str, LatencyProfile] = {
    profile.name: profile
    for profile in (
        LatencyProfile(
            name="lan",
            target=ModelTiming(
                rtt_s=0.001, ttft_base_s=0.030, prefill_tokens_per_s=20_000.0, tpot_s=0.025, jitter=0.05
            ),
            draft=ModelTiming(
                rtt_s=0.001, ttft_base_s=0.004, prefill_tokens_per_s=100_000.0, tpot_s=0.004, jitter=0.05
            ),
        ),
        LatencyProfile(
            name="hosted",
            target=ModelTiming(
                rtt_s=0.050,
                ttft_base_s=0.350,
                prefill_tokens_per_s=10_000.0,
                tpot_s=0.012,
                jitter=0.2,
                cache_block_tokens=128,
                cache_min_tokens=1024,
                pricing=_GPT_4O,
            ),
            draft=ModelTiming(
                rtt_s=0.050,
                ttft_base_s=0.250,
                prefill_tokens_per_s=20_000.0,
                tpot_s=0.008,
                jitter=0.2,
                cache_block_tokens=128,
                cache_min_tokens=1024,
                pricing=_GPT_4O_MINI,
            ),
        ),
        LatencyProfile(name="vllm-cpu", target=_VLLM_CPU, draft=_VLLM_CPU),
        LatencyProfile(name="instant", target=ModelTiming(), draft=ModelTiming()),
    )
}


def get_latency_profile(profile: str | LatencyProfile) -> LatencyProfile:
    """A profile by name (or the profile itself)."""
    if isinstance(profile, LatencyProfile):
        return profile
    try:
        return LATENCY_PROFILES[profile]
    except KeyError:
        raise KeyError(f"unknown latency profile {profile!r}; known: {', '.join(LATENCY_PROFILES)}") from None


class PrefixCache:
    """Which token prefixes have been processed, block by block, like a server's KV prefix cache.

    Each full block is keyed by a hash chained over every token before it, so a block hits only when the
    whole prefix up to it was seen. At most ``capacity`` blocks are kept (least recently used go first).
    """

    def __init__(self, *, block_tokens: int, min_tokens: int = 0, capacity: int = 100_000) -> None:
        self.block_tokens = block_tokens
        self.min_tokens = min_tokens
        self.capacity = capacity
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def _keys(self, token_ids: Sequence[int]) -> list[int]:
        keys = []
        key = 0
        block = self.block_tokens
        for start in range(0, len(token_ids) - block + 1, block):
            key = hash((key, tuple(token_ids[start : start + block])))
            keys.append(key)
        return keys

    def lookup(self, token_ids: Sequence[int]) -> int:
        """How many leading tokens of a prompt are cached (whole blocks; never the last token)."""
        if self.block_tokens <= 0 or len(token_ids) < max(self.min_tokens, 1):
            return 0
        hits = 0
        for key in self._keys(token_ids[: len(token_ids) - 1]):
            if key not in self._blocks:
                break
            self._blocks.move_to_end(key)
            hits += 1
        return hits * self.block_tokens

    def insert(self, token_ids: Sequence[int]) -> None:
        """Remember every full block of ``token_ids`` (prompt and generated tokens alike)."""
        if self.block_tokens <= 0:
            return
        for key in self._keys(token_ids):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self.capacity:
            self._blocks.popitem(last=False)


class RateLimiter:
    """Requests per second (sliding one-second window) and concurrency, on an injectable clock."""

    def __init__(self, *, requests_per_s: float | None, max_concurrency: int | None, clock: Callable[[], float]):
        self.requests_per_s = requests_per_s
        self.max_concurrency = max_concurrency
        self.clock = clock
        self.in_flight = 0
        self._starts: deque[float] = deque()

    def try_acquire(self) -> float | None:
        """Take a slot; ``None`` on success, else the seconds to wait before retrying."""
        now = self.clock()
        if self.max_concurrency is not None and self.in_flight >= self.max_concurrency:
            return 1.0
        if self.requests_per_s is not None:
            window = 1.0
            while self._starts and self._starts[0] <= now - window:
                self._starts.popleft()
            if len(self._starts) >= self.requests_per_s:
                return max(0.001, self._starts[0] + window - now)
            self._starts.append(now)
        self.in_flight += 1
        return None

    def release(self) -> None:
        """Give a concurrency slot back."""
        self.in_flight = max(0, self.in_flight - 1)


class ManualClock:
    """A clock that moves only when told: ``clock()`` reads it, ``advance(s)`` moves it."""

    def __init__(self, start: float = 0.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class RecordingSleep:
    """An async sleep that returns at once and records each requested duration.

    With a ``clock``, each sleep advances it (sequentially: concurrent sleeps add up).
    """

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.calls: list[float] = []
        self.clock = clock

    async def __call__(self, seconds: float) -> None:
        self.calls.append(seconds)
        if self.clock is not None:
            self.clock.advance(seconds)
        await asyncio.sleep(0)

    @property
    def total(self) -> float:
        return sum(self.calls)
