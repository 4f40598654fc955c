"""Capability probing: what each server flavour offers, what probing costs and who pays, transient
failures while probing, and the `specapi probe` command against the toy server over real HTTP."""

from __future__ import annotations

import dataclasses
import gc
import json
import warnings

import httpx2
import pytest

import specapi.parts.probe
from specapi import AsyncSpeculativeOpenAI, Endpoint
from specapi.transport._calls import Meter, RoleClient
from specapi.cli import cli_logic
from specapi.parts.probe import Capabilities, choose_verification, probe_endpoint
from specapi.sim import CAPABILITY_PROFILES, Faults, SimProvider, SimTransport, simulated_endpoints
from simclient import target_alone
from toyserver import ToyServer

PROBE_PROMPT = specapi.parts.probe._PROBE_PROMPT


pytestmark = pytest.mark.usefixtures("fresh_probe_cache")


def sim(profile, **options) -> tuple[SimProvider, Endpoint, Endpoint]:
    provider = SimProvider(capabilities=profile, latency="instant", seed=0, **options)
    target, draft = simulated_endpoints(provider=provider)
    return provider, target, draft


async def probe(target: Endpoint) -> tuple[Capabilities, Meter]:
    role = RoleClient("target", target)
    meter = Meter(target)
    try:
        return await probe_endpoint(role, meter), meter
    finally:
        await role.sdk.close()


# ----------------------------------------------------------------------------- what each flavour offers

EXPECTED = {
    "vllm": dict(completions=True, echo_logprobs=True, prompt_logprobs=True, chat=True, chat_logprobs=20,
                 chat_prefill=True, prefill_style="continue_final_message", prefill_echoes_prefix=False,
                 predicted_outputs=False, logprobs_raw=True),
    "openai": dict(completions=True, completions_logprobs=5, echo_logprobs=False, prompt_logprobs=False, chat=True,
                   chat_logprobs=20, chat_prefill=False, predicted_outputs=True, logprobs_raw=None),
    "llamacpp": dict(completions=True, echo_logprobs=False, prompt_logprobs=False, chat=True, chat_logprobs=20,
                     chat_prefill=True, prefill_style="trailing", prefill_echoes_prefix=True,
                     predicted_outputs=False),
}
CHOSEN = {"vllm": ("echo", "prompt-logprobs"), "openai": ("prefill-fanout", "predicted-outputs"),
          "llamacpp": ("token-ids", "prefill-fanout")}


@pytest.mark.parametrize("profile", ["vllm", "openai", "llamacpp"])
async def test_probe_finds_what_each_profile_offers(profile):
    provider, target, _ = sim(profile)
    caps, meter = await probe(target)
    found = {name: getattr(caps, name) for name in EXPECTED[profile]}
    assert found == EXPECTED[profile]
    assert caps.completions_logprobs >= 5  # top-5 asked, the chosen token may come on top
    assert (choose_verification(caps, chat=False), choose_verification(caps, chat=True)) == CHOSEN[profile]
    assert caps.notes and all(isinstance(n, str) and n for n in caps.notes)
    # every probe request is metered, refusals included (the GETs that ask what the server is bill nothing)
    target_calls = [c for c in provider.calls if c.method == "POST"]
    assert meter.requests == len(target_calls) > 0
    assert meter.failed_requests == sum(c.status != 200 for c in target_calls)


SERVERS = {"vllm": ("vllm", True), "sglang": ("sglang", True), "llamacpp": ("llama-server", True), "openai": (None, False)}


@pytest.mark.parametrize("profile", list(SERVERS))
async def test_probe_names_the_dialect_from_the_servers_identity_endpoint(profile):
    """vLLM answers /version, SGLang /get_model_info, llama-server /props; each takes token-id prompts
    through its native API, which the probe checks by tokenizing its prompt."""
    provider, target, _ = sim(profile)
    caps, _ = await probe(target)
    assert (caps.server, caps.token_ids) == SERVERS[profile]
    native = [c.path for c in provider.calls if c.path in ("/tokenize", "/generate")]
    assert bool(native) == caps.token_ids
    assert any(n.startswith("dialect: ") for n in caps.notes)


