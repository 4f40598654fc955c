"""`SpeculativeOpenAI`: the synchronous twin, a thin wrapper that runs the async client on a private loop.

The loop lives in a daemon thread, so the sync client also works where an event loop is already
running (notebooks, async frameworks calling sync code).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import weakref
from collections.abc import Callable, Coroutine, Iterator, Mapping
from typing import Any, Generic, Literal, Optional, TypeVar, overload

import httpx2
import openai
from openai import Omit, omit
from openai.lib.streaming.chat import ChatCompletionStreamManager
from openai.pagination import SyncPage
from openai.types import Completion, Model
from openai.types.chat import ChatCompletionChunk, completion_create_params
from typing_extensions import Unpack

from ..transport._sdk import ResponseFormatT, sdk_beta
from .checks import DEFAULT_CHECK_TIMEOUT, EndpointStatus
from .client import AsyncSpeculativeOpenAI
from ..dialects.openai_params import ChatCompletionCreateParams, ChatCompletionParseParams, CompletionCreateParams, declared
from .raw import RawResponse, StreamedHeaders
from .sdk_post import Beta, resource_for, sdk_request
from .streaming import SpeculativeStream
from .structured import helper_arguments, stream_params
from ..core.types import SpeculativeChatCompletion, SpeculativeCompletion, SpeculativeParsedChatCompletion
from .validation import given_arguments

__all__ = ["SpeculativeOpenAI", "SyncSpeculativeStream"]

T = TypeVar("T")
ChunkT = TypeVar("ChunkT")


class _LoopThread:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._finalizer: weakref.finalize | None = None

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="specapi-sync", daemon=True)
                self._thread.start()
                # A client never closed is stopped at exit (or when dropped), as `asyncio.run` ends its loop:
                # its connections close quietly, as the SDK's do.
                self._finalizer = weakref.finalize(self, _stop_loop, self._loop, self._thread)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        with self._lock:
            if self._loop is not None:
                if self._finalizer is not None:
                    self._finalizer.detach()
                _stop_loop(self._loop, self._thread)
                self._loop = None
                self._thread = None


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread | None) -> None:
    """Close the loop's async generators (the transport's session guards among them), then the loop."""
    if thread is not None and thread.is_alive():
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(loop.shutdown_asyncgens(), loop).result(timeout=5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
    loop.close()


class SpeculativeOpenAI(openai.OpenAI):
    """Same arguments as `AsyncSpeculativeOpenAI`; `create(...)` calls return results directly.

    It is an `openai.OpenAI` (see `AsyncSpeculativeOpenAI`): `completions` and `chat.completions`
    speculate, the SDK's other resources go to the target as the SDK sends them."""

    def __init__(self, **options: Any) -> None:
        self._async = AsyncSpeculativeOpenAI(**options)
        self._loop = _LoopThread()
        self._owns_http = True
        self._sdk_http: httpx2.Client | None = None

    def __getattr__(self, name: str) -> Any:
        # As `AsyncSpeculativeOpenAI.__getattr__`: the SDK's `openai.OpenAI.__init__` runs once, on the
        # first read of an attribute only the SDK half has (its HTTP client costs about 20 ms to build).
        if name.startswith("__") or "_sdk_ready" in self.__dict__ or "_async" not in self.__dict__:
            raise AttributeError(name)
        self._sdk_init(self._sdk_http)
        return getattr(self, name)

    def _sdk_init(self, http_client: httpx2.Client | None) -> None:
        """The `openai.OpenAI` half, with the target's URL, key, timeout and retries."""
        self._sdk_ready = True
        source = self._async
        openai.OpenAI.__init__(
            self, api_key=source.api_key, base_url=source.base_url, timeout=source.timeout, max_retries=source.max_retries,
            default_headers=dict(source.target.headers) if source.target.headers else None, http_client=http_client,
        )

    # The speculating resources in place of the SDK's (same names, same call shapes).

    @functools.cached_property
    def completions(self) -> _Completions:  # type: ignore[override]
        return _Completions(self)

    @functools.cached_property
    def chat(self) -> _Chat:  # type: ignore[override]
        return _Chat(self)

    @functools.cached_property
    def models(self) -> _Models:  # type: ignore[override]
        return _Models(self)

    @functools.cached_property
    def beta(self) -> Beta:  # type: ignore[override]
        return Beta(self.chat, lambda: sdk_beta(openai.OpenAI, self))

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run `coro` on the loop thread; a stream comes back as a plain iterator."""
        return _wrap(self._loop.run(coro), self._loop)

    @property
    def async_client(self) -> AsyncSpeculativeOpenAI:
        return self._async

    def with_options(self, **changes: Any) -> SpeculativeOpenAI:  # type: ignore[override]
        """A client with some options changed (as `AsyncSpeculativeOpenAI.with_options`, the SDK's
        `timeout=` and `max_retries=` included), sharing this one's connections and loop thread."""
        copy = object.__new__(SpeculativeOpenAI)
        copy._async = self._async.with_options(**changes)
        copy._loop = self._loop
        copy._owns_http = False
        copy._sdk_http = self._client  # this client's (its SDK half set up now, if it was not)
        return copy

    copy = with_options  # type: ignore[assignment]

    def post(self, path: str, *, cast_to: Any, body: Any = None, options: Any = None, stream: bool = False, **rest: Any) -> Any:  # type: ignore[override]
        """The SDK's low-level POST (LiteLLM sends through it): `/completions` and `/chat/completions`
        go through `create` and speculate; any other path goes to the target as the SDK sends it."""
        resource = resource_for(self, path)
        if resource is None or not isinstance(body, Mapping) or rest.get("files"):
            return openai.OpenAI.post(self, path, cast_to=cast_to, body=body, options=options or {}, stream=stream, **rest)
        params, raw = sdk_request(resource, body, options)
        if raw:
            return resource.with_raw_response.create(**params)
        return resource.create(**params)

    def check_endpoints(self, *, timeout: float = DEFAULT_CHECK_TIMEOUT) -> tuple[EndpointStatus, ...]:
        """Whether each endpoint answers and serves its model (see `AsyncSpeculativeOpenAI.check_endpoints`)."""
        return self._loop.run(self._async.check_endpoints(timeout=timeout))

    def close(self) -> None:
        if self._loop._loop is not None:
            self._loop.run(self._async.close())
        self._loop.stop()
        if self._owns_http and "_sdk_ready" in self.__dict__:
            openai.OpenAI.close(self)

    def __enter__(self) -> SpeculativeOpenAI:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncSpeculativeStream(Generic[ChunkT]):
    """A plain iterator over an async `SpeculativeStream`, driven on the client's loop thread."""

    def __init__(self, stream: SpeculativeStream[ChunkT], loop: _LoopThread) -> None:
        self._stream = stream
        self._loop = loop

    @property
    def speculative(self) -> Any:
        return self._stream.speculative

    def __iter__(self) -> SyncSpeculativeStream[ChunkT]:
        return self

    def __next__(self) -> ChunkT:
        try:
            return self._loop.run(self._stream.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        self._loop.run(self._stream.close())

    @property
    def response(self) -> _StreamResponse:
        """What the SDK's stream helpers close when they are done (as `openai.Stream.response`)."""
        return _StreamResponse(self.close)

    def __enter__(self) -> SyncSpeculativeStream[ChunkT]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class _StreamResponse:
    """A stream's `response`: only closing is offered (the upstream responses are specapi's)."""

    def __init__(self, close: Callable[[], None]) -> None:
        self._close = close
        self.headers: dict[str, str] = {}

    def close(self) -> None:
        self._close()


def _wrap(result: Any, loop: _LoopThread) -> Any:
    return SyncSpeculativeStream(result, loop) if isinstance(result, SpeculativeStream) else result


class _RawCreate:
    """`with_raw_response` on the sync client: the async one's, run on the loop thread."""

    def __init__(self, client: SpeculativeOpenAI, resource: Any) -> None:
        self._client = client
        self._resource = resource

    def create(self, **params: Any) -> RawResponse[Any]:
        return self._raw(self._resource.with_raw_response.create(**params))

    def parse(self, **params: Any) -> RawResponse[Any]:
        return self._raw(self._resource.with_raw_response.parse(**params))

    def _raw(self, call: Coroutine[Any, Any, RawResponse[Any]]) -> RawResponse[Any]:
        raw = self._client._loop.run(call)
        return RawResponse(_wrap(raw.parse(), self._client._loop), raw.headers, raw.http_response)


class StreamedResponse(StreamedHeaders[T]):
    """What `with_streaming_response` yields on the sync client: headers at once, `parse()`."""

    def parse(self) -> T:
        return self._raw.parse()


class _StreamingCreate:
    """`with_streaming_response` on the sync client: `with ....create(...) as response: response.parse()`."""

    def __init__(self, raw: _RawCreate) -> None:
        self._raw = raw

    def create(self, **params: Any) -> contextlib.AbstractContextManager[StreamedResponse[Any]]:
        return _streamed(lambda: self._raw.create(**params))

    def parse(self, **params: Any) -> contextlib.AbstractContextManager[StreamedResponse[Any]]:
        return _streamed(lambda: self._raw.parse(**params))


@contextlib.contextmanager
def _streamed(call: Callable[[], RawResponse[T]]) -> Iterator[StreamedResponse[T]]:
    raw = call()
    try:
        yield StreamedResponse(raw)
    finally:
        parsed = raw.parse()
        if isinstance(parsed, SyncSpeculativeStream):
            parsed.close()  # a stream left unread ends with the block


class _Completions:
    def __init__(self, client: SpeculativeOpenAI) -> None:
        self._client = client
        self.with_raw_response = _RawCreate(client, client._async.completions)
        self.with_streaming_response = _StreamingCreate(self.with_raw_response)

    @overload
    def create(self, *, stream: Optional[Literal[False]] | Omit = omit, **params: Unpack[CompletionCreateParams]) -> SpeculativeCompletion: ...
    @overload
    def create(self, *, stream: Literal[True], **params: Unpack[CompletionCreateParams]) -> SyncSpeculativeStream[Completion]: ...

    @declared(CompletionCreateParams)
    def create(self, **params: Any) -> SpeculativeCompletion | SyncSpeculativeStream[Completion]:
        """As `AsyncSpeculativeOpenAI().completions.create`, run on the client's loop thread."""
        return self._client._call(self._client._async.completions.create(**given_arguments(params)))


class _ChatCompletions:
    def __init__(self, client: SpeculativeOpenAI) -> None:
        self._client = client
        self.with_raw_response = _RawCreate(client, client._async.chat.completions)
        self.with_streaming_response = _StreamingCreate(self.with_raw_response)

    @overload
    def create(self, *, stream: Optional[Literal[False]] | Omit = omit, **params: Unpack[ChatCompletionCreateParams]) -> SpeculativeChatCompletion: ...
    @overload
    def create(self, *, stream: Literal[True], **params: Unpack[ChatCompletionCreateParams]) -> SyncSpeculativeStream[ChatCompletionChunk]: ...

    @declared(ChatCompletionCreateParams)
    def create(self, **params: Any) -> SpeculativeChatCompletion | SyncSpeculativeStream[ChatCompletionChunk]:
        """As `AsyncSpeculativeOpenAI().chat.completions.create`, run on the client's loop thread."""
        return self._client._call(self._client._async.chat.completions.create(**given_arguments(params)))

    def parse(
        self, *, response_format: type[ResponseFormatT] | Omit = omit, **params: Unpack[ChatCompletionParseParams]
    ) -> SpeculativeParsedChatCompletion[ResponseFormatT]:
        """As `AsyncSpeculativeOpenAI().chat.completions.parse` (the SDK's `parse`), run on the loop thread."""
        return self._client._loop.run(self._client._async.chat.completions.parse(response_format=response_format, **params))

    def stream(
        self,
        *,
        response_format: completion_create_params.ResponseFormat | type[ResponseFormatT] | Omit = omit,
        **params: Unpack[ChatCompletionParseParams],
    ) -> ChatCompletionStreamManager[ResponseFormatT]:
        """The SDK's `chat.completions.stream` (`with client.chat.completions.stream(...) as stream:`)."""
        request, rich_format, input_tools = stream_params(given_arguments(helper_arguments(params, response_format)))
        resource = self._client._async.chat.completions
        return ChatCompletionStreamManager(lambda: self._client._call(resource._create(request)), response_format=rich_format, input_tools=input_tools)


class _Chat:
    def __init__(self, client: SpeculativeOpenAI) -> None:
        self.completions = _ChatCompletions(client)


class _Models:
    """`client.models`: the target's models (`list()` returns an iterable `SyncPage`)."""

    def __init__(self, client: SpeculativeOpenAI) -> None:
        self._client = client

    def list(self, **options: Any) -> SyncPage[Model]:
        page = self._client._loop.run(self._client._async.models.list(**options))
        # A server may leave `object` out, and the SDK builds the page without validating it.
        return SyncPage[Model].model_construct(data=list(page.data), object=getattr(page, "object", "list"))

    def retrieve(self, model: str, **options: Any) -> Model:
        return self._client._loop.run(self._client._async.models.retrieve(model, **options))
