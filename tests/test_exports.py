"""The public surface: `specapi.__all__` is the documented API, and the exception tree is the one drawn in
`specapi.transport._exceptions`' docstring."""

from __future__ import annotations

import re

import openai
import pytest

import specapi
from specapi.transport import _exceptions

DOCUMENTED = {
    # clients and configuration
    "AsyncSpeculativeOpenAI",
    "SpeculativeOpenAI",
    "Endpoint",
    "SuffixIndex",
    "EndpointStatus",
    # statistics
    "SpeculativeStats",
    "RoleUsage",
    "RoundRecord",
    # responses
    "SpeculativeCompletion",
    "SpeculativeChatCompletion",
    # exceptions
    "SpecAPIError",
    "ConfigurationError",
    "InvalidRequestError",
    "UnsupportedRequestError",
    "EndpointError",
    "DraftError",
    "TargetError",
    "MalformedResponseError",
}


def test_all_is_exactly_the_documented_api():
    assert len(specapi.__all__) == len(set(specapi.__all__)), "duplicates in __all__"
    assert set(specapi.__all__) == DOCUMENTED


@pytest.mark.parametrize("name", sorted(DOCUMENTED))
def test_every_public_name_is_importable_and_defined_in_specapi(name):
    obj = getattr(specapi, name)
    assert obj.__module__.startswith("specapi.")


def test_star_import_gives_the_public_api():
    namespace: dict = {}
    exec("from specapi import *", namespace)
    assert DOCUMENTED <= set(namespace)


def test_response_types_are_the_sdk_types():
    assert issubclass(specapi.SpeculativeCompletion, openai.types.Completion)
    assert issubclass(specapi.SpeculativeChatCompletion, openai.types.chat.ChatCompletion)


def _drawn_tree(doc: str) -> dict[str, str | None]:
    """Parse the box-drawing tree of a docstring into {class name: parent name}."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in doc.splitlines():
        match = re.match(r"^(\s*)((?:[│ ]\s*)*)(?:[├└]── )?([A-Z]\w+)(?:\s|$)", line)
        if not match or not match.group(3).endswith("Error"):
            continue
        name = match.group(3)
        depth = line.index(name)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    return parents


def test_exception_hierarchy_is_as_drawn_in_the_docstring():
    tree = _drawn_tree(_exceptions.__doc__)
    assert tree.get("SpecAPIError", "absent") is None, tree
    drawn = set(tree)
    exported_errors = {n for n in specapi.__all__ if isinstance(getattr(specapi, n), type) and issubclass(getattr(specapi, n), BaseException)}
    assert drawn == exported_errors == set(_exceptions.__all__)
    for name, parent in tree.items():
        cls = getattr(specapi, name)
        if parent is None:
            assert cls.__bases__ == (Exception,)
        else:
            assert getattr(specapi, parent) in cls.__bases__, f"{name} should derive from {parent}"


def test_the_drawn_tree_is_the_expected_one():
    assert _drawn_tree(_exceptions.__doc__) == {
        "SpecAPIError": None,
        "ConfigurationError": "SpecAPIError",
        "InvalidRequestError": "ConfigurationError",
        "UnsupportedRequestError": "SpecAPIError",
        "EndpointError": "SpecAPIError",
        "DraftError": "EndpointError",
        "TargetError": "EndpointError",
        "MalformedResponseError": "EndpointError",
    }


def test_create_argument_errors_are_also_the_sdks_bad_request():
    assert issubclass(specapi.InvalidRequestError, openai.BadRequestError)
    err = specapi.InvalidRequestError("max_tokens must be an integer >= 1, got -1")
    assert (err.status_code, err.param, err.message) == (400, "max_tokens", "max_tokens must be an integer >= 1, got -1")


def test_argument_errors_are_also_value_errors():
    assert issubclass(specapi.ConfigurationError, ValueError)
    assert issubclass(specapi.UnsupportedRequestError, ValueError)
    assert not issubclass(specapi.EndpointError, ValueError)


def test_endpoint_errors_name_role_and_endpoint():
    err = specapi.TargetError("HTTP 500: boom", role="target", endpoint="big @ http://x/v1", status_code=500)
    assert (err.role, err.endpoint, err.status_code) == ("target", "big @ http://x/v1", 500)
    assert "target" in str(err) and "big @ http://x/v1" in str(err) and "boom" in str(err)