@pytest.mark.parametrize("profile", ["vllm", "sglang"])
async def test_long_contexts_are_verified_in_token_ids_where_echo_would_re_prefill_them(profile):
    from specapi.parts.paths import LONG_CONTEXT_CHARS, PathResolver

    _, target, _ = sim(profile)
    resolver = PathResolver(RoleClient("target", target), "auto")
    meter = Meter(target)
    short = await resolver.resolve(False, meter, context_chars=100)
    long = await resolver.resolve(False, meter, context_chars=LONG_CONTEXT_CHARS)
    chat = await resolver.resolve(True, meter, context_chars=LONG_CONTEXT_CHARS)
    if profile == "vllm":
        # vLLM runs every request on token ids (completions, and chat through `/tokenize` with the
        # messages): no text round-trip that could split the answer otherwise, at any length.
        assert (short.name, long.name, chat.name) == ("token-ids", "token-ids", "token-ids")
    else:
        assert (short.name, long.name) == ("echo", "token-ids")
        assert chat.name != "token-ids"
    # Sampled requests go to token ids at any length (the target's own picks need no list coverage),
    # unless their opted-in lossy rule reads the target's lists.
    sampled = await resolver.resolve(False, meter, context_chars=100, greedy=False)
    lossy = await resolver.resolve(False, meter, context_chars=LONG_CONTEXT_CHARS, greedy=False, needs_lists=True)
    assert (sampled.name, lossy.name) == ("token-ids", "echo")


