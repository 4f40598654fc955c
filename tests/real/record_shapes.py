#!/usr/bin/env python3
"""Record what llama.cpp's `llama-server` answers on its native API, as JSON fixtures.

    python tests/real/record_shapes.py [OUT_DIR]      # default: tests/fixtures/llamacpp/

Starts the cached `llama-server` (tests/real/build_servers.sh) on the tiny target model of
make_models.py, one slot-parallel process on a free port, sends the requests below, and writes one
`<name>.json` per request: `{"request": {method, path, body}, "status": ..., "response": ...}`. The
simulator's native llama.cpp dialect is tested against these files (tests/test_sim_llamacpp.py): same
keys, types and nesting. Values are this model's and this build's; only the shapes carry over.

Recorded: a single token-id prompt; several prompts in one request (`n_probs`, `n_predict` 1);
`n_predict` 0; greedy and seeded sampling; a stop word; a generation that ends with EOS; a CJK prompt whose tokens are partial UTF-8 (plain and with
`post_sampling_probs`); `/tokenize` (plain, `add_special`, `with_pieces`); `/detokenize`; `/props`.

It also answers one question and writes the answer to `seed_per_prompt.json`: in a multi-prompt
request with a `seed`, does every prompt get the same random stream? Two identical prompts sampled at
temperature 1 with the same seed, in one request, over many seeds: if the streams were shared or
interleaved the two results would differ for some seed.
"""

from __future__ import annotations

import json
import pathlib
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import httpx2

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from conftest import llama_server_binary  # noqa: E402
from make_models import make_models  # noqa: E402

OUT = HERE.parent / "fixtures" / "llamacpp"
SEED_TRIALS = 40

CODE = "def read_lines(path):\n    with open(path"
CJK = "今天天气"
CHAT = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(binary: pathlib.Path, model: pathlib.Path, log: pathlib.Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    argv = [
        str(binary), "--model", str(model), "--alias", "tiny-target",
        "--host", "127.0.0.1", "--port", str(port), "--ctx-size", "4096", "--parallel", "4",
        "--threads", "1", "--threads-batch", "1", "--threads-http", "8", "--no-webui",
    ]  # fmt: skip
    with open(log, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    root = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"llama-server exited with {process.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if httpx2.get(root + "/health", timeout=5).status_code == 200:
                return process, root
        except httpx2.HTTPError:
            pass
        time.sleep(0.25)
    process.kill()
    raise SystemExit("llama-server did not become ready")


def _call(client: httpx2.Client, root: str, method: str, path: str, body: Any = None) -> dict[str, Any]:
    response = client.request(method, root + path, json=body) if body is not None else client.request(method, root + path)
    try:
        payload = response.json()
    except ValueError:
        payload = response.text
    return {"request": {"method": method, "path": path, "body": body}, "status": response.status_code, "response": payload}


def _requests(token_ids: list[int]) -> dict[str, tuple[str, str, Any]]:
    """name -> (method, path, body)."""
    head = token_ids[:6]
    return {
        "completion_ids": ("POST", "/completion", {
            "prompt": head, "n_predict": 4, "n_probs": 3, "temperature": 0, "return_tokens": True, "cache_prompt": True,
        }),
        "completion_multi": ("POST", "/completion", {
            "prompt": [head, token_ids[:8], CODE], "n_predict": 1, "n_probs": 3, "temperature": 0, "return_tokens": True,
        }),
        "completion_n_predict_0": ("POST", "/completion", {"prompt": head, "n_predict": 0, "n_probs": 3, "return_tokens": True}),
        "completion_greedy_text": ("POST", "/completion", {"prompt": CODE, "n_predict": 6, "temperature": 0}),
        "completion_seed": ("POST", "/completion", {
            "prompt": CODE, "n_predict": 6, "temperature": 1.0, "seed": 42, "n_probs": 2, "return_tokens": True,
        }),
        "completion_cjk": ("POST", "/completion", {
            "prompt": CJK, "n_predict": 4, "n_probs": 2, "temperature": 0, "return_tokens": True,
        }),
        "completion_cjk_post_sampling": ("POST", "/completion", {
            "prompt": CJK, "n_predict": 4, "n_probs": 2, "temperature": 0, "post_sampling_probs": True, "return_tokens": True,
        }),
        "completion_stop_word": ("POST", "/completion", {
            "prompt": CODE, "n_predict": 8, "temperature": 0, "stop": ["ent"], "return_tokens": True,
        }),
        "completion_eos": ("POST", "/completion", {
            "prompt": CHAT, "n_predict": 400, "temperature": 0, "return_tokens": True,
        }),
        "tokenize": ("POST", "/tokenize", {"content": CODE}),
        "tokenize_add_special": ("POST", "/tokenize", {"content": CJK, "add_special": True}),
        "tokenize_with_pieces": ("POST", "/tokenize", {"content": CJK + " def", "with_pieces": True}),
        "detokenize": ("POST", "/detokenize", {"tokens": head}),
        "props": ("GET", "/props", None),
    }


def _seed_experiment(client: httpx2.Client, root: str, token_ids: list[int]) -> dict[str, Any]:
    prompt = token_ids[:6]
    same_in_request = 0
    repeat_equal = 0
    examples = []
    for seed in range(SEED_TRIALS):
        body = {"prompt": [prompt, prompt], "n_predict": 8, "temperature": 1.0, "seed": seed, "return_tokens": True, "cache_prompt": False}
        first = client.post(root + "/completion", json=body).json()
        again = client.post(root + "/completion", json=body).json()
        a, b = first[0]["tokens"], first[1]["tokens"]
        same_in_request += a == b
        repeat_equal += [r["tokens"] for r in first] == [r["tokens"] for r in again]
        if len(examples) < 3:
            examples.append({"seed": seed, "tokens": [a, b], "repeated": [r["tokens"] for r in again]})
    return {
        "question": "multi-prompt /completion with a seed: does each prompt get the same random stream?",
        "trials": SEED_TRIALS,
        "body": {"prompt": "[p, p] (the same 6 token ids twice)", "n_predict": 8, "temperature": 1.0, "seed": "0..trials-1"},
        "identical_prompts_same_tokens": same_in_request,
        "same_request_repeated_same_tokens": repeat_equal,
        "examples": examples,
    }


def record_from(root: str, out: pathlib.Path) -> None:
    """Send the requests to a running llama-server at `root` and write the fixtures into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    with httpx2.Client(timeout=60) as client:
        token_ids = client.post(root + "/tokenize", json={"content": CODE}).json()["tokens"]
        for name, (method, path, body) in _requests(token_ids).items():
            answer = _call(client, root, method, path, body)
            (out / f"{name}.json").write_text(json.dumps(answer, indent=1, ensure_ascii=False) + "\n")
            print(name, answer["status"])
        seed = _seed_experiment(client, root, token_ids)
        (out / "seed_per_prompt.json").write_text(json.dumps(seed, indent=1) + "\n")
        print("seed:", seed["identical_prompts_same_tokens"], "/", seed["trials"], "identical;",
              seed["same_request_repeated_same_tokens"], "repeatable")


def record(out: pathlib.Path) -> None:
    """Start llama-server on the tiny target model, record into `out`, stop it."""
    target, _ = make_models()
    log = out.parent / ".llama-server-record.log"
    process, root = _start(llama_server_binary(), target, log)
    try:
        record_from(root, out)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
        log.unlink(missing_ok=True)


if __name__ == "__main__":
    record(pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
