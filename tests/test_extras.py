"""The client installs light: `import specapi` loads no package of an extra, and a command whose extra is
missing names the extra to install instead of failing with a traceback.

Each check runs a fresh interpreter, so what other tests imported into this one does not count, and a
package is made missing by putting None in `sys.modules` before specapi is imported (Python then
raises ModuleNotFoundError for it, as when it is not installed).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

#: Packages that only the extras install.
HEAVY = ("numpy", "matplotlib", "starlette", "uvicorn", "rich", "prometheus_client", "redis", "scipy")


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_importing_the_client_loads_no_package_of_an_extra():
    done = _python(
        """
        import sys
        import specapi
        from specapi import AsyncSpeculativeOpenAI, Endpoint, SpeculativeOpenAI, SuffixIndex
        SpeculativeOpenAI(target=Endpoint(base_url="http://127.0.0.1:9/v1", model="m")).close()
        print(" ".join(sorted({name.split(".")[0] for name in sys.modules})))
        """
    )
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "specapi" in loaded and "openai" in loaded  # the check sees what was imported
    assert not loaded & set(HEAVY), f"import specapi loaded {sorted(loaded & set(HEAVY))}"


@pytest.mark.parametrize(
    "missing, argv, extra",
    [
        ("numpy", ["bench", "--quick"], "bench"),
        ("rich", ["bench", "--quick"], "bench"),
        ("numpy", ["simulate"], "bench"),
        ("starlette", ["serve", "--target-model", "m"], "serve"),
        ("numpy", ["run", "def fib(n):", "--max-tokens", "4"], "bench"),  # the simulator, reached at run time
    ],
)
def test_a_command_whose_extra_is_missing_names_the_extra(missing, argv, extra):
    done = _python(
        f"""
        import sys
        sys.modules[{missing!r}] = None
        from specapi.cli import cli_logic
        sys.exit(cli_logic({argv!r}))
        """
    )
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert f"specapi {argv[0]} needs the '{extra}' extra: pip install 'specapi[{extra}]'" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_client_commands_work_without_the_extras():
    done = _python(
        """
        import sys
        for name in ("numpy", "matplotlib", "rich", "starlette", "uvicorn", "prometheus_client", "redis"):
            sys.modules[name] = None
        from specapi.cli import cli_logic
        sys.exit(cli_logic(["probe", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]))
        """
    )
    assert done.returncode == 1, done.stderr  # the endpoint is not reachable: the probe itself ran
    assert "is not reachable" in done.stderr and "extra" not in done.stderr