def test_probe_command_names_the_dialect(capsys):
    from simserver import ServerThread
    from specapi.cli import cli_logic
    from specapi.sim import create_app

    with ServerThread(create_app(SimProvider(capabilities="llamacpp", latency="instant"))) as server:
        code = cli_logic(["probe", "--base-url", server.root + "/v1", "--model", "sim-target", "--json", "--api-key", "k"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 0
    assert payload["capabilities"]["server"] == "llama-server" and payload["capabilities"]["token_ids"] is True
    assert payload["verification"]["completions"] == "token-ids"


VARIANTS = {
    # SGLang-like: continues a final assistant message, has no chat prompt_logprobs
    "no-prompt-logprobs": ("vllm", dict(prompt_logprobs_param=False),
                           dict(echo_logprobs=True, prompt_logprobs=False, chat_prefill=True), "prefill-fanout"),
    "no-prediction": ("openai", dict(predicted_outputs=False), dict(predicted_outputs=False, chat_prefill=False),
                      "prefix-match"),
    "no-prefill": ("llamacpp", dict(assistant_prefill=False), dict(chat_prefill=False, prefill_echoes_prefix=False),
                   "prefix-match"),
    "no-echo": ("vllm", dict(completions_echo=False), dict(echo_logprobs=False, completions=True, prompt_logprobs=True),
                "prompt-logprobs"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
async def test_probe_follows_the_server_not_the_profile_name(variant):
    """Turning one capability off changes what the probe reports, and nothing else it found."""
    base, changes, expected, chat_path = VARIANTS[variant]
    caps_profile = dataclasses.replace(CAPABILITY_PROFILES[base], name=f"{base}-{variant}", **changes)
    caps, _ = await probe(simulated_endpoints(provider=SimProvider(capabilities=caps_profile, latency="instant"))[0])
    assert {name: getattr(caps, name) for name in expected} == expected
    assert choose_verification(caps, chat=True) == chat_path


async def test_probe_tells_raw_logprobs_from_temperature_scaled_ones():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)

    async def scaled(request: httpx2.Request) -> httpx2.Response:
        """A server whose echoed logprobs are divided by the temperature (not raw)."""
        body = json.loads(request.content)
        reply = await provider.handle(request.method, request.url.path, body, dict(request.headers))
        payload = reply.json
        if reply.status == 200 and body.get("echo"):
            temperature = body.get("temperature") or 1.0
            for choice in payload["choices"]:
                lp = choice["logprobs"]
                lp["token_logprobs"] = [None if x is None else x / temperature for x in lp["token_logprobs"]]
        return httpx2.Response(reply.status, json=payload, headers=reply.headers)

    target = Endpoint(model="sim-target", base_url="http://scaled/v1", api_key="x", name="scaled logprobs",
                      http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(scaled)))
    caps, _ = await probe(target)
    assert caps.echo_logprobs is True
    assert caps.logprobs_raw is False
    raw, _ = await probe(simulated_endpoints(provider=provider)[0])
    assert raw.logprobs_raw is True


def test_choose_verification_prefers_one_call_scoring():
    assert choose_verification(Capabilities(), chat=False) == "none"
    assert choose_verification(Capabilities(), chat=True) == "prefix-match"
    assert choose_verification(Capabilities(completions=True), chat=False) == "prefill-fanout"
    assert choose_verification(Capabilities(completions=True, echo_logprobs=True), chat=False) == "echo"
    everything = Capabilities(completions=True, echo_logprobs=True, chat=True, prompt_logprobs=True,
                              chat_prefill=True, predicted_outputs=True)
    assert choose_verification(everything, chat=True) == "prompt-logprobs"
    assert choose_verification(dataclasses.replace(everything, prompt_logprobs=False), chat=True) == "prefill-fanout"
    assert choose_verification(Capabilities(chat=True, predicted_outputs=True), chat=True) == "predicted-outputs"


# ----------------------------------------------------------------------------- who pays for probing


@pytest.mark.parametrize("profile", ["vllm", "openai", "llamacpp"])
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_probe_requests_are_accounted_to_the_request_that_caused_them(profile, chat):
    provider, target, draft = sim(profile)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed") as client:
        for attempt in ("probing", "probed"):
            before = {m: dataclasses.replace(u) for m, u in provider.usage.items()}
            start = len(provider.calls)
            if chat:
                resp = await client.chat.completions.create(
                    messages=[{"role": "user", "content": "Write a Python function that returns the sum of a list."}],
                    max_tokens=24, temperature=0)
            else:
                resp = await client.completions.create(prompt="def fibonacci(n):\n", max_tokens=24, temperature=0)
            s = resp.speculative
            probes = [c for c in provider.calls[start:] if isinstance(c.body, dict)
                      and (c.body.get("prompt") == PROBE_PROMPT or c.body.get("messages", [{}])[0].get("content") == "a b c d e")]
            assert bool(probes) == (attempt == "probing"), "the first request probes, the next one does not"
            for role, model in (("target", "sim-target"), ("draft", "sim-draft")):
                mine, server = getattr(s, role), provider.usage[model]
                billed = (server.requests - before[model].requests) + (server.errors - before[model].errors)
                calls = [c for c in provider.calls[start:] if c.method == "POST" and _model_of(c) == model]
                # Every POST is counted; tokenizing (token-id paths) is a request the server does not bill.
                unbilled = sum(c.path == "/tokenize" for c in calls)
                assert mine.requests == len(calls) == billed + unbilled, (attempt, role)
                assert mine.failed_requests == server.errors - before[model].errors, (attempt, role)
                assert mine.prompt_tokens == server.prompt_tokens - before[model].prompt_tokens, (attempt, role)
                assert mine.completion_tokens == server.completion_tokens - before[model].completion_tokens, (attempt, role)


def _model_of(call) -> str | None:
    """The model a call was for: the simulator's record, or the body's field (native paths)."""
    return call.model or (call.body.get("model") if isinstance(call.body, dict) else None)


# ----------------------------------------------------------------------------- transient failures while probing


async def test_probe_retries_429s_honouring_retry_after_and_keeps_the_best_path():
    provider, target, draft = sim("llamacpp", faults=Faults(fail_first=2, fail_first_status=429, retry_after_s=0.75,
                                                              model="sim-target"))
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", sleep=sleep) as client:
        resp = await client.completions.create(prompt="def fibonacci(n):\n", max_tokens=16, temperature=0)
    s = resp.speculative
    assert slept == [0.75, 0.75]
    assert (s.verification, s.speculated) == ("token-ids", True)
    assert s.target.failed_requests >= 2  # the 429s are in the statistics of the request that probed


@pytest.mark.parametrize("profile, best", [("llamacpp", "token-ids"), ("openai", "prefill-fanout")])
async def test_a_probe_defeated_by_429s_does_not_downgrade_later_requests(profile, best):
    """More 429s than retries: the probe gives up. The request still gets the target's output, and
    the endpoint is probed again later instead of being written off."""
    provider, target, draft = sim(profile, faults=Faults(fail_first=4, fail_first_status=429, retry_after_s=0.1,
                                                           model="sim-target"))
    clean = SimProvider(capabilities=profile, latency="instant", seed=0)
    reference, _ = simulated_endpoints(provider=clean)

    async def sleep(seconds: float) -> None:
        pass

    prompt = "def fibonacci(n):\n"
    async with AsyncSpeculativeOpenAI(target=reference, verification="none") as plain:
        expected = (await plain.completions.create(prompt=prompt, max_tokens=16, temperature=0)).choices[0].text
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", sleep=sleep) as client:
        paths = []
        for _ in range(3):
            resp = await client.completions.create(prompt=prompt, max_tokens=16, temperature=0)
            assert resp.choices[0].text == expected
            paths.append(resp.speculative.verification)
    assert paths[-1] == best, paths


# ----------------------------------------------------------------------------- the command


def test_probe_command_against_the_toy_server_over_http(capsys):
    with ToyServer() as srv, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        code = cli_logic(["probe", "--base-url", srv.base_url, "--model", "target", "--json"])
        report = json.loads(capsys.readouterr().out)
        assert code == 0
        caps = report["capabilities"]
        assert (caps["completions"], caps["echo_logprobs"], caps["prompt_logprobs"], caps["chat"]) == (True, True, True, True)
        assert (caps["chat_prefill"], caps["prefill_style"], caps["prefill_echoes_prefix"]) == (True, "continue_final_message", False)
        assert (caps["predicted_outputs"], caps["logprobs_raw"]) == (False, True)
        assert caps["chat_logprobs"] == 12  # the toy vocabulary: 11 characters and end of text
        served = srv.snapshot()["target"]
        assert report["requests"] == served.requests + served.failed > 0
        assert (report["prompt_tokens"], report["completion_tokens"]) == (served.prompt_tokens, served.completion_tokens)

        assert report["verification"] == {"completions": "echo", "chat": "prompt-logprobs"}
        code = cli_logic(["probe", "--base-url", srv.base_url, "--model", "target"])
        captured = capsys.readouterr()
        table = captured.out
        assert code == 0
        assert "verification for completions" in table and "echo" in table
        assert "verification for chat" in table and "prompt-logprobs" in table
        assert "probing cost" in captured.err and "probing cost" not in table

        gc.collect()  # connections the command left open are reported now, not at exit
    leaked = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
    assert not leaked, f"the probe command left connections open: {leaked}"


# ----------------------------------------------------------------------------- server sampling defaults


def _llama_like(kind: str) -> Endpoint:
    """The toy server dressed as a llama.cpp server: llama-server reports its defaults at /props,
    llama-cpp-python names itself "me" in /v1/models."""
    from toyclient import InProcessToy

    toy = InProcessToy(kind)

    def handler(request: httpx2.Request) -> httpx2.Response:
        if request.method == "GET" and request.url.path == "/props":
            if kind == "llama-server":
                params = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}
                return httpx2.Response(200, json={"default_generation_settings": {"params": params}})
            return httpx2.Response(404, json={"error": "not found"})
        if request.method == "GET" and request.url.path == "/v1/models":
            return httpx2.Response(200, json={"object": "list", "data": [{"id": "target", "object": "model", "owned_by": "me" if kind == "llama-cpp-python" else "llamacpp"}]})
        return toy.handler(request)

    return Endpoint(model="target", base_url="http://llama.test/v1", api_key="x", name=f"{kind} (toy)",
                    http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)))


