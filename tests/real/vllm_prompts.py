"""Prompts for the real-vLLM path tests: code and prose from this interpreter's standard library, and
lines of Chinese, Japanese, emoji and trailing whitespace. Deterministic: the same list on every run.

`completion_prompts()` gives texts to continue; `chat_messages()` one user message per prompt.
"""

from __future__ import annotations

import pathlib
import sysconfig

#: Files of the standard library the code prompts come from (stable across 3.10-3.13).
CODE_FILES = ("textwrap.py", "shlex.py", "fnmatch.py", "bisect.py", "heapq.py", "colorsys.py", "glob.py", "keyword.py", "calendar.py", "difflib.py")

PROSE = (
    "The interpreter reads a program as a sequence of lines, and each line is broken into tokens. ",
    "A function definition is an executable statement. Its execution binds the function name in the",
    "Exceptions are raised when the program meets an error, and they can be handled by a try",
    "The with statement is used to wrap the execution of a block with methods defined by a context manager.",
    "Names refer to objects. Names are introduced by name binding operations. Each occurrence of a name",
    "A module is a file containing definitions and statements. The file name is the module name with",
    "Strings are immutable sequences of Unicode code points. String literals are written in a variety of",
    "The for statement is used to iterate over the elements of a sequence (such as a string, tuple or list)",
)

OTHER = (
    "文字列はUnicodeのコードポイントの列です。",
    "Python 是一种解释型语言，函数定义是可执行的语句。",
    "def 関数(名前):\n    return f'こんにちは {名前}'\n",
    "Release notes 🎉: the parser 🐍 now reads emoji 😀 and",
    "# 注释: 计算平方\ndef square(x):\n",
    "The café's résumé — naïve façade: ",
    "def main():\n    print('done')\n\n",
    "x = 1\ny = 2\n   ",
    "for item in items:\n\t",
    "The end of the line is here.  \n",
    "class Point:\n    def __init__(self, x, y):\n        ",
    "Tabs\tand spaces  mixed \t",
)


def _code_prompts(per_file: int = 3) -> list[str]:
    """From each file, the lines up to (and including) a `def` line, the last 8 of them."""
    stdlib = pathlib.Path(sysconfig.get_paths()["stdlib"])
    prompts: list[str] = []
    for name in CODE_FILES:
        path = stdlib / name
        if not path.exists():
            continue
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("def ")]
        for i in starts[1 : 1 + per_file]:
            prompts.append("".join(lines[max(0, i - 7) : i + 1]))
    return prompts


def completion_prompts() -> list[str]:
    return _code_prompts() + list(PROSE) + list(OTHER)


def chat_messages() -> list[list[dict[str, str]]]:
    asks = ["Write the body of this function:\n" + p for p in _code_prompts(1)] + ["Go on: " + p for p in PROSE[:4]] + list(OTHER[:6])
    return [[{"role": "user", "content": text}] for text in asks]
