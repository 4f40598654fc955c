"""The documentation the README and the HTML report point to exists, and says what the code does."""

from __future__ import annotations

import pathlib
import re

from specapi.transport import _exceptions
from specapi.bench.html import render_html
from specapi.core.cli_options import VERIFICATION_CHOICES

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = ["algorithm.md", "performance.md", "verification.md", "sdk.md", "cli.md", "proxy.md"]


def _links(markdown: str) -> list[str]:
    return [link for link in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", markdown) if "://" not in link]


def test_readme_and_docs_links_resolve():
    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        for link in _links(page.read_text(encoding="utf-8")):
            assert (page.parent / link).exists(), f"{page.name} links to missing {link}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in PAGES:
        assert f"docs/{name}" in readme, name
    assert "speculation.md" not in readme


def test_the_report_links_to_docs_that_exist():
    from test_bench_report import _run  # the hand-made scenario run
    from specapi.bench.summary import report

    html = render_html(report([_run()], mode="simulator", version="0"))
    targets = re.findall(r"href='(docs/[^']+)'", html)
    assert targets and all((ROOT / target).exists() for target in targets)


def test_docs_name_every_verification_path_and_every_sdk_error_class():
    verification = (ROOT / "docs" / "verification.md").read_text(encoding="utf-8")
    for path in VERIFICATION_CHOICES:
        if path not in ("auto", "none"):
            assert f"`{path}`" in verification, path
    sdk = (ROOT / "docs" / "sdk.md").read_text(encoding="utf-8")
    for cls in ("RateLimitError", "NotFoundError", "AuthenticationError", "BadRequestError", "InternalServerError", "APITimeoutError", "APIConnectionError"):
        assert cls in sdk and cls in (_exceptions.__doc__ or ""), cls