@pytest.mark.parametrize("kind", ["llama-server", "llama-cpp-python"])
async def test_probe_learns_a_llama_servers_sampling_defaults(kind):
    client = RoleClient("target", _llama_like(kind))
    caps = await specapi.parts.probe.probe_endpoint(client, Meter(client.endpoint))
    assert caps.server == kind
    assert caps.sampler_defaults["temperature"] == 0.8 and caps.sampler_defaults["top_k"] == 40
    assert caps.sampler_defaults["repeat_penalty"] == (1.1 if kind == "llama-cpp-python" else 1.0)


async def test_a_default_repeat_penalty_leaves_the_target_alone_unless_the_caller_sets_one():
    from toyclient import InProcessToy

    target = _llama_like("llama-cpp-python")
    draft = InProcessToy("draft").endpoint("draft")
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed") as client:
        # 24 tokens: llama-cpp-python's last 16 come from one target call (see probe.Capabilities.final_stretch)
        plain = await client.completions.create(prompt="cafe", max_tokens=24, temperature=0)
        neutral = await client.completions.create(prompt="cafe", max_tokens=24, temperature=0, extra_body={"repeat_penalty": 1.0})
    assert not plain.speculative.speculated and "repeat_penalty 1.1" in plain.speculative.fallback_reason
    assert neutral.speculative.speculated and neutral.speculative.exact


