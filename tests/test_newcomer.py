"""A newcomer's first steps, as the README writes them: the first screen, the bench command, the quick start
run as a script; and no word about how the project is made in anything a user reads (the README,
docs/, each command's --help, benchmarks/README.md, the examples)."""

from __future__ import annotations

import argparse
import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from specapi.cli import build_parser

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")

#: Words about the project's own process, which have no place in user-facing text. ("session affinity",
#: a load balancer's, is a product word.)
INTERNAL = [
    r"\bissues? ?#?\d+",
    r"\bsessions?\b(?! affinity)",
    r"\bthe lead\b",
    r"\bworktree",
    r"\bhelpers? (brief|notes)",
    r"HELPER_COMMON|GUIDE\.md",
    r"\bbar \(",
    r"'s bar\b",
]


def _section(title: str) -> str:
    match = re.search(rf"(?ms)^## {re.escape(title)}\n(.*?)(?=^## |\Z)", README)
    assert match, f"the README has no section {title!r}"
    return match.group(1)


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"(?ms)^```{language}\n(.*?)^```", text)


def _specapi() -> list[str]:
    """The `specapi` console script pip installed next to this Python (else on PATH)."""
    beside = pathlib.Path(sys.executable).with_name("specapi")
    found = str(beside) if beside.exists() else shutil.which("specapi")
    assert found, "the specapi command is not installed (pip install . puts it next to python)"
    return [found]


def test_the_first_screen_says_who_it_is_for_then_gives_the_two_commands():
    first_screen = "\n".join(README.splitlines()[:45])
    guide = first_screen.index("## Should you use it?")
    commands = first_screen.index("## Two commands")
    assert guide < commands
    for question in ("change your inference server's flags", "hosted", "repetitive", "two servers"):
        assert question in first_screen, question
    # Where the figures come from, and who wins on real servers, said plainly before the commands.
    said = " ".join(first_screen[:commands].split())
    assert "speedups beside them are a model of servers" in said and "the engine's own speculation currently wins" in said
    (block,) = _blocks(_section("Two commands"), "bash")
    lines = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert lines == ["pip install '.[bench]' && specapi bench", "pip install '.[test]' && python -m pytest -q"]
    # The real-server tables the guide refers to are in the README itself, before the simulator's.
    measured = _section("Measured")
    assert measured.index("vLLM's own draft-model speculation") < measured.index("llama.cpp's own speculation in one llama-server")
    assert measured.index("llama.cpp's own speculation in one llama-server") < measured.index("On the embedded simulator")


def test_the_readme_bench_command_runs_with_the_quick_flag_it_shows(tmp_path):
    (block,) = _blocks(_section("Two commands"), "bash")
    bench = block.strip().splitlines()[0].split("#")[0].split("&&")[1].split()
    assert bench == ["specapi", "bench"]
    assert "`specapi bench --quick`" in _section("Two commands")  # the quick settings the README offers
    report = tmp_path / "bench.json"
    proc = subprocess.run(
        [*_specapi(), *bench[1:], "--quick", "--json", str(report)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "specapi bench (simulator, quick)" in proc.stdout and "latency percentiles" in proc.stdout
    assert proc.stderr.count("\n") > 10  # progress, one line per step, into the pipe
    assert report.exists()


def test_the_quick_start_runs_as_written(tmp_path):
    (code,) = _blocks(_section("Quick start"), "python")
    tree = ast.parse(code)
    top_level_awaits = [n for n in ast.walk(ast.Module(body=[s for s in tree.body if not isinstance(s, ast.AsyncFunctionDef)], type_ignores=[])) if isinstance(n, ast.Await)]
    assert not top_level_awaits, "the quick start must run as a script (asyncio.run, no top-level await)"
    script = tmp_path / "quickstart.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert any("tokens" in line and "exact" in line for line in lines), proc.stdout  # resp.speculative.summary()
    assert proc.stderr == "", proc.stderr


def _help_texts() -> dict[str, str]:
    parser = build_parser()
    texts = {"specapi --help": parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                texts[f"specapi {name} --help"] = sub.format_help()
    return texts


def _user_facing() -> dict[str, str]:
    pages = {"README.md": README}
    pages.update({f"docs/{p.name}": p.read_text(encoding="utf-8") for p in sorted((ROOT / "docs").glob("*.md"))})
    pages["benchmarks/README.md"] = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    pages.update({f"examples/{p.name}": p.read_text(encoding="utf-8") for p in sorted((ROOT / "examples").glob("*.py"))})
    pages.update(_help_texts())
    return pages


def test_the_benchmarks_page_and_every_example_are_checked():
    pages = _user_facing()
    assert "benchmarks/README.md" in pages
    examples = {f"examples/{p.name}" for p in (ROOT / "examples").glob("*.py")}
    assert examples and examples <= set(pages)


def test_every_subcommand_s_help_is_checked():
    assert {"specapi bench --help", "specapi run --help", "specapi probe --help", "specapi serve --help", "specapi simulate --help"} <= set(_help_texts())


@pytest.mark.parametrize("name", sorted(_user_facing()))
def test_no_internal_process_words(name):
    text = _user_facing()[name]
    found = [m.group(0) for pattern in INTERNAL for m in re.finditer(pattern, text, flags=re.I)]
    assert not found, f"{name}: {found}"


def test_the_internal_word_patterns_catch_what_they_should():
    caught = ["Issue 37's bar", "issue #12", "this session", "the fourth session", "sessions", "as the lead said", "bar (1.5x)"]
    kept = ["no session affinity", "an issue with the server", "a progress bar", "a tissue 3"]
    hit = lambda text: any(re.search(p, text, flags=re.I) for p in INTERNAL)  # noqa: E731
    assert all(hit(t) for t in caught) and not any(hit(t) for t in kept)
