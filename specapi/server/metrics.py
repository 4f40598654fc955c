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
                                                    acceptance by draft position (0-based; accepted / drafted)
    specapi_upstream_requests_total{role}, specapi_upstream_tokens_total{role,kind}, specapi_cost_usd_total{role}
    specapi_fallbacks_total{reason}                 requests (partly) served by the target alone, by category:
                                                    draft_failed, unverifiable_response, verification_refused,
                                                    tokenize_refused, policy_off (the policy predicted no gain),
                                                    under_load, verification_off, target_only_request (what the
                                                    request asks for cannot be verified: tools, n > 1, ...)
    specapi_speculation_reduced_total{model_name,reason}
                                                    requests whose draft length the load-aware policy lowered
                                                    or whose speculation it stopped, by the policy's reason
    specapi_ready                                   1 while the target answers, 0 while it is unreachable
    specapi_workers                                 processes serving (startup done: warmed, target probed)
    specapi_share_degraded                          with `--share`: 1 while Redis does not answer (sharing
                                                    is off meanwhile; requests go on), 0 while it does
    specapi_share_records_total{direction}          with `--share`: suffix sequences published, received from
                                                    other processes, dropped (Redis away and the buffer full)

vLLM's spec-decode counters, with vLLM's meaning, under specapi's prefix and with vLLM's `model_name` label:

    specapi_spec_decode_num_drafts_total{model_name}              rounds that proposed at least one token
    specapi_spec_decode_num_draft_tokens_total{model_name}        tokens proposed
    specapi_spec_decode_num_accepted_tokens_total{model_name}     tokens accepted
    specapi_spec_decode_num_accepted_tokens_per_pos_total{model_name,position}
                                                    accepted tokens at each draft position, 1-based
                                                    (positions past 64 share the label "65+")

so mean acceptance length is `1 + accepted / drafts` and acceptance at position i is
`per_pos{position="i"} / drafts`, as on a vLLM dashboard. The prefix stays specapi's: a proxy in front of
a vLLM that speculates itself would otherwise report a second, different `vllm:spec_decode_*` series.

No `_created` series are exported. Under several worker processes (`specapi serve --workers N`,
`PROMETHEUS_MULTIPROC_DIR` set before `prometheus_client` is imported), every process writes its values to
that directory and `render()` adds them up across the processes, so any worker answers for all of them.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from ..core.stats import RoleUsage, SpeculativeStats

