"""A fresh client's first request: how many round trips the probe puts before it, on servers that answer
the probe's optional endpoints and on one that answers none of them (404), and that the first request
speculates, on the right path, with the target's own text (`benchmarks/cold_start.py` times it)."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx2
import openai
import pytest

import specapi.parts.probe
from specapi import AsyncSpeculativeOpenAI, Endpoint
from specapi.transport._calls import Meter, RoleClient
from specapi.parts.probe import probe_endpoint
from specapi.sim import CAPABILITY_PROFILES, SimProvider, SimTransport

pytestmark = pytest.mark.usefixtures("fresh_probe_cache")

#: vLLM's OpenAI endpoints on a server that answers none of the probe's optional ones.
BARE = dataclasses.replace(CAPABILITY_PROFILES["vllm"], name="bare", dialect="openai", token_id_extras=False)
OPTIONAL = ("/props", "/version", "/get_model_info", "/tokenize")
PROMPT = "def fibonacci(n):\n    "


class Waves(httpx2.AsyncBaseTransport):
    """Holds every request until no more arrive and none is being answered, then lets all of them go
    at once: one wave is one round trip, whatever the latency. `waves` records what each one carried."""

    def __init__(self, inner: httpx2.AsyncBaseTransport) -> None:
        self.inner = inner
        self.waves: list[list[tuple[str, str, bytes]]] = []
        self._held: list[tuple[httpx2.Request, asyncio.Future[None]]] = []
        self._answering = 0
        self._driver: asyncio.Task[None] | None = None

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        released = asyncio.get_running_loop().create_future()
        self._held.append((request, released))
        if self._driver is None or self._driver.done():
            self._driver = asyncio.ensure_future(self._drive())
        await released
        self._answering += 1
        try:
            response = await self.inner.handle_async_request(request)
            await response.aread()  # answered whole: what follows it belongs to the next wave
            return response
        finally:
            self._answering -= 1

    async def _drive(self) -> None:
        while self._held or self._answering:
            for _ in range(50):  # everything that can be sent before an answer comes is sent
                await asyncio.sleep(0)
            if self._answering:
                continue
            wave, self._held = self._held, []
            self.waves.append([(r.method, r.url.path, r.content) for r, _ in wave])
            for _, released in wave:
                released.set_result(None)

    def first_wave_of(self, needle: bytes) -> int:
        """The 1-based wave of the first request whose body holds `needle` (0: none)."""
        return next((i + 1 for i, wave in enumerate(self.waves) if any(needle in body for _, _, body in wave)), 0)


def endpoints(profile) -> tuple[SimProvider, Waves, Endpoint, Endpoint]:
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    waves = Waves(SimTransport(provider))
    made = []
    for model in ("sim-target", "sim-draft"):
        made.append(Endpoint(model=model, base_url="http://sim/v1", api_key="sim", http_client=httpx2.AsyncClient(transport=waves),
                             max_logprobs=provider.capabilities.completions_max_logprobs))
    return provider, waves, made[0], made[1]


@pytest.mark.parametrize(("profile", "most"), [("vllm", 2), (BARE, 1), ("llamacpp", 4), ("openai", 2)])
async def test_the_probe_asks_what_it_can_at_once(profile, most):
    """Asked one after the other, the probe was 5-7 round trips before the first request could start
    (vLLM 7, without the optional endpoints 6, llama.cpp 7, OpenAI 5). Now what does not depend on another
    answer goes in the first wave; only a refused echo (asked again with shorter lists, then without echo)
    and the native tokenizer (once the server is known) wait for one."""
    provider, waves, target, _ = endpoints(profile)
    role = RoleClient("target", target)
    try:
        caps = await probe_endpoint(role, Meter(target))
    finally:
        await role.sdk.close()
    assert caps.completions and caps.chat
    assert 1 <= len(waves.waves) <= most, waves.waves
    first = {(method, path) for method, path, _ in waves.waves[0]}
    assert {("GET", "/props"), ("GET", "/version"), ("GET", "/get_model_info"), ("GET", "/v1/models")} <= first
    assert ("POST", "/v1/chat/completions") in first and ("POST", "/v1/completions") in first


async def test_first_request_on_a_server_without_optional_endpoints():
    """404 for /props, /version, /get_model_info and /tokenize: the probe still finds echo, and the first
    request speculates on it from the second wave on, its text the target's own (asked of the server
    with the plain SDK, which shares no code with the client)."""
    provider, waves, target, draft = endpoints(BARE)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        result = await client.completions.create(prompt=PROMPT, max_tokens=40, temperature=0)
    stats = result.speculative
    assert stats.num_rounds > 0 and stats.speculated
    assert stats.verification == "echo", stats
    missing = {call.path for call in provider.calls if call.status == 404}
    assert {"/props", "/version", "/get_model_info"} <= missing
    assert not any(call.path == "/tokenize" and call.status == 200 for call in provider.calls)
    # The probe's whole first wave, then the request's own calls: the first draft goes in the second.
    assert waves.first_wave_of(b'"model":"sim-draft"') == 2, waves.waves[:3]

    plain = openai.AsyncOpenAI(base_url="http://sim/v1", api_key="sim", http_client=httpx2.AsyncClient(transport=SimTransport(provider)))
    async with plain:
        alone = await plain.completions.create(model="sim-target", prompt=PROMPT, max_tokens=40, temperature=0)
    assert result.choices[0].text == alone.choices[0].text


@pytest.mark.parametrize("profile", ["vllm", BARE])
async def test_fresh_client_streams_the_targets_text_on_its_first_three_requests(profile):
    """The benchmark's shape (streamed, one request after another, each prompt new): every one speculated
    and exact, the probe done once. (The fixed policy: with no latency, the adaptive one rightly stops.)"""
    provider, _, target, draft = endpoints(profile)
    prompts = [PROMPT, "class Stack:\n    def push(self, item):\n", "import json\n\ndef load(path):\n"]
    plain = openai.AsyncOpenAI(base_url="http://sim/v1", api_key="sim", http_client=httpx2.AsyncClient(transport=SimTransport(provider)))
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed") as client, plain:
        for prompt in prompts:
            stream = await client.completions.create(prompt=prompt, max_tokens=32, temperature=0, stream=True)
            text = "".join([chunk.choices[0].text async for chunk in stream if chunk.choices])
            alone = await plain.completions.create(model="sim-target", prompt=prompt, max_tokens=32, temperature=0)
            assert text == alone.choices[0].text
            assert stream.speculative.num_rounds > 0
    echo_probes = [c for c in provider.calls if isinstance(c.body, dict) and c.body.get("echo") and c.body.get("prompt") == specapi.parts.probe._PROBE_PROMPT]
    assert len(echo_probes) == 3  # one probe: the echo scoring request and the two temperatures


def test_a_new_client_loads_what_the_first_request_would_otherwise_wait_for():
    """In a fresh process, constructing a client loads the suffix index's tokenizer, the price table and
    each role's HTTP client; before, the first request loaded them on the event loop (0.35 s here: a
    first answer from a 5 M vLLM target took 559 ms against the target alone's 109 ms)."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import sys
        from specapi import AsyncSpeculativeOpenAI, Endpoint
        import specapi.parts.drafters as drafters
        before = (drafters._ENCODING is not None, "genai_prices" in sys.modules)
        client = AsyncSpeculativeOpenAI(target=Endpoint(base_url="http://127.0.0.1:9/v1", model="t"),
                                        draft=Endpoint(base_url="http://127.0.0.1:9/v1", model="d"))
        roles = client._runtime.target._client is not None and client._runtime.draft._client is not None
        print(before, (drafters._ENCODING is not None, "genai_prices" in sys.modules), roles)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["(False,", "False)", "(True,", "True)", "True"], result.stdout
