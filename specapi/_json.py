"""JSON on the hot path: orjson where it gives the standard library's answer, the standard library
where it might not.

Every streamed chunk is parsed once and, through the proxy, written once; with the standard library
that was about a quarter of the CPU a chunk cost between the upstream's bytes and the event sent on
(`benchmarks/README.md`). orjson parses strict JSON to the same values, with two exceptions that
`loads` routes back to `json.loads`:

- what orjson refuses (NaN, Infinity, numbers beyond a float's range, lone surrogates: the standard
  library writes or accepts them, and some servers send them);
- integers beyond 64 bits, which orjson turns into floats without a word: a body with an integer
  of 19 digits or more is read by `json.loads`.

`dumps` writes compact UTF-8 JSON as `json.dumps(ensure_ascii=False, separators=(",", ":"))` does,
except that a NaN or an infinity becomes `null` (valid JSON, where the standard library writes a
token JSON parsers refuse); what orjson cannot write (keys that are not strings, other types) is
written by the standard library.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

__all__ = ["loads", "dumps"]

#: An integer of 19 digits or more as a JSON value (after `:`, `[` or `,`): one orjson may turn into a float.
_LONG_NUMBER = re.compile(r"[:\[,][ \t\n\r]*-?[0-9]{19}")
_LONG_NUMBER_BYTES = re.compile(rb"[:\[,][ \t\n\r]*-?[0-9]{19}")
_NUMBER_STARTS = frozenset("-0123456789") | frozenset(bytes([c]) for c in b"-0123456789")


def loads(data: bytes | str) -> Any:
    """`json.loads(data)`, parsed by orjson when that gives the same value."""
    if data.lstrip()[:1] in _NUMBER_STARTS:
        return json.loads(data)  # a bare number
    long_number = _LONG_NUMBER.search(data) if isinstance(data, str) else _LONG_NUMBER_BYTES.search(data)
    if long_number is None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass
    return json.loads(data)


def dumps(data: Any) -> bytes:
    """`data` as compact UTF-8 JSON."""
    try:
        return orjson.dumps(data)
    except TypeError:  # orjson.JSONEncodeError is a TypeError
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
