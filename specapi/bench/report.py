"""The terminal report: a table of the scenarios, a table of latency percentiles, then a short explanation of each."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from .spread import BAND, EVEN, LOSS, NO_SPECULATION, WIN

__all__ = ["print_report", "summary_table", "percentile_table", "sweep_table", "median_of", "is_free", "SPEEDUP_BAND", "VERDICT_STYLES"]

#: The one colour rule, here and in the HTML report: a speedup at or above the upper bound is a win
#: (green), at or below the lower bound a loss (red), in between even (amber); with repeated runs a win
#: or a loss needs every run on its side of 1.0x (`spread.verdict_class`). No speculation: grey.
SPEEDUP_BAND = BAND
VERDICT_STYLES = {WIN: "bold green", LOSS: "bold red", EVEN: "yellow", NO_SPECULATION: "dim"}
_VERDICT_WORDS = {WIN: "win", LOSS: "loss", EVEN: "even", NO_SPECULATION: "no spec."}


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _speedup_text(s: dict[str, Any]) -> Text:
    """The speedup (the median with --repeat), the lowest-highest run, and the verdict, in its colour."""
    value, verdict = s["speedup"], s.get("verdict")
    if value is None:
        return Text("–")
    figures = (s.get("repeats") or {}).get("figures", {})
    spread = figures.get("speedup")
    text = Text(f"{spread['median'] if spread else value:.2f}x", style=VERDICT_STYLES.get(verdict or "", ""))
    if spread:
        text.append(f"\n{spread['min']:.2f}–{spread['max']:.2f}")
    if verdict:
        text.append(f"\n{_VERDICT_WORDS[verdict]}", style=VERDICT_STYLES[verdict])
    return text


def median_of(s: dict[str, Any], name: str, value: Any) -> Any:
    """With repeated runs, the median of figure `name` (`summary.REPEATED_FIGURES`); else `value`."""
    spread = ((s.get("repeats") or {}).get("figures") or {}).get(name)
    return spread["median"] if spread else value


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
    (with --repeat: the median, the lowest-highest run) and its verdict, the predicted speedup,
    acceptance, the cost ratio and whether every output was the target's own. The full figures (time
    to first token, best draft length, break-even, billed tokens) are in the explanations, the JSON
    and the HTML report."""
    runs = max([(s.get("repeats") or {}).get("runs", 1) for s in report["scenarios"]] or [1])
    title = f"specapi bench ({report['mode']}" + (f", median of {runs} runs" if runs > 1 else "") + ")"
    table = Table(title=title, header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
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
        speedup = _speedup_text(s)
        if warmed and warmed.get("speedup") is not None:
            speedup.append(f"\n{median_of(s, 'speedup_after_warmup', warmed['speedup']):.2f}x warm")
        table.add_row(
            s["name"],
            _fmt(median_of(s, "baseline_wall_s", base["wall_s"]), ".3f"),
            _fmt(median_of(s, "speculative_wall_s", spec["wall_s"]), ".3f"),
            speedup,
            _fmt(median_of(s, "predicted_speedup", s["predicted_speedup"]), ".2f", "x"),
            _fmt(median_of(s, "acceptance_rate", s["acceptance_rate"]), ".0%"),
            _cost(s),
            exact,
        )
    return table


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f}" if value >= 0.0995 else f"{value * 1000:.1f}"


def percentile_table(report: dict[str, Any]) -> Table:
    """Time to first token and inter-token latency (the gaps between streamed text chunks) at p50, p90
    and p99, in milliseconds, for each side of each scenario (with --repeat, over every run's requests).
    A speculative chunk can carry several tokens: its gaps are longer and fewer than the target's."""
    table = Table(
        title="latency percentiles (ms)", header_style="bold", box=box.SIMPLE_HEAD, pad_edge=False,
        caption="TTFT: time to first token; ITL: the gap between streamed chunks (a speculative chunk can carry several tokens)",
    )
    table.add_column("scenario", no_wrap=True)
    table.add_column("side", no_wrap=True)
    for name in ("TTFT", "ITL"):
        for q in ("p50", "p90", "p99"):
            table.add_column(f"{name}\n{q}", justify="right", no_wrap=True)
    for s in report["scenarios"]:
        for label, side in (("alone", "baseline"), ("spec.", "speculative")):
            found = s[side].get("percentiles") or {}
            ttft, itl = found.get("ttft_s") or {}, found.get("itl_s") or {}
            table.add_row(
                s["name"] if side == "baseline" else "", label,
                *(_ms(ttft.get(q)) for q in ("p50", "p90", "p99")), *(_ms(itl.get(q)) for q in ("p50", "p90", "p99")),
            )
    return table


def sweep_table(report: dict[str, Any]) -> Table:
    """The sweep of draft lengths (`sweep.sweep_summary`): per scenario the target alone's seconds per
    request, then a row per setting (the default policy, each fixed draft length) with its seconds per
    request, speedup against the target alone in the same run, acceptance, tokens per round and
    exactness. The fastest fixed length is marked with *."""
    table = Table(
        title="draft lengths (each against the target alone in the same run)", header_style="bold", box=box.SIMPLE_HEAD,
        pad_edge=False, collapse_padding=True, caption="* the fastest fixed draft length",
    )
    table.add_column("scenario", no_wrap=True)
    table.add_column("setting", no_wrap=True)
    table.add_column("s/req", justify="right", no_wrap=True)
    table.add_column("speedup", justify="right", no_wrap=True)
    table.add_column("accept-\nance", justify="right", no_wrap=True)
    table.add_column("tokens/\nround", justify="right", no_wrap=True)
    table.add_column("exact", justify="center", no_wrap=True)
    for sweep in report.get("draft_length_sweep") or ():
        table.add_row(sweep["scenario"], "target alone", _fmt(sweep["target_alone_wall_s"], ".3f"), "1.00x", "", "", "")
        for row in sweep["rows"]:
            best = row["draft_length"] is not None and row["draft_length"] == sweep["best_draft_length"]
            speedup = Text(_fmt(row["speedup"], ".2f", "x"), style=VERDICT_STYLES.get(row["verdict"] or "", ""))
            exact = Text("yes", style="green") if row["exact_outputs"] else Text("NO", style="bold red")
            table.add_row(
                "", row["setting"] + (" *" if best else ""), _fmt(row["wall_s"], ".3f"), speedup,
                _fmt(row["acceptance_rate"], ".0%"), _fmt(row["tokens_per_round"], ".2f"), exact,
            )
    return table


def print_report(report: dict[str, Any], console: Console | None = None, *, table_only: bool = False) -> None:
    """The tables, then (unless `table_only`) one paragraph per scenario."""
    console = console or Console()
    console.print(summary_table(report))
    if report.get("draft_length_sweep"):
        console.print(sweep_table(report))
    console.print(percentile_table(report))
    if table_only:
        return
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
