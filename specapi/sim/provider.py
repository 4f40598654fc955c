"""The simulated OpenAI-format provider: one async ``handle`` for every request, and its records.

``SimProvider.handle(method, path, body, headers)`` serves ``POST /v1/completions``,
``POST /v1/chat/completions`` and ``GET /v1/models`` (``/v1`` optional) and returns a ``SimResponse``: a
status, headers, and a JSON body, raw bytes (a truncated body) or an ``SSEStream``. Adapters turn it into an
``httpx2`` transport (``transport.py``) or an ASGI app (``server.py``).

What a request gets depends on three injected pieces: the ``Capabilities`` (which parameters the server
flavour accepts and how it shapes answers), the ``LatencyProfile`` (how long it takes, what it costs) and
the ``Faults`` (what goes wrong). Time is injected too (``sleep``, ``clock``), so tests run instantly.

Every request is recorded in ``calls`` (a ``Call`` each: path, body, status, response or chunks, usage,
simulated timing), and ``usage`` holds per-model counters of requests and billed tokens, for comparison
with what a client reports. For streams, completion tokens are counted as chunks are delivered, so a client
that stops reading early is billed for what it received.

Randomness comes from ``seed``: jitter and fault draws from their own generators, sampling from the
request's ``seed`` when it gives one (the same request and seed give the same text) or else from the
provider's sampling generator.
"""

from __future__ import annotations

import asyncio
import difflib
import itertools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

import numpy as np

from .corpus import EOS_TOKEN_ID, decode_text, encode_text, is_known_token
from .faults import FaultInjector, FaultPlan, Faults, drop_logprobs, mismatch_logprobs, truncate
from .generation import Generation, TokenRecord, generate, score_prompt, text_offsets
from .latency import (
    LatencyProfile,
    ModelTiming,
    PrefixCache,
    RateLimiter,
    RequestTiming,
    Sleep,
    get_latency_profile,
    jittered,
    request_timing,
)
from .models import MODEL_SPECS, ModelSpec, NGramModel, get_model
from .profiles import Capabilities, get_capabilities
from .responses import chat_logprob_items, completion_logprobs, error_body, raw_prompt_logprobs, usage_body
from .template import message_text, render_chat

__all__ = [
    "Call",
    "CallList",
    "ModelUsage",
    "SSEStream",
    "SimProvider",
    "SimResponse",
]

CONTEXT_WINDOW = 8192
"""Prompt plus output tokens a simulated model accepts."""
DEFAULT_CHAT_MAX_TOKENS = 512
"""Chat output limit when the request sets none (the models rarely stop on their own)."""
MAX_N = 8


