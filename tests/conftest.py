"""Shared test setup, kept minimal: make respx see the openai SDK's requests, and put tests/ on sys.path.

openai >= 3 sends requests through `httpx2`; respx patches `httpx`/`httpcore`. `httpx2.alias_httpx()`
makes those names resolve to `httpx2`/`httpcore2`, but only if nothing imported them first, and respx's
own pytest plugin (entry point `pytest11`) imports the real httpx before any conftest runs. So the
modules that plugin loaded are dropped first; tests `import respx` afresh and get an httpx2-backed
respx. (The plugin's `respx_mock` fixture still patches the real httpx: use `respx.mock` instead.
Running with `-p no:respx` avoids the dance.)
"""

import sys

import httpx2

if sys.modules.get("httpx") not in (None, httpx2):
    for _name in [m for m in sys.modules if m.partition(".")[0] in ("httpx", "httpcore", "respx")]:
        del sys.modules[_name]
httpx2.alias_httpx()

import pathlib  # noqa: E402

_TESTS = str(pathlib.Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)
