"""`specapi simulate` (run_server) over real HTTP: each profile answers its own server's native
endpoints, the ones a probe tells servers apart by (`/version`, `/get_model_info`, `/props`), and not the
others'; one generation through each native API."""

from __future__ import annotations

import contextlib
import os
import pathlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx2
import pytest

from specapi.sim import encode_text

ROOT = pathlib.Path(__file__).resolve().parent.parent
CLI = "import sys; from specapi.cli import cli; sys.argv[0] = 'specapi'; cli()"  # the `specapi` script

#: (profile, the path only that server answers)
IDENTITY = {"vllm": "/version", "sglang": "/get_model_info", "llamacpp": "/props"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def simulate(profiles: list[str]) -> Iterator[dict[str, str]]:
    """`specapi simulate` processes, one per profile, started together; their root URLs."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    started: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    try:
        for profile in profiles:
            port = _free_port()
            argv = [sys.executable, "-c", CLI, "simulate", "--port", str(port), "--profile", profile,
                    "--latency", "instant", "--log-level", "warning"]
            process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
            started[profile] = (process, f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + 60
        for profile, (process, root) in started.items():
            while True:
                assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
                assert time.monotonic() < deadline, f"specapi simulate --profile {profile} did not start"
                try:
                    if httpx2.get(root + "/v1/models", timeout=2).status_code == 200:
                        break
                except httpx2.HTTPError:
                    time.sleep(0.1)
        yield {profile: root for profile, (_, root) in started.items()}
    finally:
        for process, _ in started.values():
            process.terminate()
        for process, _ in started.values():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stderr:
                process.stderr.close()


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, str]]:
    with simulate(list(IDENTITY)) as roots:
        yield roots


@pytest.mark.parametrize("profile", list(IDENTITY))
def test_each_profile_answers_only_its_own_identity_endpoint(servers, profile):
    root = servers[profile]
    for other, path in IDENTITY.items():
        status = httpx2.get(root + path, timeout=10).status_code
        assert status == (200 if other == profile else 404), (profile, path, status)


def test_native_generation_over_http(servers):
    ids = encode_text("def add(a, b):")
    llamacpp = httpx2.post(servers["llamacpp"] + "/completion", json={
        "prompt": [ids, "def add(a, b):"], "n_predict": 2, "n_probs": 2, "temperature": 0, "return_tokens": True}, timeout=30).json()
    assert llamacpp[0]["tokens"] == llamacpp[1]["tokens"] and llamacpp[0]["completion_probabilities"]
    sglang = httpx2.post(servers["sglang"] + "/generate", json={
        "input_ids": ids, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}, timeout=30).json()
    vllm = httpx2.post(servers["vllm"] + "/v1/completions", json={
        "model": "sim-target", "prompt": ids, "max_tokens": 2, "temperature": 0, "return_token_ids": True}, timeout=30).json()
    assert sglang["output_ids"] == vllm["choices"][0]["token_ids"] == llamacpp[0]["tokens"]  # one model, three dialects
