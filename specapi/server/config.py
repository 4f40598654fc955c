"""`ServerConfig`: what one proxy serves and the limits it enforces. Immutable configuration."""

from __future__ import annotations

import os
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ..transport._exceptions import ConfigurationError
from ..transport.endpoint import Endpoint, check_roles

__all__ = ["ServerConfig", "DEFAULT_MAX_REQUEST_BYTES", "DEFAULT_MAX_TOKENS_LIMIT", "DEFAULT_MAX_TENANTS", "SUFFIX_SCOPES"]

#: Largest request body accepted (bytes); larger ones get HTTP 413.
DEFAULT_MAX_REQUEST_BYTES = 1 << 20
#: No limit of the proxy's own on `max_tokens` (the default): requests run as the target alone runs them.
DEFAULT_MAX_TOKENS_LIMIT: int | None = None
#: How the suffix index (drafts learnt from traffic) is shared: per upstream model, or per client API key.
SUFFIX_SCOPES = ("model", "api-key")
#: With `suffix_scope="api-key"`, the most keys that keep an index (least recently used ones are dropped).
DEFAULT_MAX_TENANTS = 256


@dataclass(frozen=True, kw_only=True)
class ServerConfig:
    """Configuration of one proxy app (`create_app(config)`).

    Args:
        target: the endpoint whose output clients get (its model is the one the proxy serves).
        draft: the endpoint that proposes tokens (may be None when `client_options` gives a `drafter`
            or `verification="none"`).
        num_speculative_tokens: draft tokens per round.
        api_key: the key clients must send as `Authorization: Bearer KEY`; None = no authentication.
            Upstream keys (on the endpoints) are never sent to clients.
        max_request_bytes: request bodies larger than this get HTTP 413.
        max_tokens_limit: None (default): the proxy adds no limit of its own, and every request runs as the
            target alone would run it (a chat request without `max_tokens` to the target's own end: end of
            text or of its context). An integer opts into a cost cap: a larger `max_tokens` or
            `max_completion_tokens` gets HTTP 400 before any upstream request, and a chat request
            without one is bounded by it (its answer then ends with "length" at the cap where the target
            alone would have written on).
        client_options: extra keyword arguments for `AsyncSpeculativeOpenAI` (`verification`, `policy`,
            `drafter`, `sleep`, `clock`, ...).
        suffix_scope: "model" (default): one suffix index per upstream model, learnt from every
            client's requests; "api-key": one per client API key (the bearer token a client sends), so
            one tenant's text never shapes another's drafts. Output never depends on it (the target
            verifies every draft), but timing does: with a shared index, a request that repeats what
            another client recently sent or received runs faster, which that client could measure.
        suffix_max_tokens: the cap of each suffix index, in tokens (the oldest sequences leave first).
        max_tenants: with "api-key", how many keys keep an index (least recently used dropped first).
        allow_lossy_acceptance: lets `client_options` choose a lossy acceptance rule ("threshold",
            "typical"), whose output is not the target's; refused without it (`--allow-lossy-acceptance`).
        readiness_interval: seconds between the background checks behind `/ready` (see `readiness.py`).
        readiness_check: the check itself, an async function returning None when the target answers, else
            a reason (default: `GET {target}/models`).
        clock: seconds, for the proxy's own latency metrics (injectable for tests).
        freeze_gc: once started (the client warmed), collect garbage and `gc.freeze()` what is left, so
            that the collector's full passes no longer walk the modules and tables loaded at startup:
            without it, one such pass stopped the proxy's event loop for 40–70 ms now and then under
            load (every stream in flight waits). For a process that is the proxy (`specapi serve` sets
            it); an app mounted in another program leaves that program's collector alone by default.
        share_url: a Redis URL (`redis://host:6379/0`) through which replicas share what they learn:
            suffix sequences (per scope, as `suffix_scope` keys them), the policy's measurements and the
            target's probed capabilities (`specapi.share`). Best effort: Redis away costs speed, never a
            request. Needs redis-py (`pip install 'specapi[share]'`). None (default): no sharing.
        share_max_entries: the cap of the shared stream, in entries (about; `XADD MAXLEN ~`).
        peers_dir: a directory the processes serving one port share (`specapi serve --workers N` makes
            one): each process tells the others, through a socket there, every sequence its suffix
            indexes learn, so that a prompt one worker answered is known to all (`peers.py`). The
            processes must share `suffix_scope`. None (default): this process learns alone.
        expose_upstream_errors: False (default): what clients see of an upstream's failure (error bodies,
            statistics' reasons, headers, `/ready`) names its role only ("the target endpoint failed (HTTP
            503)"); its address and raw message go to the proxy's log. True: they go to clients too.
    """

    target: Endpoint
    draft: Endpoint | None = None
    num_speculative_tokens: int = 4
    api_key: str | None = field(default=None, repr=False)
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    max_tokens_limit: int | None = DEFAULT_MAX_TOKENS_LIMIT
    client_options: Mapping[str, Any] = field(default_factory=dict)
    suffix_scope: str = "model"
    suffix_max_tokens: int = 32_768
    max_tenants: int = DEFAULT_MAX_TENANTS
    allow_lossy_acceptance: bool = False
    readiness_interval: float = 5.0
    readiness_check: Callable[[], Awaitable[str | None]] | None = field(default=None, repr=False, compare=False)
    clock: Callable[[], float] = field(default=time.perf_counter, repr=False, compare=False)
    freeze_gc: bool = False
    peers_dir: str | None = None
    share_url: str | None = None
    share_max_entries: int = 10_000
    expose_upstream_errors: bool = False

    def __post_init__(self) -> None:
        check_roles(self.target, self.draft)
        if self.suffix_scope not in SUFFIX_SCOPES:
            raise ConfigurationError(f"suffix_scope must be one of {', '.join(SUFFIX_SCOPES)}, got {self.suffix_scope!r}")
        for name in ("num_speculative_tokens", "max_request_bytes", "max_tokens_limit", "suffix_max_tokens", "max_tenants"):
            value = getattr(self, name)
            if value is None and name == "max_tokens_limit":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigurationError(f"{name} must be an integer >= 1, got {value!r}")
        if self.share_url is not None:
            if not isinstance(self.share_url, str) or not self.share_url.startswith(("redis://", "rediss://", "unix://")):
                raise ConfigurationError(f"share_url must be a redis://, rediss:// or unix:// URL, got {self.share_url!r}")
            from ..share import import_redis

            import_redis()  # a clear error now, not at startup, when redis-py is missing
        max_entries = self.share_max_entries
        if isinstance(max_entries, bool) or not isinstance(max_entries, int) or max_entries < 1:
            raise ConfigurationError(f"share_max_entries must be an integer >= 1, got {max_entries!r}")
        interval = self.readiness_interval
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval > 0:
            raise ConfigurationError(f"readiness_interval must be a number > 0, got {interval!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ConfigurationError("api_key must be a non-empty string or None")
        acceptance = self.client_options.get("acceptance", "exact")
        if acceptance != "exact" and not self.allow_lossy_acceptance:
            raise ConfigurationError(
                f"acceptance {acceptance!r} is lossy (clients would get text that is not the target's output): "
                "start the proxy with --allow-lossy-acceptance (allow_lossy_acceptance=True) to serve it"
            )
        object.__setattr__(self, "client_options", MappingProxyType(dict(self.client_options)))

    @property
    def addresses(self) -> dict[str, str]:
        """Where the upstreams are (each endpoint's label, base URL and host:port), by role: kept out of
        what clients see unless `expose_upstream_errors`."""
        found: dict[str, str] = {}
        for role, endpoint in (("draft", self.draft), ("target", self.target)):  # a shared server: the target's name
            if endpoint is None:
                continue
            for address in (endpoint.label, endpoint.base_url):
                if address:
                    found[address] = role
                    found[address.rstrip("/")] = role
            netloc = urllib.parse.urlsplit(endpoint.base_url or "").netloc.rpartition("@")[2]
            if netloc:
                found[netloc] = role
        return found

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every key this proxy knows; error messages are scrubbed of them before they leave."""
        keys = [self.api_key]
        for endpoint in (self.target, self.draft):
            if endpoint is not None:
                # An endpoint without a key uses OPENAI_API_KEY (see `Endpoint.build_client`).
                keys.append(endpoint.api_key or os.environ.get("OPENAI_API_KEY"))
        if self.share_url:
            keys.append(urllib.parse.urlsplit(self.share_url).password)  # redis://:PASSWORD@host
        return tuple(k for k in keys if k)
