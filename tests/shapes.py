"""Comparing JSON shapes: the simulator's answers against recorded (or documented) real ones.

Same keys, same types, same nesting; values may differ (the models differ). Lists are compared element
by element as far as both go, and further actual elements against the expected list's last one. Dicts
whose keys are data (tokens, token ids: vLLM's `top_logprobs` and `prompt_logprobs` entries) are given by
the name of the list holding them: their values are compared, not their keys.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"


def fixture(dialect: str, name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / dialect / f"{name}.json").read_text(encoding="utf-8"))


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list):
        return "list"
    return "dict"


def shape_differences(actual: Any, expected: Any, *, data_keyed: frozenset[str] = frozenset(), path: str = "$",
                      parent: str = "") -> list[str]:
    """Where `actual` differs in shape from `expected` (empty when they match)."""
    a, e = _kind(actual), _kind(expected)
    if a != e and not (a == "int" and e == "float"):
        return [f"{path}: {a} where the real server has {e}"]
    if e == "dict":
        if parent in data_keyed:
            values = list(expected.values())
            return [d for key, v in actual.items() if values
                    for d in shape_differences(v, values[0], data_keyed=data_keyed, path=f"{path}[{key!r}]")]
        out = []
        missing, extra = sorted(set(expected) - set(actual)), sorted(set(actual) - set(expected))
        if missing:
            out.append(f"{path}: missing keys {missing}")
        if extra:
            out.append(f"{path}: keys the real server does not send {extra}")
        for key in set(expected) & set(actual):
            out += shape_differences(actual[key], expected[key], data_keyed=data_keyed, path=f"{path}.{key}", parent=key)
        return out
    if e == "list" and expected:
        out = []
        for index, item in enumerate(actual):
            out += shape_differences(item, expected[min(index, len(expected) - 1)], data_keyed=data_keyed,
                                     path=f"{path}[{index}]", parent=parent)
        return out
    return []


def assert_same_shape(actual: Any, expected: Any, *, data_keyed: frozenset[str] = frozenset()) -> None:
    differences = shape_differences(actual, expected, data_keyed=data_keyed)
    assert not differences, "\n".join(differences[:20])
