"""vLLM's native endpoints besides the OpenAI ones, as the simulator serves them (``capabilities="vllm"``).

Shapes from vLLM's source (``vllm/entrypoints/openai/protocol.py``: ``TokenizeCompletionRequest``,
``TokenizeChatRequest``, ``TokenizeResponse``, ``DetokenizeRequest``, ``DetokenizeResponse``;
``api_server.py``: ``/version``); fixtures in ``tests/fixtures/vllm/``:

* ``POST /tokenize`` ``{model?, prompt, add_special_tokens (true), return_token_strs?}`` or
  ``{model?, messages, add_generation_prompt, continue_final_message, ...}`` ->
  ``{count, max_model_len, tokens, token_strs}`` (``token_strs`` null unless asked for).
* ``POST /detokenize`` ``{model?, tokens}`` -> ``{prompt}``.
* ``GET /version`` -> ``{version}``.
* ``GET /metrics`` -> Prometheus text; only ``vllm:cache_config_info`` here, whose labels give the prefix
  cache's ``block_size`` and ``enable_prefix_caching`` (as vLLM 0.32 writes them).

The completions extras (token-id and batched prompts, ``return_token_ids``,
``return_tokens_as_token_ids``) are served by the provider's ``/v1/completions`` with the ``vllm``
profile's flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .corpus import decode_text, encode_text, is_known_token, token_str
from .params import ApiError, read_bool
from .template import render_chat

__all__ = ["VERSION", "detokenize", "metrics", "tokenize", "version"]

VERSION = "0.11.0"
"""The vLLM version the simulated server reports."""


def tokenize(body: Mapping[str, Any], *, max_model_len: int) -> dict[str, Any]:
    """``/tokenize``: a ``prompt`` or chat ``messages`` (rendered with the chat template)."""
    read_bool(body, "add_special_tokens", True)  # the simulated tokenizer adds no special tokens
    if "messages" in body:
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ApiError(400, "messages must be a list of message objects", param="messages")
        continue_final = read_bool(body, "continue_final_message", False)
        add_generation = read_bool(body, "add_generation_prompt", True)
        if continue_final and add_generation:
            raise ApiError(400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
        try:
            text = render_chat(messages, add_generation_prompt=add_generation, continue_final_message=continue_final)
        except ValueError as error:
            raise ApiError(400, str(error), param="messages") from None
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise ApiError(400, "prompt must be a string", param="prompt")
        text = prompt
    ids = encode_text(text)
    strs = [token_str(t) for t in ids] if read_bool(body, "return_token_strs", False) else None
    return {"count": len(ids), "max_model_len": max_model_len, "tokens": ids, "token_strs": strs}


def detokenize(body: Mapping[str, Any]) -> dict[str, Any]:
    """``/detokenize``: the text of ``tokens``."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and is_known_token(t) for t in tokens
    ):
        raise ApiError(400, "tokens must be a list of token ids", param="tokens")
    return {"prompt": decode_text(tokens)}


def version() -> dict[str, Any]:
    return {"version": VERSION}


def metrics(*, block: int, min_tokens: int) -> str:
    """``/metrics``: the cache's configuration (a cache that only serves long prompts, or none, is off)."""
    enabled = block > 0 and min_tokens <= block
    return (
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n"
        "# TYPE vllm:cache_config_info gauge\n"
        f'vllm:cache_config_info{{block_size="{max(block, 1)}",cache_dtype="auto",enable_prefix_caching="{enabled}",engine="0"}} 1.0\n'
    )
