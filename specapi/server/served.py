"""The models the proxy serves: the configured target model, and every other model the target's server
lists on `GET /v1/models`, as specapi's Python clients accept any of them with `model=`.

A request naming another model is verified against that model, on the same server and key, and drafted
by the configured draft or the free drafters. The list is read when the proxy starts and read again when a
request names a model it does not hold (or `/v1/models` is asked) and the last reading is older than
`refresh_after_s`: a model added upstream is served without a restart, and a flood of unknown names
costs the target one listing per interval. A listing that fails keeps the last one (at first: the
configured model alone).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

__all__ = ["ServedModels"]

logger = logging.getLogger("specapi.server")


class ServedModels:
    """The configured model first, then the others the target's server lists (`fetch` reads them)."""

    def __init__(
        self,
        configured: str,
        fetch: Callable[[], Awaitable[Sequence[str]]],
        *,
        clock: Callable[[], float],
        refresh_after_s: float = 10.0,
        wait_s: float = 5.0,
    ) -> None:
        self.configured = configured
        self._fetch = fetch
        self._clock = clock
        self.refresh_after_s = refresh_after_s
        #: How long a request waits for a listing it started (it goes on in the background after that).
        self.wait_s = wait_s
        self._names: tuple[str, ...] = (configured,)
        self._read_at: float | None = None
        self._reading: asyncio.Task[None] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return self._names

    def __contains__(self, name: object) -> bool:
        return name in self._names

    async def refresh(self, *, force: bool = False) -> None:
        """Read the target's list again, unless it was read less than `refresh_after_s` ago (`force`: read
        anyway). Concurrent callers share one reading; each waits for it at most `wait_s` seconds."""
        reading = self._reading
        if reading is None or reading.done():
            if not force and self._read_at is not None and self._clock() - self._read_at < self.refresh_after_s:
                return
            self._read_at = self._clock()  # the interval counts from the attempt: failures are not retried at once
            reading = self._reading = asyncio.ensure_future(self._read())
        await asyncio.wait((reading,), timeout=self.wait_s)

    async def knows(self, name: object) -> bool:
        """Whether `name` is served, reading the list again first when it is not (see `refresh`)."""
        if not isinstance(name, str) or name in self._names:
            return isinstance(name, str)
        await self.refresh()
        return name in self._names

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reading

    async def _read(self) -> None:
        try:
            listed = await self._fetch()
        except Exception as exc:  # the target's list is a convenience: the configured model is served anyway
            logger.warning("could not read the target's model list: %s", type(exc).__name__)
            return
        self._names = (self.configured, *dict.fromkeys(name for name in listed if name != self.configured))
