"""`specapi.transport._json`, the JSON of the hot path: orjson's speed, the standard library's values. Every case
is checked against `json` itself, the oracle, including the inputs where orjson alone would differ."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specapi.transport import _json
from specapi.core.context import Context


def _same(left: object, right: object) -> bool:
    """Equal values of equal types all the way down (1 is not 1.0 here), NaN equal to NaN."""
    if isinstance(left, float) and isinstance(right, float) and math.isnan(left) and math.isnan(right):
        return True
    if type(left) is not type(right):
        return False
    if isinstance(left, dict):
        return list(left) == list(right) and all(_same(left[k], right[k]) for k in left)  # type: ignore[index]
    if isinstance(left, list):
        return len(left) == len(right) and all(_same(a, b) for a, b in zip(left, right))  # type: ignore[arg-type]
    return left == right


@pytest.mark.parametrize(
    "text",
    [
        '{"a": NaN, "b": Infinity, "c": -Infinity}',  # Python's json writes these, and reads them
        '{"a": 123456789012345678901234567890}',  # orjson alone would give a float
        "[1,\n -9223372036854775809]",
        " 123456789012345678901",  # a bare number
        "-9223372036854775809",
        '{"a": 18446744073709551615, "b": 1e400}',
        '"\\ud83d"',  # a lone surrogate: half an emoji, as a server splitting one by escapes sends it
        '"\\ud83d\\ude00 caf\\u00e9 中文 e\\u0301"',
        '{"a": 1, "a": 2}',
        '{"x": [1.0, 1e-05, -0.0, 0.1, 2]}',
        '{"id": "cmpl-1234567890123456789012", "n": 1733059200}',  # a long digit run inside a string
        '{"a":[0,12345678901234567890123,{"b":-98765432109876543210}]}',  # no space after the separators
        "\n\t -12345678901234567890",  # a bare number after whitespace
        '{"a": 1234567890123456789, "b": "\u4e2d\u6587 中文 😀"}',  # 19 digits, and text that is not ASCII
    ],
)
def test_loads_gives_what_json_loads_gives(text: str) -> None:
    assert _same(_json.loads(text), json.loads(text))
    assert _same(_json.loads(text.encode("utf-8")), json.loads(text.encode("utf-8")))


@pytest.mark.parametrize(
    "body",
    [b"{", b'{"a": 1,}', b'\xef\xbb\xbf{"a": 1', b'{"a": "\xff"}', b""],
)
def test_loads_refuses_what_json_refuses_with_the_same_error(body: bytes) -> None:
    with pytest.raises(ValueError) as expected:
        json.loads(body)
    with pytest.raises(type(expected.value)) as got:
        _json.loads(body)
    assert str(got.value) == str(expected.value)


def test_loads_reads_utf16_bodies_and_a_byte_order_mark_as_json_does() -> None:
    body = json.dumps({"text": "中文"}).encode("utf-16")
    assert _json.loads(body) == json.loads(body) == {"text": "中文"}
    assert _json.loads(b"\xef\xbb\xbf{}") == json.loads(b"\xef\xbb\xbf{}") == {}


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_any_json_reads_back_to_the_same_values_and_writes_what_reads_back_to_them(value: object) -> None:
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
        assert _same(_json.loads(text), json.loads(text))
    written = _json.dumps(value)
    assert _same(json.loads(written), json.loads(json.dumps(value)))


def test_dumps_writes_compact_utf8_and_falls_back_for_what_orjson_cannot_write() -> None:
    chunk = {"id": "c", "choices": [{"index": 0, "text": "é 😀 中文", "finish_reason": None}]}
    assert _json.dumps(chunk) == json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    assert _json.dumps({1: "a"}) == b'{"1":"a"}'  # keys that are not strings: the standard library's answer
    assert _json.dumps({"big": 2**70}) == b'{"big":1180591620717411303424}'


def test_dumps_writes_non_finite_floats_as_null_not_tokens_json_parsers_refuse() -> None:
    assert json.loads(_json.dumps({"a": math.nan, "b": math.inf})) == {"a": None, "b": None}


@given(st.text(), st.text(), st.none() | st.lists(st.integers(0, 2**31), max_size=5), st.none() | st.lists(st.integers(0, 2**31), max_size=5))
def test_an_advanced_context_equals_one_built_field_by_field(accepted: str, text: str, ids: list[int] | None, known: list[int] | None) -> None:
    from dataclasses import replace

    context = Context(prompt="p", accepted=accepted, token_ids=None if known is None else tuple(known), extras={"k": 1})
    expected_ids = context.token_ids + tuple(ids) if context.token_ids is not None and ids is not None else None
    advanced = context.advanced(text, ids)
    assert advanced == replace(context, accepted=accepted + text, token_ids=expected_ids)
    assert context.accepted == accepted  # the original is untouched
    with pytest.raises(AttributeError):
        advanced.accepted = "x"  # type: ignore[misc]  # still frozen
