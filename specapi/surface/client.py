"""`AsyncSpeculativeOpenAI`: the drop-in async client with the openai SDK's call shapes (its sync twin
is `specapi.surface.sync.SpeculativeOpenAI`).

    client = AsyncSpeculativeOpenAI(target=Endpoint(...), draft=Endpoint(...))
    resp = await client.completions.create(prompt="...", max_tokens=64, temperature=0)
    chat = await client.chat.completions.create(messages=[...], max_tokens=64)

Arguments are checked before any request is sent. Requests that speculation cannot serve exactly
(tools, n > 1, logit_bias, penalties, ...) go to the target unchanged and say so in `resp.speculative`.

The resources here are thin: the parameters are declared once in `dialects.openai_params` (shared with
the sync client), checked in `validation`, served by `generation` (speculating) or `passthrough`
(the target alone), on the client's `runtime.Runtime`.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, Optional, overload

import httpx2
import openai
from openai import NotGiven, Omit, not_given, omit
from openai.lib.streaming.chat import AsyncChatCompletionStreamManager
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk, completion_create_params
from typing_extensions import Unpack

from ..transport._calls import Clock, Meter, Sleep
from ..transport._exceptions import ConfigurationError
from ..transport._sdk import ResponseFormatT, http_client_of, sdk_beta
from .checks import DEFAULT_CHECK_TIMEOUT, EndpointStatus, check_endpoint
from .call_options import deadline, request_options, seconds, with_sdk_options
from ..core.context import Context
from ..dialects.logprobs import caller_logprobs
from ..dialects.openai_params import ChatCompletionCreateParams, ChatCompletionParseParams, CompletionCreateParams, declared
from ..parts.drafters import Drafter
from ..transport.endpoint import Endpoint, check_roles
from .generation import choice_count, respond
from ..transport.models import AsyncModels
from .passthrough import passthrough
from ..parts.policy import DraftLengthPolicy
from .raw import AsyncRawCreate, AsyncStreamingCreate
from .runtime import Runtime, acceptance_rule, build_policy
from .sdk_post import Beta, resource_for, sdk_request
from .streaming import SpeculativeStream
from .structured import helper_arguments, parse_params, parsed_completion, stream_params
from ..parts.suffix import SuffixIndex
from ..core.types import SpeculativeChatCompletion, SpeculativeCompletion, SpeculativeParsedChatCompletion
from .validation import (
    CHAT_ARGS,
    COMPLETION_ARGS,
    bad_request,
    given_arguments,
    request_fields,
    sendable,
    stops,
    stream_options,
    unverifiable,
    validated_max_tokens,
    validated_sampling,
    validated_seed,
    with_limit,
)

__all__ = ["AsyncSpeculativeOpenAI", "AsyncCompletions", "AsyncChatCompletions", "given_arguments"]



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
        verification: "auto" (default: completions echo; vLLM's prompt scoring for chat) or "none"
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
        timeout, max_retries, default_headers: the openai SDK client's own options, applied to both
            endpoints: `timeout` (seconds, an `httpx2.Timeout`, or None for none) is the default of every
            call, as `with_options(timeout=)` sets it (it bounds each upstream request and the whole call);
            `max_retries` replaces each endpoint's; `default_headers` go with every upstream request
            (an endpoint's own `headers` win where both name a header).

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
        timeout: float | httpx2.Timeout | None | NotGiven = not_given,
        max_retries: int | NotGiven = not_given,
        default_headers: Mapping[str, str] | None = None,
    ) -> None:
        check_roles(target, draft)
        sdk_options: dict[str, Any] = {"timeout": timeout, "max_retries": max_retries, "default_headers": default_headers}
        target = with_sdk_options(target, **sdk_options)  # checks them, before any request
        draft = with_sdk_options(draft, **sdk_options) if draft is not None else None
        self._runtime = Runtime(
            target=target,
            draft=draft,
            drafter=drafter,
            policy=build_policy(policy, num_speculative_tokens),
            verification=verification,
            pipeline=pipeline,
            sleep=sleep,
            clock=clock,
            suffix_index=suffix_index,
            acceptance=acceptance_rule(acceptance, acceptance_threshold, typical_epsilon, typical_delta),
        )
        self._runtime.request_timeout = timeout
        self._runtime.warm()  # at construction, not in the first request (0.3 s once per process)
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
    def beta(self) -> Beta:  # type: ignore[override]
        return Beta(self.chat, lambda: sdk_beta(openai.AsyncOpenAI, self))

    def __getattr__(self, name: str) -> Any:
        # `__init__` does not run `openai.AsyncOpenAI.__init__`: the SDK half (its `api_key`, `base_url`,
        # HTTP client, `files`, `embeddings`, ...) needs the target's SDK client, which costs about 20 ms
        # to build and which speculating requests build only when they need it. Python calls
        # `__getattr__` only for an attribute the instance and its classes lack, so specapi's own
        # attributes never come here: the first SDK attribute read runs the SDK's `__init__` once
        # (`_sdk_init`), then reads the attribute again. Dunder names and an instance still in its own
        # `__init__` (no `_runtime` yet) get the plain AttributeError.
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
            default_headers=dict(self.target.headers) if self.target.headers else None,
            http_client=http_client_of(sdk),
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
            seconds(timeout)  # checked now, not at the first call
        copy = AsyncSpeculativeOpenAI(**options)
        if same_endpoints:
            copy._owns_connections = False  # closing the copy leaves this client's connections open
            copy._runtime.target.share_connections(self._runtime.target)
            if copy._runtime.draft is not None and self._runtime.draft is not None:
                copy._runtime.draft.share_connections(self._runtime.draft)
            copy._runtime.paths.capabilities = self._runtime.paths.capabilities
            copy._runtime.warnings = self._runtime.warnings  # a failure logged once, whichever copy met it
        copy._runtime.request_timeout = timeout if not isinstance(timeout, NotGiven) else self._runtime.request_timeout
        return copy

    copy = with_options  # type: ignore[assignment]

    async def post(self, path: str, *, cast_to: Any, body: Any = None, options: Any = None, stream: bool = False, **rest: Any) -> Any:  # type: ignore[override]
        """The SDK's low-level POST (LiteLLM sends through it): `/completions` and `/chat/completions`
        go through `create` and speculate; any other path goes to the target as the SDK sends it."""
        resource = resource_for(self, path)
        if resource is None or not isinstance(body, Mapping) or rest.get("files"):
            return await openai.AsyncOpenAI.post(self, path, cast_to=cast_to, body=body, options=options or {}, stream=stream, **rest)
        params, raw = sdk_request(resource, body, options)
        if raw:
            return await resource.with_raw_response.create(**params)
        return await resource.create(**params)

    async def check_endpoints(self, *, timeout: float = DEFAULT_CHECK_TIMEOUT) -> tuple[EndpointStatus, ...]:
        """Whether each endpoint answers and serves its model (`specapi.surface.checks`): one `EndpointStatus`
        per role, the target's first, each with the problem if there is one. Worth calling at start-up:
        a draft that does not answer (a mistyped model, a server down) otherwise shows only as answers
        written by the target alone, and one logged warning."""
        roles = [role for role in (self._runtime.target, self._runtime.draft) if role is not None]
        problems = await asyncio.gather(*(check_endpoint(role, timeout=timeout) for role in roles))
        return tuple(EndpointStatus(role.role, role.endpoint.label, problem) for role, problem in zip(roles, problems))

    async def _warm(self) -> None:
        """What a long-running server does before its first request (see `Runtime.warm`)."""
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


class _AsyncChat:
    def __init__(self, runtime: Runtime) -> None:
        self.completions = AsyncChatCompletions(runtime)


class _Resource:
    """What completions and chat completions share: the runtime, the raw-response views, and the
    checks around a call."""

    chat: bool = False

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime

    def _parse_call(self) -> Any:
        """`parse` where the resource has one (chat)."""
        return None

    @property
    def with_raw_response(self) -> AsyncRawCreate:
        """`.with_raw_response.create(...)`: the same call, returning a `RawResponse` (`.headers`, `.parse()`)."""
        return AsyncRawCreate(self.create, self._parse_call())  # type: ignore[attr-defined]

    @property
    def with_streaming_response(self) -> AsyncStreamingCreate:
        """`async with .with_streaming_response.create(...) as response:` then `await response.parse()`."""
        return AsyncStreamingCreate(self.create, self._parse_call())  # type: ignore[attr-defined]

    async def _create(self, params: dict[str, Any]) -> Any:
        """Check the call's options and bound it by its timeout; `_served` does the rest."""
        with bad_request():
            kwargs, options = request_options(params, self._runtime.request_timeout)
            sendable(kwargs)
            limit = seconds(options.get("timeout"))
            return await deadline(self._served(kwargs, options), limit, self._runtime.target)

    async def _served(self, kwargs: dict[str, Any], options: dict[str, Any]) -> Any:
        raise NotImplementedError

    async def _speculate(self, context: Context, limit: int | None, stop: tuple[str, ...], kwargs: Mapping[str, Any], model: str) -> Any:
        stream, include_usage = stream_options(kwargs)
        return await respond(self._runtime, self.chat, context, limit=limit, stop=stop, kwargs=kwargs, stream=stream, include_usage=include_usage, model=model)

    async def _choices_reason(self, kwargs: Mapping[str, Any], greedy: bool) -> str | None:
        """Why several greedy choices go to the target alone: its server refuses them (its own error is
        the answer), or None."""
        if not greedy or choice_count(kwargs.get("n")) <= 1:  # (a bad n is refused here, before any request)
            return None
        known = await self._runtime.paths.probed(Meter(self._runtime.target.endpoint))
        if known is not None and known.refuses_greedy_choices:
            return "n above 1 with greedy sampling is served by the target alone (its server refuses it)"
        return None

    async def _alone(self, path: str, body: dict[str, Any], reason: str, options: Mapping[str, Any]) -> Any:
        return await passthrough(self._runtime, self.chat, path, body, reason, options)


