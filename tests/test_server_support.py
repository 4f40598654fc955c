"""Helpers shared by the proxy's tests (`test_server*.py`): toy upstream + live proxy, SSE and metrics parsing."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specapi import Endpoint
from specapi.server import BackgroundServer, ServerConfig, create_app
from specapi.server.command import OPTIONS, add_arguments
from toyserver import ToyServer

__all__ = ["breaking_target", "PROXY_KEY", "UPSTREAM_KEY", "make_config", "running_proxy", "proxy_pair", "parse_sse", "metric", "REQUIRED", "parse", "clean_environment"]

PROXY_KEY = "sk-proxy-key-for-tests"
UPSTREAM_KEY = "sk-upstream-secret-4242"

#: The options `specapi serve` cannot start without.
REQUIRED = ["--target-base-url", "http://t/v1", "--target-model", "big", "--draft-base-url", "http://d/v1", "--draft-model", "small"]


def parse(argv: list[str]) -> argparse.Namespace:
    """`specapi serve`'s command line as its parser reads it."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture
def clean_environment(monkeypatch):
    """No SPECAPI_* variable of the machine's reaches the command line's defaults."""
    for option in OPTIONS:
        monkeypatch.delenv(option.env, raising=False)


async def no_sleep(seconds: float) -> None:
    """Retry back-off that does not wait (specapi's `sleep` is injectable)."""


def make_config(srv: ToyServer, **overrides: Any) -> ServerConfig:
    """Target and draft on `srv`, no retries (failures surface at once), priced so that costs show."""
    common = {"base_url": srv.base_url, "api_key": UPSTREAM_KEY, "max_retries": 0, "timeout": 10.0}
    options: dict[str, Any] = {
        "target": Endpoint(model="target", input_price_per_mtok=Decimal("3"), output_price_per_mtok=Decimal("15"), **common),
        "draft": Endpoint(model="draft", input_price_per_mtok=Decimal("0.1"), output_price_per_mtok=Decimal("0.4"), **common),
        "num_speculative_tokens": 4,
        "api_key": PROXY_KEY,
        # Speculate on every request (the adaptive policy measures the target alone first); never wait to retry.
        "client_options": {"policy": "fixed", "sleep": no_sleep},
        # One readiness check at startup, then none that could land among the upstream requests a test counts
        # (test_server_readiness.py checks often).
        "readiness_interval": 3600.0,
    }
    options.update(overrides)
    return ServerConfig(**options)


@contextlib.contextmanager
def running_proxy(srv: ToyServer, *, shutdown_timeout: float = 10.0, **overrides: Any) -> Iterator[BackgroundServer]:
    with BackgroundServer(create_app(make_config(srv, **overrides)), shutdown_timeout=shutdown_timeout) as proxy:
        yield proxy


@contextlib.contextmanager
def proxy_pair(**overrides: Any) -> Iterator[tuple[ToyServer, BackgroundServer]]:
    """A fresh toy upstream (own faults, delays and probe cache entry) with its own proxy."""
    with ToyServer(api_key=UPSTREAM_KEY) as srv, running_proxy(srv, **overrides) as proxy:
        yield srv, proxy


def parse_sse(text: str) -> list[Any]:
    """The `data:` payloads of an event stream: JSON objects, and the string "[DONE]"."""
    events: list[Any] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus text exposition (0.0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


class _Breaks(httpx2.AsyncByteStream):
    """Two chunks of a completion, then the connection drops (or, `clean`, the body just ends)."""

    def __init__(self, clean: bool) -> None:
        self.clean = clean

    async def __aiter__(self):  # type: ignore[no-untyped-def]
        for text in ("ab", "cd"):
            chunk = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "target",
                     "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": None}]}
            yield b"data: " + json.dumps(chunk).encode() + b"\n\n"
        if not self.clean:
            raise httpx2.RemoteProtocolError("peer closed connection without sending complete message body")


def breaking_target(clean: bool, *, streams_only: bool = False) -> Endpoint:
    """A target whose streamed completions send two chunks and then break (`clean`: end without a
    finish_reason). `streams_only`: every other request gets a 404 (the engine's own calls fail loudly)."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        if streams_only and not (request.url.path.endswith("/completions") and json.loads(request.content).get("stream")):
            return httpx2.Response(404, json={"error": {"message": "not here"}})
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=_Breaks(clean))

    return Endpoint(model="target", base_url="http://breaks.test/v1", api_key="sk-breaks", max_retries=0,
                    http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)))
