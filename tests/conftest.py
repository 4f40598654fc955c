"""Shared test setup: make respx see the openai SDK's requests, and put tests/ on sys.path.

openai >= 3 sends requests through `httpx2`; respx patches `httpx`. `httpx2.alias_httpx()` makes
`import httpx` resolve to `httpx2`, as long as nothing imported httpx before: respx's own pytest
plugin would, so pyproject.toml turns it off (`-p no:respx`). Use `respx.mock`, not `respx_mock`.
"""

import pathlib
import sys

import httpx2

httpx2.alias_httpx()

_TESTS = str(pathlib.Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)


import shutil  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture
def curl_installed() -> None:
    """`curl` checks need the command: .ci/run installs it; a missing one fails loudly, never skips."""
    assert shutil.which("curl"), "the curl command is missing (apt-get install curl)"


@pytest.fixture(autouse=True)
def fresh_probe_cache():
    """Simulated endpoints of one flavour share a label: probe results must not leak between tests.
    For every test: one that passed only after another had probed the same label (its own request
    then made no probe) hid what its first request does."""
    import specapi.parts.probe

    specapi.parts.probe._CACHE.clear()
    yield
    specapi.parts.probe._CACHE.clear()
