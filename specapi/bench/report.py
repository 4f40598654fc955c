"""The terminal report: one rich table of the scenarios, then a short explanation of each."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["print_report", "summary_table", "is_free", "SPEEDUP_BAND"]

#: The one colour rule, here and in the HTML report: a speedup at or above the upper bound is a win
#: (green), at or below the lower bound a loss (red), in between even (amber).
SPEEDUP_BAND = (0.95, 1.05)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _speedup_text(value: float | None) -> Text:
    if value is None:
        return Text("–")
    style = "bold green" if value >= SPEEDUP_BAND[1] else ("bold red" if value <= SPEEDUP_BAND[0] else "yellow")
    return Text(f"{value:.2f}x", style=style)


def is_free(s: dict[str, Any]) -> bool:
    """A scenario whose requests all succeeded on both sides and cost nothing (a local server): "free".
    Failed requests cost nothing because nothing was served: that is no price."""
    sides = (s["baseline"], s["speculative"])
    return (
        all(side.get("failed", 0) == 0 and side.get("requests", 0) > 0 for side in sides)
        and all(side["cost_usd"] is not None and Decimal(side["cost_usd"]) == 0 for side in sides)
    )


def _cost(s: dict[str, Any]) -> str:
    if s["cost_ratio"] is not None:
        return f"{s['cost_ratio']:.2f}x"
    return "free" if is_free(s) else "–"


def summary_table(report: dict[str, Any]) -> Table:
    """Scenarios as rows, in 80 columns: mean seconds per request on each side, the speedup achieved
    and predicted, acceptance, the cost ratio and whether every output was the target's own. The
    full figures (time to first token, best draft length, break-even, billed tokens) are in the
    explanations, the JSON and the HTML report."""
    table = Table(title=f"specapi bench ({report['mode']})", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("scenario", no_wrap=True)
    table.add_column("alone\ns/req", justify="right", no_wrap=True)
    table.add_column("spec.\ns/req", justify="right", no_wrap=True)
    table.add_column("speedup", justify="right", no_wrap=True)
    table.add_column("pre-\ndicted", justify="right", no_wrap=True)
    table.add_column("accept-\nance", justify="right", no_wrap=True)
    table.add_column("cost\nratio", justify="right", no_wrap=True)
    table.add_column("exact", justify="center", no_wrap=True)
    for s in report["scenarios"]:
        base, spec = s["baseline"], s["speculative"]
        if s["speedup"] is None:
            exact = Text("failed", style="bold red")
        else:
            exact = Text("yes", style="green") if s["exact_outputs"] else Text("NO", style="bold red")
        warmed = s.get("after_warmup")
        speedup = _speedup_text(s["speedup"])
        if warmed and warmed.get("speedup") is not None:
            speedup.append(f"\n{warmed['speedup']:.2f}x warm")
        table.add_row(
            s["name"],
            _fmt(base["wall_s"], ".3f"),
            _fmt(spec["wall_s"], ".3f"),
            speedup,
            _fmt(s["predicted_speedup"], ".2f", "x"),
            _fmt(s["acceptance_rate"], ".0%"),
            _cost(s),
            exact,
        )
    return table


def print_report(report: dict[str, Any], console: Console | None = None) -> None:
    """The table, then one paragraph per scenario."""
    console = console or Console()
    console.print(summary_table(report))
    for s in report["scenarios"]:
        console.print()
        console.print(Text(s["name"], style="bold"), Text(f"– {s['description']}", style="dim"))
        style = "bold red" if s["mismatches"] or s["errors"] else ""
        console.print(Text(s["explanation"], style=style))
        if s.get("seed_blog"):
            from .blog import format_sweep, format_table

            console.print()
            console.print(Text(format_table(s["seed_blog"]), overflow="fold"), soft_wrap=True)
            console.print()
            console.print(Text(format_sweep(s["sweep"])), soft_wrap=True)
