"""Calls to one role's endpoint: retries (tenacity), timing, usage metering and error naming.

The calls go over the lean transport of `_http` (aiohttp, or an injected `httpx2` client), configured
like the endpoint's SDK client (base URL, key, headers, timeout); failures are turned into the SDK's
own error classes with the SDK's own messages, so callers see what they saw when the SDK sent them.
The first attempt runs without the retry machinery; tenacity takes over after a transient failure.

Responses are kept as the JSON the server sent (dicts), since verification needs fields that the SDK's
types do not model (vLLM's prompt scores, llama.cpp's chat-shaped completion logprobs, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from decimal import Decimal
from typing import Any, TypeVar
from urllib.parse import urlencode

import httpx2
import openai
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception, stop_after_attempt

from ._http import AiohttpTransport, HTTPTransport, Httpx2Transport, Reply, SSEDecoder, Timeout, dumps, timeout_of
from ._exceptions import EndpointError, MalformedResponseError, endpoint_error
from ._sdk import status_error
from .endpoint import Endpoint
from . import _json as fast_json
from ..core import answer_keys
from ..core.load import LoadCurve
from .pricing import call_cost
from ..core.stats import RoleUsage

__all__ = ["Meter", "RoleClient", "is_transient", "Sleep", "Clock", "TargetResponse", "capture_target_response"]

Sleep = Callable[[float], Awaitable[None]]
Clock = Callable[[], float]
T = TypeVar("T")

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


#: The jitter of every backoff without an `rng` of its own: one generator, not one seeded from the
#: system's entropy for each call (made for every stream opened, and as costly as a streamed chunk).
_JITTER = random.Random()


class wait_retry_after:
    """Wait what the server asked for (Retry-After), else back off exponentially with full jitter."""

    def __init__(self, *, initial: float = 0.2, maximum: float = 20.0, rng: random.Random | None = None, offset: int = 0) -> None:
        self._offset = offset
        self._initial = initial
        self._maximum = maximum
        self._rng = rng or _JITTER

    def __call__(self, retry_state: RetryCallState) -> float:
        exc = retry_state.outcome.exception() if retry_state.outcome else None
        # `offset` attempts ran before tenacity's loop began (see `RoleClient.post`).
        return self._wait(exc, retry_state.attempt_number + self._offset)

    def first(self, exc: BaseException) -> float:
        """The wait after the first attempt failed with `exc`."""
        return self._wait(exc, 1)

    def _wait(self, exc: BaseException | None, attempt: int) -> float:
        asked = _retry_after_seconds(exc)
        if asked is not None:
            return min(asked, self._maximum)
        ceiling = min(self._maximum, self._initial * 2 ** (attempt - 1))
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)


#: The OpenAI paths whose answers show the target alone's fields (`answer_keys`): whether each is chat.
_ANSWER_PATHS = {"/completions": False, "/chat/completions": True}


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
        #: The usage object of the last call that reported one, as the server sent it (every field).
        self.last_usage: Mapping[str, Any] | None = None
        #: `prompt_tokens_details.cached_tokens` of the first call that reported it (what the server held cached
        #: of the request's prompt when it first read it).
        self.first_cached: int | None = None

    def record_attempt(self, latency_s: float, *, failed: bool) -> None:
        self.requests += 1
        self.failed_requests += failed
        self.latency_s += latency_s

    def record_usage(self, usage: Mapping[str, Any] | None) -> None:
        self.last_usage = usage
        if not usage:
            self.cost_usd = None  # billed, but by how much is unknown: never report it as free
            return
        prompt = int(usage.get("prompt_tokens") or 0)
        completion = int(usage.get("completion_tokens") or 0)
        details = usage.get("prompt_tokens_details") or {}
        cached = int(details.get("cached_tokens") or 0) if isinstance(details, Mapping) else 0
        if self.first_cached is None and isinstance(details, Mapping) and "cached_tokens" in details:
            self.first_cached = cached
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
class _Wire:
    """How a role reaches its endpoint: the transport, the base URL, the headers and the timeout."""

    transport: HTTPTransport
    base_url: str
    headers: dict[str, str]
    timeout: Timeout
    owned: bool

    def url(self, path: str, params: Mapping[str, Any] | None) -> str:
        url = path if path.startswith(("http://", "https://")) else self.base_url + path.lstrip("/")
        if params:
            url += ("&" if "?" in url else "?") + urlencode(dict(params), doseq=True)
        return url

    def call_headers(self, extra: Mapping[str, Any] | None) -> Mapping[str, str]:
        if not extra:
            return self.headers
        merged = dict(self.headers)
        for name, value in extra.items():
            for existing in [k for k in merged if k.lower() == name.lower()]:
                del merged[existing]
            if isinstance(value, str):
                merged[name] = value  # the SDK's Omit() removes a header
        return merged


def _wire_for(sdk: openai.AsyncOpenAI, endpoint: Endpoint) -> _Wire:
    """The lean path for an endpoint, configured like its SDK client (URL, key, headers, timeout)."""
    injected = endpoint.http_client if endpoint.http_client is not None else getattr(endpoint.client, "_client", None)
    headers = {k: v for k, v in {**sdk.default_headers, **sdk.auth_headers}.items() if isinstance(v, str)}
    base_url = str(sdk.base_url)
    base_url = base_url if base_url.endswith("/") else base_url + "/"
    timeout = timeout_of(sdk.timeout)
    if isinstance(injected, httpx2.AsyncClient):
        return _Wire(Httpx2Transport(injected), base_url, headers, timeout, owned=False)
    return _Wire(AiohttpTransport(), base_url, headers, timeout, owned=True)


def _parse(reply: Reply) -> Any:
    """The body as the SDK reads it for `cast_to=object`: JSON when the server says JSON, else text."""
    content_type = reply.headers.get("content-type", "*").split(";")[0]
    if not content_type.endswith("json"):
        return reply.body.decode("utf-8", errors="replace")
    return fast_json.loads(reply.body)


@dataclass
class RoleClient:
    """One role's endpoint: a lean HTTP transport for the calls, the SDK client for the rest (models)."""

    role: str
    endpoint: Endpoint
    sleep: Sleep = asyncio.sleep
    clock: Clock = time.perf_counter

    def __post_init__(self) -> None:
        self._client: openai.AsyncOpenAI | None = None
        self._wire: _Wire | None = None
        #: How this upstream's call latency grows with the requests in flight (see `specapi.core.load`).
        self.load = LoadCurve()

    @property
    def sdk(self) -> openai.AsyncOpenAI:
        if self._client is None:
            self._client = self.endpoint.build_client()
        return self._client

    @property
    def wire(self) -> _Wire:
        if self._wire is None:
            self._wire = _wire_for(self.sdk, self.endpoint)
        return self._wire

    @property
    def base_url(self) -> str:
        return self.wire.base_url

    def share_connections(self, other: RoleClient) -> None:
        """Use `other`'s connections (a copy of a client, or another model on the same server)."""
        self._client = other.sdk
        self._wire = replace(other.wire, owned=False)
        self.load = other.load

    def apart(self) -> RoleClient:
        """The same endpoint and connections, with calls left out of the load curve: for calls unlike a
        generation's (the capability probe's tiny requests would bend the line a burst's first rounds read)."""
        copy = RoleClient(self.role, self.endpoint, sleep=self.sleep, clock=self.clock)
        copy.share_connections(self)
        copy.load = LoadCurve()
        return copy

    async def aclose(self) -> None:
        """Close the connections this role owns (not an SDK client or an `httpx2` client it was given)."""
        if self._wire is not None and self._wire.owned:
            await self._wire.transport.aclose()
        if self._client is not None and self.endpoint.client is None:
            await self._client.close()

    def error(
        self, message: str, *, status_code: int | None = None, malformed: bool = False, cause: BaseException | None = None
    ) -> EndpointError:
        """The error naming this role and endpoint; also an instance of `cause`'s SDK class if it has one."""
        if malformed:
            return self.malformed(message, status_code=status_code)
        return endpoint_error(message, role=self.role, endpoint=self.endpoint.label, status_code=status_code, cause=cause)

    def malformed(self, message: str, *, status_code: int | None = None) -> MalformedResponseError:
        """The error for an answer that lacks or contradicts what was asked (`dialects.reading` maps
        the errors of reading one into it)."""
        return MalformedResponseError(message, role=self.role, endpoint=self.endpoint.label, status_code=status_code)

    def _status_error(self, reply: Reply) -> openai.APIStatusError:
        return status_error(self.sdk, reply.http_response())

    def _body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        merged = dict(self.endpoint.extra_body or {})
        merged.update(body)
        merged.setdefault("model", self.endpoint.model)
        return merged

    def _retrying(self, attempts: int, *, offset: int = 0) -> AsyncRetrying:
        """Tenacity's loop: `attempts` tries, waiting what the server asks or backing off with jitter;
        `offset` attempts already ran before it."""
        return AsyncRetrying(
            stop=stop_after_attempt(attempts),
            wait=wait_retry_after(offset=offset),
            retry=retry_if_exception(is_transient),
            sleep=self.sleep,
            reraise=True,
        )

    async def _attempts(self, once: Callable[[], Awaitable[T]], attempts: int) -> T:
        """`once()`, tried up to `attempts` times while it fails transiently, waiting what the server asks
        or backing off with jitter. The first try runs without tenacity's loop (the common case: in a
        profile of the proxy on one-token streams its machinery was 6% of the CPU), which takes over
        after a transient failure."""
        try:
            return await once()
        except BaseException as exc:
            if attempts <= 1 or not is_transient(exc):
                raise
            wait = wait_retry_after().first(exc)
        await self.sleep(wait)
        result: T
        async for attempt in self._retrying(attempts - 1, offset=1):
            with attempt:
                result = await once()
        return result

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
        data = dumps(self._body(body))
        attempts = 1 + (self.endpoint.max_retries if retries is None else retries)
        try:
            result = await self._attempts(lambda: self._post_once(path, data, meter, options), attempts)
        except openai.APIStatusError as exc:
            raise self.error(f"HTTP {exc.status_code}: {exc.message}", status_code=exc.status_code, cause=exc) from exc
        except openai.APIError as exc:
            raise self.error(f"{type(exc).__name__}: {exc}", cause=exc) from exc
        except (json.JSONDecodeError, UnicodeDecodeError, ValueError) as exc:
            raise self.malformed(f"unreadable response body ({exc})") from exc
        if isinstance(result, list) and array_ok:
            # A native multi-prompt answer (llama.cpp's /completion): one result per prompt, unbilled
            # in OpenAI's terms; what each evaluated and generated is its bill.
            meter.record_usage(_native_usage(result))
            return result
        if not isinstance(result, dict):
            raise self.malformed(f"expected a JSON object, got {type(result).__name__}")
        meter.record_usage(result.get("usage") if "usage" in result or not _is_native(result) else _native_usage([result]))
        if self.role == "target" and path in _ANSWER_PATHS:
            key = (self.endpoint.base_url, body.get("model") or self.endpoint.model)
            answer_keys.learn(key, _ANSWER_PATHS[path], result, logprobs=bool(body.get("logprobs")))
        return result

    async def get(self, path: str, meter: Meter, *, timeout: float | None = None) -> Any:
        """GET a JSON document (no retries: used to learn what a server is); `timeout`: seconds, else the endpoint's."""
        wire = self.wire
        started = self.clock()
        try:
            limit = wire.timeout if timeout is None else timeout_of(timeout)
            reply = await wire.transport.send("GET", wire.url(path, None), wire.headers, None, limit)
            if not 200 <= reply.status < 300:
                raise self._status_error(reply)
            result = _parse(reply)
        except openai.APIStatusError as exc:
            meter.record_attempt(self.clock() - started, failed=True)
            raise self.error(f"HTTP {exc.status_code}: {exc.message}", status_code=exc.status_code, cause=exc) from exc
        except openai.APIError as exc:
            meter.record_attempt(self.clock() - started, failed=True)
            raise self.error(f"{type(exc).__name__}: {exc}", cause=exc) from exc
        meter.record_attempt(self.clock() - started, failed=False)
        return result

    async def _post_once(self, path: str, data: bytes, meter: Meter, options: Mapping[str, Any] | None = None) -> Any:
        wire = self.wire
        load = self.load.requests
        started = self.clock()
        box = _capture.get() if self.role == "target" else None
        try:
            if options:
                url = wire.url(path, options.get("params"))
                headers = wire.call_headers(options.get("headers"))
                timeout = timeout_of(options["timeout"]) if "timeout" in options else wire.timeout
            else:
                url, headers, timeout = wire.url(path, None), wire.headers, wire.timeout
            reply = await wire.transport.send("POST", url, headers, data, timeout)
            if not 200 <= reply.status < 300:
                raise self._status_error(reply)
            result = _parse(reply)
        except BaseException:
            meter.record_attempt(self.clock() - started, failed=True)
            raise
        latency = self.clock() - started
        meter.record_attempt(latency, failed=False)
        self.load.add(load, latency)
        if box is not None:
            box.http_response = reply.http_response()
        return result

    async def _open_stream(self, path: str, data: bytes, meter: Meter, options: Mapping[str, Any] | None) -> tuple[Reply, float]:
        wire = self.wire
        options = options or {}
        url = wire.url(path, options.get("params"))
        headers = wire.call_headers(options.get("headers"))
        timeout = timeout_of(options["timeout"]) if "timeout" in options else wire.timeout
        started = self.clock()
        try:
            reply = await wire.transport.stream("POST", url, headers, data, timeout)
            if not 200 <= reply.status < 300:
                try:
                    await reply.read()
                finally:
                    await reply.close()
                raise self._status_error(reply)
        except BaseException:
            meter.record_attempt(self.clock() - started, failed=True)
            raise
        return reply, started

    async def stream(
        self, path: str, body: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any] | None = None
    ) -> AsyncIterator[dict[str, Any]]:
        """POST with `stream: true` and yield each JSON chunk.

        Opening the stream is retried like `post`; once a chunk has arrived nothing is retried (the
        text would repeat). Closing the generator early closes the upstream response.
        """
        async with contextlib.aclosing(self.stream_batches(path, body, meter, options=options)) as batches:
            async for batch in batches:
                for chunk in batch:
                    yield chunk

    async def _begun_stream(
        self, path: str, payload: dict[str, Any], meter: Meter, options: Mapping[str, Any] | None
    ) -> tuple[Reply, float]:
        """The reply of a stream the server has begun (opening it is retried as a call is), and when it
        was first asked; its status and headers go where the caller captures the target's response.
        An endpoint that fails raises the role's error."""
        data = dumps(payload)
        try:
            reply, started = await self._attempts(lambda: self._open_stream(path, data, meter, options), 1 + self.endpoint.max_retries)
        except openai.APIStatusError as exc:
            raise self.error(f"HTTP {exc.status_code}: {exc.message}", status_code=exc.status_code, cause=exc) from exc
        except openai.APIError as exc:
            raise self.error(f"{type(exc).__name__}: {exc}", cause=exc) from exc
        box = _capture.get() if self.role == "target" else None
        if box is not None:
            box.http_response = httpx2.Response(reply.status, headers=list(reply.headers.items()), request=reply.request())
        return reply, started

    async def stream_batches(
        self, path: str, body: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any] | None = None
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """Like `stream`, the chunks that arrived together (one read from the connection) in one list:
        one chunk at a time while the reader keeps up, several when it falls behind (under load), so
        that what it does per batch is done once for all of them."""
        payload = self._body(body)
        payload["stream"] = True
        reply, started = await self._begun_stream(path, payload, meter, options)
        failed = True
        usage_seen = False
        last: dict[str, Any] | None = None
        done = False
        answer_path = self.role == "target" and path in _ANSWER_PATHS
        shape = answer_keys.StreamKeys((self.endpoint.base_url, payload.get("model")), _ANSWER_PATHS[path], logprobs=bool(payload.get("logprobs"))) if answer_path else None
        try:
            async with contextlib.aclosing(_event_lists(reply)) as event_lists:
                async for events in event_lists:
                    batch: list[dict[str, Any]] = []
                    for event in events:
                        if done or event.startswith(b"[DONE]"):
                            done = True  # read to the end, so the connection can be used again
                            continue
                        try:
                            chunk = _stream_item(event, reply)
                        except BaseException:
                            if batch:
                                yield batch  # what came before the error, as chunk by chunk
                            raise
                        if isinstance(chunk, dict):
                            last = chunk
                            if shape is not None:
                                shape.add(chunk)
                            if chunk.get("usage"):
                                usage_seen = True
                                meter.record_usage(chunk["usage"])
                            batch.append(chunk)
                    if batch:
                        yield batch
            failed = False
            if shape is not None:
                shape.done()
            if not usage_seen and last is not None and _is_native(last) and last.get("stop"):
                usage_seen = True  # llama.cpp's native stream bills in its last chunk
                meter.record_usage(_native_usage([last]))
        except openai.APIError as exc:
            raise self.error(f"stream broke: {exc}", cause=exc) from exc
        finally:
            await reply.close()
            meter.record_attempt(self.clock() - started, failed=failed)
            if not usage_seen:
                meter.record_usage(None)


async def _event_lists(reply: Reply) -> AsyncIterator[list[bytes]]:
    """The SSE events of a reply, as bytes, in the lists that each read from the connection completed
    (the decoder's rest last)."""
    decoder = SSEDecoder()
    async for piece in reply.chunks():
        yield decoder.feed_raw(piece)
    yield decoder.end_raw()


def _stream_item(data: bytes, reply: Reply) -> Any:
    """One event's JSON; an event that carries an error raises it, as the SDK's stream does."""
    item = fast_json.loads(data)
    if isinstance(item, dict) and item.get("error"):
        error = item["error"]
        message = error.get("message") if isinstance(error, Mapping) else None
        if not isinstance(message, str) or not message:
            message = "An error occurred during streaming"
        raise openai.APIError(message, reply.request(), body=error)
    return item
