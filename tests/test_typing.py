"""Static types: `mypy` accepts `examples/` (which calls `create` with the SDK's parameters and checks the
return types with `assert_type`) as Python 3.10 code (the oldest the project supports: nothing from a newer
`typing`), and refuses a misspelt parameter or a stream taken for a response."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent

WRONG = '''
from typing_extensions import assert_type
from specapi import AsyncSpeculativeOpenAI, SpeculativeCompletion, SpeculativeOpenAI


async def wrong(client: AsyncSpeculativeOpenAI, sync: SpeculativeOpenAI) -> None:
    await client.completions.create(prompt="x", temprature=0)  # line 7: misspelt
    assert_type(await client.completions.create(prompt="x", stream=True), SpeculativeCompletion)  # line 8: a stream
    await client.chat.completions.create(messages=[{"role": "user", "content": "x"}], max_tokens="many")  # line 9
    sync.completions.create(prompt="x", top_p="high")  # line 10
'''


def test_mypy_accepts_the_examples_and_refuses_wrong_calls(tmp_path, request):
    wrong = tmp_path / "wrong_usage.py"
    wrong.write_text(WRONG, encoding="utf-8")
    cache = request.config.cache.mkdir("mypy") if getattr(request.config, "cache", None) else tmp_path / "mypy-cache"
    command = [sys.executable, "-m", "mypy", "--follow-imports=silent", "--cache-dir", str(cache), "--no-error-summary",
               "--hide-error-context", "--python-version", "3.10", str(ROOT / "examples"), str(wrong)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert not [line for line in lines if line.startswith("examples")], result.stdout
    flagged = {int(line.split(":")[1]) for line in lines if "wrong_usage.py" in line}
    assert flagged == {7, 8, 9, 10}, result.stdout + result.stderr
