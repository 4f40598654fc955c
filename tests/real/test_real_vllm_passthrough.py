"""`specapi serve` in front of a real vLLM passes the routes it does not speculate to the target unchanged:
vLLM's `/tokenize`, `/detokenize` and `/version`, and `/v1/embeddings` (which vLLM serves only for pooling
models: its 404 comes back as it is). The oracle is the same request sent to the target directly."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from real_helpers import ServerPair
from test_real_vllm_conformance import proxy_url  # noqa: F401  (the fixture: specapi serve in front of the pair)


def _both(vllm: ServerPair, proxy_root: str, method: str, path: str, body: dict[str, Any] | None) -> tuple[httpx2.Response, httpx2.Response]:
    with httpx2.Client(timeout=30.0) as client:
        direct = client.request(method, vllm.target.root + path, json=body)
        proxied = client.request(method, proxy_root + path, json=body)
    return direct, proxied


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/tokenize", {"model": "tiny-target", "prompt": "def add(a, b):\n    return a + b  # 今天 😀"}),
        ("POST", "/detokenize", {"model": "tiny-target", "tokens": [1, 2, 3, 40, 41]}),
        ("GET", "/version", None),
        ("POST", "/v1/embeddings", {"model": "tiny-target", "input": "hello"}),
    ],
    ids=["tokenize", "detokenize", "version", "embeddings"],
)
def test_routes_it_does_not_speculate_reach_vllm_unchanged(vllm: ServerPair, proxy_url: str, method: str, path: str, body: dict[str, Any] | None) -> None:  # noqa: F811
    direct, proxied = _both(vllm, proxy_url.removesuffix("/v1"), method, path, body)
    assert proxied.status_code == direct.status_code, (path, direct.status_code, proxied.text[:300])
    assert proxied.headers.get("content-type") == direct.headers.get("content-type")
    assert proxied.json() == direct.json()
