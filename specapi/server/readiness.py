"""Readiness (`GET /ready`): whether each endpoint answers and serves its model, checked in the background
and on upstream failures.

`/health` says the process lives; `/ready` says whether it can serve: 503 while the target is unreachable,
200 once it answers again, and each role's state in its body (a draft that fails leaves the proxy ready,
"degraded": it serves with the target alone). `Readiness.run()` (started with the app) checks every `interval` seconds (every
`retry_interval` seconds, at most one, while the target is unreachable);
`suspect(reason)`, called when a request fails on the target with a dropped connection, a timeout or a
5xx, marks the proxy not ready at once and checks again without waiting for the interval, so one check
decides whether the failure was the target's or the request's.

The default check of each role is `specapi.surface.checks.EndpointChecker`: `GET {base URL}/models` with the
proxy's key for that endpoint (no answer, a refused key or a 5xx is a problem), and a model the server
does not list asked for one token until it has answered once. `target_check` builds one for an endpoint
alone. Time is injectable (`sleep`, `clock`) and so are the checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from ..transport._calls import RoleClient
from ..surface.checks import EndpointChecker
from ..transport.endpoint import Endpoint

__all__ = ["Readiness", "Check", "target_check", "DEFAULT_INTERVAL", "CHECK_TIMEOUT"]

#: Seconds between background checks.
DEFAULT_INTERVAL = 5.0
#: Seconds each request of a check may take.
CHECK_TIMEOUT = 5.0
_NOT_CHECKED = "not checked yet"

#: A check returns None when the target answers, else a short reason.
Check = Callable[[], Awaitable[str | None]]


def target_check(endpoint: Endpoint, *, timeout: float = CHECK_TIMEOUT) -> tuple[Check, Callable[[], Awaitable[None]]]:
    """A check of `endpoint` as the target, and a function that releases its connections."""
    role = RoleClient("target", endpoint)
    return EndpointChecker(role, timeout=timeout), role.aclose


class Readiness:
    """Whether the target answers (`ready`, `reason`), and each role's problem (`roles`: None while it
    answers); `run()` keeps them current, `suspect()` questions one. `others`: the checks of the roles
    besides the target's (the draft's); one failing leaves the proxy ready (`degraded`).
    `on_change(ready)` hears the target's changes, `on_role(role, problem)` every role's."""

    def __init__(
        self,
        check: Check,
        *,
        interval: float = DEFAULT_INTERVAL,
        retry_interval: float | None = None,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[bool], None] | None = None,
        others: Mapping[str, Check] | None = None,
        on_role: Callable[[str, str | None], None] | None = None,
    ) -> None:
        if interval <= 0:
            raise ValueError("interval must be > 0")
        self._checks: dict[str, Check] = {"target": check, **(others or {})}
        self.interval = interval
        self.retry_interval = min(interval, 1.0) if retry_interval is None else retry_interval
        self._sleep = sleep
        self._clock = clock
        self._on_change = on_change
        self._on_role = on_role
        self.ready = False
        self.reason: str | None = _NOT_CHECKED
        #: Each role's problem, None while it answers ("not checked yet" before the first check).
        self.roles: dict[str, str | None] = {role: _NOT_CHECKED for role in self._checks}
        self.checked_at: float | None = None
        self.checks = 0
        self._wake = asyncio.Event()

    @property
    def degraded(self) -> bool:
        """A role besides the target fails (the proxy serves, with the target alone)."""
        return any(problem is not None for role, problem in self.roles.items() if role != "target")

    def _set(self, role: str, problem: str | None) -> None:
        before = self.roles.get(role)
        self.roles[role] = problem
        first = before == _NOT_CHECKED
        if self._on_role is not None and ((first and problem is not None) or (not first and (problem is None) != (before is None))):
            self._on_role(role, problem)
        if role == "target":
            changed = (problem is None) != self.ready
            self.ready, self.reason = problem is None, problem
            if changed and self._on_change is not None:
                self._on_change(self.ready)

    async def _run_check(self, check: Check) -> str | None:
        try:
            return await check()
        except Exception as exc:  # a broken check must not stop the loop: it counts as unreachable
            return f"readiness check failed ({type(exc).__name__})"

    async def check_now(self) -> bool:
        """Check every role once and record the answers; True if the target answers."""
        roles = list(self._checks)
        problems = await asyncio.gather(*(self._run_check(self._checks[role]) for role in roles))
        self.checks += 1
        self.checked_at = self._clock()
        for role, problem in zip(roles, problems):
            self._set(role, problem)
        return self.ready

    def suspect(self, reason: str, role: str = "target") -> None:
        """A request just failed on `role`: it counts as failing until the next check (which runs at once) passes."""
        if role in self._checks:
            self._set(role, reason)
            self._wake.set()

    async def run(self) -> None:
        """Check now, then every `interval` seconds (`retry_interval` while the target is unready) or as
        soon as `suspect()` is called; runs until cancelled."""
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
