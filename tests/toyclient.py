"""Test helpers around the toy server: in-process endpoints and a chi-square check (not a test module)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import httpx2
from scipy.stats import chisquare

from specapi import Endpoint
from toyserver import ToyServer


class InProcessToy:
    """The toy server's request handling behind an httpx2 MockTransport: no sockets, same answers."""

    def __init__(self, label: str = "toy", **server_options: Any) -> None:
        self.toy = ToyServer(**server_options)  # never started
        self.label = label

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        reply = self.toy.handle(request.method, request.url.path, json.loads(request.content), {})
        return httpx2.Response(reply.status, json=reply.payload, headers=reply.headers)

    def endpoint(self, model: str) -> Endpoint:
        return Endpoint(model=model, base_url="http://toy.test/v1", api_key="x", name=f"toy {model} ({self.label})",
                        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler)))


def chisquare_p(counts: dict[str, int], exact: dict[str, float]) -> float:
    """p-value of a chi-square goodness of fit; cells expecting fewer than 5 merged into one."""
    n = sum(counts.values())
    assert not set(counts) - set(exact), "an output impossible under the model"
    big = [k for k in exact if exact[k] * n >= 5]
    rest = [k for k in exact if exact[k] * n < 5]
    observed = [counts.get(k, 0) for k in big]
    expected = [exact[k] * n for k in big]
    if rest:
        observed.append(sum(counts.get(k, 0) for k in rest))
        expected.append(sum(exact[k] for k in rest) * n)
    expected[-1] += n - math.fsum(expected)
    return float(chisquare(observed, expected).pvalue)


def text_probs(
    next_tokens: Callable[[list[int]], Mapping[int, float]], start: Sequence[int], n: int, *, end: int, decode: Callable[[list[int]], str]
) -> dict[str, float]:
    """The exact probability of each text of `n` tokens (shorter where the `end` token comes) that a
    model drawing `next_tokens(ids)` after `start` writes: the oracle of the chi-square tests."""
    out: dict[str, float] = {}

    def walk(ids: list[int], generated: list[int], prob: float) -> None:
        if len(generated) == n:
            out[decode(generated)] = out.get(decode(generated), 0.0) + prob
            return
        for token, p in next_tokens(ids).items():
            if token == end:  # the text ends here
                out[decode(generated)] = out.get(decode(generated), 0.0) + prob * p
            else:
                walk(ids + [token], generated + [token], prob * p)

    walk(list(start), [], 1.0)
    return out


async def sample_texts(client, prompt: str, max_tokens: int, n: int, *, batch: int = 100):  # type: ignore[no-untyped-def]
    """`n` seeded temperature-1 completions (seeds 0..n-1, `batch` at a time): the responses and a
    count of each output text."""
    import asyncio

    responses = []
    for start in range(0, n, batch):
        responses += await asyncio.gather(*(
            client.completions.create(prompt=prompt, max_tokens=max_tokens, temperature=1.0, seed=seed)
            for seed in range(start, min(n, start + batch))))
    counts: dict[str, int] = {}
    for r in responses:
        counts[r.choices[0].text] = counts.get(r.choices[0].text, 0) + 1
    return responses, counts
