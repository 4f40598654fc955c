"""`AsyncSpeculativeOpenAI` and `SpeculativeOpenAI`: drop-in clients with the openai SDK's call shapes.

    client = AsyncSpeculativeOpenAI(target=Endpoint(...), draft=Endpoint(...))
    resp = await client.completions.create(prompt="...", max_tokens=64, temperature=0)
    chat = await client.chat.completions.create(messages=[...], max_tokens=64)

Arguments are checked before any request is sent. Requests that speculation cannot serve exactly
(tools, n > 1, logit_bias, penalties, ...) go to the target unchanged and say so in `resp.speculative`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from dataclasses import replace
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from typing import Any, Dict, List, Literal, Optional, TypeVar, Union, overload

import httpx2
import openai
from openai._models import construct_type
from openai._types import Body, Headers, NotGiven, Omit, Query, SequenceNotStr, not_given, omit
from openai.types import ChatModel, Completion, Metadata, ReasoningEffort
from openai.lib._parsing import ResponseFormatT
from openai.lib.streaming.chat import AsyncChatCompletionStreamManager
from openai.types.chat import (
    ChatCompletionAudioParam,
    ChatCompletionChunk,
    ChatCompletionMessageParam,
    ChatCompletionPredictionContentParam,
    ChatCompletionStreamOptionsParam,
    ChatCompletionToolChoiceOptionParam,
    ChatCompletionToolUnionParam,
    completion_create_params,
)

from ._calls import Clock, Meter, RoleClient, Sleep
from ._exceptions import ConfigurationError, InvalidRequestError
from .raw import AsyncRawCreate, AsyncStreamingCreate
from .models import AsyncModels
from .acceptance import SamplingParams
from .context import Context
from .drafters import CombinedDrafter, Drafter, LookupDrafter, ModelDrafter, PredictionDrafter
from .endpoint import Endpoint
from .lossy import AcceptanceRule
from .engine import Engine, Finished, GenerationRequest, Piece
from .load import current_request, new_request_id
from .policy import AdaptiveDraftLength, DraftLengthPolicy, FixedDraftLength
from .stats import RoleUsage, SpeculativeStats
from .streaming import SpeculativeStream, chat_chunks, completion_chunks, parse_chat_chunk, parse_completion, response_id
from .structured import parse_params, parsed_completion, stream_params
from .types import SpeculativeChatCompletion, SpeculativeCompletion, SpeculativeParsedChatCompletion
from .paths import PathResolver
from .pricing import call_cost
from .suffix import SuffixDrafter, SuffixIndex, gate_free_drafts, indexes, learn, load_tokenizer, with_index, without_suffix

__all__ = ["AsyncSpeculativeOpenAI", "AsyncCompletions", "AsyncChatCompletions", "given_arguments"]

T = TypeVar("T")

#: Arguments the engine reproduces exactly.
#: Other models (`model=` on a call) that keep their own path memory and suffix index; least recently used leave.
MAX_OTHER_MODELS = 32
_TRANSPORT_ARGS = {"extra_headers", "extra_query", "timeout"}
_COMPLETION_ARGS = {"prompt", "model", "max_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "user", "extra_body", "stream_options", "prediction"} | _TRANSPORT_ARGS
_CHAT_ARGS = {"messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "user", "extra_body", "stream_options", "metadata", "store", "prediction"} | _TRANSPORT_ARGS
#: Sampling extras whose value changes nothing (forwarded, speculation still exact).
_NEUTRAL_EXTRAS = {"repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0, "top_k": -1, "repetition_penalty": 1.0}
_HARMLESS_EXTRAS = {"user", "metadata", "store", "service_tier", "request_id"}
#: Sampler truncations that never change the most likely token: exact when greedy; when sampling,
#: only a path where the target draws its own tokens (fan-out) reproduces them.
_TRUNCATIONS = {"top_k", "min_p", "typical_p"}
#: Fields the engine sends itself; everything else the caller sent goes to the target as it is.
_ENGINE_FIELDS = {"prompt", "messages", "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "n", "stream", "stream_options", "prediction", "extra_body"} | _TRANSPORT_ARGS


def given_arguments(arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments a caller gave to `create`: without `self`, the SDK's `omit`/`not_given` markers and unset extras."""
    return {
        name: value
        for name, value in arguments.items()
        if name != "self"
        and not isinstance(value, (Omit, NotGiven))
        and not (value is None and name in ("extra_headers", "extra_query", "extra_body"))
    }


_given = given_arguments


@contextlib.contextmanager
def _bad_request() -> Iterator[None]:
    """Bad arguments to `create` are also the SDK's `BadRequestError` (still raised before any request)."""
    try:
        yield
    except InvalidRequestError:
        raise
    except ConfigurationError as exc:
        raise InvalidRequestError(str(exc)) from None


def _request_options(params: Mapping[str, Any], default_timeout: Any = not_given) -> tuple[dict[str, Any], dict[str, Any]]:
    """Split `extra_headers`, `extra_query` and `timeout` off the request's arguments: the remaining
    arguments, and the SDK request options sent with every upstream request (the draft's included;
    speculation stays on). `default_timeout` is the client's (`with_options(timeout=)`)."""
    kwargs = dict(params)
    if "timeout" not in kwargs and not isinstance(default_timeout, NotGiven):
        kwargs["timeout"] = default_timeout
    headers = kwargs.pop("extra_headers", None)
    query = kwargs.pop("extra_query", None)
    options: dict[str, Any] = {}
    if headers:
        options["headers"] = dict(headers)
    if query:
        options["params"] = dict(query)
    if "timeout" in kwargs:
        options["timeout"] = kwargs.pop("timeout")
    return kwargs, options


def _seconds(timeout: Any) -> float | None:
    if isinstance(timeout, httpx2.Timeout):
        parts = [t for t in (timeout.connect, timeout.read, timeout.write, timeout.pool) if t is not None]
        return sum(parts) if parts else None
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigurationError(f"timeout must be a number of seconds > 0, an httpx Timeout or None, got {timeout!r}")
    return float(timeout)


async def _deadline(call: Coroutine[Any, Any, T], seconds: float | None, runtime: _Runtime) -> T:
    """`timeout=` bounds the whole call (every round); for a stream, until the stream is open."""
    if seconds is None:
        return await call
    try:
        return await asyncio.wait_for(call, seconds)
    except asyncio.TimeoutError:
        request = httpx2.Request("POST", str(runtime.target.sdk.base_url))
        cause = openai.APITimeoutError(request=request)
        raise runtime.target.error(f"the call took longer than timeout={seconds:g}s", cause=cause) from cause


