"""Calls to one role's endpoint: retries (tenacity), timing, usage metering and error naming.

Responses are kept as the JSON the server sent (dicts), since verification needs fields that the SDK's
types do not model (vLLM's `prompt_logprobs`, llama.cpp's chat-shaped completion logprobs, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import httpx2
import openai
from openai._constants import RAW_RESPONSE_HEADER
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from ._exceptions import EndpointError, MalformedResponseError, endpoint_error
from .endpoint import Endpoint
from .pricing import call_cost
from .stats import RoleUsage

__all__ = ["Meter", "RoleClient", "is_transient", "Sleep", "Clock", "TargetResponse", "capture_target_response"]

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]

_TRANSIENT_STATUS = {408, 409, 429, 500, 502, 503, 504}


def is_transient(exc: BaseException) -> bool:
    """Worth retrying: rate limits, server errors, timeouts and dropped connections."""
    if isinstance(exc, (openai.APITimeoutError, openai.APIConnectionError)):
        return True
    return isinstance(exc, openai.APIStatusError) and (exc.status_code in _TRANSIENT_STATUS or exc.status_code >= 500)


def _retry_after_seconds(exc: BaseException | None) -> float | None:
    if not isinstance(exc, openai.APIStatusError):
        return None
    value = exc.response.headers.get("retry-after-ms")
    if value is not None:
        try:
            return float(value) / 1000.0
        except ValueError:
            pass
    value = exc.response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


class TargetResponse:
    """The HTTP response of the last target call made while `capture_target_response()` is active."""

    def __init__(self) -> None:
        self.http_response: httpx2.Response | None = None


_capture: contextvars.ContextVar[TargetResponse | None] = contextvars.ContextVar("specapi_target_response", default=None)


@contextlib.contextmanager
def capture_target_response() -> Iterator[TargetResponse]:
    """Record the target's last HTTP response (for `with_raw_response`); tasks started inside share it."""
    box = TargetResponse()
    token = _capture.set(box)
    try:
        yield box
    finally:
        _capture.reset(token)


def _with_raw_header(options: Mapping[str, Any] | None) -> dict[str, Any]:
    options = dict(options or {})
    options["headers"] = {**(options.get("headers") or {}), RAW_RESPONSE_HEADER: "true"}
    return options


class wait_retry_after:
    """Wait what the server asked for (Retry-After), else back off exponentially with full jitter."""

    def __init__(self, *, initial: float = 0.2, maximum: float = 20.0, rng: random.Random | None = None) -> None:
        self._initial = initial
        self._maximum = maximum
        self._rng = rng or random.Random()

    def __call__(self, retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        asked = _retry_after_seconds(exc)
        if asked is not None:
            return min(asked, self._maximum)
        ceiling = min(self._maximum, self._initial * 2 ** (retry_state.attempt_number - 1))
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)


class Meter:
    """Adds up what one role was asked and billed for during one user request."""

    def __init__(self, endpoint: Endpoint) -> None:
        self._endpoint = endpoint
        self.requests = 0
        self.failed_requests = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.cached_tokens = 0
        self.latency_s = 0.0
        self.cost_usd: Decimal | None = Decimal(0)

    def record_attempt(self, latency_s: float, *, failed: bool) -> None:
        self.requests += 1
        self.failed_requests += failed
        self.latency_s += latency_s

    def record_usage(self, usage: Mapping[str, Any] | None) -> None:
        if not usage:
            self.cost_usd = None  # billed, but by how much is unknown: never report it as free
            return
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
        self.prompt_tokens += prompt
        self.completion_tokens += completion
        self.cached_tokens += cached
        cost = call_cost(self._endpoint, prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)
        self.cost_usd = None if cost is None or self.cost_usd is None else self.cost_usd + cost

    def snapshot(self) -> RoleUsage:
        return RoleUsage(
            requests=self.requests,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            cached_tokens=self.cached_tokens,
            latency_s=self.latency_s,
            cost_usd=self.cost_usd,
            failed_requests=self.failed_requests,
        )


def _is_native(result: Mapping[str, Any]) -> bool:
    """A native answer that bills in its own fields (llama.cpp's `/completion`, SGLang's `/generate`)."""
    return "tokens_evaluated" in result or "meta_info" in result or ("tokens" in result and "choices" not in result)


def _native_usage(results: list[Any]) -> dict[str, int] | None:
    """OpenAI-shaped usage summed over native results: llama.cpp's `tokens_evaluated`/`tokens_predicted`,
    SGLang's `meta_info.prompt_tokens`/`completion_tokens`; None when a result shows neither."""
    prompt = completion = 0
    for result in results:
        if not isinstance(result, Mapping):
            return None
        meta = result.get("meta_info")
        if isinstance(meta, Mapping) and isinstance(meta.get("prompt_tokens"), int):
            prompt += int(meta["prompt_tokens"])
            completion += int(meta.get("completion_tokens") or 0)
        elif isinstance(result.get("tokens_evaluated"), int):
            prompt += int(result["tokens_evaluated"])
            completion += int(result.get("tokens_predicted") or 0)
        elif "tokens" in result and "choices" not in result:
            return {"prompt_tokens": 0, "completion_tokens": 0}  # /tokenize: nothing billed
        else:
            return None
    return {"prompt_tokens": prompt, "completion_tokens": completion}


