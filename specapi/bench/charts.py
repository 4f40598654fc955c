"""What every chart of the HTML report shares: the palette, SVG output with text kept as text, legends below
the axes, and the figure wrapper with its caption. `html.py` (the report) and `blog_html.py` (its
seed-blog section) both draw with these, so neither imports the other's insides."""

from __future__ import annotations

import io
import re
from html import escape
from typing import Any

import matplotlib
from matplotlib.figure import Figure

__all__ = ["BASE", "SPEC", "DRAFT", "TARGET", "GOOD", "BAD", "EVEN", "NONE", "LINE", "svg", "legend_below", "figure_html"]

BASE = "#7f8c8d"
SPEC = "#2e86de"
DRAFT = "#f39c12"
TARGET = "#34495e"
GOOD = "#27ae60"
BAD = "#c0392b"
EVEN = "#d4ac0d"
#: No speculation (the target alone ran on both sides): grey, neither a win nor a loss.
NONE = "#aab7b8"
LINE = "#8e44ad"


def svg(figure: Figure) -> str:
    """The figure as inline SVG (no XML declaration, doctype or metadata; text kept as text)."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "specapi"}):
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    text = text[text.index("<svg") :]
    return re.sub(r"<metadata>.*?</metadata>", "", text, flags=re.S)


def legend_below(ax: Any, columns: int = 3) -> None:
    """The legend under the axes, so it never covers data."""
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=columns, frameon=False)


def figure_html(svg_text: str, caption: str) -> str:
    """A chart with its caption, as an HTML figure."""
    return f"<figure>{svg_text}<figcaption class=muted>{escape(caption)}</figcaption></figure>"