def _check_number(name: str, value: Any, low: float, high: float, *, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(f"{name} must be a number, got {value!r}")
    if value < low or value > high or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise ConfigurationError(f"{name} must be in {bracket}{low}, {high}], got {value!r}")
    return float(value)


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise ConfigurationError(f"stop must be a non-empty string or a list of up to 16 of them, got {stop!r}")
    return tuple(stop)


def _unverifiable(kwargs: Mapping[str, Any], allowed: set[str]) -> str | None:
    """Why speculation cannot reproduce this request exactly, or None if it can."""
    for name, value in kwargs.items():
        if name in allowed or value is None:
            continue
        if name in ("presence_penalty", "frequency_penalty") and value == 0:
            continue
        if name == "logprobs" and value is False:
            continue
        if name == "echo" and value is False:
            continue
        return f"argument {name!r} is not reproduced by verification"
    if kwargs.get("n") not in (None, 1):
        return "n > 1 is served by the target alone"
    extra = kwargs.get("extra_body") or {}
    greedy = kwargs.get("temperature") == 0
    for name, value in extra.items():
        if name in _HARMLESS_EXTRAS or (name in _NEUTRAL_EXTRAS and value == _NEUTRAL_EXTRAS[name]):
            continue
        if name in _TRUNCATIONS and (greedy or isinstance(value, (int, float))):
            continue  # greedy: the most likely token survives any truncation; sampling: see _request_fields
        return f"extra_body field {name!r} changes sampling in a way verification cannot reproduce"
    return None


def _request_fields(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The caller's fields that every target request carries, and whether the caller's sampler
    truncates in a way logprob lists cannot show."""
    extras = {k: v for k, v in kwargs.items() if k not in _ENGINE_FIELDS and v is not None}
    extras.update(kwargs.get("extra_body") or {})
    truncated = any(name in _TRUNCATIONS and value != _NEUTRAL_EXTRAS.get(name) for name, value in extras.items())
    return extras, truncated


def _bound(table: OrderedDict[str, Any]) -> None:
    while len(table) > MAX_OTHER_MODELS:
        table.popitem(last=False)


class _Runtime:
    """What every request of a client shares: the role clients, the policy, the verifier choice."""

    def __init__(
        self,
        *,
        target: Endpoint,
        draft: Endpoint | None,
        drafter: str | Drafter,
        policy: DraftLengthPolicy,
        verification: str,
        pipeline: bool,
        sleep: Sleep,
        clock: Clock,
        suffix_index: SuffixIndex | None = None,
        acceptance: AcceptanceRule = AcceptanceRule(),
    ) -> None:
        self.acceptance = acceptance
        self.target = RoleClient("target", target, sleep=sleep, clock=clock)
        self.draft = RoleClient("draft", draft, sleep=sleep, clock=clock) if draft is not None else None
        # What finished requests taught: shared per target model (another `model=` gets its own).
        self.suffix_index = suffix_index if suffix_index is not None else SuffixIndex()
        self._suffix_by_model: OrderedDict[str, SuffixIndex] = OrderedDict()
        self.drafter = _build_drafter(drafter, self.draft, self.suffix_index, paid_max_length=getattr(policy, "max_length", None))
        # Learning costs a little CPU per request: only where something drafts from it (or may, later).
        self.learning = suffix_index is not None or bool(indexes(self.drafter))
        self.on_learn: Callable[[str, list[int]], None] | None = None
        self.policy = policy
        self.pipeline = pipeline
        self.verification = verification
        self.clock = clock
        self.paths = PathResolver(self.target, verification, self.draft)
        #: The timeout of every call that sets none (`with_options(timeout=)`): bounds the whole call.
        self.request_timeout: Any = not_given
        # `model=` on a call names another model on the target's server: its own client view and
        # path memory, sharing the connection pool.
        self._by_model: OrderedDict[str, tuple[RoleClient, PathResolver]] = OrderedDict()

    def warm(self) -> None:
        """Load now what the first requests would otherwise load on the event loop, stalling every
        stream in flight: the suffix index's tokenizer (0.3 s of CPU) and the price table. Best effort:
        what fails here fails again, reported, in the request that needs it."""
        with contextlib.suppress(Exception):
            if self.learning:
                load_tokenizer()
            for role in (self.target, self.draft):
                if role is not None:
                    call_cost(role.endpoint, prompt_tokens=1, completion_tokens=1)

    async def prepare(self, meter: Meter) -> None:
        """Probe the target now if choosing a path will need it (see `PathResolver.prepare`), metering
        its calls in `meter`: no request's statistics will carry them."""
        with contextlib.suppress(Exception):
            await self.paths.prepare(meter)

    def target_for(self, model: str) -> tuple[RoleClient, PathResolver]:
        if model == self.target.endpoint.model:
            return self.target, self.paths
        if model not in self._by_model:
            role = RoleClient("target", replace(self.target.endpoint, model=model, name=None), sleep=self.target.sleep, clock=self.clock)
            role.share_connections(self.target)
            self._by_model[model] = (role, PathResolver(role, self.verification, self.draft))
            _bound(self._by_model)
        self._by_model.move_to_end(model)
        return self._by_model[model]

    def suffix_for(self, model: str) -> SuffixIndex:
        if model == self.target.endpoint.model:
            return self.suffix_index
        if model not in self._suffix_by_model:
            self._suffix_by_model[model] = SuffixIndex(max_tokens=self.suffix_index.max_tokens)
            _bound(self._suffix_by_model)
        self._suffix_by_model.move_to_end(model)
        return self._suffix_by_model[model]

    def learn(self, context: Context, text: str, model: str) -> None:
        """A request finished with `text`: the suffix index of its model remembers it (and
        `on_learn`, when set, hears which tokens it took: the proxy tells its other workers)."""
        if self.learning:
            tokens = learn(self.suffix_for(model), context, text)
            if self.on_learn is not None:
                self.on_learn(model, tokens)

    def engine(
        self, chat: bool, prediction: str | None = None, model: str | None = None, context: Context | None = None, max_tokens: int = 0
    ) -> Engine:
        target, paths = self.target_for(model or self.target.endpoint.model)
        drafter = self.drafter
        if model is not None and model != self.target.endpoint.model:
            drafter = with_index(drafter, self.suffix_for(model))
        if prediction:
            if isinstance(drafter, CombinedDrafter):
                drafter = drafter.with_drafters([PredictionDrafter(prediction=prediction), *drafter.drafters])
            else:
                drafter = CombinedDrafter([PredictionDrafter(prediction=prediction), *([drafter] if drafter else [])])
        policy = self.policy
        watch = getattr(policy, "watch_load", None)
        if watch is not None:
            watch(target.load, self.draft.load if self.draft is not None else None)
        seeded_drafter: Drafter | None = None
        if context is not None and context.seed is not None and not context.sampling.greedy and drafter is not None:
            # Where the drafts decide the draws (echo, prompt logprobs), drafts learnt from traffic would
            # change a seed's text between calls: those paths draft without them (the engine chooses once
            # the path is known). Paths that keep the target's picks give a seed one text whatever the drafts.
            seeded_drafter = without_suffix(drafter) if indexes(drafter) else drafter
            if isinstance(seeded_drafter, CombinedDrafter):
                seeded_drafter = seeded_drafter.unlearnt()
        if context is not None and drafter is not None and indexes(drafter):
            index = self.suffix_for(model or self.target.endpoint.model)
            drafter, policy = gate_free_drafts(drafter, policy, context, index, max_tokens)
        return Engine(
            target=target,
            paths=paths,
            chat=chat,
            drafter=drafter,
            draft_meter_endpoint=self.draft,
            policy=policy,
            clock=self.clock,
            pipeline=self.pipeline,
            seeded_drafter=seeded_drafter,
            seeded_policy=self.policy if seeded_drafter is not None else None,
        )


def _build_drafter(choice: str | Drafter, draft: RoleClient | None, index: SuffixIndex, *, paid_max_length: int | None = None) -> Drafter | None:
    if not isinstance(choice, str):
        return choice
    if choice == "model":
        if draft is None:
            raise ConfigurationError("drafter='model' needs a draft Endpoint")
        return ModelDrafter(draft)
    if choice == "lookup":
        return LookupDrafter()
    if choice == "suffix":
        return SuffixDrafter(index)
    if choice == "auto":
        free: list[Drafter] = [SuffixDrafter(index), LookupDrafter()]
        return CombinedDrafter([*free, ModelDrafter(draft)] if draft is not None else free, paid_max_length=paid_max_length)
    raise ConfigurationError(f"drafter must be 'auto', 'model', 'lookup', 'suffix' or a drafter object, got {choice!r}")


def _acceptance_rule(mode: Any, threshold: Any, epsilon: Any, delta: Any) -> AcceptanceRule:
    try:
        return AcceptanceRule(mode=mode, threshold=threshold, epsilon=epsilon, delta=delta)
    except ValueError as exc:
        raise ConfigurationError(str(exc)) from None


def _build_policy(choice: str | DraftLengthPolicy, k: int) -> DraftLengthPolicy:
    fixed = FixedDraftLength(k)  # validates k either way
    if not isinstance(choice, str):
        return choice
    if choice == "fixed":
        return fixed
    if choice == "adaptive":
        return AdaptiveDraftLength(start_length=k, max_length=max(10, k))  # free drafts: up to max(32, k)
    raise ConfigurationError(f"policy must be 'adaptive', 'fixed' or a policy object, got {choice!r}")


class AsyncSpeculativeOpenAI(openai.AsyncOpenAI):
    """An async client that speculates: `draft` proposes, `target` verifies, output is the target's.

    Args:
        target: the expensive model whose output you want.
        draft: the cheap model that proposes tokens. Optional: without it, only free drafters
            (prompt lookup, per-call predictions) propose.
        num_speculative_tokens: draft tokens per round: the fixed length with policy="fixed", the
            starting length with policy="adaptive" (default 4).
        policy: "adaptive" (default: chooses the length each round from measured acceptance and
            latencies, and stops speculating when the target alone is faster), "fixed", or an object
            with the `DraftLengthPolicy` interface.
        drafter: "auto" (default: each round, whichever of the suffix index, prompt lookup and the
            draft model promises the most tokens per second), "model", "lookup", "suffix" (drafts
            from what earlier requests of this client produced, no model), or an object with the
            `Drafter` interface.
        verification: "auto" (default: completions echo; vLLM chat prompt_logprobs for chat) or "none"
            (never speculate: a baseline that goes through the same code).
        pipeline: draft the next round while the current one is verified (default True).
        suffix_index: the `SuffixIndex` that finished requests are learnt into and suffix drafts come
            from (default: a new one, shared by `with_options` copies; pass one to share it further).
        acceptance: "exact" (default: the output is the target's), or a lossy rule you opt into:
            "threshold" (keep a draft token while p_target/p_draft >= `acceptance_threshold`, default
            0.7) or "typical" (Medusa's: keep it while p_target > min(`typical_epsilon`,
            `typical_delta` * exp(-entropy)), defaults 0.09 and 0.3). Lossy responses say
            `exact=False` and measure their divergence (`speculative.divergent_tokens`,
            `logprob_gap`); paths that show no target distribution (fan-out, Predicted Outputs,
            prefix match) decide exactly and say so in `speculative.acceptance_note`.
        sleep, clock: injectable for tests and the simulator.

    It is an `openai.AsyncOpenAI` (libraries that check the type accept it: instructor, LiteLLM,
    LangChain's `root_async_client`): `completions` and `chat.completions` speculate; the SDK's other
    resources (`embeddings`, `files`, ...) and its low-level `post` go to the target as the SDK sends
    them, with the target's URL and key (`post` to the two speculating paths goes through them).
    """

    def __init__(
        self,
        *,
        target: Endpoint,
        draft: Endpoint | None = None,
        num_speculative_tokens: int = 4,
        policy: str | DraftLengthPolicy = "adaptive",
        drafter: str | Drafter = "auto",
        verification: str = "auto",
        pipeline: bool = True,
        suffix_index: SuffixIndex | None = None,
        acceptance: str = "exact",
        acceptance_threshold: float = 0.7,
        typical_epsilon: float = 0.09,
        typical_delta: float = 0.3,
        sleep: Sleep = asyncio.sleep,
        clock: Clock = time.perf_counter,
    ) -> None:
        if not isinstance(target, Endpoint):
            raise ConfigurationError("target must be an Endpoint")
        if draft is not None and not isinstance(draft, Endpoint):
            raise ConfigurationError("draft must be an Endpoint or None")
        self._runtime = _Runtime(
            target=target,
            draft=draft,
            drafter=drafter,
            policy=_build_policy(policy, num_speculative_tokens),
            verification=verification,
            pipeline=pipeline,
            sleep=sleep,
            clock=clock,
            suffix_index=suffix_index,
            acceptance=_acceptance_rule(acceptance, acceptance_threshold, typical_epsilon, typical_delta),
        )
        self._owns_connections = True
        self._specapi_options = {
            "target": target,
            "draft": draft,
            "num_speculative_tokens": num_speculative_tokens,
            "policy": policy,
            "drafter": drafter,
            "verification": verification,
            "pipeline": pipeline,
            "suffix_index": self._runtime.suffix_index,
            "acceptance": acceptance,
            "acceptance_threshold": acceptance_threshold,
            "typical_epsilon": typical_epsilon,
            "typical_delta": typical_delta,
            "sleep": sleep,
            "clock": clock,
        }
        self.target = target
        self.draft = draft
        self.num_speculative_tokens = num_speculative_tokens

    # The speculating resources in place of the SDK's (same names, same call shapes).

    @functools.cached_property
    def completions(self) -> AsyncCompletions:  # type: ignore[override]
        return AsyncCompletions(self._runtime)

    @functools.cached_property
    def chat(self) -> _AsyncChat:  # type: ignore[override]
        return _AsyncChat(self._runtime)

    @functools.cached_property
    def models(self) -> AsyncModels:  # type: ignore[override]
        return AsyncModels(self._runtime.target)

    @functools.cached_property
    def beta(self) -> _Beta:  # type: ignore[override]
        return _Beta(self.chat, lambda: openai.AsyncOpenAI.beta.func(self))  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> Any:
        # The `openai.AsyncOpenAI` half is set up when first used (the target's SDK client it shares
        # costs about 20 ms to build, which requests build only when they need it).
        if name.startswith("__") or "_sdk_ready" in self.__dict__ or "_runtime" not in self.__dict__:
            raise AttributeError(name)
        self._sdk_init()
        return getattr(self, name)

    def _sdk_init(self) -> None:
        """The `openai.AsyncOpenAI` half: the target's URL, key, timeout and retries (the attributes
        libraries read), on the target's own connection pool (no second one)."""
        self._sdk_ready = True
        sdk = self._runtime.target.sdk
        timeout = self._runtime.request_timeout
        openai.AsyncOpenAI.__init__(
            self,
            api_key=sdk.api_key,
            base_url=sdk.base_url,
            timeout=self.target.timeout if isinstance(timeout, NotGiven) else timeout,
            max_retries=self.target.max_retries,
            http_client=sdk._client,
        )

    def with_options(self, **changes: Any) -> AsyncSpeculativeOpenAI:  # type: ignore[override]
        """A client with some options changed (as `openai.AsyncOpenAI.with_options`), e.g.
        `client.with_options(policy="fixed", num_speculative_tokens=6).completions.create(...)`, or the
        SDK's `timeout=` (the default of every call: it bounds the whole call, as `create(timeout=)`
        does) and `max_retries=` (retries of each upstream request, the draft's too).

        It shares this client's connections to the endpoints; a policy object passed as a string is
        built anew (so a fixed-length copy does not disturb the adaptive policy's measurements).
        """
        timeout = changes.pop("timeout", not_given)
        max_retries = changes.pop("max_retries", not_given)
        unknown = set(changes) - set(self._specapi_options)
        if unknown:
            raise ConfigurationError(
                f"with_options does not take {', '.join(sorted(unknown))} (the target's URL, key and headers are its Endpoint's)"
            )
        options = {**self._specapi_options, **changes}
        if "policy" not in changes and "num_speculative_tokens" not in changes:
            options["policy"] = self._runtime.policy  # keep what the policy has learnt
        same_endpoints = changes.keys().isdisjoint({"target", "draft"})
        if not isinstance(max_retries, NotGiven):
            if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
                raise ConfigurationError(f"max_retries must be an integer >= 0, got {max_retries!r}")
            for role in ("target", "draft"):
                if options[role] is not None:
                    options[role] = replace(options[role], max_retries=max_retries)
        if not isinstance(timeout, NotGiven):
            _seconds(timeout)  # checked now, not at the first call
        copy = AsyncSpeculativeOpenAI(**options)
        if same_endpoints:
            copy._owns_connections = False  # closing the copy leaves this client's connections open
            copy._runtime.target.share_connections(self._runtime.target)
            if copy._runtime.draft is not None and self._runtime.draft is not None:
                copy._runtime.draft.share_connections(self._runtime.draft)
            copy._runtime.paths.capabilities = self._runtime.paths.capabilities
        copy._runtime.request_timeout = timeout if not isinstance(timeout, NotGiven) else self._runtime.request_timeout
        return copy

    copy = with_options  # type: ignore[assignment]

    async def post(self, path: str, *, cast_to: Any, body: Any = None, options: Any = None, stream: bool = False, **rest: Any) -> Any:  # type: ignore[override]
        """The SDK's low-level POST (LiteLLM sends through it): `/completions` and `/chat/completions`
        go through `create` and speculate; any other path goes to the target as the SDK sends it."""
        resource = _resource_for(self, path)
        if resource is None or not isinstance(body, Mapping) or rest.get("files"):
            return await openai.AsyncOpenAI.post(self, path, cast_to=cast_to, body=body, options=options or {}, stream=stream, **rest)
        params, raw = _sdk_request(resource, body, options)
        if raw:
            return await resource.with_raw_response.create(**params)
        return await resource.create(**params)

    async def _warm(self) -> None:
        """What a long-running server does before its first request (see `_Runtime.warm`)."""
        await asyncio.to_thread(self._runtime.warm)

    async def _probe(self, meter: Meter) -> None:
        """Probe the target before the first request needs it (a long-running server's startup), so
        that no request waits for the probe; its calls are metered in `meter` (cancelled midway too).
        Best effort: a failed probe is done again by the first request, whose statistics carry it."""
        await self._runtime.prepare(meter)

    async def close(self) -> None:
        if not self._owns_connections:
            return
        for role in (self._runtime.target, self._runtime.draft):
            if role is not None:
                await role.aclose()

    async def __aenter__(self) -> AsyncSpeculativeOpenAI:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class _Beta:
    """`client.beta`: `beta.chat.completions` is the speculating resource (LangChain streams structured
    output through `beta.chat.completions.stream`); the SDK's other beta resources are the SDK's."""

    def __init__(self, chat: Any, sdk_beta: Callable[[], Any]) -> None:
        self.chat = chat
        self._sdk_beta = sdk_beta

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sdk_beta(), name)


#: The SDK's header asking for a raw response (what `with_raw_response` sends).
_RAW_RESPONSE_HEADER = "X-Stainless-Raw-Response"


def _resource_for(client: Any, path: str) -> Any:
    """The speculating resource that serves `path` (a low-level SDK call), if one does."""
    normalized = "/" + path.strip("/")
    if normalized == "/completions":
        return client.completions
    if normalized == "/chat/completions":
        return client.chat.completions
    return None


def _sdk_request(resource: Any, body: Mapping[str, Any], options: Any) -> tuple[dict[str, Any], bool]:
    """`create`'s arguments for a low-level SDK POST of `body` with the SDK's request `options`, and
    whether it asked for the raw response. Fields `create` does not name go as `extra_body`."""
    names = set(inspect.signature(resource.create).parameters)
    params = {k: v for k, v in body.items() if k in names and k not in ("extra_body", "extra_headers", "extra_query", "timeout")}
    extra = {k: v for k, v in body.items() if k not in params}
    options = dict(options or {})
    if isinstance(options.get("extra_json"), Mapping):
        extra.update(options["extra_json"])
    if extra:
        params["extra_body"] = extra
    headers = {k: v for k, v in dict(options.get("headers") or {}).items() if isinstance(v, str)}
    raw = any(k.lower() == _RAW_RESPONSE_HEADER.lower() and v.lower() in ("true", "raw") for k, v in headers.items())
    headers = {k: v for k, v in headers.items() if not k.lower().startswith("x-stainless")}
    if headers:
        params["extra_headers"] = headers
    if options.get("params"):
        params["extra_query"] = dict(options["params"])
    timeout = options.get("timeout")
    if timeout is not None and not isinstance(timeout, NotGiven):
        params["timeout"] = timeout
    return params, raw


class _AsyncChat:
    def __init__(self, runtime: _Runtime) -> None:
        self.completions = AsyncChatCompletions(runtime)


def _validated_sampling(kwargs: Mapping[str, Any], target: Endpoint, draft: Endpoint | None) -> SamplingParams:
    temperature = _check_number("temperature", kwargs["temperature"] if kwargs.get("temperature") is not None else 1.0, 0.0, 2.0)
    top_p = _check_number("top_p", kwargs["top_p"] if kwargs.get("top_p") is not None else 1.0, 0.0, 1.0, low_open=True)
    return SamplingParams(
        temperature=temperature,
        top_p=top_p,
        explicit=frozenset(name for name in ("temperature", "top_p") if kwargs.get(name) is not None),
        raw_logprobs=target.logprobs_mode == "raw",
        draft_raw_logprobs=draft is None or draft.logprobs_mode == "raw",
    )


def _validated_max_tokens(value: Any, default: int | None) -> int | None:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigurationError(f"max_tokens must be an integer >= 1, got {value!r}")
    return value


def _with_limit(body: dict[str, Any], name: str, limit: int | None) -> dict[str, Any]:
    """A target-alone body with the caller's limit under the caller's name; none when the caller set none
    (the server's own default applies, as it would to the caller's request)."""
    return body if limit is None else {**body, name: limit}


def _validated_seed(value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigurationError(f"seed must be an integer, got {value!r}")
    return value


class _Resource:
    """What completions and chat completions share: validation, pass-through and collection."""

    chat: bool = False

    def __init__(self, runtime: _Runtime) -> None:
        self._runtime = runtime

    @property
    def with_raw_response(self) -> AsyncRawCreate:
        """`.with_raw_response.create(...)`: the same call, returning a `RawResponse` (`.headers`, `.parse()`)."""
        return AsyncRawCreate(self.create, getattr(self, "parse", None))  # type: ignore[attr-defined]

    @property
    def with_streaming_response(self) -> AsyncStreamingCreate:
        """`async with .with_streaming_response.create(...) as response:` then `await response.parse()`."""
        return AsyncStreamingCreate(self.create, getattr(self, "parse", None))  # type: ignore[attr-defined]

    async def _passthrough(self, path: str, kwargs: dict[str, Any], reason: str, options: Mapping[str, Any] | None = None) -> Any:
        runtime = self._runtime
        meter = Meter(runtime.target.endpoint)
        started = runtime.clock()
        body = {k: v for k, v in kwargs.items() if k != "extra_body" and k not in _TRANSPORT_ARGS and v is not None}
        body.update(kwargs.get("extra_body") or {})
        if body.get("stream"):
            chunks = _passthrough_chunks(runtime, path, body, meter, reason, started, options)
            return SpeculativeStream(chunks, parse_chat_chunk if self.chat else parse_completion)
        data = await runtime.target.post(path, body, meter, options=options)
        stats = SpeculativeStats(
            target=meter.snapshot(),
            draft=RoleUsage(),
            speculated=False,
            fallback_reason=reason,
            verification="none",
            generated_tokens=int((data.get("usage") or {}).get("completion_tokens") or 0),
            wall_s=runtime.clock() - started,
        )
        return self._build(data, stats)

    def _build(self, data: Any, stats: SpeculativeStats) -> Any:
        """The response object, built as the SDK builds it: without validating the fields (a target's
        echo puts null first in `token_logprobs`, which the SDK's types do not allow, and passes on)."""
        if not isinstance(data, Mapping):
            raise self._runtime.target.error(f"response is not a JSON object: {str(data)[:200]!r}", malformed=True)
        cls = SpeculativeChatCompletion if self.chat else SpeculativeCompletion
        response = construct_type(type_=cls, value=dict(data))
        response.speculative = stats
        return response

    async def _events(self, engine: Engine, request: GenerationRequest) -> AsyncIterator[Piece | Finished]:
        events = engine.generate(request)
        text: list[str] = []
        loads = [role.load for role in (engine.target, engine.draft_client) if role is not None]
        request_id = new_request_id()
        finished = False
        for load in loads:
            load.enter(request_id)  # what the load-aware policy sees: requests in flight per upstream
        try:
            while True:
                # The request's id is set around each step, not once: a stream may be read on by
                # another task than the one that started it (the proxy reads the first chunk in the
                # request's handler and the rest in the response's task), and a context variable set
                # in the first would be missing in the second, where the policy would rank this
                # request last among those in flight.
                token = current_request.set(request_id)
                try:
                    event = await events.__anext__()
                except StopAsyncIteration:
                    break
                finally:
                    current_request.reset(token)
                if isinstance(event, Piece):
                    text.append(event.text)
                else:
                    finished = True
                yield event
        finally:
            try:
                if finished:
                    # Learnt once the last event is out (whether the reader then asks for more or
                    # closes): a stream's end does not wait for it, and a proxy that finishes many
                    # streams at once does not hold each one's last bytes behind the others' learning.
                    self._runtime.learn(request.context, "".join(text), engine.target.endpoint.model)
            finally:
                for load in loads:
                    load.leave(request_id)
                await events.aclose()

    async def _collect(self, engine: Engine, request: GenerationRequest) -> tuple[str, Finished]:
        text = []
        async with contextlib.aclosing(self._events(engine, request)) as events:  # closed here: it learns then
            async for event in events:
                if isinstance(event, Piece):
                    text.append(event.text)
                else:
                    return "".join(text), event
        raise RuntimeError("the engine ended without finishing")  # pragma: no cover

    async def _respond(
        self, context: Context, limit: int | None, stop: tuple[str, ...], kwargs: Mapping[str, Any], stream: bool, include_usage: bool, model: str
    ) -> Any:
        """Run the engine: a stream of chunks, or one response collected from it."""
        runtime = self._runtime
        if runtime.acceptance.lossy:
            context = replace(context, sampling=replace(context.sampling, acceptance=runtime.acceptance))
        engine = runtime.engine(chat=self.chat, prediction=_prediction_text(kwargs.get("prediction")), model=model, context=context, max_tokens=limit)
        request = GenerationRequest(context=context, max_tokens=limit, stop=stop, stream=stream)
        if stream:
            events = self._events(engine, request)
            if self.chat:
                return SpeculativeStream(chat_chunks(events, model, include_usage), parse_chat_chunk)
            return SpeculativeStream(completion_chunks(events, model, include_usage), parse_completion)
        text, finished = await self._collect(engine, request)
        data = {
            "id": response_id(self.chat),
            "object": "chat.completion" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [self._choice(text, finished.finish_reason)],
            "usage": self._usage(finished),
        }
        return self._build(data, finished.stats)

    @staticmethod
    def _choice(text: str, finish_reason: str) -> dict[str, Any]:
        raise NotImplementedError

    def _usage(self, finished: Finished) -> dict[str, Any]:
        if finished.usage is not None:
            return dict(finished.usage)  # one target call wrote the answer: its usage, every field
        prompt = finished.prompt_tokens or 0
        return {"prompt_tokens": prompt, "completion_tokens": finished.completion_tokens, "total_tokens": prompt + finished.completion_tokens}



def _prediction_text(prediction: Any) -> str | None:
    """OpenAI's `prediction={"type": "content", "content": "..."}`, or a plain string."""
    if prediction is None:
        return None
    if isinstance(prediction, str):
        return prediction
    if isinstance(prediction, Mapping) and prediction.get("type") == "content":
        content = prediction.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    raise ConfigurationError(f"prediction must be {{'type': 'content', 'content': str}} or a string, got {prediction!r}")


def _stream_options(kwargs: Mapping[str, Any]) -> tuple[bool, bool]:
    stream = bool(kwargs.get("stream"))
    options = kwargs.get("stream_options") or {}
    if not isinstance(options, Mapping):
        raise ConfigurationError(f"stream_options must be an object, got {options!r}")
    if options and not stream:
        raise ConfigurationError("stream_options is only allowed with stream=True")
    return stream, bool(options.get("include_usage"))


async def _passthrough_chunks(
    runtime: _Runtime, path: str, body: dict[str, Any], meter: Meter, reason: str, started: float, options: Mapping[str, Any] | None = None
) -> AsyncIterator[dict[str, Any]]:
    """The target's own stream, each chunk passed on as it comes; the last one carries the statistics.

    Only a chunk the stream may end on (one that finishes a choice, or one without choices: usage) waits
    for the next, so that the statistics can go on the last; text goes on at once. A stream that ends on
    a chunk already passed on gets one more, without choices, for the statistics. Usage is always asked
    of the target (so the statistics are billed figures); its chunk is passed on only if the caller
    asked for it.
    """
    wanted_usage = bool((body.get("stream_options") or {}).get("include_usage"))
    body = {**body, "stream_options": {**(body.get("stream_options") or {}), "include_usage": True}}
    held: dict[str, Any] | None = None
    last: dict[str, Any] | None = None
    async with contextlib.aclosing(runtime.target.stream(path, body, meter, options=options)) as chunks:
        async for chunk in chunks:
            if chunk.get("usage") and not chunk.get("choices") and not wanted_usage:
                continue
            if held is not None:
                yield held
                held = None
            if _may_end_a_stream(chunk):
                held = chunk
            else:
                yield chunk
            last = chunk
    if last is None:
        return
    if held is None:
        held = {key: last[key] for key in ("id", "object", "created", "model") if key in last}
        held["choices"] = []
    usage = meter.snapshot()
    held["_speculative"] = SpeculativeStats(
        target=usage,
        draft=RoleUsage(),
        speculated=False,
        fallback_reason=reason,
        verification="none",
        generated_tokens=usage.completion_tokens,
        wall_s=runtime.clock() - started,
    )
    yield held


def _may_end_a_stream(chunk: Mapping[str, Any]) -> bool:
    """Whether a well-formed stream may end after `chunk`: it finishes a choice, or has none (usage)."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices:
        return True
    return any(isinstance(choice, Mapping) and choice.get("finish_reason") is not None for choice in choices)


class AsyncCompletions(_Resource):
    """`client.completions`: `/v1/completions` with speculation."""

    @overload
    async def create(
        self,
        *,
        prompt: Union[str, SequenceNotStr[str], Iterable[int], Iterable[Iterable[int]], None],
        stream: Optional[Literal[False]] | Omit = omit,
        model: Union[str, Literal["gpt-3.5-turbo-instruct", "davinci-002", "babbage-002"]] | None = None,
        best_of: Optional[int] | Omit = omit,
        echo: Optional[bool] | Omit = omit,
        frequency_penalty: Optional[float] | Omit = omit,
        logit_bias: Optional[Dict[str, int]] | Omit = omit,
        logprobs: Optional[int] | Omit = omit,
        max_tokens: Optional[int] | Omit = omit,
        n: Optional[int] | Omit = omit,
        presence_penalty: Optional[float] | Omit = omit,
        seed: Optional[int] | Omit = omit,
        stop: Union[str, SequenceNotStr[str], None] | Omit = omit,
        stream_options: Optional[ChatCompletionStreamOptionsParam] | Omit = omit,
        suffix: Optional[str] | Omit = omit,
        temperature: Optional[float] | Omit = omit,
        top_p: Optional[float] | Omit = omit,
        user: str | Omit = omit,
        prediction: Optional[ChatCompletionPredictionContentParam] | str | Omit = omit,
        extra_headers: Headers | None = None,
        extra_query: Query | None = None,
        extra_body: Body | None = None,
        timeout: float | httpx2.Timeout | None | NotGiven = not_given,
    ) -> SpeculativeCompletion:
        ...

    @overload
    async def create(
        self,
        *,
        prompt: Union[str, SequenceNotStr[str], Iterable[int], Iterable[Iterable[int]], None],
        stream: Literal[True],
        model: Union[str, Literal["gpt-3.5-turbo-instruct", "davinci-002", "babbage-002"]] | None = None,
        best_of: Optional[int] | Omit = omit,
        echo: Optional[bool] | Omit = omit,
        frequency_penalty: Optional[float] | Omit = omit,
        logit_bias: Optional[Dict[str, int]] | Omit = omit,
        logprobs: Optional[int] | Omit = omit,
        max_tokens: Optional[int] | Omit = omit,
        n: Optional[int] | Omit = omit,
        presence_penalty: Optional[float] | Omit = omit,
        seed: Optional[int] | Omit = omit,
        stop: Union[str, SequenceNotStr[str], None] | Omit = omit,
        stream_options: Optional[ChatCompletionStreamOptionsParam] | Omit = omit,
        suffix: Optional[str] | Omit = omit,
        temperature: Optional[float] | Omit = omit,
        top_p: Optional[float] | Omit = omit,
        user: str | Omit = omit,
        prediction: Optional[ChatCompletionPredictionContentParam] | str | Omit = omit,
        extra_headers: Headers | None = None,
        extra_query: Query | None = None,
        extra_body: Body | None = None,
        timeout: float | httpx2.Timeout | None | NotGiven = not_given,
    ) -> SpeculativeStream[Completion]:
        ...

    async def create(
        self,
        *,
        prompt: Union[str, SequenceNotStr[str], Iterable[int], Iterable[Iterable[int]], None],
        stream: Optional[Literal[False]] | Literal[True] | Omit = omit,
        model: Union[str, Literal["gpt-3.5-turbo-instruct", "davinci-002", "babbage-002"]] | None = None,
        best_of: Optional[int] | Omit = omit,
        echo: Optional[bool] | Omit = omit,
        frequency_penalty: Optional[float] | Omit = omit,
        logit_bias: Optional[Dict[str, int]] | Omit = omit,
        logprobs: Optional[int] | Omit = omit,
        max_tokens: Optional[int] | Omit = omit,
        n: Optional[int] | Omit = omit,
        presence_penalty: Optional[float] | Omit = omit,
        seed: Optional[int] | Omit = omit,
        stop: Union[str, SequenceNotStr[str], None] | Omit = omit,
        stream_options: Optional[ChatCompletionStreamOptionsParam] | Omit = omit,
        suffix: Optional[str] | Omit = omit,
        temperature: Optional[float] | Omit = omit,
        top_p: Optional[float] | Omit = omit,
        user: str | Omit = omit,
        prediction: Optional[ChatCompletionPredictionContentParam] | str | Omit = omit,
        extra_headers: Headers | None = None,
        extra_query: Query | None = None,
        extra_body: Body | None = None,
        timeout: float | httpx2.Timeout | None | NotGiven = not_given,
    ) -> SpeculativeCompletion | SpeculativeStream[Completion]:
        """`/v1/completions` with speculation; the openai SDK's parameters, plus `speculative` on the result."""
        return await self._create(_given(locals()))


    async def _create(self, params: dict[str, Any]) -> SpeculativeCompletion | SpeculativeStream[Completion]:
        with _bad_request():
            kwargs, options = _request_options(params, self._runtime.request_timeout)
            prompt = kwargs.pop("prompt")
            model = kwargs.pop("model", None)
            max_tokens = kwargs.pop("max_tokens", None)
            seconds = _seconds(options.get("timeout"))
            return await _deadline(self._create_checked(prompt, model, max_tokens, kwargs, options), seconds, self._runtime)

    async def _create_checked(
        self, prompt: Any, model: str | None, max_tokens: int | None, kwargs: dict[str, Any], options: dict[str, Any]
    ) -> SpeculativeCompletion | SpeculativeStream[Completion]:
        runtime = self._runtime
        target = runtime.target.endpoint
        sampling = _validated_sampling(kwargs, target, runtime.draft.endpoint if runtime.draft else None)
        # max_tokens=0 with echo scores the prompt alone: the target answers as it does, 200 or its own 400.
        scores_only = max_tokens == 0 and not isinstance(max_tokens, bool) and kwargs.get("echo") is True
        # None: the caller set none, and the server's own default applies (OpenAI's and vLLM's 16, llama-server's
        # to the end of the context), on every path.
        limit = 0 if scores_only else _validated_max_tokens(max_tokens, None)
        seed = _validated_seed(kwargs.get("seed"))
        stop = _stops(kwargs.get("stop"))
        stream, include_usage = _stream_options(kwargs)
        model = model or target.model
        if scores_only:
            return await self._passthrough("/completions", {"prompt": prompt, "model": model, "max_tokens": 0, **kwargs}, "max_tokens=0 with echo (the prompt scored) is served by the target alone", options)
        if not isinstance(prompt, str):
            if isinstance(prompt, list) and prompt:
                return await self._passthrough("/completions", _with_limit({"prompt": prompt, "model": model, **kwargs}, "max_tokens", limit), "a list prompt (batch or token ids) is served by the target alone", options)
            raise ConfigurationError(f"prompt must be a string, got {type(prompt).__name__}")
        reason = _unverifiable(kwargs, _COMPLETION_ARGS)
        if reason is not None:
            return await self._passthrough("/completions", _with_limit({"prompt": prompt, "model": model, **kwargs}, "max_tokens", limit), reason, options)
        extras, truncated = _request_fields(kwargs)
        sampling = replace(sampling, target_sampler_only=truncated and not sampling.greedy)
        context = Context(prompt=prompt, sampling=sampling, seed=seed, extras=extras, options=options)
        return await self._respond(context, limit, stop, kwargs, stream, include_usage, model)

    @staticmethod
    def _choice(text: str, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}


class AsyncChatCompletions(_Resource):
    """`client.chat.completions`: `/v1/chat/completions` with speculation."""

    chat = True

    @overload
    async def create(
        self,
        *,
        messages: Iterable[ChatCompletionMessageParam],
        stream: Optional[Literal[False]] | Omit = omit,
        model: Union[str, ChatModel] | None = None,
        audio: Optional[ChatCompletionAudioParam] | Omit = omit,
        frequency_penalty: Optional[float] | Omit = omit,
        function_call: completion_create_params.FunctionCall | Omit = omit,
        functions: Iterable[completion_create_params.Function] | Omit = omit,
        logit_bias: Optional[Dict[str, int]] | Omit = omit,
        logprobs: Optional[bool] | Omit = omit,
        max_completion_tokens: Optional[int] | Omit = omit,
        max_tokens: Optional[int] | Omit = omit,
        metadata: Optional[Metadata] | Omit = omit,
        modalities: Optional[List[Literal["text", "audio"]]] | Omit = omit,
        moderation: Optional[completion_create_params.Moderation] | Omit = omit,
        n: Optional[int] | Omit = omit,
        parallel_tool_calls: bool | Omit = omit,
        prediction: Optional[ChatCompletionPredictionContentParam] | Omit = omit,
        presence_penalty: Optional[float] | Omit = omit,
        prompt_cache_key: Optional[str] | Omit = omit,
        prompt_cache_options: completion_create_params.PromptCacheOptions | Omit = omit,
        prompt_cache_retention: Optional[Literal["in_memory", "24h"]] | Omit = omit,
        reasoning_effort: Optional[ReasoningEffort] | Omit = omit,
        response_format: completion_create_params.ResponseFormat | Omit = omit,
        safety_identifier: Optional[str] | Omit = omit,
        seed: Optional[int] | Omit = omit,
        service_tier: Optional[Literal["auto", "default", "flex", "scale", "priority", "fast"]] | Omit = omit,
        stop: Union[str, SequenceNotStr[str], None] | Omit = omit,
        store: Optional[bool] | Omit = omit,
        stream_options: Optional[ChatCompletionStreamOptionsParam] | Omit = omit,
        temperature: Optional[float] | Omit = omit,
        tool_choice: ChatCompletionToolChoiceOptionParam | Omit = omit,
        tools: Iterable[ChatCompletionToolUnionParam] | Omit = omit,
        top_logprobs: Optional[int] | Omit = omit,
        top_p: Optional[float] | Omit = omit,
        user: str | Omit = omit,
        verbosity: Optional[Literal["low", "medium", "high"]] | Omit = omit,
        web_search_options: completion_create_params.WebSearchOptions | Omit = omit,
        extra_headers: Headers | None = None,
        extra_query: Query | None = None,
        extra_body: Body | None = None,
        timeout: float | httpx2.Timeout | None | NotGiven = not_given,
    ) -> SpeculativeChatCompletion:
        ...

    @overload
    async def create(
        self,
        *,
        messages: Iterable[ChatCompletionMessageParam],
        stream: Literal[True],
        model: Union[str, ChatModel] | None = None,
        audio: Optional[ChatCompletionAudioParam] | Omit = omit,
        frequency_penalty: Optional[float] | Omit = omit,
        function_call: completion_create_params.FunctionCall | Omit = omit,
        functions: Iterable[completion_create_params.Function] | Omit = omit,
        logit_bias: Optional[Dict[str, int]] | Omit = omit,
        logprobs: Optional[bool] | Omit = omit,
        max_completion_tokens: Optional[int] | Omit = omit,
        max_tokens: Optional[int] | Omit = omit,
        metadata: Optional[Metadata] | Omit = omit,
        modalities: Optional[List[Literal["text", "audio"]]] | Omit = omit,
        moderation: Optional[completion_create_params.Moderation] | Omit = omit,
        n: Optional[int] | Omit = omit,
        parallel_tool_calls: bool | Omit = omit,
        prediction: Optional[ChatCompletionPredictionContentParam] | Omit = omit,
        presence_penalty: Optional[float] | Omit = omit,
        prompt_cache_key: Optional[str] | Omit = omit,
        prompt_cache_options: completion_create_params.PromptCacheOptions | Omit = omit,
        prompt_cache_retention: Optional[Literal["in_memory", "24h"]] | Omit = omit,
        reasoning_effort: Optional[ReasoningEffort] | Omit = omit,
        response_format: completion_create_params.ResponseFormat | Omit = omit,
        safety_identifier: Optional[str] | Omit = omit,
        seed: Optional[int] | Omit = omit,
        service_tier: Optional[Literal["auto", "default", "flex", "scale", "priority", "fast"]] | Omit = omit,
        stop: Union[str, SequenceNotStr[str], None] | Omit = omit,
        store: Optional[bool] | Omit = omit,
        stream_options: Optional[ChatCompletionStreamOptionsParam] | Omit = omit,
        temperature: Optional[float] | Omit = omit,
        tool_choice: ChatCompletionToolChoiceOptionParam | Omit = omit,
        tools: Iterable[ChatCompletionToolUnionParam] | Omit = omit,
        top_logprobs: Optional[int] | Omit = omit,
        top_p: Optional[float] | Omit = omit,
        user: str | Omit = omit,
        verbosity: Optional[Literal["low", "medium", "high"]] | Omit = omit,
        web_search_options: completion_create_params.WebSearchOptions | Omit = omit,
        extra_headers: Headers | None = None,
        extra_query: Query | None = None,
        extra_body: Body | None = None,
        timeout: float | httpx2.Timeout | None | NotGiven = not_given,
    ) -> SpeculativeStream[ChatCompletionChunk]:
        ...

    async def create(
        self,
        *,
        messages: Iterable[ChatCompletionMessageParam],
        stream: Optional[Literal[False]] | Literal[True] | Omit = omit,
        model: Union[str, ChatModel] | None = None,
        audio: Optional[ChatCompletionAudioParam] | Omit = omit,
        frequency_penalty: Optional[float] | Omit = omit,
        function_call: completion_create_params.FunctionCall | Omit = omit,
        functions: Iterable[completion_create_params.Function] | Omit = omit,
        logit_bias: Optional[Dict[str, int]] | Omit = omit,
        logprobs: Optional[bool] | Omit = omit,
        max_completion_tokens: Optional[int] | Omit = omit,
        max_tokens: Optional[int] | Omit = omit,
        metadata: Optional[Metadata] | Omit = omit,
        modalities: Optional[List[Literal["text", "audio"]]] | Omit = omit,
        moderation: Optional[completion_create_params.Moderation] | Omit = omit,
        n: Optional[int] | Omit = omit,
        parallel_tool_calls: bool | Omit = omit,
        prediction: Optional[ChatCompletionPredictionContentParam] | Omit = omit,
        presence_penalty: Optional[float] | Omit = omit,
        prompt_cache_key: Optional[str] | Omit = omit,
        prompt_cache_options: completion_create_params.PromptCacheOptions | Omit = omit,
        prompt_cache_retention: Optional[Literal["in_memory", "24h"]] | Omit = omit,
        reasoning_effort: Optional[ReasoningEffort] | Omit = omit,
        response_format: completion_create_params.ResponseFormat | Omit = omit,
        safety_identifier: Optional[str] | Omit = omit,
        seed: Optional[int] | Omit = omit,
        service_tier: Optional[Literal["auto", "default", "flex", "scale", "priority", "fast"]] | Omit = omit,
        stop: Union[str, SequenceNotStr[str], None] | Omit = omit,
        store: Optional[bool] | Omit = omit,
        stream_options: Optional[ChatCompletionStreamOptionsParam] | Omit = omit,
        temperature: Optional[float] | Omit = omit,
        tool_choice: ChatCompletionToolChoiceOptionParam | Omit = omit,
        tools: Iterable[ChatCompletionToolUnionParam] | Omit = omit,
        top_logprobs: Optional[int] | Omit = omit,
        top_p: Optional[float] | Omit = omit,
        user: str | Omit = omit,
        verbosity: Optional[Literal["low", "medium", "high"]] | Omit = omit,
        web_search_options: completion_create_params.WebSearchOptions | Omit = omit,
        extra_headers: Headers | None = None,
        extra_query: Query | None = None,
        extra_body: Body | None = None,
        timeout: float | httpx2.Timeout | None | NotGiven = not_given,
    ) -> SpeculativeChatCompletion | SpeculativeStream[ChatCompletionChunk]:
        """`/v1/chat/completions` with speculation; the openai SDK's parameters, plus `speculative` on the result."""
        return await self._create(_given(locals()))


    async def _create(self, params: dict[str, Any]) -> SpeculativeChatCompletion | SpeculativeStream[ChatCompletionChunk]:
        with _bad_request():
            kwargs, options = _request_options(params, self._runtime.request_timeout)
            messages = kwargs.pop("messages")
            if isinstance(messages, Iterable) and not isinstance(messages, (str, bytes, Mapping, Sequence)):
                messages = list(messages)  # the SDK takes any iterable of messages
            model = kwargs.pop("model", None)
            max_tokens = kwargs.pop("max_tokens", None)
            seconds = _seconds(options.get("timeout"))
            return await _deadline(self._create_checked(messages, model, max_tokens, kwargs, options), seconds, self._runtime)

    async def _create_checked(
        self, messages: Any, model: str | None, max_tokens: int | None, kwargs: dict[str, Any], options: dict[str, Any]
    ) -> SpeculativeChatCompletion | SpeculativeStream[ChatCompletionChunk]:
        runtime = self._runtime
        target = runtime.target.endpoint
        if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
            raise ConfigurationError("messages must be a non-empty list of {'role', 'content'} objects")
        for message in messages:
            if not isinstance(message, Mapping) or "role" not in message:
                raise ConfigurationError(f"each message needs a 'role', got {message!r}")
        limit_field = "max_tokens"
        if max_tokens is None:
            max_tokens = kwargs.pop("max_completion_tokens", None)
            limit_field = "max_completion_tokens"
        else:
            kwargs.pop("max_completion_tokens", None)
        sampling = _validated_sampling(kwargs, target, runtime.draft.endpoint if runtime.draft else None)
        limit = _validated_max_tokens(max_tokens, None)
        seed = _validated_seed(kwargs.get("seed"))
        stop = _stops(kwargs.get("stop"))
        stream, include_usage = _stream_options(kwargs)
        model = model or target.model
        reason = _unverifiable(kwargs, _CHAT_ARGS)
        if reason is None and not all(isinstance(m.get("content"), str) for m in messages):
            reason = "message content that is not plain text is served by the target alone"
        if reason is None and messages[-1].get("role") == "assistant":
            reason = "a final assistant message (prefill) is served by the target alone"
        if reason is not None:
            body = _with_limit({"messages": list(messages), "model": model, **kwargs}, limit_field, max_tokens)
            return await self._passthrough("/chat/completions", body, reason, options)
        extras, truncated = _request_fields(kwargs)
        sampling = replace(sampling, target_sampler_only=truncated and not sampling.greedy)
        context = Context(messages=tuple(dict(m) for m in messages), sampling=sampling, seed=seed, extras=extras, options=options)
        return await self._respond(context, limit, stop, kwargs, stream, include_usage, model)

    @staticmethod
    def _choice(text: str, finish_reason: str) -> dict[str, Any]:
        return {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None, "finish_reason": finish_reason}

    async def parse(
        self,
        *,
        messages: Iterable[ChatCompletionMessageParam],
        model: Union[str, ChatModel] | None = None,
        response_format: type[ResponseFormatT] | Omit = omit,
        tools: Iterable[ChatCompletionToolUnionParam] | Omit = omit,
        **params: Any,
    ) -> SpeculativeParsedChatCompletion[ResponseFormatT]:
        """The SDK's `chat.completions.parse`: `response_format` a pydantic model (sent as its JSON
        schema), the answer parsed into it as `message.parsed` (strict function tools likewise); the
        other arguments are `create`'s. See `specapi.structured`."""
        request, rich_format, input_tools = parse_params(_given({**params, "messages": messages, "model": model, "response_format": response_format, "tools": tools}))
        completion = await self._create(request)
        return parsed_completion(completion, rich_format, input_tools)

    def stream(
        self,
        *,
        messages: Iterable[ChatCompletionMessageParam],
        model: Union[str, ChatModel] | None = None,
        response_format: Any = omit,
        tools: Iterable[ChatCompletionToolUnionParam] | Omit = omit,
        **params: Any,
    ) -> AsyncChatCompletionStreamManager[Any]:
        """The SDK's `chat.completions.stream`: `async with client.chat.completions.stream(...) as stream`
        gives the SDK's events (`content.delta`, ...) and `get_final_completion()`, on a speculative
        stream (or the target's alone, for a `response_format`). See `specapi.structured`."""
        request, rich_format, input_tools = stream_params(_given({**params, "messages": messages, "model": model, "response_format": response_format, "tools": tools}))
        return AsyncChatCompletionStreamManager(self._create(request), response_format=rich_format, input_tools=input_tools)

