"""Test helpers around the simulator: the target's own answer, a response's answer, a completion through a proxy app (not a test module)."""

from __future__ import annotations

import httpx2
import openai

from specapi.sim import SimProvider, SimTransport


async def target_alone(
    provider: SimProvider, *, prompt: str | None = None, messages: list | None = None, max_tokens: int
) -> tuple[str, str]:
    """The target's own greedy answer, from the openai SDK straight to the simulated provider."""
    http = httpx2.AsyncClient(transport=SimTransport(provider))
    async with openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", http_client=http, max_retries=0) as sdk:
        if messages is not None:
            r = await sdk.chat.completions.create(model="sim-target", messages=messages, max_tokens=max_tokens, temperature=0)
            return r.choices[0].message.content, r.choices[0].finish_reason
        r = await sdk.completions.create(model="sim-target", prompt=prompt, max_tokens=max_tokens, temperature=0)
        return r.choices[0].text, r.choices[0].finish_reason


def answer(resp) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """(text, finish_reason) of a completion or chat completion."""
    choice = resp.choices[0]
    return (choice.message.content if hasattr(choice, "message") else choice.text), choice.finish_reason


async def proxy_completion(app, key: str, prompt: str, max_tokens: int = 30) -> dict:  # type: ignore[no-untyped-def]
    """A greedy completion through a proxy app (in process), with the client key `key`: the response's JSON."""
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://proxy") as http:
        response = await http.post(
            "/v1/completions",
            json={"model": "sim-target", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0},
            headers={"authorization": f"Bearer {key}"},
        )
    assert response.status_code == 200, response.text
    return response.json()
