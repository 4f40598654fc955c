"""Server dialects: how each server family is asked and answered.

`native_dialect(server)` gives the token-id dialect of a server found by the probe (`"vllm"`,
`"sglang"`, `"llama-server"`), or None when it only speaks the OpenAI formats.
"""

from __future__ import annotations

from .base import Generated, NativeDialect, Pick, reading, server_root, spelling
from .llamacpp import LlamaCppDialect
from .sglang import SglangDialect
from .vllm import VllmDialect

__all__ = [
    "Generated",
    "LlamaCppDialect",
    "NativeDialect",
    "Pick",
    "SglangDialect",
    "VllmDialect",
    "native_dialect",
    "reading",
    "server_root",
    "spelling",
]

_NATIVE = {"llama-server": LlamaCppDialect, "vllm": VllmDialect, "sglang": SglangDialect}


def native_dialect(server: str | None) -> NativeDialect | None:
    factory = _NATIVE.get(server or "")
    return factory() if factory is not None else None
