"""The HTML report: one self-contained file (inline CSS, charts as inline SVG) a person can read at a glance.

Top: the summary table and a chart of achieved against predicted speedup per scenario. Then, per
scenario, its explanation and four charts: latency per request (target alone against speculative, with
the time to first token marked), tokens per round, acceptance by draft position, and cost (or billed
tokens, when the prices are zero) per role; where the client learns from traffic (``agentic``), speedup
against request number.

Rules the charts follow: one colour rule for speedups everywhere (the scenario's verdict,
`spread.verdict_class`: green a win, red a loss, amber even, grey no speculation, in the table and the
chart alike, with a legend swatch for each); legends sit below the axes, never on
the data; axes are fitted to the data they show; every axis and figure has its unit. Charts are drawn
with matplotlib's object API (no pyplot state) and embedded as SVG with text kept as text, so the page
stays small. The arithmetic behind the predictions is in the repository's docs/performance.md.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal
from html import escape
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .blog_html import seed_blog_section
from .charts import BAD, BASE, DRAFT, EVEN, GOOD, LINE, NONE, SPEC, TARGET, figure_html, legend_below, svg
from .report import SPEEDUP_BAND, is_free, median_of
from .spread import EVEN as EVEN_VERDICT
from .spread import LOSS, NO_SPECULATION, WIN, verdict_class

__all__ = ["overview_svg", "render_html", "scenario_svg", "learning_svg", "write_html", "speedup_class", "verdict_css"]

#: CSS class, chart colour and legend words of each verdict.
_VERDICTS = {
    WIN: ("good", GOOD, "win (faster than the target alone)"),
    EVEN_VERDICT: ("even", EVEN, "even (within the noise)"),
    LOSS: ("bad", BAD, "loss (slower)"),
    NO_SPECULATION: ("none", NONE, "no speculation (the target alone)"),
}


def speedup_class(value: float | None) -> str:
    """"good", "bad" or "even" for one speedup by the one colour rule (the terminal table uses the same band)."""
    return verdict_css(verdict_class(value))


def verdict_css(verdict: str | None) -> str:
    """The CSS class of a scenario's verdict: "good", "even", "bad", "none" (no speculation), "" (no figure)."""
    return _VERDICTS[verdict][0] if verdict in _VERDICTS else ""


def _verdict(summary: dict[str, Any]) -> str | None:
    return summary.get("verdict") or verdict_class(summary.get("speedup"))


def overview_svg(report: dict[str, Any]) -> str:
    """Achieved and predicted speedup per scenario, against the target alone (1x)."""
    scenarios = report["scenarios"]
    figure = Figure(figsize=(11, 1.2 + 0.55 * max(1, len(scenarios))), layout="constrained")
    ax = figure.add_subplot()
    names = [s["name"] for s in scenarios][::-1]
    achieved = [median_of(s, "speedup", s["speedup"]) or 0.0 for s in scenarios][::-1]
    predicted = [median_of(s, "predicted_speedup", s["predicted_speedup"]) for s in scenarios][::-1]
    rows = range(len(names))
    verdicts = [_verdict(s) for s in scenarios][::-1]
    colors = [_VERDICTS[v][1] if v in _VERDICTS else BASE for v in verdicts]
    ax.barh([r + 0.18 for r in rows], achieved, height=0.36, color=colors)
    ax.barh([r - 0.18 for r in rows], [p or 0.0 for p in predicted], height=0.36, color="none", edgecolor="#34495e", hatch="//")
    for r, s in zip(rows, scenarios[::-1]):
        spread = ((s.get("repeats") or {}).get("figures") or {}).get("speedup")
        if spread:  # the lowest to the highest run
            ax.plot([spread["min"], spread["max"]], [r + 0.18, r + 0.18], color="black", linewidth=1.2)
    # One swatch per verdict, each in its own colour (a single labelled bar would show only its first colour).
    handles = [Patch(facecolor=colour, label=f"achieved: {words}") for _, colour, words in _VERDICTS.values()]
    handles.append(Patch(facecolor="none", edgecolor="#34495e", hatch="//", label="predicted"))
    for r, a in zip(rows, achieved):
        ax.text(a, r + 0.18, f" {a:.2f}x", va="center", fontsize=9)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.text(1.0, len(names) - 0.45, " target alone", fontsize=8, va="bottom")
    ax.set_yticks(list(rows), names)
    ax.set_xlabel("speedup over the target alone (time alone / time with speculation)")
    ax.set_ylim(-0.6, len(names) - 0.2)
    highest = [((s.get("repeats") or {}).get("figures") or {}).get("speedup", {}).get("max", 0.0) for s in scenarios]
    ax.set_xlim(0, max([*achieved, *highest, *[p or 0 for p in predicted], 1.0]) * 1.12)
    ax.legend(handles=handles, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3, frameon=False)
    return svg(figure)