class AsyncCompletions(_Resource):
    """`client.completions`: `/v1/completions` with speculation."""

    @overload
    async def create(self, *, stream: Optional[Literal[False]] | Omit = omit, **params: Unpack[CompletionCreateParams]) -> SpeculativeCompletion: ...
    @overload
    async def create(self, *, stream: Literal[True], **params: Unpack[CompletionCreateParams]) -> SpeculativeStream[Completion]: ...

    @declared(CompletionCreateParams)
    async def create(self, **params: Any) -> SpeculativeCompletion | SpeculativeStream[Completion]:
        """`/v1/completions` with speculation; the openai SDK's parameters, plus `speculative` on the result."""
        return await self._create(given_arguments(params))

    async def _served(self, kwargs: dict[str, Any], options: dict[str, Any]) -> SpeculativeCompletion | SpeculativeStream[Completion]:
        runtime = self._runtime
        target = runtime.target.endpoint
        prompt = kwargs.pop("prompt")
        model = kwargs.pop("model", None) or target.model
        max_tokens = kwargs.pop("max_tokens", None)
        sampling = validated_sampling(kwargs, target, runtime.draft.endpoint if runtime.draft else None)
        # max_tokens=0 with echo scores the prompt alone: the target answers as it does, 200 or its own 400.
        scores_only = max_tokens == 0 and not isinstance(max_tokens, bool) and kwargs.get("echo") is True
        # None: the caller set none, and the server's own default applies (OpenAI's and vLLM's 16, llama-server's
        # to the end of the context), on every path.
        limit = 0 if scores_only else validated_max_tokens(max_tokens, None)
        seed = validated_seed(kwargs.get("seed"))
        stop = stops(kwargs.get("stop"))
        stream_options(kwargs)
        if scores_only:
            return await self._alone("/completions", {"prompt": prompt, "model": model, "max_tokens": 0, **kwargs}, "max_tokens=0 with echo (the prompt scored) is served by the target alone", options)
        if not isinstance(prompt, str):
            if isinstance(prompt, list) and prompt:
                return await self._alone("/completions", with_limit({"prompt": prompt, "model": model, **kwargs}, "max_tokens", limit), "a list prompt (batch or token ids) is served by the target alone", options)
            raise ConfigurationError(f"prompt must be a string, got {type(prompt).__name__}")
        asked = kwargs.get("logprobs")
        if isinstance(asked, int) and not isinstance(asked, bool) and asked < 0:
            # vLLM reads -1 as every token's logprobs; other servers refuse it: the target's to answer.
            reason = "logprobs below 0 (vLLM's -1: every token's) is served by the target alone"
            return await self._alone("/completions", with_limit({"prompt": prompt, "model": model, **kwargs}, "max_tokens", limit), reason, options)
        speculated = dict(kwargs)  # the caller's logprobs are the engine's to ask for (Context.logprobs)
        logprobs = caller_logprobs(False, speculated)
        reason = unverifiable(speculated, COMPLETION_ARGS) or await self._choices_reason(kwargs, sampling.greedy)
        if reason is not None:
            return await self._alone("/completions", with_limit({"prompt": prompt, "model": model, **kwargs}, "max_tokens", limit), reason, options)
        extras, truncated = request_fields(speculated)
        sampling = replace(sampling, target_sampler_only=truncated and not sampling.greedy)
        context = Context(prompt=prompt, sampling=sampling, seed=seed, extras=extras, options=options, logprobs=logprobs)
        return await self._speculate(context, limit, stop, kwargs, model)


