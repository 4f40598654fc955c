"""Readiness (`GET /ready`): whether the target answers, checked in the background and on upstream failures.

`/health` says the process lives; `/ready` says whether it can serve: 503 while the target is unreachable,
200 once it answers again. `Readiness.run()` (started with the app) checks every `interval` seconds (every
`retry_interval` seconds, at most one, while the target is unreachable);
`suspect(reason)`, called when a request fails on the target with a dropped connection, a timeout or a
5xx, marks the proxy not ready at once and checks again without waiting for the interval, so one check
decides whether the failure was the target's or the request's.

The default check (`target_check`) is `GET {target base URL}/models` with the proxy's key for the target:
any answer below 500 except 401/403 means reachable (a server without `/models` still answers 404).
Time is injectable (`sleep`, `clock`) and so is the check.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx2

from ..endpoint import Endpoint

__all__ = ["Readiness", "Check", "target_check", "DEFAULT_INTERVAL"]

#: Seconds between background checks.
DEFAULT_INTERVAL = 5.0
_OPENAI_BASE_URL = "https://api.openai.com/v1"

#: A check returns None when the target answers, else a short reason.
Check = Callable[[], Awaitable[str | None]]


def target_check(endpoint: Endpoint, *, timeout: float = 5.0) -> tuple[Check, Callable[[], Awaitable[None]]]:
    """A check of `endpoint` and a function that releases what it holds (its own HTTP client, if any)."""
    client = endpoint.client
    base_url = str(getattr(client, "base_url", "") or endpoint.base_url or _OPENAI_BASE_URL).rstrip("/")
    api_key = getattr(client, "api_key", None) or endpoint.api_key
    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    http = endpoint.http_client
    owned = http is None
    if http is None:
        http = httpx2.AsyncClient(timeout=timeout, limits=httpx2.Limits(max_connections=2))

    async def check() -> str | None:
        try:
            response = await http.get(f"{base_url}/models", headers=headers, timeout=timeout)
        except httpx2.TimeoutException:
            return f"target did not answer within {timeout:g} s"
        except httpx2.HTTPError as exc:
            return f"target unreachable ({type(exc).__name__})"
        if response.status_code in (401, 403):
            return f"target refused the proxy's credentials (HTTP {response.status_code})"
        if response.status_code >= 500:
            return f"target answered HTTP {response.status_code}"
        return None

    async def close() -> None:
        if owned:
            await http.aclose()

    return check, close


class Readiness:
    """Whether the target answers (`ready`, `reason`); `run()` keeps it current, `suspect()` questions it."""

    def __init__(
        self,
        check: Check,
        *,
        interval: float = DEFAULT_INTERVAL,
        retry_interval: float | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self._check = check
        self.interval = interval
        self.retry_interval = min(interval, 1.0) if retry_interval is None else retry_interval
        self._sleep = sleep
        self._clock = clock
        self._on_change = on_change
        self.ready = False
        self.reason: str | None = "not checked yet"
        self.checked_at: float | None = None
        self.checks = 0
        self._wake = asyncio.Event()

    def _set(self, ready: bool, reason: str | None) -> None:
        changed = ready != self.ready
        self.ready, self.reason = ready, reason
        if changed and self._on_change is not None:
            self._on_change(ready)

    async def check_now(self) -> bool:
        """Check the target once and record the answer."""
        try:
            reason = await self._check()
        except Exception as exc:  # a broken check must not stop the loop: it counts as unreachable
            reason = f"readiness check failed ({type(exc).__name__})"
        self.checks += 1
        self.checked_at = self._clock()
        self._set(reason is None, reason)
        return self.ready

    def suspect(self, reason: str) -> None:
        """A request just failed on the target: not ready until the next check (which runs at once) passes."""
        self._set(False, reason)
        self._wake.set()

    async def run(self) -> None:
        """Check now, then every `interval` seconds (`retry_interval` while unready) or as soon as `suspect()`
        is called; runs until cancelled."""
        while True:
            self._wake.clear()
            await self.check_now()
            pause = asyncio.ensure_future(self._sleep(self.interval if self.ready else self.retry_interval))
            woken = asyncio.ensure_future(self._wake.wait())
            try:
                await asyncio.wait({pause, woken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (pause, woken):
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
