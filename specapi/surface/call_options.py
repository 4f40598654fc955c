"""The SDK's per-call options on `create`: `extra_headers` and `extra_query` go with every upstream
request (the draft's included), `timeout` bounds the whole call. And the SDK client's own options
(`timeout`, `max_retries`, `default_headers`), given to a speculative client, on its endpoints.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from collections.abc import Coroutine, Mapping
from typing import Any, TypeVar

import httpx2
import openai
from openai import NotGiven, not_given

from ..transport._calls import RoleClient
from ..transport._exceptions import ConfigurationError
from ..transport.endpoint import Endpoint

__all__ = ["deadline", "request_options", "seconds", "with_sdk_options"]

T = TypeVar("T")


def request_options(params: Mapping[str, Any], default_timeout: Any = not_given) -> tuple[dict[str, Any], dict[str, Any]]:
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


def seconds(timeout: Any) -> float | None:
    """A `timeout=` as seconds for the whole call (the parts of an httpx `Timeout` added up), None for none."""
    if isinstance(timeout, httpx2.Timeout):
        parts = [t for t in (timeout.connect, timeout.read, timeout.write, timeout.pool) if t is not None]
        return sum(parts) if parts else None
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0:
        raise ConfigurationError(f"timeout must be a number of seconds > 0, an httpx Timeout or None, got {timeout!r}")
    return float(timeout)


async def deadline(call: Coroutine[Any, Any, T], limit: float | None, target: RoleClient) -> T:
    """`timeout=` bounds the whole call (every round); for a stream, until the stream is open."""
    if limit is None:
        return await call
    try:
        return await asyncio.wait_for(call, limit)
    except asyncio.TimeoutError:
        request = httpx2.Request("POST", str(target.sdk.base_url))
        cause = openai.APITimeoutError(request=request)
        raise target.error(f"the call took longer than timeout={limit:g}s", cause=cause) from cause


def with_sdk_options(
    endpoint: Endpoint, *, timeout: Any = not_given, max_retries: Any = not_given, default_headers: Mapping[str, str] | None = None
) -> Endpoint:
    """`endpoint` with the SDK client options a caller gave the speculative client (`AsyncOpenAI(timeout=,
    max_retries=, default_headers=)`): a number of seconds becomes its timeout per request, `max_retries`
    its retries, and `default_headers` join its headers (its own win). Checked here, before any request."""
    if not isinstance(timeout, NotGiven):
        seconds(timeout)
    if not isinstance(max_retries, NotGiven) and (isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0):
        raise ConfigurationError(f"max_retries must be an integer >= 0, got {max_retries!r}")
    if default_headers is not None and not (
        isinstance(default_headers, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in default_headers.items())
    ):
        raise ConfigurationError(f"default_headers must map header names to strings, got {default_headers!r}")
    changes: dict[str, Any] = {}
    if isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        changes["timeout"] = float(timeout)
    if not isinstance(max_retries, NotGiven):
        changes["max_retries"] = max_retries
    if default_headers:
        own = {name.lower() for name in endpoint.headers or {}}
        merged = {name: value for name, value in default_headers.items() if name.lower() not in own}
        changes["headers"] = {**merged, **(endpoint.headers or {})}
        if endpoint.client is not None:  # an SDK client of the caller's carries the calls: the headers go on it
            changes["client"] = endpoint.client.with_options(default_headers=changes["headers"])
    return replace(endpoint, **changes) if changes else endpoint