__all__ = ["ProxyMetrics", "fallback_category", "reason_label", "CONTENT_TYPE", "MULTIPROCESS_DIR_VARIABLE", "MAX_POSITION_LABEL"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: prometheus-client's switch to multiprocess mode (read when it is imported).
MULTIPROCESS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: Positions beyond this share one label (0-based metrics: this value; vLLM-style: "65+"), to bound the label set.
MAX_POSITION_LABEL = 64
_MAX_REASON_LENGTH = 64
#: Distinct load reasons kept as labels; later new ones count as "other".
_MAX_REASONS = 32

#: The fallback categories, by the words that start (or are in) the engine's reasons; first match wins.
_FALLBACK_CATEGORIES = (
    ("draft failed", "draft_failed"),
    ("could not be verified", "unverifiable_response"),
    ("refused the verification", "verification_refused"),
    ("would not tokenize", "tokenize_refused"),
    ("under load", "under_load"),
    ("adaptive policy:", "policy_off"),
    ("draft-length policy", "policy_off"),
    ("verification='none'", "verification_off"),
)


def fallback_category(reason: str | None) -> str | None:
    """A bounded label for a free-text fallback reason (None when there was no fallback)."""
    if not reason:
        return None
    for needle, category in _FALLBACK_CATEGORIES:
        if needle in reason:
            return category
    return "target_only_request"


def reason_label(reason: str, limit: int = _MAX_REASON_LENGTH) -> str:
    """A free-text reason as a label of at most `limit` characters, cut between words (never inside one),
    with "..." where it was cut."""
    if len(reason) <= limit:
        return reason
    cut = reason[: limit - 3].rstrip()
    if reason[limit - 3 : limit - 2] not in ("", " ") and " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" :;,") + "..."


def _vllm_position(index: int) -> str:
    """The 1-based label of 0-based draft position `index`."""
    return str(index + 1) if index < MAX_POSITION_LABEL else f"{MAX_POSITION_LABEL + 1}+"


class _WithoutCreated:
    """A collector view that drops `_created` samples (prometheus-client adds them to counters and histograms)."""

    def __init__(self, source: Any) -> None:
        self._source = source

    def collect(self) -> Iterator[Any]:
        for metric in self._source.collect():
            metric.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield metric


def multiprocess_dir() -> str | None:
    """The directory of multiprocess mode if prometheus-client runs in it in this process, else None."""
    directory = os.environ.get(MULTIPROCESS_DIR_VARIABLE)
    return directory if directory and getattr(values.ValueClass, "_multiprocess", False) else None


class ProxyMetrics:
    """The proxy's counters and histograms, registered in `self.registry`; `model` is the `model_name` label."""

    def __init__(self, model: str = "") -> None:
        self.model = model
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self._serving(registry)
        self._speculation(registry)
        self._upstreams(registry)
        self._vllm_spec_decode(registry)
        self._reasons: set[str] = set()
        self._children: dict[tuple[Any, ...], Any] = {}
        self._view = self._exported()

    def _serving(self, registry: CollectorRegistry) -> None:
        """The proxy's own traffic: requests, latencies, what is in flight, readiness, sharing."""
        self.requests = Counter("specapi_requests", "HTTP requests by route and status", ["route", "status"], registry=registry)
        self.duration = Histogram(
            "specapi_request_duration_seconds", "Completed generations, seconds", ["route"], buckets=_LATENCY_BUCKETS, registry=registry
        )
        self.ttft = Histogram(
            "specapi_time_to_first_token_seconds", "Seconds to the first text", ["route"], buckets=_LATENCY_BUCKETS, registry=registry
        )
        self.in_flight = Gauge("specapi_in_flight_requests", "Generations in progress", registry=registry, multiprocess_mode="livesum")
        self.ready = Gauge("specapi_ready", "1 while the target answers", registry=registry, multiprocess_mode="livemin")
        self.workers = Gauge(
            "specapi_workers", "Processes serving (startup done)", registry=registry, multiprocess_mode="livesum"
        )
        self.share_degraded = Gauge(
            "specapi_share_degraded", "1 while sharing through Redis is degraded", registry=registry, multiprocess_mode="livemax"
        )
        self.share_records = Counter("specapi_share_records", "Suffix sequences shared through Redis", ["direction"], registry=registry)
        self.disconnects = Counter("specapi_client_disconnects", "Clients that left before the end", ["route"], registry=registry)
        self.stream_errors = Counter("specapi_stream_errors", "Streams ended by an error event", ["route"], registry=registry)

    def _speculation(self, registry: CollectorRegistry) -> None:
        """What speculation did: responses, rounds, tokens drafted and kept (by position), fallbacks."""
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
        self.fallbacks = Counter("specapi_fallbacks", "Requests served partly or wholly by the target alone", ["reason"], registry=registry)
        self.reduced = Counter(
            "specapi_speculation_reduced",
            "Requests whose draft length the load-aware policy lowered or whose speculation it stopped",
            ["model_name", "reason"],
            registry=registry,
        )
        self.verification_refused = Counter(
            "specapi_verification_refused",
            "Verification paths written off because the target refused their request shape while it served the "
            "same requests plain (confirmed twice); that model's later requests go to the target alone",
            ["model_name", "verification"],
            registry=registry,
        )

    def _upstreams(self, registry: CollectorRegistry) -> None:
        """The upstream calls each role made, the tokens billed and their cost."""
        self.upstream_requests = Counter("specapi_upstream_requests", "Upstream HTTP requests", ["role"], registry=registry)
        self.upstream_failed = Counter("specapi_upstream_failed_requests", "Failed upstream HTTP requests", ["role"], registry=registry)
        self.upstream_tokens = Counter("specapi_upstream_tokens", "Upstream tokens billed", ["role", "kind"], registry=registry)
        self.cost = Counter("specapi_cost_usd", "Upstream cost in USD (priced models only)", ["role"], registry=registry)

    def _vllm_spec_decode(self, registry: CollectorRegistry) -> None:
        """The counters under vLLM's own names, so that a vLLM dashboard reads them."""
        self.num_drafts = Counter(
            "specapi_spec_decode_num_drafts", "Speculation rounds that proposed draft tokens (vLLM's num_drafts)", ["model_name"], registry=registry
        )
        self.num_draft_tokens = Counter(
            "specapi_spec_decode_num_draft_tokens", "Draft tokens proposed (vLLM's num_draft_tokens)", ["model_name"], registry=registry
        )
        self.num_accepted_tokens = Counter(
            "specapi_spec_decode_num_accepted_tokens", "Draft tokens accepted (vLLM's num_accepted_tokens)", ["model_name"], registry=registry
        )
        self.num_accepted_tokens_per_pos = Counter(
            "specapi_spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted at each 1-based position (vLLM's num_accepted_tokens_per_pos)",
            ["model_name", "position"],
            registry=registry,
        )

    def child(self, metric: Any, *labels: str) -> Any:
        """`metric.labels(*labels)`, kept: prometheus-client checks and hashes the labels at every call,
        about 17 times per request. The label sets are bounded (routes, statuses, roles, positions,
        reasons), and so is this."""
        key = (id(metric), *labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def _exported(self) -> _WithoutCreated:
        directory = multiprocess_dir()
        if directory is None:
            return _WithoutCreated(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=directory)  # reads every process's files at each scrape
        return _WithoutCreated(merged)

    def request(self, route: str, status: int) -> None:
        self.child(self.requests, route, str(status)).inc()

    def observe(self, route: str, stats: SpeculativeStats) -> None:
        """Add one finished generation's statistics."""
        self.child(self.responses, route, "true" if stats.speculated else "false", "true" if stats.exact else "false").inc()
        for counter, amount in (
            (self.rounds, stats.num_rounds),
            (self.drafted, stats.drafted_tokens),
            (self.accepted, stats.accepted_tokens),
            (self.generated, stats.generated_tokens),
        ):
            if amount:
                counter.inc(amount)
        self._observe_positions(stats)
        for role, usage in (("target", stats.target), ("draft", stats.draft)):
            self.upstream(role, usage)
        category = fallback_category(stats.fallback_reason)
        if category is not None:
            self.child(self.fallbacks, category).inc()
        if stats.verification_refused:
            self.child(self.verification_refused, self.model, stats.verification_refused).inc()
        reason = stats.load_reason  # the load-aware policy's decision held speculation back
        if reason:
            label = reason_label(str(reason))
            if label not in self._reasons and len(self._reasons) >= _MAX_REASONS:
                label = "other"
            self._reasons.add(label)
            self.child(self.reduced, self.model, label).inc()

    def upstream(self, role: str, usage: RoleUsage) -> None:
        """Add upstream calls: a generation's, or the startup probe's (which no response carries)."""
        for counter, labels, amount in (
            (self.upstream_requests, (role,), usage.requests),
            (self.upstream_failed, (role,), usage.failed_requests),
            (self.upstream_tokens, (role, "prompt"), usage.prompt_tokens),
            (self.upstream_tokens, (role, "completion"), usage.completion_tokens),
        ):
            child = self.child(counter, *labels)  # the series exists (at 0) from the first request on
            if amount:
                child.inc(amount)
        if usage.cost_usd is not None:
            self.child(self.cost, role).inc(float(usage.cost_usd))

    def _observe_positions(self, stats: SpeculativeStats) -> None:
        drafted: dict[int, int] = {}
        accepted: dict[int, int] = {}
        drafts = 0
        for record in stats.rounds:
            drafts += record.drafted > 0
            for position, ok in enumerate(record.accepted_by_position):
                slot = min(position, MAX_POSITION_LABEL)
                drafted[slot] = drafted.get(slot, 0) + 1
                accepted[slot] = accepted.get(slot, 0) + ok
        for slot, count in drafted.items():
            self.child(self.drafted_by_position, str(slot)).inc(count)
            if accepted[slot]:
                self.child(self.accepted_by_position, str(slot)).inc(accepted[slot])
                self.child(self.num_accepted_tokens_per_pos, self.model, _vllm_position(slot)).inc(accepted[slot])
        for counter, amount in (
            (self.num_drafts, drafts),
            (self.num_draft_tokens, stats.drafted_tokens),
            (self.num_accepted_tokens, stats.accepted_tokens),
        ):
            child = self.child(counter, self.model)
            if amount:
                child.inc(amount)

    def retire(self) -> None:
        """This process stops serving: under several processes, its live gauges leave the sums."""
        directory = multiprocess_dir()
        if directory is not None:
            mark_process_dead(os.getpid(), directory)

    def render(self) -> bytes:
        return generate_latest(self._view)  # type: ignore[arg-type]  # any object with collect() will do
