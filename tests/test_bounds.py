"""Bounded memory: every per-request record, cache and learned table stays bounded after many inserts
(the simulator's call records and prefix cache, the client's per-model tables, the proxy's tenants and
metric labels). Sizes only, no timing: `benchmarks/soak.py` shows the resident memory over a long run."""

from __future__ import annotations

import gc
from dataclasses import dataclass

import httpx2

from specapi import AsyncSpeculativeOpenAI
from specapi.surface.runtime import MAX_OTHER_MODELS
from specapi.server import ServerConfig, create_app
from specapi.server.metrics import ProxyMetrics
from specapi.sim import SimProvider, simulated_endpoints
from specapi.sim.latency import PrefixCache
from specapi.sim.provider import CallList
from specapi.sim.server import serving_provider
from specapi.core.stats import RoundRecord, SpeculativeStats
from test_server_support import metric


async def test_the_simulator_keeps_only_its_latest_calls():
    provider = SimProvider(latency="instant", max_calls=5)
    for i in range(40):
        body = {"model": "sim-target", "prompt": f"def f{i}(x):", "max_tokens": 2, "echo": True, "logprobs": 5}
        assert (await provider.handle("POST", "/v1/completions", body)).status == 200
    assert len(provider.calls) == 5
    assert [c.body["prompt"] for c in provider.calls] == [f"def f{i}(x):" for i in range(35, 40)]
    assert provider.usage["sim-target"].requests == 40  # the counters still count every request


async def test_a_served_simulator_records_no_calls_and_its_models_stay_out_of_the_collectors_passes():
    try:
        provider = serving_provider(latency="instant")
        model = provider.model("sim-target")  # built by the warm-up, before the freeze
        assert not any(o is model for o in gc.get_objects())  # frozen: no pass of the collector walks it
        for i in range(3):
            body = {"model": "sim-target", "prompt": f"def f{i}(x):", "max_tokens": 2, "stream": i == 2}
            response = await provider.handle("POST", "/v1/completions", body)
            assert response.status == 200
            if response.stream is not None:
                assert [chunk async for chunk in response.stream]
        assert list(provider.calls) == []
        assert provider.usage["sim-target"].requests == 3 and provider.usage["sim-target"].completion_tokens == 6
    finally:
        gc.unfreeze()


def test_call_list_bound_and_the_default():
    calls = CallList(limit=3)
    for i in range(1000):
        calls.append(i)  # type: ignore[arg-type]
    assert list(calls) == [997, 998, 999] and calls.last == 999
    assert SimProvider().calls.limit == 1000
    assert SimProvider(max_calls=None).calls.limit is None


def test_the_simulated_prefix_cache_has_a_default_capacity():
    cache = PrefixCache(block_tokens=1)
    assert cache.capacity == 100_000
    cache = PrefixCache(block_tokens=1, capacity=50)
    for start in range(0, 10_000, 100):
        cache.insert(list(range(start, start + 100)))
    assert len(cache._blocks) == 50


async def test_the_clients_tables_for_other_models_are_bounded():
    target, draft = simulated_endpoints(latency="instant")
    client = AsyncSpeculativeOpenAI(target=target, draft=draft)
    runtime = client._runtime
    own = runtime.suffix_for(target.model)
    for i in range(10 * MAX_OTHER_MODELS):
        runtime.target_for(f"model-{i}")
        runtime.suffix_for(f"model-{i}")
    assert len(runtime._by_model) == MAX_OTHER_MODELS and len(runtime._suffix_by_model) == MAX_OTHER_MODELS
    assert f"model-{10 * MAX_OTHER_MODELS - 1}" in runtime._by_model and "model-0" not in runtime._by_model
    assert runtime.suffix_for(target.model) is own is runtime.suffix_index  # the target's own index never leaves
    await client.close()


async def test_the_proxys_tenant_indexes_are_bounded():
    target, draft = simulated_endpoints(latency="instant")
    app = create_app(ServerConfig(target=target, draft=draft, suffix_scope="api-key", max_tenants=3))
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://proxy") as http:
        for i in range(12):
            response = await http.post(
                "/v1/completions", json={"prompt": "def f(x):", "max_tokens": 2, "temperature": 0},
                headers={"authorization": f"Bearer tenant-{i}"},
            )
            assert response.status_code == 200
    proxy = app.routes[0].endpoint.__self__
    assert len(proxy._tenants) == 3


def test_metric_labels_are_bounded():
    metrics = ProxyMetrics(model="m")
    long_draft = SpeculativeStats(rounds=(RoundRecord(drafted=500, accepted=500, emitted=501, accepted_by_position=(True,) * 500),))
    metrics.observe("/v1/completions", long_draft)
    text = metrics.render().decode()
    positions = {line.split('position="')[1].split('"')[0] for line in text.splitlines() if "per_pos_total{" in line}
    assert len(positions) == 65 and metric(text, "specapi_spec_decode_num_accepted_tokens_per_pos_total", position="65+") == 436
    for i in range(100):
        metrics.observe("/v1/completions", _WithReason(load_reason=f"reason {i} " + "x" * 100))
    reasons = {line.split('reason="')[1].split('"')[0] for line in metrics.render().decode().splitlines() if "reduced_total{" in line}
    assert len(reasons) == 33 and "other" in reasons and max(map(len, reasons)) <= 64
    # A long reason is cut between words, never inside one, and says it was cut.
    assert reasons - {"other"} == {f"reason {i}..." for i in range(32)}


@dataclass(frozen=True)
class _WithReason(SpeculativeStats):
    load_reason: str | None = None


_MALLOC_PROBE = """
import ctypes, os, re, sys, threading
from specapi.sim.server import tune_malloc
if sys.argv[1] == "tune":
    assert tune_malloc() is True
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
libc.fopen.restype = ctypes.c_void_p
class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]
libc.mallinfo2.restype = Info
libc.free(libc.malloc(8 << 20))  # mmapped and freed: a dynamic threshold rises to 8 MB
before = libc.mallinfo2().hblks
held = libc.malloc(7 << 20)  # mmapped only if the threshold stayed where it was set
mmapped = libc.mallinfo2().hblks - before
def other_thread():
    libc.free(libc.malloc(1000))  # a thread's first malloc: glibc gives it an arena of its own unless capped
thread = threading.Thread(target=other_thread)
thread.start()
thread.join()
path = os.path.join(sys.argv[2], "malloc_info.xml")
stream = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
print(mmapped, len(re.findall("<heap nr=", open(path).read())))
"""


def test_the_simulator_server_tunes_glibcs_malloc_where_there_is_one(tmp_path):
    """`specapi simulate` pins glibc's mmap threshold (a large block freed no longer moves later ones onto
    the heap) and keeps one malloc arena (another thread gets none of its own); both seen through glibc's
    own statistics, in fresh processes with and without the call. Elsewhere the call says it did nothing."""
    import ctypes.util
    import platform
    import subprocess
    import sys

    from specapi.sim.server import tune_malloc

    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc" and ctypes.util.find_library("c")
    if not glibc:
        assert tune_malloc() is False
        return

    def probe(mode: str) -> tuple[int, int]:
        command = [sys.executable, "-c", _MALLOC_PROBE, mode, str(tmp_path)]
        out = subprocess.run(command, capture_output=True, text=True, check=True)
        mmapped, arenas = out.stdout.split()
        return int(mmapped), int(arenas)

    assert probe("tune") == (1, 1)
    assert probe("default") == (0, 2)  # glibc's defaults, for contrast: what the call changes
