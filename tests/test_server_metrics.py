"""The proxy's Prometheus metrics: vLLM-style spec-decode counters on a known run, the load-reason counter,
no `_created` series, and values from two worker processes adding up in a multiprocess directory."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx2
import pytest
from prometheus_client import values
from prometheus_client.mmap_dict import MmapedDict

from specapi.server import BackgroundServer
from specapi.server.metrics import MULTIPROCESS_DIR_VARIABLE, ProxyMetrics
from specapi.server.peers import PEERS_DIR_VARIABLE
from specapi.sim import SimProvider
from specapi.sim import create_app as create_sim_app
from specapi.core.stats import RoundRecord, SpeculativeStats
from test_server_support import metric

ROUTE = "/v1/completions"
# Three rounds: 4 drafted, first 3 accepted; 4 drafted, none accepted; a plain target step (nothing drafted).
KNOWN = SpeculativeStats(
    rounds=(
        RoundRecord(drafted=4, accepted=3, emitted=4, accepted_by_position=(True, True, True, False)),
        RoundRecord(drafted=4, accepted=0, emitted=1, accepted_by_position=(False, False, False, False)),
        RoundRecord(drafted=0, accepted=0, emitted=1),
    ),
    generated_tokens=6,
)


def test_vllm_style_counters_on_a_known_run():
    metrics = ProxyMetrics(model="big-model")
    metrics.observe(ROUTE, KNOWN)
    metrics.observe(ROUTE, KNOWN)
    text = metrics.render().decode()
    labels = {"model_name": "big-model"}
    assert metric(text, "specapi_spec_decode_num_drafts_total", **labels) == 4  # rounds that drafted, not the plain step
    assert metric(text, "specapi_spec_decode_num_draft_tokens_total", **labels) == 16
    assert metric(text, "specapi_spec_decode_num_accepted_tokens_total", **labels) == 6
    per_position = [metric(text, "specapi_spec_decode_num_accepted_tokens_per_pos_total", position=str(p), **labels) for p in range(1, 6)]
    assert per_position == [2, 2, 2, 0, 0]  # 1-based positions; the per-position counts add up to the accepted total
    assert "_created" not in text
    # The 0-based counters are unchanged.
    assert metric(text, "specapi_drafted_tokens_by_position_total", position="0") == 4
    assert metric(text, "specapi_accepted_tokens_by_position_total", position="2") == 2


def test_deep_positions_share_one_label():
    deep = SpeculativeStats(rounds=(RoundRecord(drafted=70, accepted=70, emitted=71, accepted_by_position=(True,) * 70),))
    metrics = ProxyMetrics(model="m")
    metrics.observe(ROUTE, deep)
    text = metrics.render().decode()
    assert metric(text, "specapi_spec_decode_num_accepted_tokens_per_pos_total", position="64") == 1
    assert metric(text, "specapi_spec_decode_num_accepted_tokens_per_pos_total", position="65+") == 6


@dataclass(frozen=True)
class LoadAwareStats(SpeculativeStats):
    """Stats as the load-aware policy fills them in (a field this module only reads by name)."""

    load_reason: str | None = None


def test_speculation_held_back_by_load_is_counted_by_reason():
    metrics = ProxyMetrics(model="m")
    metrics.observe(ROUTE, LoadAwareStats(load_reason="shorter_draft_under_load"))
    metrics.observe(ROUTE, LoadAwareStats(load_reason="shorter_draft_under_load"))
    metrics.observe(ROUTE, LoadAwareStats(load_reason="stopped_under_load"))
    metrics.observe(ROUTE, LoadAwareStats())
    metrics.observe(ROUTE, KNOWN)  # stats without the field at all
    text = metrics.render().decode()
    assert metric(text, "specapi_speculation_reduced_total", model_name="m", reason="shorter_draft_under_load") == 2
    assert metric(text, "specapi_speculation_reduced_total", model_name="m", reason="stopped_under_load") == 1
    assert sum(s.value for f in _families(text, "specapi_speculation_reduced") for s in f.samples) == 3


def test_the_policy_s_own_load_reasons_are_labelled_without_cutting_a_word():
    from specapi.parts.policy import LOAD_DRAFT_LENGTH, LOAD_STREAM_FASTER, LOAD_TARGET_ALONE

    metrics = ProxyMetrics(model="m")
    reasons = (LOAD_TARGET_ALONE, LOAD_DRAFT_LENGTH, LOAD_STREAM_FASTER)
    for reason in reasons:
        metrics.observe(ROUTE, LoadAwareStats(load_reason=reason))
    labels = [s.labels["reason"] for f in _families(metrics.render().decode(), "specapi_speculation_reduced") for s in f.samples]
    assert len(set(labels)) == 3
    for label in labels:
        assert len(label) <= 64
        whole = next(r for r in reasons if r == label or (label.endswith("...") and r.startswith(label[:-3])))
        if label != whole:  # cut: what was kept ends where a word ends
            assert whole[len(label) - 3] in " :;,", label


def _families(text: str, name: str) -> list:
    from prometheus_client.parser import text_string_to_metric_families

    return [f for f in text_string_to_metric_families(text) if f.name == name]


def test_metrics_of_two_processes_add_up_in_the_multiprocess_directory(tmp_path, monkeypatch):
    """Two workers simulated in one process: each writes its own files (process ids 101 and 102)."""
    monkeypatch.setenv(MULTIPROCESS_DIR_VARIABLE, str(tmp_path))
    workers = []
    for pid in (101, 102):
        monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda pid=pid: pid))
        workers.append(ProxyMetrics(model="m"))
    first, second = workers
    first.observe(ROUTE, KNOWN)
    second.observe(ROUTE, KNOWN)
    second.observe(ROUTE, KNOWN)
    first.request(ROUTE, 200)
    second.request(ROUTE, 200)
    second.request(ROUTE, 429)
    first.in_flight.inc(2)
    second.in_flight.inc(1)
    assert {p.name for p in tmp_path.iterdir()} >= {"counter_101.db", "counter_102.db"}
    for text in (first.render().decode(), second.render().decode()):  # either worker answers for both
        assert metric(text, "specapi_spec_decode_num_drafts_total", model_name="m") == 6
        assert metric(text, "specapi_spec_decode_num_accepted_tokens_total", model_name="m") == 9
        assert metric(text, "specapi_requests_total", route=ROUTE, status="200") == 2
        assert metric(text, "specapi_requests_total", route=ROUTE, status="429") == 1
        assert metric(text, "specapi_in_flight_requests") == 3
        assert "_created" not in text
    assert first.registry.get_sample_value("specapi_rounds_total") == 3  # each process's own registry: its own values


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _counts_by_process(directory, name: str) -> dict[str, float]:
    """What each worker's own counter file holds for samples called `name` (summed over labels)."""
    totals: dict[str, float] = {}
    for path in directory.glob("counter_*.db"):
        pid = path.stem.split("_", 1)[1]
        for key, value, *_ in MmapedDict.read_all_values_from_file(str(path)):
            if f'"{name}"' in key.split(",")[1]:
                totals[pid] = totals.get(pid, 0.0) + value
    return totals