def _latency_panel(ax: Any, summary: dict[str, Any]) -> None:
    requests = summary["requests"]
    xs = list(range(len(requests)))
    base = [r["baseline_wall_s"] or 0.0 for r in requests]
    spec = [r["speculative_wall_s"] or 0.0 for r in requests]
    ax.bar([x - 0.2 for x in xs], base, width=0.4, color=BASE, label="target alone")
    ax.bar([x + 0.2 for x in xs], spec, width=0.4, color=SPEC, label="speculative")
    base_ttft = [r["baseline_ttft_s"] for r in requests]
    spec_ttft = [r["speculative_ttft_s"] for r in requests]
    ax.scatter([x - 0.2 for x, t in zip(xs, base_ttft) if t is not None], [t for t in base_ttft if t is not None], marker="_", s=300, color="black", zorder=3, label="first token")
    ax.scatter([x + 0.2 for x, t in zip(xs, spec_ttft) if t is not None], [t for t in spec_ttft if t is not None], marker="_", s=300, color="black", zorder=3)
    ax.set_xticks(xs, [f"#{r['index']}" + ("" if r["num_rounds"] else "\n(alone)") for r in requests])
    ax.set_ylabel("seconds per request")
    ax.set_xlabel("request")
    speedup = summary["speedup"]
    ax.set_title("Latency per request" + (f" (speedup {speedup:.2f}x)" if speedup else ""))
    ax.set_ylim(0, max([*base, *spec, 0.001]) * 1.08)
    legend_below(ax)


