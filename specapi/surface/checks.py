"""Whether an endpoint can serve its role: reachable, the key accepted, the model there.

    problem = await check_endpoint(role_client)      # None, or a sentence naming the role and endpoint

One `GET {base URL}/models` decides most cases: no answer, a refused key or a server error is a problem,
and a listing that names the model is none. A server may serve a model it does not list (one that
answers for any name, or has no `/models`), so a model missing from the listing is asked for one token (completions, then chat): the model is there if either answers. That request is
the only one that bills tokens, and `EndpointChecker` sends it once per endpoint; later checks list.

`AsyncSpeculativeOpenAI.check_endpoints()` runs this for both roles; `specapi serve` runs it before it
serves, and its `/ready` keeps it current per role (`server/readiness.py`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import openai

from ..transport._calls import Meter, RoleClient
from ..transport._exceptions import EndpointError
from ..core.stats import RoleUsage

__all__ = ["EndpointStatus", "EndpointChecker", "check_endpoint", "DEFAULT_CHECK_TIMEOUT"]

#: Seconds each request of a check may take.
DEFAULT_CHECK_TIMEOUT = 10.0
#: Models named in a problem's text, at most.
_LISTED = 6


@dataclass(frozen=True)
class EndpointStatus:
    """One role's check: `problem` is None when the endpoint serves the model, else what is wrong."""

    role: str
    endpoint: str
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.problem is None


def _where(role: RoleClient) -> str:
    return f"{role.role} endpoint {role.endpoint.label}"


def _failure(role: RoleClient, exc: EndpointError, timeout: float) -> str | None:
    """The problem an upstream error shows about the endpoint itself (None: it says nothing of the model)."""
    cause = exc.__cause__
    status = exc.status_code
    if isinstance(cause, openai.APITimeoutError):
        return f"{_where(role)} did not answer within {timeout:g} s: is the server overloaded, or the URL that of another service?"
    if isinstance(cause, openai.APIConnectionError) or (status is None and not isinstance(cause, openai.APIStatusError)):
        return (
            f"{_where(role)} is unreachable ({type(cause or exc).__name__}): is its server running, and is the base URL "
            "right (scheme, host, port, and the /v1 path)?"
        )
    if status in (401, 403):
        return f"{_where(role)} refused the credentials (HTTP {status}): check the {role.role}'s API key"
    if status is not None and status >= 500:
        return f"{_where(role)} answered HTTP {status}: the server failed ({_message(exc)})"
    return None


def _message(exc: EndpointError) -> str:
    """The server's own words: its error object's message (or FastAPI's `detail`), else the SDK's."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            if isinstance(body.get(key), str) and body[key]:
                return str(body[key])
    return str(getattr(exc, "message", None) or exc)


async def _listed(role: RoleClient, meter: Meter, timeout: float) -> tuple[str | None, list[str] | None]:
    """(problem, the model ids the server lists, None if it has no listing)."""
    try:
        page = await role.get("/models", meter, timeout=timeout)
    except EndpointError as exc:
        return _failure(role, exc, timeout), None
    data = page.get("data") if isinstance(page, dict) else None
    if not isinstance(data, list):
        return None, None
    return None, [str(item["id"]) for item in data if isinstance(item, dict) and "id" in item]


async def _one_token(role: RoleClient, meter: Meter, timeout: float, listed: list[str] | None) -> str | None:
    """Ask the model for one token (completions, then chat): None if either answers."""
    options = {"timeout": timeout}
    requests: list[tuple[str, dict[str, Any]]] = [
        ("/completions", {"prompt": "Hello", "max_tokens": 1, "temperature": 0}),
        ("/chat/completions", {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 1, "temperature": 0}),
    ]
    refusal: EndpointError | None = None
    for path, body in requests:
        try:
            await role.post(path, body, meter, retries=0, options=options)
            return None
        except EndpointError as exc:
            problem = _failure(role, exc, timeout)
            if problem is not None:
                return problem
            if refusal is None or "model" in _message(exc).lower():
                refusal = exc  # the answer that speaks of the model, if one does
    assert refusal is not None
    model = role.endpoint.model
    lists = ""
    if listed:
        names = ", ".join(listed[:_LISTED]) + (", ..." if len(listed) > _LISTED else "")
        lists = f"; it lists {names}"
    return (
        f"{_where(role)}: the model {model!r} is not served there "
        f"(HTTP {refusal.status_code}: {_message(refusal)}){lists}. Check the {role.role} model's name"
    )


async def check_endpoint(role: RoleClient, *, meter: Meter | None = None, timeout: float = DEFAULT_CHECK_TIMEOUT, ask: bool = True) -> str | None:
    """None if `role`'s endpoint serves its model, else the problem, naming the role and endpoint.
    `meter` records the one-token requests (the listing bills nothing and is not recorded).
    `ask=False`: a model the server does not list is not asked for a token (taken as served)."""
    meter = meter if meter is not None else Meter(role.endpoint)
    problem, listed = await _listed(role, Meter(role.endpoint), timeout)  # a listing bills nothing: not metered
    if problem is not None or (listed is not None and role.endpoint.model in listed) or not ask:
        return problem
    return await _one_token(role, meter, timeout, listed)


class EndpointChecker:
    """Checks one role's endpoint each time it is called (behind `/ready`): a model the server does not
    list is asked for a token until it has answered once; then listing the models is enough.
    `on_usage` hears what each check's one-token requests billed."""

    def __init__(self, role: RoleClient, *, timeout: float = DEFAULT_CHECK_TIMEOUT, on_usage: Callable[[RoleUsage], None] | None = None) -> None:
        self.role = role
        self.timeout = timeout
        self._on_usage = on_usage
        self._confirmed = False

    async def __call__(self) -> str | None:
        meter = Meter(self.role.endpoint)
        try:
            problem = await check_endpoint(self.role, meter=meter, timeout=self.timeout, ask=not self._confirmed)
        finally:
            if self._on_usage is not None:
                self._on_usage(meter.snapshot())
        self._confirmed = self._confirmed or problem is None
        return problem
