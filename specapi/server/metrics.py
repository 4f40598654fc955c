"""Prometheus metrics of one proxy app, in its own `CollectorRegistry` (several apps never collide).

    specapi_requests_total{route,status}            every request; status 499 = the client left first
    specapi_request_duration_seconds{route}         completed generations, request received to last byte
    specapi_time_to_first_token_seconds{route}      request received to first text (streams: first chunk)
    specapi_in_flight_requests                      generations in progress
    specapi_client_disconnects_total{route}         clients that left before the end (upstream work cancelled)
    specapi_stream_errors_total{route}              streams that ended with an error event
    specapi_responses_total{route,speculated,exact} finished generations
    specapi_rounds_total, specapi_drafted_tokens_total, specapi_accepted_tokens_total,
    specapi_generated_tokens_total                  speculation work
    specapi_drafted_tokens_by_position_total{position}, specapi_accepted_tokens_by_position_total{position}
                                                    acceptance by draft position (accepted / drafted)
    specapi_upstream_requests_total{role}, specapi_upstream_tokens_total{role,kind}, specapi_cost_usd_total{role}
    specapi_fallbacks_total{reason}                 requests (partly) served by the target alone, by category
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from ..stats import SpeculativeStats

__all__ = ["ProxyMetrics", "fallback_category", "CONTENT_TYPE"]

CONTENT_TYPE = CONTENT_TYPE_LATEST

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Positions beyond this share one label, to bound the label set.
_MAX_POSITION_LABEL = 16

_FALLBACK_CATEGORIES = (
    ("draft failed", "draft_failed"),
    ("could not be verified", "unverifiable_response"),
    ("refused the verification", "verification_refused"),
)


def fallback_category(reason: str | None) -> str | None:
    """A bounded label for a free-text fallback reason (None when there was no fallback)."""
    if not reason:
        return None
    for needle, category in _FALLBACK_CATEGORIES:
        if needle in reason:
            return category
    return "target_only_request"


class ProxyMetrics:
    """The proxy's counters and histograms, registered in `self.registry`."""

    def __init__(self) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("specapi_requests", "HTTP requests by route and status", ["route", "status"], registry=registry)
        self.duration = Histogram(
            "specapi_request_duration_seconds", "Completed generations, seconds", ["route"], buckets=_LATENCY_BUCKETS, registry=registry
        )
        self.ttft = Histogram(
            "specapi_time_to_first_token_seconds", "Seconds to the first text", ["route"], buckets=_LATENCY_BUCKETS, registry=registry
        )
        self.in_flight = Gauge("specapi_in_flight_requests", "Generations in progress", registry=registry)
        self.disconnects = Counter("specapi_client_disconnects", "Clients that left before the end", ["route"], registry=registry)
        self.stream_errors = Counter("specapi_stream_errors", "Streams ended by an error event", ["route"], registry=registry)
        self.responses = Counter(
            "specapi_responses", "Finished generations", ["route", "speculated", "exact"], registry=registry
        )
        self.rounds = Counter("specapi_rounds", "Draft-then-verify rounds", registry=registry)
        self.drafted = Counter("specapi_drafted_tokens", "Draft tokens proposed", registry=registry)
        self.accepted = Counter("specapi_accepted_tokens", "Draft tokens accepted", registry=registry)
        self.generated = Counter("specapi_generated_tokens", "Tokens returned to clients", registry=registry)
        self.drafted_by_position = Counter(
            "specapi_drafted_tokens_by_position", "Draft tokens proposed at each position", ["position"], registry=registry
        )
        self.accepted_by_position = Counter(
            "specapi_accepted_tokens_by_position", "Draft tokens accepted at each position", ["position"], registry=registry
        )
        self.upstream_requests = Counter("specapi_upstream_requests", "Upstream HTTP requests", ["role"], registry=registry)
        self.upstream_failed = Counter("specapi_upstream_failed_requests", "Failed upstream HTTP requests", ["role"], registry=registry)
        self.upstream_tokens = Counter("specapi_upstream_tokens", "Upstream tokens billed", ["role", "kind"], registry=registry)
        self.cost = Counter("specapi_cost_usd", "Upstream cost in USD (priced models only)", ["role"], registry=registry)
        self.fallbacks = Counter("specapi_fallbacks", "Requests served partly or wholly by the target alone", ["reason"], registry=registry)

    def request(self, route: str, status: int) -> None:
        self.requests.labels(route=route, status=str(status)).inc()

    def observe(self, route: str, stats: SpeculativeStats) -> None:
        """Add one finished generation's statistics."""
        self.responses.labels(route=route, speculated=str(stats.speculated).lower(), exact=str(stats.exact).lower()).inc()
        self.rounds.inc(stats.num_rounds)
        self.drafted.inc(stats.drafted_tokens)
        self.accepted.inc(stats.accepted_tokens)
        self.generated.inc(stats.generated_tokens)
        for record in stats.rounds:
            for position, ok in enumerate(record.accepted_by_position):
                label = str(min(position, _MAX_POSITION_LABEL))
                self.drafted_by_position.labels(position=label).inc()
                if ok:
                    self.accepted_by_position.labels(position=label).inc()
        for role, usage in (("target", stats.target), ("draft", stats.draft)):
            self.upstream_requests.labels(role=role).inc(usage.requests)
            self.upstream_failed.labels(role=role).inc(usage.failed_requests)
            self.upstream_tokens.labels(role=role, kind="prompt").inc(usage.prompt_tokens)
            self.upstream_tokens.labels(role=role, kind="completion").inc(usage.completion_tokens)
            if usage.cost_usd is not None:
                self.cost.labels(role=role).inc(float(usage.cost_usd))
        category = fallback_category(stats.fallback_reason)
        if category is not None:
            self.fallbacks.labels(reason=category).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