async def test_the_probes_calls_stay_out_of_the_load_curve_that_generation_calls_teach():
    """The probe's tiny requests are unlike a round's calls: in the latency-vs-requests line that a
    burst's first rounds read, they made later calls look costlier per request in flight (probed at a
    proxy's startup, all at one request in flight). Its calls are metered; the line does not see them."""
    _, target, _ = sim("vllm")
    role = RoleClient("target", target)
    meter = Meter(target)
    try:
        await specapi.parts.probe.cached_probe(role, meter)
        assert meter.requests >= 3  # billed like any call
        assert role.load.samples == 0
        await role.post("/completions", {"prompt": "def f(x):", "max_tokens": 2, "temperature": 0}, meter)
        assert role.load.samples == 1  # a generation's call teaches it
    finally:
        await role.sdk.close()


class _UnavailableAtFirst(httpx2.AsyncBaseTransport):
    """In front of a simulated server: 503 to the first `failing` requests whose path ends with `path`."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, path: str, failing: int) -> None:
        self.inner, self.path, self.failing = inner, path, failing

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if request.url.path.endswith(self.path) and self.failing > 0:
            self.failing -= 1
            return httpx2.Response(503, json={"error": {"message": "overloaded", "type": "server_error"}})
        return await self.inner.handle_async_request(request)


@pytest.mark.parametrize("path", ["/version", "/tokenize"])
async def test_a_server_unavailable_while_probed_is_probed_again_not_written_off(path):
    """A 503 to the probe's identity GET or its tokenize call says nothing of what the server supports:
    the request goes on, and the next one probes again and verifies on token ids."""
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    http = httpx2.AsyncClient(transport=_UnavailableAtFirst(SimTransport(provider), path, failing=1))
    target = Endpoint(base_url="http://sim/v1", model="sim-target", name="target", http_client=http, max_retries=0)
    draft = Endpoint(base_url="http://sim/v1", model="sim-draft", name="draft", http_client=http, max_retries=0)
    expected, _ = await target_alone(provider, prompt="def fibonacci(n):\n", max_tokens=16)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", verification="token-ids") as client:
        answers = [await client.completions.create(prompt="def fibonacci(n):\n", max_tokens=16, temperature=0) for _ in range(2)]
    await http.aclose()
    assert [answer.choices[0].text for answer in answers] == [expected, expected]
    assert (answers[-1].speculative.verification, answers[-1].speculative.speculated) == ("token-ids", True), answers[-1].speculative.fallback_reason
