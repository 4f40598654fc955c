"""``simulated_endpoints``: a target and a draft ``specapi.Endpoint`` served in-process by a ``SimProvider``.

    target, draft = simulated_endpoints(profile="vllm", latency="lan")

Both endpoints talk to one provider through its ``httpx2`` transport (no sockets), carry the latency
profile's prices and the server flavour's largest completions logprobs list. The provider deducts its compute time from
the simulated latency, since these endpoints run on real time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import httpx2

from .latency import LatencyProfile
from .profiles import Capabilities
from .provider import SimProvider
from .transport import SimTransport

if TYPE_CHECKING:
    from ..transport.endpoint import Endpoint

__all__ = ["simulated_endpoints"]


def simulated_endpoints(
    *,
    profile: str | Capabilities = "vllm",
    latency: str | LatencyProfile = "lan",
    seed: int = 0,
    target_model: str = "sim-target",
    draft_model: str = "sim-draft",
    provider: SimProvider | None = None,
) -> tuple[Endpoint, Endpoint]:
    """``(target, draft)`` endpoints on ``provider`` (a new one from ``profile``/``latency``/``seed`` if none)."""
    from ..transport.endpoint import Endpoint

    if provider is None:
        provider = SimProvider(capabilities=profile, latency=latency, seed=seed, deduct_compute_time=True)
    caps = provider.capabilities
    endpoints = []
    for model in (target_model, draft_model):
        spec = provider.specs[model]
        pricing = provider.latency.timing_for(model, spec.tier).pricing
        endpoints.append(
            Endpoint(
                model=model,
                base_url="http://sim/v1",
                api_key="sim",
                http_client=httpx2.AsyncClient(transport=SimTransport(provider)),
                input_price_per_mtok=pricing.input,
                output_price_per_mtok=pricing.output,
                cached_input_price_per_mtok=pricing.cached_input,
                max_logprobs=caps.completions_max_logprobs,
                name=f"{model} @ sim ({caps.name}, {provider.latency.name})",
            )
        )
    return endpoints[0], endpoints[1]