def _rounds_panel(ax: Any, summary: dict[str, Any]) -> None:
    counts = Counter(summary["tokens_per_round"])
    if not counts:
        ax.text(0.5, 0.5, "no speculative rounds\n(the target generated alone)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("Tokens per round")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    xs = sorted(counts)
    ax.bar(xs, [counts[x] for x in xs], color=SPEC, width=0.8)
    mean = sum(summary["tokens_per_round"]) / len(summary["tokens_per_round"])
    ax.axvline(mean, color="black", linestyle="--", linewidth=1, label=f"measured mean {mean:.2f}")
    prediction = summary.get("prediction")
    if prediction:
        ax.axvline(prediction["expected_tokens_per_round"], color=LINE, linewidth=1.5, label=f"predicted E(K) {prediction['expected_tokens_per_round']:.2f}")
    ax.set_xticks(range(min(xs), max(xs) + 1))
    ax.set_xlim(min(xs) - 0.6, max(xs) + 0.6)
    ax.set_ylim(0, max(counts.values()) * 1.08)
    ax.set_xlabel("tokens produced in a round (accepted + 1)")
    ax.set_ylabel("rounds (count)")
    ax.set_title(f"Tokens per round ({len(summary['tokens_per_round'])} rounds)")
    legend_below(ax, columns=2)


def _acceptance_panel(ax: Any, summary: dict[str, Any]) -> None:
    by_position = summary["acceptance_by_position"]
    conditional = summary["conditional_acceptance"]
    if not by_position:
        ax.text(0.5, 0.5, "no draft tokens", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("Acceptance by draft position")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    xs = list(range(1, len(by_position) + 1))
    ax.bar(xs, by_position, color=SPEC, label="accepted (share of rounds)")
    ax.plot(list(range(1, len(conditional) + 1)), conditional, color=LINE, marker="o", label="given earlier ones accepted")
    break_even = summary.get("break_even_acceptance")
    if break_even is not None:
        ax.axhline(break_even, color="black", linestyle=":", label=f"break-even {break_even:.2f}")
    top = max([*by_position, *conditional, break_even or 0.0, 0.05])
    ax.set_ylim(0, min(1.0, top) * 1.08)
    ax.set_xlim(0.4, len(by_position) + 0.6)
    ax.set_xticks(xs)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance (fraction of rounds)")
    source = summary.get("acceptance_source", "")
    ax.set_title("Acceptance by draft position" + (" (warm-up)" if source == "warm-up requests" else ""))
    legend_below(ax)


def _cost_panel(ax: Any, summary: dict[str, Any]) -> None:
    base, spec = summary["baseline"], summary["speculative"]
    costs = [base["by_role"]["target"]["cost_usd"], spec["by_role"]["target"]["cost_usd"], spec["by_role"]["draft"]["cost_usd"]]
    priced = all(c is not None for c in costs) and any(Decimal(c) > 0 for c in costs)
    labels = ["target alone", "speculative"]
    if priced:
        base_target = float(Decimal(costs[0]))
        spec_target, spec_draft = float(Decimal(costs[1])), float(Decimal(costs[2]))
        ax.bar(labels, [base_target, spec_target], color=TARGET, label="target")
        ax.bar(labels, [0.0, spec_draft], bottom=[base_target, spec_target], color=DRAFT, label="draft")
        ax.set_ylabel("USD (all measured requests)")
        ax.set_ylim(0, max(base_target, spec_target + spec_draft) * 1.12)
        ratio = summary["cost_ratio"]
        ax.set_title("Cost per role" + (f" ({ratio:.1f}x)" if ratio else ""))
        for i, total in enumerate([base_target, spec_target + spec_draft]):
            ax.text(i, total, f"${total:.5f}", ha="center", va="bottom", fontsize=8)
    else:
        roles = [base["by_role"]["target"], spec["by_role"]["target"]]
        draft = spec["by_role"]["draft"]
        prompt = [roles[0]["prompt_tokens"], roles[1]["prompt_tokens"]]
        completion = [roles[0]["completion_tokens"], roles[1]["completion_tokens"]]
        ax.bar(labels, prompt, color=TARGET, label="target prompt")
        ax.bar(labels, completion, bottom=prompt, color="#85c1e9", label="target completion")
        ax.bar(labels, [0, draft["prompt_tokens"] + draft["completion_tokens"]], bottom=[p + c for p, c in zip(prompt, completion)], color=DRAFT, label="draft")
        ax.set_ylabel("billed tokens (prices are zero)")
        ax.set_title("Billed tokens per role")
        ax.set_ylim(0, max(p + c for p, c in zip(prompt, completion)) * 1.08 + draft["prompt_tokens"] + draft["completion_tokens"])
    legend_below(ax)


def scenario_svg(summary: dict[str, Any]) -> str:
    """The four charts of one scenario in one figure."""
    figure = Figure(figsize=(11, 8), layout="constrained")
    axes = figure.subplots(2, 2)
    _latency_panel(axes[0][0], summary)
    _rounds_panel(axes[0][1], summary)
    _acceptance_panel(axes[1][0], summary)
    _cost_panel(axes[1][1], summary)
    figure.suptitle(summary["name"], fontsize=13, fontweight="bold")
    return svg(figure)


def learning_svg(summary: dict[str, Any]) -> str:
    """Speedup against request number, for scenarios where the client learns from traffic."""
    figure = Figure(figsize=(11, 3.6), layout="constrained")
    ax = figure.add_subplot()
    requests = [r for r in summary["requests"] if r.get("speedup") is not None]
    numbers = [r["index"] + 1 for r in requests]
    speedups = [r["speedup"] for r in requests]
    ax.plot(numbers, speedups, color=SPEC, marker="o", label="speedup of this request")
    ax.axhline(1.0, color="black", linewidth=1)
    warmed = summary.get("after_warmup") or {}
    if warmed.get("from_request"):
        ax.axvspan(0.5, warmed["from_request"] + 0.5, color="#eeeeee", label="warm-up (the client is learning)")
    if warmed.get("speedup") is not None:
        ax.axhline(warmed["speedup"], color=GOOD, linestyle="--", label=f"after warm-up: {warmed['speedup']:.2f}x")
    ax.set_xlabel("request number")
    ax.set_ylabel("time alone / time with speculation")
    ax.set_title("Speedup as the suffix index learns from earlier requests")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
    return svg(figure)


_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1180px; color: #222; }
h1 { margin-bottom: 0.2em; } .muted { color: #666; }
table { border-collapse: collapse; margin: 1em 0; font-size: 14px; }
th, td { border-bottom: 1px solid #ddd; padding: 6px 10px; text-align: right; }
th { background: #f4f6f8; } td:first-child, th:first-child { text-align: left; white-space: nowrap; }
.good { color: #1e8449; font-weight: bold; } .bad { color: #b03a2e; font-weight: bold; } .even { color: #9a7d0a; font-weight: bold; }
.none { color: #707b7c; font-style: italic; }
.swatch { display: inline-block; width: 0.9em; height: 0.9em; vertical-align: -0.1em; margin-right: 0.25em; border-radius: 2px; }
section { margin-top: 2.5em; border-top: 2px solid #eee; padding-top: 1em; }
.explanation { background: #f8f9fa; border-left: 4px solid #2e86de; padding: 0.8em 1em; line-height: 1.5; }
.alarm { border-left-color: #c0392b; background: #fdedec; }
svg { max-width: 100%; height: auto; } code { background: #f4f6f8; padding: 1px 4px; }
"""


def _cell(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _speedup_cell(summary: dict[str, Any]) -> str:
    value = summary["speedup"]
    if value is None:
        return "<td class=bad>failed</td>"
    verdict = _verdict(summary)
    spread = ((summary.get("repeats") or {}).get("figures") or {}).get("speedup")
    shown = f"{spread['median']:.2f}x<br><small>{spread['min']:.2f}–{spread['max']:.2f}</small>" if spread else f"{value:.2f}x"
    words = {NO_SPECULATION: "no speculation"}.get(verdict or "", verdict or "")
    return f'<td class="{verdict_css(verdict)}">{shown}<br><small>{escape(words)}</small></td>'


def _percentile_rows(report: dict[str, Any]) -> str:
    rows = []
    for s in report["scenarios"]:
        for label, side in (("target alone", "baseline"), ("speculative", "speculative")):
            found = s[side].get("percentiles") or {}
            cells = "".join(
                f"<td>{_cell(None if found.get(kind, {}).get(q) is None else found[kind][q] * 1000, '.1f')}</td>"
                for kind in ("ttft_s", "itl_s", "tpot_s")
                for q in ("p50", "p90", "p99")
            )
            rows.append(f"<tr><td>{escape(s['name']) if side == 'baseline' else ''}</td><td>{label}</td>{cells}</tr>")
    return "\n".join(rows)


_PERCENTILE_HEADER = (
    "<tr><th rowspan=2>scenario</th><th rowspan=2>side</th><th colspan=3>time to first token (ms)</th>"
    "<th colspan=3>inter-token latency (ms, between streamed chunks)</th><th colspan=3>time per output token (ms)</th></tr>"
    "<tr>" + "<th>p50</th><th>p90</th><th>p99</th>" * 3 + "</tr>"
)


def _summary_rows(report: dict[str, Any]) -> str:
    rows = []
    for s in report["scenarios"]:
        base, spec = s["baseline"], s["speculative"]
        prediction = s.get("prediction") or {}
        if s["speedup"] is None:
            exact = "<span class=bad>not compared</span>"
        else:
            exact = "<span class=good>yes</span>" if s["exact_outputs"] else "<span class=bad>NO</span>"
        best = "–" if s["best_draft_length"] is None else f"{s['best_draft_length']} ({prediction.get('best_speedup', 0):.2f}x)"
        tokens = _cell(s.get("billed_tokens_ratio"), ".1f", "x")
        cost = f"{_cell(s['cost_ratio'], '.2f', 'x')} ({tokens})" if s["cost_ratio"] is not None else f"{'free' if is_free(s) else '–'} ({tokens})"
        rows.append(
            "<tr>"
            f"<td><a href='#{escape(s['name'])}'>{escape(s['name'])}</a></td>"
            f"<td>{_cell(median_of(s, 'baseline_wall_s', base['wall_s']), '.3f')}</td>"
            f"<td>{_cell(median_of(s, 'baseline_ttft_s', base['ttft_s']), '.3f')}</td>"
            f"<td>{_cell(median_of(s, 'speculative_wall_s', spec['wall_s']), '.3f')}</td>"
            f"<td>{_cell(median_of(s, 'speculative_ttft_s', spec['ttft_s']), '.3f')}</td>"
            f"{_speedup_cell(s)}<td>{_cell(median_of(s, 'predicted_speedup', s['predicted_speedup']), '.2f', 'x')}</td><td>{best}</td>"
            f"<td>{_cell(median_of(s, 'acceptance_rate', s['acceptance_rate']), '.0%')}</td>"
            f"<td>{'never' if s['break_even_acceptance'] is None and prediction else _cell(s['break_even_acceptance'], '.0%')}</td>"
            f"<td>{cost}</td><td>{exact}</td>"
            "</tr>"
        )
    return "\n".join(rows)


_HEADER = (
    "<tr><th rowspan=2>scenario</th><th colspan=2>target alone (s)</th><th colspan=2>speculative (s)</th>"
    "<th rowspan=2>speedup</th><th rowspan=2>predicted speedup</th><th rowspan=2>best draft length (predicted speedup)</th>"
    "<th rowspan=2>acceptance</th><th rowspan=2>break-even acceptance</th><th rowspan=2>cost ratio (billed tokens ratio)</th>"
    "<th rowspan=2>every output the target's</th></tr>"
    "<tr><th>per request</th><th>first token</th><th>per request</th><th>first token</th></tr>"
)
_DOCS = (
    "The arithmetic behind the predictions: <a href='docs/performance.md'>docs/performance.md</a>; the algorithm: "
    "<a href='docs/algorithm.md'>docs/algorithm.md</a>; what exact means on each verification path: "
    "<a href='docs/verification.md'>docs/verification.md</a> (in the specapi repository)."
)


def _legend() -> str:
    return ", ".join(
        f"<span class={css}><span class=swatch style='background:{colour}'></span>{escape(words)}</span>" for css, colour, words in _VERDICTS.values()
    )


def render_html(report: dict[str, Any]) -> str:
    """The whole report as one HTML string."""
    sections = []
    for s in report["scenarios"]:
        alarm = " alarm" if not s["exact_outputs"] or s["errors"] else ""
        settings = ", ".join(f"{k}={v}" for k, v in s["settings"].items() if k != "simulator")
        sim = s["settings"].get("simulator")
        where = f"simulator: {sim['profile']} server, {sim['latency']} latency" if sim else f"target {s['target']}, draft {s['draft']}"
        mismatches = "".join(
            f"<li>request {m['request']}, character {m['first_difference_at_char']}: target alone <code>{escape(repr(m['target_alone']))}</code>, "
            f"speculative <code>{escape(repr(m['speculative']))}</code></li>"
            for m in s["mismatches"]
        )
        sections.append(
            f"<section id='{escape(s['name'])}'><h2>{escape(s['name'])}</h2>"
            f"<p>{escape(s['description'])}</p><p class=muted>{escape(where)}; {escape(settings)}</p>"
            f"<div class='explanation{alarm}'>{escape(s['explanation'])}</div>"
            + (f"<p class=bad>Outputs that differ from the target alone's:</p><ul>{mismatches}</ul>" if mismatches else "")
            + figure_html(scenario_svg(s), f"{s['name']}: latency per request, tokens per round, acceptance by draft position, cost per role")
            + (figure_html(learning_svg(s), f"{s['name']}: speedup by request number as the client learns") if s.get("after_warmup") else "")
            + (seed_blog_section(s) if s.get("seed_blog") else "")
            + "</section>"
        )
    low, high = SPEEDUP_BAND
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>specapi bench</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>specapi bench</h1><p class=muted>specapi {escape(report['specapi_version'])}, {escape(report['mode'])}. "
        "Speedup = time per request with the target alone / time with speculation (above 1: speculation wins). "
        f"{_legend()}: a win at {high:.2f}x or more, a loss at {low:.2f}x or less, even in between; with repeated runs the "
        "median is shown over the lowest and highest run, and a win (a loss) needs every run above (below) 1.0x. "
        "A scenario in which no request speculated is drawn as such, whatever its ratio. Times in seconds; acceptance and break-even as the share of draft tokens kept; "
        "cost ratio = money with speculation / money alone (billed tokens ratio in brackets). "
        "Predicted speedups come from the measured acceptance and call latencies.</p>"
        f"<p class=muted>{_DOCS}</p>"
        f"<table>{_HEADER}{_summary_rows(report)}</table>"
        f"<table>{_PERCENTILE_HEADER}{_percentile_rows(report)}</table>"
        + figure_html(overview_svg(report), "achieved (solid) and predicted (hatched) speedup per scenario; 1x is the target alone")
        + "".join(sections)
        + "</body></html>\n"
    )


def write_html(report: dict[str, Any], path: str | Path) -> None:
    """Write `render_html(report)` to `path`."""
    Path(path).write_text(render_html(report), encoding="utf-8")
