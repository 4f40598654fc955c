"""`Endpoint`: where a model is served and what it costs. Immutable configuration."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Literal

import openai

from ._exceptions import ConfigurationError

__all__ = ["Endpoint", "check_roles"]


def _decimal(value: Decimal | float | int | str | None, name: str) -> Decimal | None:
    if value is None:
        return None
    try:
        result = Decimal(str(value))
    except Exception as exc:  # decimal.InvalidOperation and friends
        raise ConfigurationError(f"{name} must be a number of USD per 1M tokens, got {value!r}") from exc
    if result < 0:
        raise ConfigurationError(f"{name} must not be negative, got {value!r}")
    return result


@dataclass(frozen=True, kw_only=True)
class Endpoint:
    """An OpenAI-format endpoint serving one model.

    Args:
        model: model name sent in every request.
        base_url: e.g. "http://gpu-box:8000/v1". Defaults to `OPENAI_BASE_URL` or OpenAI's API.
        api_key: defaults to `OPENAI_API_KEY`; local servers that need none get the placeholder "EMPTY".
        client: an existing `openai.AsyncOpenAI` to use instead of building one (base_url/api_key ignored);
            its `httpx2` client carries the calls.
        http_client: an `httpx2.AsyncClient` to carry every call (custom transport, proxies, mocks).
            Without one (or `client`), calls go through aiohttp, which costs far less CPU per call.
        headers: extra headers sent with every request.
        timeout: seconds per request.
        max_retries: retries of transient failures (429, 5xx, timeouts, connection errors) per request.
        input_price_per_mtok, output_price_per_mtok, cached_input_price_per_mtok: USD per 1M tokens.
            When not given, prices come from genai-prices; unknown models cost `None`.
        price_provider: genai-prices provider id (e.g. "openai") to disambiguate price look-ups.
        max_logprobs: the largest top-k list the server returns (OpenAI completions: 5; vLLM: 20).
        logprobs_mode: "raw" if the server's logprobs ignore temperature (vLLM, OpenAI), "processed" if
            they already include it (SGLang's output logprobs).
        extra_body: extra JSON fields sent with every request (e.g. {"repeat_penalty": 1.0} for llama.cpp).
        name: a label for reports and errors (defaults to "model @ base_url").
    """

    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)
    client: Any = field(default=None, repr=False, compare=False)
    http_client: Any = field(default=None, repr=False, compare=False)
    headers: Mapping[str, str] | None = None
    timeout: float = 60.0
    max_retries: int = 3
    input_price_per_mtok: Decimal | float | None = None
    output_price_per_mtok: Decimal | float | None = None
    cached_input_price_per_mtok: Decimal | float | None = None
    price_provider: str | None = None
    max_logprobs: int = 20
    logprobs_mode: Literal["raw", "processed"] = "raw"
    extra_body: Mapping[str, Any] | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ConfigurationError("Endpoint needs a model name")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)):
            raise ConfigurationError(f"timeout must be a number of seconds, got {self.timeout!r}")
        for name in ("max_retries", "max_logprobs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigurationError(f"{name} must be an integer, got {value!r}")
        if self.timeout <= 0:
            raise ConfigurationError(f"timeout must be > 0 seconds, got {self.timeout!r}")
        if self.max_retries < 0:
            raise ConfigurationError(f"max_retries must be >= 0, got {self.max_retries!r}")
        if self.max_logprobs < 1:
            raise ConfigurationError(f"max_logprobs must be >= 1, got {self.max_logprobs!r}")
        if self.logprobs_mode not in ("raw", "processed"):
            raise ConfigurationError(f"logprobs_mode must be 'raw' or 'processed', got {self.logprobs_mode!r}")
        if self.client is not None and not isinstance(self.client, openai.AsyncOpenAI):
            raise ConfigurationError("client must be an openai.AsyncOpenAI instance")
        for name in ("input_price_per_mtok", "output_price_per_mtok", "cached_input_price_per_mtok"):
            object.__setattr__(self, name, _decimal(getattr(self, name), name))

    @property
    def label(self) -> str:
        if self.name:
            return self.name
        url = self.base_url or (str(self.client.base_url) if self.client is not None else os.environ.get("OPENAI_BASE_URL", "https://api.openai.com/v1"))
        return f"{self.model} @ {url}"

    @property
    def has_prices(self) -> bool:
        return self.input_price_per_mtok is not None and self.output_price_per_mtok is not None

    def build_client(self) -> openai.AsyncOpenAI:
        """The SDK client for this endpoint. SDK retries are off: specapi retries and counts each attempt."""
        if self.client is not None:
            return self.client.with_options(max_retries=0)
        api_key = self.api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        return openai.AsyncOpenAI(
            base_url=self.base_url,
            api_key=api_key,
            timeout=self.timeout,
            max_retries=0,
            default_headers=dict(self.headers) if self.headers else None,
            http_client=self.http_client,
        )


def check_roles(target: Any, draft: Any) -> None:
    """A client's or proxy's roles, checked before any request: the target is an `Endpoint`, the draft
    one or None."""
    if not isinstance(target, Endpoint):
        raise ConfigurationError("target must be an Endpoint")
    if draft is not None and not isinstance(draft, Endpoint):
        raise ConfigurationError("draft must be an Endpoint or None")
