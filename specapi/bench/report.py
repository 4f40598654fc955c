"""The terminal report: one rich table of the scenarios, then a short explanation of each."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["print_report", "summary_table"]


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _speedup_text(value: float | None) -> Text:
    if value is None:
        return Text("–")
    style = "bold green" if value >= 1.05 else ("bold red" if value <= 0.95 else "yellow")
    return Text(f"{value:.2f}x", style=style)


def _cost(s: dict[str, Any]) -> str:
    tokens = _fmt(s.get("billed_tokens_ratio"), ".1f", "x")
    if s["cost_ratio"] is not None:
        return f"{s['cost_ratio']:.2f}x ({tokens})"
    if s["baseline"]["cost_usd"] is not None and Decimal(s["baseline"]["cost_usd"]) == 0:
        return f"free ({tokens})"
    return f"– ({tokens})"


def summary_table(report: dict[str, Any]) -> Table:
    """Scenarios as rows: times, speedup achieved and predicted, acceptance, cost, exactness."""
    table = Table(title=f"specapi bench ({report['mode']})", header_style="bold", show_lines=False)
    table.add_column("scenario", no_wrap=True)
    table.add_column("target alone\ns/req (TTFT)", justify="right")
    table.add_column("speculative\ns/req (TTFT)", justify="right")
    table.add_column("speedup", justify="right")
    table.add_column("predicted", justify="right")
    table.add_column("best K\n(pred.)", justify="right")
    table.add_column("accept.", justify="right")
    table.add_column("break-\neven", justify="right")
    table.add_column("tok/\nround", justify="right")
    table.add_column("cost ratio\n(billed tok)", justify="right")
    table.add_column("exact", justify="center")
    table.add_column("aim", justify="center")
    for s in report["scenarios"]:
        base, spec = s["baseline"], s["speculative"]
        prediction = s.get("prediction") or {}
        best = "–" if s["best_draft_length"] is None else f"{s['best_draft_length']} ({prediction.get('best_speedup', 0):.2f}x)"
        aim = s.get("aim")
        if aim is None or aim.get("met") is None:
            aim_text = Text("–")
        else:
            bound = "<" if aim["below"] else "≥"
            aim_text = Text(f"{bound}{aim['speedup']:g}x " + ("ok" if aim["met"] else "MISSED"), style="green" if aim["met"] else "red")
        warmed = s.get("after_warmup")
        speedup = _speedup_text(s["speedup"])
        if warmed and warmed.get("speedup") is not None:
            speedup.append(f"\n{warmed['speedup']:.2f}x warm")
        exact = Text("yes", style="green") if s["exact_outputs"] else Text("NO", style="bold red")
        break_even = s["break_even_acceptance"]
        table.add_row(
            s["name"],
            f"{_fmt(base['wall_s'], '.3f')} ({_fmt(base['ttft_s'], '.3f')})",
            f"{_fmt(spec['wall_s'], '.3f')} ({_fmt(spec['ttft_s'], '.3f')})",
            speedup,
            _fmt(s["predicted_speedup"], ".2f", "x"),
            best,
            _fmt(s["acceptance_rate"], ".2f"),
            "never" if break_even is None and prediction else _fmt(break_even, ".2f"),
            _fmt(spec.get("tokens_per_round"), ".2f"),
            _cost(s),
            exact,
            aim_text,
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
