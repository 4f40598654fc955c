"""Comparing the keys of JSON answers recursively: a speculated answer against the target alone's.

`key_tree` maps an answer to its keys at every level (a list's elements merged into one tree, so a
stream's chunks, given as a list, compare as the union of their keys); `key_differences` lists where two
trees differ. Values are not compared. specapi's own `speculative` field is left out.
"""

from __future__ import annotations

from typing import Any

__all__ = ["key_tree", "key_differences"]

#: A node that is not an object (a string, a number, null).
LEAF: dict[str, Any] = {}


def _merge(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    if a is None:
        return b
    if b is None:
        return a
    merged = dict(a)
    for key, value in b.items():
        merged[key] = _merge(merged.get(key), value)
    return merged


def key_tree(value: Any, *, top: bool = True) -> dict[str, Any] | None:
    """The keys under `value`: {key: subtree}; a list's elements merged ("[]"); None for a scalar."""
    if isinstance(value, dict):
        return {key: key_tree(item, top=False) for key, item in value.items() if not (top and key == "speculative")}
    if isinstance(value, list):
        tree: dict[str, Any] | None = None
        for item in value:
            tree = _merge(tree, key_tree(item, top=top))
        return {"[]": tree} if not top else tree
    return None


def key_differences(got: Any, expected: Any, path: str = "$") -> list[str]:
    """Where the key trees `got` and `expected` differ (empty when every level has the same keys)."""
    if not isinstance(expected, dict) or not isinstance(got, dict):
        if isinstance(expected, dict) and expected and got is None:
            return [f"{path}: null where the target alone has keys {sorted(expected)}"]
        if isinstance(got, dict) and got and expected is None:
            return [f"{path}: keys {sorted(got)} where the target alone has a value without keys"]
        return []
    out = []
    missing, extra = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    if missing:
        out.append(f"{path}: missing {missing}")
    if extra:
        out.append(f"{path}: not in the target alone's answer {extra}")
    for key in set(expected) & set(got):
        out += key_differences(got[key], expected[key], f"{path}.{key}")
    return out