@dataclass
class RoleClient:
    """One role's endpoint, with the SDK client built once and shared by all requests."""

    role: str
    endpoint: Endpoint
    sleep: Sleep = asyncio.sleep
    clock: Clock = time.perf_counter

    def __post_init__(self) -> None:
        self._client: openai.AsyncOpenAI | None = None

    @property
    def sdk(self) -> openai.AsyncOpenAI:
        if self._client is None:
            self._client = self.endpoint.build_client()
        return self._client

    def error(
        self, message: str, *, status_code: int | None = None, malformed: bool = False, cause: BaseException | None = None
    ) -> EndpointError:
        """The error naming this role and endpoint; also an instance of `cause`'s SDK class if it has one."""
        if malformed:
            return MalformedResponseError(message, role=self.role, endpoint=self.endpoint.label, status_code=status_code)
        return endpoint_error(message, role=self.role, endpoint=self.endpoint.label, status_code=status_code, cause=cause)

    def _body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        merged = dict(self.endpoint.extra_body or {})
        merged.update(body)
        merged.setdefault("model", self.endpoint.model)
        return merged

    async def post(
        self,
        path: str,
        body: Mapping[str, Any],
        meter: Meter,
        *,
        retries: int | None = None,
        options: Mapping[str, Any] | None = None,
        array_ok: bool = False,
    ) -> Any:
        """POST `body` (plus the endpoint's extras) and return the JSON; retry transient failures.

        `options` are the SDK's request options (`headers`, `params`, `timeout`) for this call.
        """
        payload = self._body(body)
        attempts = 1 + (self.endpoint.max_retries if retries is None else retries)
        retrying = AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait_retry_after(),
            retry=retry_if_exception(is_transient),
            sleep=self.sleep,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    result = await self._post_once(path, payload, meter, options)
        except openai.APIStatusError as exc:
            raise self.error(f"HTTP {exc.status_code}: {exc.message}", status_code=exc.status_code, cause=exc) from exc
        except openai.APIError as exc:
            raise self.error(f"{type(exc).__name__}: {exc}", cause=exc) from exc
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            raise self.error(f"unreadable response body ({exc})", malformed=True) from exc
        if isinstance(result, list) and array_ok:
            # A native multi-prompt answer (llama.cpp's /completion): one result per prompt, unbilled
            # in OpenAI's terms; what each evaluated and generated is its bill.
            meter.record_usage(_native_usage(result))
            return result
        if not isinstance(result, dict):
            raise self.error(f"expected a JSON object, got {type(result).__name__}", malformed=True)
        meter.record_usage(result.get("usage") if "usage" in result or not _is_native(result) else _native_usage([result]))
        return result

    async def get(self, path: str, meter: Meter) -> Any:
        """GET a JSON document (no retries: used to learn what a server is)."""
        started = self.clock()
        try:
            result = await self.sdk.get(path, cast_to=object)
        except openai.APIStatusError as exc:
            meter.record_attempt(self.clock() - started, failed=True)
            raise self.error(f"HTTP {exc.status_code}: {exc.message}", status_code=exc.status_code, cause=exc) from exc
        except openai.APIError as exc:
            meter.record_attempt(self.clock() - started, failed=True)
            raise self.error(f"{type(exc).__name__}: {exc}", cause=exc) from exc
        meter.record_attempt(self.clock() - started, failed=False)
        return result

    async def _post_once(self, path: str, payload: dict[str, Any], meter: Meter, options: Mapping[str, Any] | None = None) -> Any:
        started = self.clock()
        box = _capture.get() if self.role == "target" else None
        try:
            if box is None:
                result = await self.sdk.post(path, body=payload, cast_to=object, options=dict(options or {}))
            else:
                raw = await self.sdk.post(path, body=payload, cast_to=object, options=_with_raw_header(options))
                result = raw.parse()
                box.http_response = raw.http_response
        except BaseException:
            meter.record_attempt(self.clock() - started, failed=True)
            raise
        meter.record_attempt(self.clock() - started, failed=False)
        return result

    async def stream(
        self, path: str, body: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """POST with `stream: true` and yield each JSON chunk.

        Opening the stream is retried like `post`; once a chunk has arrived nothing is retried (the
        text would repeat). Closing the generator early closes the upstream response.
        """
        payload = self._body(body)
        payload["stream"] = True
        retrying = AsyncRetrying(
            stop=stop_after_attempt(1 + self.endpoint.max_retries),
            wait=wait_retry_after(),
            retry=retry_if_exception(is_transient),
            sleep=self.sleep,
            reraise=True,
        )
        started = self.clock()
        try:
            async for attempt in retrying:
                with attempt:
                    started = self.clock()
                    try:
                        stream = await self.sdk.post(
                            path, body=payload, cast_to=object, stream=True, stream_cls=openai.AsyncStream[object], options=dict(options or {})
                        )
                    except BaseException:
                        meter.record_attempt(self.clock() - started, failed=True)
                        raise
        except openai.APIStatusError as exc:
            raise self.error(f"HTTP {exc.status_code}: {exc.message}", status_code=exc.status_code, cause=exc) from exc
        except openai.APIError as exc:
            raise self.error(f"{type(exc).__name__}: {exc}", cause=exc) from exc
        box = _capture.get() if self.role == "target" else None
        if box is not None:
            box.http_response = stream.response
        failed = True
        usage_seen = False
        last: dict[str, Any] | None = None
        try:
            async for chunk in stream:
                if isinstance(chunk, dict):
                    last = chunk
                    if chunk.get("usage"):
                        usage_seen = True
                        meter.record_usage(chunk["usage"])
                    yield chunk
            failed = False
            if not usage_seen and last is not None and _is_native(last) and last.get("stop"):
                usage_seen = True  # llama.cpp's native stream bills in its last chunk
                meter.record_usage(_native_usage([last]))
        except openai.APIError as exc:
            raise self.error(f"stream broke: {exc}", cause=exc) from exc
        finally:
            await stream.close()
            meter.record_attempt(self.clock() - started, failed=failed)
            if not usage_seen:
                meter.record_usage(None)