class AsyncChatCompletions(_Resource):
    """`client.chat.completions`: `/v1/chat/completions` with speculation."""

    chat = True

    @overload
    async def create(self, *, stream: Optional[Literal[False]] | Omit = omit, **params: Unpack[ChatCompletionCreateParams]) -> SpeculativeChatCompletion: ...
    @overload
    async def create(self, *, stream: Literal[True], **params: Unpack[ChatCompletionCreateParams]) -> SpeculativeStream[ChatCompletionChunk]: ...

    @declared(ChatCompletionCreateParams)
    async def create(self, **params: Any) -> SpeculativeChatCompletion | SpeculativeStream[ChatCompletionChunk]:
        """`/v1/chat/completions` with speculation; the openai SDK's parameters, plus `speculative` on the result."""
        return await self._create(given_arguments(params))

    def _parse_call(self) -> Any:
        return self.parse

    async def _served(self, kwargs: dict[str, Any], options: dict[str, Any]) -> SpeculativeChatCompletion | SpeculativeStream[ChatCompletionChunk]:
        runtime = self._runtime
        target = runtime.target.endpoint
        messages = kwargs.pop("messages")
        if isinstance(messages, Iterable) and not isinstance(messages, (str, bytes, Mapping, Sequence)):
            messages = list(messages)  # the SDK takes any iterable of messages
        model = kwargs.pop("model", None) or target.model
        max_tokens = kwargs.pop("max_tokens", None)
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
        sampling = validated_sampling(kwargs, target, runtime.draft.endpoint if runtime.draft else None)
        limit = validated_max_tokens(max_tokens, None)
        seed = validated_seed(kwargs.get("seed"))
        stop = stops(kwargs.get("stop"))
        stream_options(kwargs)
        speculated = dict(kwargs)  # the caller's logprobs are the engine's to ask for (Context.logprobs)
        logprobs = caller_logprobs(True, speculated)
        reason = unverifiable(speculated, CHAT_ARGS) or await self._choices_reason(kwargs, sampling.greedy)
        if reason is None and not all(isinstance(m.get("content"), str) for m in messages):
            reason = "message content that is not plain text is served by the target alone"
        if reason is None and messages[-1].get("role") == "assistant":
            reason = "a final assistant message (prefill) is served by the target alone"
        if reason is not None:
            body = with_limit({"messages": list(messages), "model": model, **kwargs}, limit_field, max_tokens)
            return await self._alone("/chat/completions", body, reason, options)
        extras, truncated = request_fields(speculated)
        sampling = replace(sampling, target_sampler_only=truncated and not sampling.greedy)
        context = Context(messages=tuple(dict(m) for m in messages), sampling=sampling, seed=seed, extras=extras, options=options, logprobs=logprobs)
        return await self._speculate(context, limit, stop, kwargs, model)

    async def parse(
        self, *, response_format: type[ResponseFormatT] | Omit = omit, **params: Unpack[ChatCompletionParseParams]
    ) -> SpeculativeParsedChatCompletion[ResponseFormatT]:
        """The SDK's `chat.completions.parse`: `response_format` a pydantic model (sent as its JSON
        schema), the answer parsed into it as `message.parsed` (strict function tools likewise); the
        other arguments are `create`'s. See `specapi.surface.structured`."""
        request, rich_format, input_tools = parse_params(given_arguments(helper_arguments(params, response_format)))
        completion = await self._create(request)
        return parsed_completion(completion, rich_format, input_tools)

    def stream(
        self,
        *,
        response_format: completion_create_params.ResponseFormat | type[ResponseFormatT] | Omit = omit,
        **params: Unpack[ChatCompletionParseParams],
    ) -> AsyncChatCompletionStreamManager[ResponseFormatT]:
        """The SDK's `chat.completions.stream`: `async with client.chat.completions.stream(...) as stream`
        gives the SDK's events (`content.delta`, ...) and `get_final_completion()`, on a speculative
        stream (or the target's alone, for a `response_format`). See `specapi.surface.structured`."""
        request, rich_format, input_tools = stream_params(given_arguments(helper_arguments(params, response_format)))
        return AsyncChatCompletionStreamManager(self._create(request), response_format=rich_format, input_tools=input_tools)
