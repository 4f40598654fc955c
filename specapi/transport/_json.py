"""JSON on the hot path: orjson where it gives the standard library's answer, the standard library
where it might not.

Every streamed chunk is parsed once and, through the proxy, written once; with the standard library
that was about a quarter of the CPU a chunk cost between the upstream's bytes and the event sent on
(`benchmarks/README.md`). orjson parses strict JSON to the same values, with two exceptions that
`loads` routes back to `json.loads`:

- what orjson refuses (NaN, Infinity, numbers beyond a float's range, lone surrogates: the standard
  library writes or accepts them, and some servers send them);
- integers beyond 64 bits, which orjson turns into floats without a word: a body with 19 digits in
  a row (every integer of 19 digits or more has them) is read by `json.loads`.

`dumps` writes compact UTF-8 JSON as `json.dumps(ensure_ascii=False, separators=(",", ":"))` does,
except that a NaN or an infinity becomes `null` (valid JSON, where the standard library writes a
token JSON parsers refuse); what orjson cannot write (keys that are not strings, other types) is
written by the standard library.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["loads", "dumps"]

#: Each ASCII digit to "0", every other byte to a space: 19 digits in a row become one substring to find.
_DIGITS_AS_ZEROS = bytes(0x30 if 0x30 <= c <= 0x39 else 0x20 for c in range(256))
_NINETEEN_DIGITS = b"0" * 19
_NUMBER_STARTS = frozenset("-0123456789") | frozenset(bytes([c]) for c in b"-0123456789")
_SPACES = frozenset(" \t\n\r") | frozenset(bytes([c]) for c in b" \t\n\r")


def _may_hold_a_long_integer(data: bytes | str) -> bool:
    """Whether `data` has 19 ASCII digits in a row anywhere, as every integer of 19 digits or more
    has (digits in a string too: the standard library then reads it, to the same value). A byte
    translation and a substring search: a regular expression trying every position took about five
    times as long on a streamed chunk."""
    raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
    return _NINETEEN_DIGITS in raw.translate(_DIGITS_AS_ZEROS)


def loads(data: bytes | str) -> Any:
    """`json.loads(data)`, parsed by orjson when that gives the same value."""
    first = data[:1]
    if first in _SPACES:
        first = data.lstrip()[:1]
    if first in _NUMBER_STARTS:
        return json.loads(data)  # a bare number
    if not _may_hold_a_long_integer(data):
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