class ApiError(Exception):
    """A request the simulated server refuses; becomes an OpenAI-shaped error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, type=type, param=param, code=code)
        self.headers = dict(headers or {})


@dataclass
class Call:
    """One request as the provider saw it, and what it answered."""

    method: str
    path: str
    body: Any
    status: int = 0
    model: str | None = None
    stream: bool = False
    response: Any = None
    chunks: list[dict[str, Any]] = field(default_factory=list)
    usage: dict[str, Any] | None = None
    timing: RequestTiming | None = None
    faults: FaultPlan = field(default_factory=FaultPlan)
    started_at: float = 0.0


class CallList(list[Call]):
    """The recorded calls, oldest first, with a few views."""

    @property
    def last(self) -> Call:
        return self[-1]

    def to(self, path: str) -> list[Call]:
        """Calls whose path ends with ``path`` (``"/completions"`` matches ``/v1/completions``)."""
        return [c for c in self if c.path.rstrip("/").endswith(path.rstrip("/"))]

    def for_model(self, model: str) -> list[Call]:
        return [c for c in self if c.model == model]


@dataclass
class ModelUsage:
    """Per-model counters: successful requests, errors, and billed tokens."""

    requests: int = 0
    errors: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0


@dataclass
class SimResponse:
    """A status, headers and one of: a JSON body, raw bytes, or a stream of SSE bytes."""

    status: int
    headers: dict[str, str]
    json: Any = None
    content: bytes | None = None
    stream: SSEStream | None = None

    @property
    def body(self) -> bytes:
        """The non-streamed body as bytes."""
        if self.content is not None:
            return self.content
        return json.dumps(self.json).encode()


@dataclass
class _Event:
    delay_s: float
    data: bytes
    billed_tokens: int = 0


class SSEStream:
    """Server-sent events, each delivered after its simulated delay. Async-iterate it for bytes;
    ``aclose()`` ends it early (the provider then releases the request's concurrency slot)."""

    def __init__(self, events: list[_Event], *, sleep: Sleep, on_token: Callable[[int], None],
                 on_close: Callable[[], None]) -> None:
        self._events = iter(events)
        self._sleep = sleep
        self._on_token = on_token
        self._on_close = on_close
        self._closed = False

    def __aiter__(self) -> SSEStream:
        return self

    async def __anext__(self) -> bytes:
        event = next(self._events, None) if not self._closed else None
        if event is None:
            await self.aclose()
            raise StopAsyncIteration
        if event.delay_s > 0:
            await self._sleep(event.delay_s)
        if event.billed_tokens:
            self._on_token(event.billed_tokens)
        return event.data

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._on_close()


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


_DONE = b"data: [DONE]\n\n"


@dataclass
class _Sampling:
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: list[str]
    n: int
    stream: bool
    include_usage: bool


@dataclass
class _Job:
    """Everything computed for one successful generation request."""

    spec: ModelSpec
    prompt_ids: list[int]
    cached_tokens: int
    choices: list[Generation]
    prompt_records: list[TokenRecord] | None = None
    prediction: tuple[int, int] | None = None
    predicted_flags: list[bool] = field(default_factory=list)

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


class SimProvider:
    """A simulated OpenAI-format server (see the module docstring).

    ``models``: names in the registry (``MODEL_SPECS``) or specs; all built-in models by default.
    ``capabilities`` / ``latency``: a profile or its name. ``faults``: injected failures (none by default).
    ``sleep`` / ``clock``: injectable time. ``seed``: the provider's randomness.
    """

    def __init__(
        self,
        *,
        models: Sequence[str | ModelSpec] | None = None,
        capabilities: str | Capabilities = "vllm",
        latency: str | LatencyProfile = "instant",
        faults: Faults | None = None,
        sleep: Sleep = asyncio.sleep,
        clock: Callable[[], float] = time.time,
        seed: int = 0,
    ) -> None:
        self.capabilities = get_capabilities(capabilities)
        self.latency = get_latency_profile(latency)
        self.specs: dict[str, ModelSpec] = {}
        for model in models if models is not None else list(MODEL_SPECS):
            spec = MODEL_SPECS[model] if isinstance(model, str) else model
            self.specs[spec.name] = spec
        self.faults = FaultInjector(faults)
        self.sleep = sleep
        self.clock = clock
        self.calls = CallList()
        self.usage: dict[str, ModelUsage] = {name: ModelUsage() for name in self.specs}
        self._sampling_rng = np.random.default_rng([seed, 1])
        self._jitter_rng = np.random.default_rng([seed, 2])
        self._caches: dict[str, PrefixCache] = {}
        self._limiters: dict[str, RateLimiter] = {}
        self._ids = itertools.count(1)

    # -- public API -----------------------------------------------------------------------------------

    def model(self, name: str) -> NGramModel:
        """The built model behind ``name`` (built on first use)."""
        return get_model(self.specs[name])

    def cost(self, model: str | None = None) -> Decimal:
        """What the billed tokens cost at the latency profile's prices (one model, or all)."""
        names = [model] if model is not None else list(self.usage)
        total = Decimal(0)
        for name in names:
            u = self.usage[name]
            pricing = self.latency.timing_for(name, self.specs[name].tier).pricing
            total += pricing.cost(
                prompt_tokens=u.prompt_tokens, cached_tokens=u.cached_tokens, completion_tokens=u.completion_tokens
            )
        return total

    async def handle(
        self,
        method: str,
        path: str,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
    ) -> SimResponse:
        """Serve one request. ``body``: the parsed JSON (or raw ``bytes``/``str`` to be parsed)."""
        call = Call(method=method.upper(), path=path, body=body, started_at=self.clock())
        self.calls.append(call)
        try:
            if isinstance(body, (bytes, str)):
                call.body = body = _parse_json(body)
            response = await self._route(call, body)
        except ApiError as error:
            response = SimResponse(error.status, {"content-type": "application/json", **error.headers}, error.body)
            call.response = error.body
            if call.model in self.usage:
                self.usage[call.model].errors += 1
        call.status = response.status
        return response

    def transport(self) -> Any:
        """An ``httpx2`` transport serving this provider in-process (see ``transport.py``)."""
        from .transport import SimTransport

        return SimTransport(self)

    def asgi_app(self) -> Any:
        """A Starlette app serving this provider over HTTP (see ``server.py``)."""
        from .server import create_app

        return create_app(self)

    # -- routing --------------------------------------------------------------------------------------

    async def _route(self, call: Call, body: Any) -> SimResponse:
        path = "/" + call.path.split("?", 1)[0].strip("/")
        if path.startswith("/v1/") or path == "/v1":
            path = path[3:] or "/"
        if path == "/models" and call.method == "GET":
            return self._json(200, self._models_body())
        if path.startswith("/models/") and call.method == "GET":
            name = path[len("/models/") :]
            self._require_model(name)
            return self._json(200, self._model_entry(name))
        if path in ("/completions", "/chat/completions"):
            if call.method != "POST":
                raise ApiError(405, f"Method {call.method} not allowed", code="method_not_allowed")
            if not isinstance(body, dict):
                raise ApiError(400, "The request body must be a JSON object.")
            if path == "/completions":
                return await self._completions(call, body)
            return await self._chat(call, body)
        raise ApiError(404, f"Unknown path {call.path}", code="not_found")

    def _json(self, status: int, payload: Any, call: Call | None = None) -> SimResponse:
        if call is not None:
            call.response = payload
        return SimResponse(status, {"content-type": "application/json"}, payload)

    def _models_body(self) -> dict[str, Any]:
        return {"object": "list", "data": [self._model_entry(name) for name in self.specs]}

    def _model_entry(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "specapi-sim"}

    def _require_model(self, name: Any) -> ModelSpec:
        if not isinstance(name, str) or not name:
            raise ApiError(400, "you must provide a model parameter", param="model")
        if name not in self.specs:
            raise ApiError(
                404,
                f"The model `{name}` does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        return self.specs[name]

    # -- endpoints ------------------------------------------------------------------------------------

    async def _completions(self, call: Call, body: dict[str, Any]) -> SimResponse:
        caps = self.capabilities
        call.model = body.get("model") if isinstance(body.get("model"), str) else None
        spec = self._require_model(body.get("model"))
        echo = _bool(body, "echo", False)
        logprobs = _int(body, "logprobs", None, minimum=-1 if caps.logprobs_all else 0)
        if logprobs is not None and logprobs > caps.completions_max_logprobs:
            raise ApiError(
                400, f"logprobs must be at most {caps.completions_max_logprobs}, got {logprobs}.", param="logprobs"
            )
        if echo and not caps.completions_echo:
            raise ApiError(400, caps.echo_error, param="echo")
        if echo and logprobs is not None and not caps.echo_with_logprobs:
            raise ApiError(
                400,
                "Setting 'echo' and 'logprobs' at the same time is not supported for this model.",
                param="echo",
                code="invalid_parameter_combination",
            )
        prompt_logprobs = self._prompt_logprobs_param(body)
        sampling = self._sampling(body, default_max_tokens=16, allow_zero=echo)
        if prompt_logprobs is not None and sampling.stream:
            raise ApiError(400, "prompt_logprobs is not supported with stream=True", param="prompt_logprobs")
        prompt_ids, prompt_text = self._prompt(body.get("prompt"))
        scored_k = logprobs if echo and logprobs is not None else prompt_logprobs
        job = await self._run(
            call,
            spec,
            prompt_ids,
            sampling,
            top_k=logprobs,
            prompt_k=scored_k,
            with_rank=prompt_logprobs is not None,
        )
        if isinstance(job, SimResponse):
            return job
        created = int(self.clock())
        ident = f"cmpl-sim-{next(self._ids):08x}"
        base_offset = len(prompt_text) if caps.offsets_from_prompt_start else 0
        if sampling.stream:
            return self._stream_completions(call, job, sampling, ident, created, echo, logprobs, prompt_text)
        choices = []
        for index, gen in enumerate(job.choices):
            shown = _shown(gen)
            text = gen.text
            choice: dict[str, Any] = {"index": index, "text": None, "logprobs": None, "finish_reason": gen.finish_reason}
            if echo:
                text = prompt_text + text
            if logprobs is not None:
                if caps.completions_logprobs_chat_shape:
                    choice["logprobs"] = {"content": chat_logprob_items(shown)}
                elif echo:
                    records = list(job.prompt_records or []) + shown
                    offsets = text_offsets([r.token_id for r in records])
                    choice["logprobs"] = completion_logprobs(records, offsets, include_chosen=caps.logprobs_all)
                else:
                    offsets = [base_offset + o for o in text_offsets([r.token_id for r in shown])]
                    choice["logprobs"] = completion_logprobs(shown, offsets, include_chosen=caps.logprobs_all)
            choice["text"] = text
            if prompt_logprobs is not None:
                choice["prompt_logprobs"] = raw_prompt_logprobs(job.prompt_records or [])
            choices.append(choice)
        payload = {
            "id": ident,
            "object": "text_completion",
            "created": created,
            "model": spec.name,
            "choices": choices,
            "usage": job.usage(),
        }
        return await self._finish(call, job, payload)

    async def _chat(self, call: Call, body: dict[str, Any]) -> SimResponse:
        caps = self.capabilities
        call.model = body.get("model") if isinstance(body.get("model"), str) else None
        spec = self._require_model(body.get("model"))
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a non-empty list of message objects", param="messages")
        if body.get("tools"):
            raise ApiError(400, "tools are not supported by the simulator", param="tools")
        logprobs = _bool(body, "logprobs", False)
        if logprobs and not caps.chat_logprobs:
            raise ApiError(400, "logprobs are not supported by this server", param="logprobs")
        top_logprobs = _int(body, "top_logprobs", None, minimum=0, maximum=caps.chat_max_top_logprobs)
        if top_logprobs is not None and not logprobs:
            raise ApiError(400, "logprobs must be set to true if top_logprobs is used", param="top_logprobs")
        if logprobs and top_logprobs is None:
            top_logprobs = caps.chat_default_top_logprobs
        prompt_logprobs = self._prompt_logprobs_param(body)
        continue_final = _bool(body, "continue_final_message", False) if caps.continue_final_message else False
        add_generation = _bool(body, "add_generation_prompt", True) if caps.continue_final_message else True
        last_is_assistant = messages[-1].get("role") == "assistant"
        if continue_final:
            if add_generation:
                raise ApiError(
                    400,
                    "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                    param="continue_final_message",
                )
            if not last_is_assistant:
                raise ApiError(400, "continue_final_message needs a final assistant message", param="messages")
        prefill = caps.assistant_prefill and last_is_assistant
        prediction = self._prediction(body, logprobs)
        sampling = self._sampling(body, default_max_tokens=None, allow_zero=False)
        if prompt_logprobs is not None and sampling.stream:
            raise ApiError(400, "prompt_logprobs is not supported with stream=True", param="prompt_logprobs")
        if prediction is not None and sampling.n > 1:
            raise ApiError(400, "Predicted Outputs are not supported with n > 1", param="prediction")
        try:
            prompt_text = render_chat(
                messages,
                add_generation_prompt=add_generation and not prefill,
                continue_final_message=continue_final or prefill,
            )
        except ValueError as error:
            raise ApiError(400, str(error), param="messages") from None
        prefix = message_text(messages[-1]) if prefill else ""
        job = await self._run(
            call,
            spec,
            encode_text(prompt_text),
            sampling,
            top_k=top_logprobs if logprobs else None,
            prompt_k=prompt_logprobs,
            with_rank=True,
            prediction=prediction,
        )
        if isinstance(job, SimResponse):
            return job
        created = int(self.clock())
        ident = f"chatcmpl-sim-{next(self._ids):08x}"
        if sampling.stream:
            return self._stream_chat(call, job, sampling, ident, created, logprobs, prefix)
        choices = []
        for index, gen in enumerate(job.choices):
            choices.append(
                {
                    "index": index,
                    "message": {"role": "assistant", "content": prefix + gen.text},
                    "logprobs": {"content": chat_logprob_items(_shown(gen))} if logprobs else None,
                    "finish_reason": gen.finish_reason,
                }
            )
        payload: dict[str, Any] = {
            "id": ident,
            "object": "chat.completion",
            "created": created,
            "model": spec.name,
            "choices": choices,
            "usage": job.usage(),
        }
        if prompt_logprobs is not None:
            payload["prompt_logprobs"] = raw_prompt_logprobs(job.prompt_records or [])
        return await self._finish(call, job, payload)

    # -- parameters -----------------------------------------------------------------------------------

    def _prompt_logprobs_param(self, body: dict[str, Any]) -> int | None:
        if "prompt_logprobs" not in body or body["prompt_logprobs"] is None:
            return None
        if not self.capabilities.prompt_logprobs_param:
            raise ApiError(400, "prompt_logprobs is not supported by this server", param="prompt_logprobs")
        value = _int(body, "prompt_logprobs", None, minimum=-1 if self.capabilities.logprobs_all else 0)
        if value is not None and value > self.capabilities.completions_max_logprobs:
            raise ApiError(400, "prompt_logprobs is above the server's maximum", param="prompt_logprobs")
        return value

    def _prediction(self, body: dict[str, Any], logprobs: bool) -> list[int] | None:
        prediction = body.get("prediction")
        if prediction is None or not self.capabilities.predicted_outputs:
            return None  # servers without Predicted Outputs ignore the field
        if not isinstance(prediction, dict) or prediction.get("type") != "content":
            raise ApiError(400, "prediction must be {type: 'content', content: ...}", param="prediction")
        if logprobs:
            raise ApiError(
                400, "Predicted Outputs are not supported with logprobs", param="prediction",
                code="invalid_parameter_combination",
            )
        if body.get("max_completion_tokens") is not None:
            raise ApiError(
                400, "Predicted Outputs are not supported with max_completion_tokens", param="prediction",
                code="invalid_parameter_combination",
            )
        try:
            return encode_text(message_text(prediction))
        except ValueError as error:
            raise ApiError(400, str(error), param="prediction") from None

    def _sampling(self, body: dict[str, Any], *, default_max_tokens: int | None, allow_zero: bool) -> _Sampling:
        max_tokens = _int(body, "max_tokens", None, minimum=0)
        if max_tokens is None:
            max_tokens = _int(body, "max_completion_tokens", None, minimum=0)
        if max_tokens is None:
            max_tokens = default_max_tokens
        if max_tokens == 0 and not allow_zero:
            raise ApiError(400, "max_tokens must be at least 1, got 0.", param="max_tokens")
        temperature = _number(body, "temperature", 1.0, minimum=0.0, maximum=2.0)
        top_p = _number(body, "top_p", 1.0, minimum=0.0, maximum=1.0)
        if top_p <= 0.0:
            raise ApiError(400, "top_p must be in (0, 1], got 0.", param="top_p")
        stop = body.get("stop")
        if stop is None:
            stops: list[str] = []
        elif isinstance(stop, str):
            stops = [stop]
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            stops = list(stop)
        else:
            raise ApiError(400, "stop must be a string or a list of strings", param="stop")
        n = _int(body, "n", 1, minimum=1, maximum=MAX_N)
        stream = _bool(body, "stream", False)
        options = body.get("stream_options")
        if options is not None and not isinstance(options, dict):
            raise ApiError(400, "stream_options must be an object", param="stream_options")
        if options and not stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")
        include_usage = bool(options and options.get("include_usage"))
        seed = _int(body, "seed", None)
        return _Sampling(
            max_tokens=max_tokens if max_tokens is not None else -1,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stops,
            n=n or 1,
            stream=stream,
            include_usage=include_usage,
        )

    def _prompt(self, prompt: Any) -> tuple[list[int], str]:
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]  # a batch of one
        if isinstance(prompt, str):
            return encode_text(prompt), prompt
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if not all(is_known_token(t) for t in prompt):
                raise ApiError(400, "prompt holds a token id outside the tokenizer", param="prompt")
            return list(prompt), decode_text(prompt)
        if isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
            raise ApiError(400, "batched prompts are not supported by the simulator", param="prompt")
        raise ApiError(400, "prompt must be a string or a non-empty list of token ids", param="prompt")

    # -- the shared core ------------------------------------------------------------------------------

    async def _run(
        self,
        call: Call,
        spec: ModelSpec,
        prompt_ids: list[int],
        sampling: _Sampling,
        *,
        top_k: int | None,
        prompt_k: int | None,
        with_rank: bool,
        prediction: list[int] | None = None,
    ) -> _Job | SimResponse:
        """Fault plan, limits, cache, generation and timing of one request."""
        timing_profile = self.latency.timing_for(spec.name, spec.tier)
        max_tokens = sampling.max_tokens
        if max_tokens < 0:
            max_tokens = max(1, min(DEFAULT_CHAT_MAX_TOKENS, CONTEXT_WINDOW - len(prompt_ids)))
        if len(prompt_ids) + max_tokens > CONTEXT_WINDOW:
            raise ApiError(
                400,
                f"This model's maximum context length is {CONTEXT_WINDOW} tokens. However, you requested "
                f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the messages, {max_tokens} in "
                "the completion). Please reduce the length of the messages or completion.",
                param="messages",
                code="context_length_exceeded",
            )
        plan = self.faults.plan(model=spec.name, path=call.path)
        call.faults = plan
        if plan.status is not None:
            raise _fault_error(plan)
        limiter = self._limiter(spec.name, timing_profile)
        wait = limiter.try_acquire()
        if wait is not None:
            raise ApiError(
                429,
                f"Rate limit reached for {spec.name}. Please try again in {wait:.3f}s.",
                type="requests",
                code="rate_limit_exceeded",
                headers=_retry_after(wait),
            )
        call.stream = sampling.stream
        try:
            model = get_model(spec)
            skip_cache = prompt_k is not None and self.capabilities.prompt_logprobs_skip_cache
            cache = self._cache(spec.name, timing_profile)
            cached = 0 if skip_cache else cache.lookup(prompt_ids)
            rng = self._rng_for(sampling.seed)
            choices = [
                generate(
                    model,
                    prompt_ids,
                    max_tokens=max_tokens,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    rng=rng,
                    stop=sampling.stop,
                    top_k=top_k,
                )
                for _ in range(sampling.n)
            ]
            job = _Job(spec=spec, prompt_ids=prompt_ids, cached_tokens=cached, choices=choices)
            if prompt_k is not None:
                job.prompt_records = score_prompt(model, prompt_ids, top_k=prompt_k, with_rank=with_rank)
            if prediction is not None:
                job.prediction, job.predicted_flags = _match_prediction(prediction, choices[0].token_ids)
            cache.insert(prompt_ids + choices[0].token_ids)
            longest = max(len(c.tokens) for c in choices)
            timing = request_timing(
                timing_profile,
                prompt_tokens=len(prompt_ids),
                cached_tokens=cached,
                completion_tokens=longest,
                predicted=job.predicted_flags,
            )
            timing = jittered(timing, timing_profile.jitter, self._jitter_rng)
            if plan.extra_latency_s:
                timing = RequestTiming(timing.first_token_s + plan.extra_latency_s, timing.gaps_s)
            call.timing = timing
            call.usage = job.usage()
            counters = self.usage[spec.name]
            counters.requests += 1
            counters.prompt_tokens += len(prompt_ids)
            counters.cached_tokens += cached
            if not sampling.stream:
                counters.completion_tokens += job.completion_tokens
        except BaseException:
            limiter.release()
            raise
        return job

    async def _finish(self, call: Call, job: _Job, payload: dict[str, Any]) -> SimResponse:
        """Apply body faults, wait the simulated time, release the slot, answer."""
        plan = call.faults
        if plan.drop_logprobs:
            payload = drop_logprobs(payload)
        if plan.mismatch_logprobs:
            payload = mismatch_logprobs(payload)
        try:
            if call.timing is not None and call.timing.total_s > 0:
                await self.sleep(call.timing.total_s)
        finally:
            self._limiters[job.spec.name].release()
        call.response = payload
        if plan.truncate:
            return SimResponse(200, {"content-type": "application/json"}, content=truncate(json.dumps(payload).encode()))
        return SimResponse(200, {"content-type": "application/json"}, payload)

    def _stream(self, call: Call, job: _Job, chunks: list[tuple[int, dict[str, Any], int]],
                include_usage: bool) -> SimResponse:
        """Turn ``(token step, chunk, billed tokens)`` triples into a timed SSE stream."""
        plan = call.faults
        timing = call.timing or RequestTiming(0.0)
        arrivals = [timing.first_token_s]
        for gap in timing.gaps_s:
            arrivals.append(arrivals[-1] + gap)
        events: list[_Event] = []
        clock = 0.0
        for step, chunk, billed in chunks:
            if plan.drop_logprobs:
                chunk = drop_logprobs(chunk)
            if plan.mismatch_logprobs:
                chunk = mismatch_logprobs(chunk)
            if include_usage:
                chunk = {**chunk, "usage": None}
            at = arrivals[min(step, len(arrivals) - 1)] if step >= 0 else 0.0
            events.append(_Event(max(0.0, at - clock), _sse(chunk), billed))
            clock = max(clock, at)
            call.chunks.append(chunk)
        rejected = job.prediction[1] if job.prediction else 0
        if include_usage:
            usage_chunk = {**chunks[-1][1], "choices": [], "usage": job.usage()}
            events.append(_Event(0.0, _sse(usage_chunk), rejected))
            call.chunks.append(usage_chunk)
        elif rejected:
            events[-1].billed_tokens += rejected
        events.append(_Event(0.0, _DONE))
        if plan.truncate:
            keep = max(1, len(events) // 2)
            events = events[:keep]
            events[-1] = _Event(events[-1].delay_s, truncate(events[-1].data), events[-1].billed_tokens)
        counters = self.usage[job.spec.name]
        limiter = self._limiters[job.spec.name]

        def on_token(count: int) -> None:
            counters.completion_tokens += count

        stream = SSEStream(events, sleep=self.sleep, on_token=on_token, on_close=limiter.release)
        headers = {"content-type": "text/event-stream", "cache-control": "no-cache"}
        return SimResponse(200, headers, stream=stream)

    def _stream_completions(self, call: Call, job: _Job, sampling: _Sampling, ident: str, created: int,
                            echo: bool, logprobs: int | None, prompt_text: str) -> SimResponse:
        caps = self.capabilities

        def chunk(index: int, text: str, lp: Any, finish: str | None) -> dict[str, Any]:
            return {
                "id": ident,
                "object": "text_completion",
                "created": created,
                "model": job.spec.name,
                "choices": [{"index": index, "text": text, "logprobs": lp, "finish_reason": finish}],
            }

        chunks: list[tuple[int, dict[str, Any], int]] = []
        base = len(prompt_text) if (caps.offsets_from_prompt_start or echo) else 0
        for index, gen in enumerate(job.choices):
            if echo:
                lp = None
                if logprobs is not None and job.prompt_records is not None:
                    records = job.prompt_records
                    lp = completion_logprobs(records, text_offsets([r.token_id for r in records]),
                                             include_chosen=caps.logprobs_all)
                chunks.append((0, chunk(index, prompt_text, lp, None), 0))
        per_choice = [_token_pieces(gen) for gen in job.choices]
        steps = max(len(p) for p in per_choice)
        for step in range(steps):
            for index, pieces in enumerate(per_choice):
                if step >= len(pieces):
                    continue
                record, text, offset, billed = pieces[step]
                gen = job.choices[index]
                last = step == len(pieces) - 1
                lp = None
                if logprobs is not None:
                    if record is None:
                        lp = {"content": []} if caps.completions_logprobs_chat_shape else _empty_completion_logprobs()
                    elif caps.completions_logprobs_chat_shape:
                        lp = {"content": chat_logprob_items([record])}
                    else:
                        lp = completion_logprobs([record], [base + offset], include_chosen=caps.logprobs_all)
                chunks.append((step, chunk(index, text, lp, gen.finish_reason if last else None), billed))
        return self._stream(call, job, chunks, sampling.include_usage)

    def _stream_chat(self, call: Call, job: _Job, sampling: _Sampling, ident: str, created: int,
                     logprobs: bool, prefix: str) -> SimResponse:
        def chunk(index: int, delta: dict[str, Any], lp: Any, finish: str | None) -> dict[str, Any]:
            return {
                "id": ident,
                "object": "chat.completion.chunk",
                "created": created,
                "model": job.spec.name,
                "choices": [{"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}],
            }

        chunks: list[tuple[int, dict[str, Any], int]] = []
        for index in range(len(job.choices)):
            chunks.append((0, chunk(index, {"role": "assistant", "content": ""}, None, None), 0))
            if prefix:
                chunks.append((0, chunk(index, {"content": prefix}, None, None), 0))
        per_choice = [_token_pieces(gen) for gen in job.choices]
        steps = max(len(p) for p in per_choice)
        for step in range(steps):
            for index, pieces in enumerate(per_choice):
                if step >= len(pieces):
                    continue
                record, text, _, billed = pieces[step]
                lp = None
                if logprobs:
                    lp = {"content": chat_logprob_items([record]) if record is not None else []}
                chunks.append((step, chunk(index, {"content": text}, lp, None), billed))
        for index, gen in enumerate(job.choices):
            chunks.append((max(steps - 1, 0), chunk(index, {}, None, gen.finish_reason), 0))
        return self._stream(call, job, chunks, sampling.include_usage)

    # -- state ----------------------------------------------------------------------------------------

    def _limiter(self, name: str, timing: ModelTiming) -> RateLimiter:
        if name not in self._limiters:
            self._limiters[name] = RateLimiter(
                requests_per_s=timing.requests_per_s, max_concurrency=timing.max_concurrency, clock=self.clock
            )
        return self._limiters[name]

    def _cache(self, name: str, timing: ModelTiming) -> PrefixCache:
        if name not in self._caches:
            self._caches[name] = PrefixCache(
                block_tokens=timing.cache_block_tokens, min_tokens=timing.cache_min_tokens
            )
        return self._caches[name]

    def _rng_for(self, seed: int | None) -> np.random.Generator:
        if seed is not None:
            return np.random.default_rng(seed & ((1 << 64) - 1))
        return np.random.default_rng(int(self._sampling_rng.integers(1 << 62)))


# -- helpers ------------------------------------------------------------------------------------------


def _parse_json(raw: bytes | str) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        raise ApiError(400, "We could not parse the JSON body of your request.") from None


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ApiError(400, f"{name} must be a boolean", param=name)
    return value


def _int(body: dict[str, Any], name: str, default: int | None, *, minimum: int | None = None,
         maximum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"{name} must be an integer", param=name)
    if minimum is not None and value < minimum:
        raise ApiError(400, f"{name} must be at least {minimum}, got {value}.", param=name)
    if maximum is not None and value > maximum:
        raise ApiError(400, f"{name} must be at most {maximum}, got {value}.", param=name)
    return value


def _number(body: dict[str, Any], name: str, default: float, *, minimum: float, maximum: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ApiError(400, f"{name} must be a number", param=name)
    if not minimum <= value <= maximum:
        raise ApiError(400, f"{name} must be between {minimum} and {maximum}, got {value}.", param=name)
    return float(value)


def _shown(gen: Generation) -> list[TokenRecord]:
    """Generated tokens as listed in logprobs: end-of-text is billed but not shown."""
    return [r for r in gen.tokens if r.token_id != EOS_TOKEN_ID]


def _token_pieces(gen: Generation) -> list[tuple[TokenRecord | None, str, int, int]]:
    """Per generated token: its record (``None`` for end-of-text), its share of the final text, its offset
    and how many tokens it bills. A generation without tokens gives one empty piece billing nothing."""
    offsets = text_offsets(gen.token_ids)
    limit = len(gen.text)
    ends = offsets[1:] + [limit]
    pieces: list[tuple[TokenRecord | None, str, int, int]] = []
    for record, start, end in zip(gen.tokens, offsets, ends):
        shown = None if record.token_id == EOS_TOKEN_ID else record
        pieces.append((shown, gen.text[min(start, limit) : min(max(end, start), limit)], start, 1))
    if not pieces:
        pieces.append((None, gen.text, 0, 0))
    return pieces


def _empty_completion_logprobs() -> dict[str, Any]:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


def _match_prediction(prediction: list[int], output: list[int]) -> tuple[tuple[int, int], list[bool]]:
    """Accepted / rejected prediction tokens, and which output tokens came from the prediction."""
    matcher = difflib.SequenceMatcher(None, prediction, output, autojunk=False)
    flags = [False] * len(output)
    accepted = 0
    for block in matcher.get_matching_blocks():
        accepted += block.size
        for j in range(block.b, block.b + block.size):
            flags[j] = True
    return (accepted, len(prediction) - accepted), flags


def _retry_after(seconds: float) -> dict[str, str]:
    return {"retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(int(seconds * 1000))}


def _fault_error(plan: FaultPlan) -> ApiError:
    status = plan.status or 500
    if status == 429:
        return ApiError(
            429,
            "Rate limit reached (injected fault).",
            type="requests",
            code="rate_limit_exceeded",
            headers=_retry_after(plan.retry_after_s or 1.0),
        )
    if status == 503:
        return ApiError(503, "The server is overloaded (injected fault).", type="server_error", code="overloaded")
    return ApiError(status, "The server had an error (injected fault).", type="server_error", code="server_error")
