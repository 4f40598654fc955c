"""`SpeculativeOpenAI`: the synchronous twin, a thin wrapper that runs the async client on a private loop.

The loop lives in a daemon thread, so the sync client also works where an event loop is already
running (notebooks, async frameworks calling sync code).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from .client import AsyncSpeculativeOpenAI
from .streaming import SpeculativeStream
from .types import SpeculativeChatCompletion, SpeculativeCompletion

__all__ = ["SpeculativeOpenAI", "SyncSpeculativeStream"]

T = TypeVar("T")


class _LoopThread:
    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever, name="specapi-sync", daemon=True)
                self._thread.start()
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def stop(self) -> None:
        with self._lock:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self._loop.stop)
                assert self._thread is not None
                self._thread.join(timeout=5)
                self._loop.close()
                self._loop = None
                self._thread = None


class SpeculativeOpenAI:
    """Same arguments as `AsyncSpeculativeOpenAI`; `create(...)` calls return results directly."""

    def __init__(self, **options: Any) -> None:
        self._async = AsyncSpeculativeOpenAI(**options)
        self._loop = _LoopThread()
        self.completions = _Completions(self)
        self.chat = _Chat(self)

    @property
    def async_client(self) -> AsyncSpeculativeOpenAI:
        return self._async

    def with_options(self, **changes: Any) -> SpeculativeOpenAI:
        """A client with some options changed, sharing this one's connections and loop thread."""
        copy = object.__new__(SpeculativeOpenAI)
        copy._async = self._async.with_options(**changes)
        copy._loop = self._loop
        copy.completions = _Completions(copy)
        copy.chat = _Chat(copy)
        return copy

    copy = with_options

    def close(self) -> None:
        if self._loop._loop is not None:
            self._loop.run(self._async.close())
        self._loop.stop()

    def __enter__(self) -> SpeculativeOpenAI:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncSpeculativeStream:
    """A plain iterator over an async `SpeculativeStream`, driven on the client's loop thread."""

    def __init__(self, stream: SpeculativeStream[Any], loop: _LoopThread) -> None:
        self._stream = stream
        self._loop = loop

    @property
    def speculative(self) -> Any:
        return self._stream.speculative

    def __iter__(self) -> SyncSpeculativeStream:
        return self

    def __next__(self) -> Any:
        try:
            return self._loop.run(self._stream.__anext__())
        except StopAsyncIteration:
            raise StopIteration from None

    def close(self) -> None:
        self._loop.run(self._stream.close())

    def __enter__(self) -> SyncSpeculativeStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _wrap(result: Any, loop: _LoopThread) -> Any:
    return SyncSpeculativeStream(result, loop) if isinstance(result, SpeculativeStream) else result


class _Completions:
    def __init__(self, client: SpeculativeOpenAI) -> None:
        self._client = client

    def create(self, **kwargs: Any) -> SpeculativeCompletion | SyncSpeculativeStream:
        return _wrap(self._client._loop.run(self._client._async.completions.create(**kwargs)), self._client._loop)


class _ChatCompletions:
    def __init__(self, client: SpeculativeOpenAI) -> None:
        self._client = client

    def create(self, **kwargs: Any) -> SpeculativeChatCompletion | SyncSpeculativeStream:
        return _wrap(self._client._loop.run(self._client._async.chat.completions.create(**kwargs)), self._client._loop)


class _Chat:
    def __init__(self, client: SpeculativeOpenAI) -> None:
        self.completions = _ChatCompletions(client)