def _served_by(directory, before: dict[str, float]) -> str:
    """The worker whose request count grew since `before` (one request sent in between)."""
    after = _counts_by_process(directory, "specapi_requests_total")
    (pid,) = [pid for pid, count in after.items() if count > before.get(pid, 0.0)]
    return pid


def test_specapi_serve_with_two_workers_adds_up_shares_what_it_learns_and_drains_on_sigterm(tmp_path):
    peers = tmp_path / "peers"
    peers.mkdir()
    with BackgroundServer(create_sim_app(SimProvider(latency="lan")), shutdown_timeout=1) as target:
        port = _free_port()
        env = {
            PEERS_DIR_VARIABLE: str(peers),
            **os.environ,
            "SPECAPI_TARGET_BASE_URL": target.url + "/v1", "SPECAPI_TARGET_MODEL": "sim-target",
            "SPECAPI_DRAFT_BASE_URL": target.url + "/v1", "SPECAPI_DRAFT_MODEL": "sim-draft",
            "SPECAPI_TARGET_API_KEY": "sk-sim", "SPECAPI_DRAFT_API_KEY": "sk-sim",
            "SPECAPI_PORT": str(port), "SPECAPI_LOG_LEVEL": "warning", MULTIPROCESS_DIR_VARIABLE: str(tmp_path),
        }
        process = subprocess.Popen(
            [sys.executable, "-c", "from specapi.cli import cli; cli()", "serve", "--workers", "2", "--shutdown-timeout", "10"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 60
            while True:
                assert process.poll() is None, process.communicate()
                try:
                    if httpx2.get(url + "/ready").status_code == 200:
                        break
                except httpx2.TransportError:
                    pass
                assert time.monotonic() < deadline, "specapi serve --workers 2 did not come up"
                time.sleep(0.1)
            # `/ready` is whichever worker took the connection; `specapi_workers` counts those done starting.
            while metric(httpx2.get(url + "/metrics").text, "specapi_workers") < 2:
                assert time.monotonic() < deadline, "the second worker did not finish its startup"
                time.sleep(0.1)
            started = httpx2.get(url + "/metrics").text
            assert metric(started, "specapi_workers") == 2
            assert metric(started, "specapi_upstream_requests_total", role="target") > 0  # each worker's probe, billed
            body = {"model": "sim-target", "prompt": "def f(x):", "max_tokens": 8, "temperature": 0}
            for _ in range(6):  # a new connection each: the kernel spreads them over the workers
                assert httpx2.post(url + "/v1/completions", json=body, timeout=30).status_code == 200
            text = httpx2.get(url + "/metrics").text
            by_process = _counts_by_process(tmp_path, "specapi_requests_total")
            assert len(list(tmp_path.glob("counter_*.db"))) == 2  # two workers, one file each
            assert sum(by_process.values()) == 6 == metric(text, "specapi_requests_total", route="/v1/completions", status="200")
            drafts = metric(text, "specapi_spec_decode_num_drafts_total", model_name="sim-target")
            assert drafts == sum(_counts_by_process(tmp_path, "specapi_spec_decode_num_drafts_total").values()) > 0
            # A prompt one worker answered is drafted from by the other: each has a socket in the peers'
            # directory, and what one learns reaches the other.
            assert len(list(peers.glob("*.sock"))) == 2
            taught = {**body, "prompt": "从前有座山, 山里有座庙 🙂; once upon a time", "max_tokens": 30}
            before = _counts_by_process(tmp_path, "specapi_requests_total")
            assert httpx2.post(url + "/v1/completions", json=taught, timeout=30).status_code == 200
            teacher = _served_by(tmp_path, before)
            time.sleep(0.3)
            for _ in range(40):  # new connections until the other worker takes one
                before = _counts_by_process(tmp_path, "specapi_requests_total")
                response = httpx2.post(url + "/v1/completions", json=taught, timeout=30).json()
                if _served_by(tmp_path, before) != teacher:
                    break
            else:
                pytest.fail("the kernel never gave the second worker a connection")
            # Most of its answer drafted from what it learnt, none by the draft model (the adaptive policy may
            # still let the target write the last tokens alone, to measure the target's speed).
            assert response["speculative"]["accepted_tokens"] >= 15  # of 30
            # (On vLLM's token-id path the draft server may split a draft's text into ids: lookups that
            # generate nothing and bill no tokens.)
            draft = response["speculative"]["draft"]
            assert draft["completion_tokens"] == 0 and draft["prompt_tokens"] == 0
            # A long stream in flight when SIGTERM comes: it finishes before its worker exits.
            with httpx2.Client(timeout=60) as client, client.stream(
                "POST", url + "/v1/completions", json={**body, "max_tokens": 60, "stream": True}
            ) as stream:
                lines = stream.iter_lines()
                first = next(line for line in lines if line.startswith("data: "))
                process.send_signal(signal.SIGTERM)
                rest = [line for line in lines if line.startswith("data: ")]
            assert first and rest[-1] == "data: [DONE]"
            assert process.wait(timeout=30) == 0
            assert list(peers.iterdir()) == []  # each worker removed its socket
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)  # the supervisor and its workers
            process.communicate(timeout=30)
    with pytest.raises(httpx2.TransportError):
        httpx2.get(url + "/health", timeout=2)
