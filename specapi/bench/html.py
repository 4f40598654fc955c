"""The HTML report: one self-contained file (inline CSS, plots as base64 PNG) a person can read at a glance.

Top: the summary table and a chart of achieved against predicted speedup per scenario. Then, per
scenario, its explanation and four plots: latency per request (target alone against speculative, with
the time to first token marked), tokens per round, acceptance by draft position, and cost (or billed
tokens, when the prices are zero) per role; where the client learns from traffic (``agentic``), speedup
against request number. Plots are drawn with matplotlib's object API (no pyplot
state), so writing a report has no global side effects.
"""

from __future__ import annotations

import base64
import io
from collections import Counter
from decimal import Decimal
from html import escape
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

__all__ = ["learning_png", "overview_png", "render_html", "scenario_png", "write_html"]

_BASE = "#7f8c8d"
_SPEC = "#2e86de"
_DRAFT = "#f39c12"
_TARGET = "#34495e"
_GOOD = "#27ae60"
_BAD = "#c0392b"


def _png(figure: Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=110)
    return buffer.getvalue()


def overview_png(report: dict[str, Any]) -> bytes:
    """Achieved and predicted speedup per scenario, against the target alone (1x)."""
    scenarios = report["scenarios"]
    figure = Figure(figsize=(9, 0.6 + 0.55 * max(1, len(scenarios))), layout="constrained")
    ax = figure.add_subplot()
    names = [s["name"] for s in scenarios][::-1]
    achieved = [s["speedup"] or 0.0 for s in scenarios][::-1]
    predicted = [s["predicted_speedup"] for s in scenarios][::-1]
    rows = range(len(names))
    colors = [_GOOD if a >= 1.0 else _BAD for a in achieved]
    ax.barh([r + 0.18 for r in rows], achieved, height=0.36, color=colors, label="achieved")
    ax.barh(
        [r - 0.18 for r in rows], [p or 0.0 for p in predicted], height=0.36, color="none", edgecolor="#34495e", hatch="//", label="predicted"
    )
    for r, a in zip(rows, achieved):
        ax.text(a, r + 0.18, f" {a:.2f}x", va="center", fontsize=9)
    ax.axvline(1.0, color="black", linewidth=1)
    ax.text(1.0, len(names) - 0.45, " target alone", fontsize=8, va="bottom")
    ax.set_yticks(list(rows), names)
    ax.set_xlabel("speedup over the target alone (time alone / time with speculation)")
    ax.set_ylim(-0.6, len(names) - 0.2)
    ax.set_xlim(0, max([*achieved, *[p or 0 for p in predicted], 1.2]) * 1.15)
    ax.legend(loc="lower right", fontsize=8)
    return _png(figure)


def _latency_panel(ax: Any, summary: dict[str, Any]) -> None:
    requests = summary["requests"]
    xs = list(range(len(requests)))
    base = [r["baseline_wall_s"] or 0.0 for r in requests]
    spec = [r["speculative_wall_s"] or 0.0 for r in requests]
    ax.bar([x - 0.2 for x in xs], base, width=0.4, color=_BASE, label="target alone")
    ax.bar([x + 0.2 for x in xs], spec, width=0.4, color=_SPEC, label="speculative")
    base_ttft = [r["baseline_ttft_s"] for r in requests]
    spec_ttft = [r["speculative_ttft_s"] for r in requests]
    ax.scatter([x - 0.2 for x, t in zip(xs, base_ttft) if t is not None], [t for t in base_ttft if t is not None], marker="_", s=300, color="black", zorder=3, label="first token")
    ax.scatter([x + 0.2 for x, t in zip(xs, spec_ttft) if t is not None], [t for t in spec_ttft if t is not None], marker="_", s=300, color="black", zorder=3)
    ax.set_xticks(xs, [f"#{r['index']}" + ("" if r["rounds"] else "\n(alone)") for r in requests])
    ax.set_ylabel("seconds per request")
    speedup = summary["speedup"]
    ax.set_title("Latency per request" + (f" ({speedup:.2f}x)" if speedup else ""))
    ax.set_ylim(0, max([*base, *spec, 0.001]) * 1.3)
    ax.legend(fontsize=8, loc="upper center", ncol=3)


def _rounds_panel(ax: Any, summary: dict[str, Any]) -> None:
    counts = Counter(summary["tokens_per_round"])
    if not counts:
        ax.text(0.5, 0.5, "no speculative rounds\n(the target generated alone)", ha="center", va="center", transform=ax.transAxes)
        ax.set_title("Tokens per round")
        ax.set_xticks([])
        ax.set_yticks([])
        return
    xs = sorted(counts)
    ax.bar(xs, [counts[x] for x in xs], color=_SPEC, width=0.8)
    mean = sum(summary["tokens_per_round"]) / len(summary["tokens_per_round"])
    ax.axvline(mean, color="black", linestyle="--", linewidth=1, label=f"mean {mean:.2f}")
    prediction = summary.get("prediction")
    if prediction:
        ax.axvline(prediction["expected_tokens_per_round"], color=_DRAFT, linewidth=1.5, label=f"E(K) {prediction['expected_tokens_per_round']:.2f}")
    ax.set_xticks(range(0, max(xs) + 1))
    ax.set_xlabel("tokens produced in a round (accepted + 1)")
    ax.set_ylabel("rounds")
    ax.set_title(f"Tokens per round ({len(summary['tokens_per_round'])} rounds)")
    ax.legend(fontsize=8)


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
    ax.bar(xs, by_position, color=_SPEC, label="accepted (share of rounds)")
    ax.plot(list(range(1, len(conditional) + 1)), conditional, color=_DRAFT, marker="o", label="given earlier ones accepted")
    break_even = summary.get("break_even_acceptance")
    if break_even is not None:
        ax.axhline(break_even, color=_BAD, linestyle=":", label=f"break-even {break_even:.2f}")
    ax.set_ylim(0, 1.05)
    ax.set_xticks(xs)
    ax.set_xlabel("draft position")
    ax.set_ylabel("acceptance")
    source = summary.get("acceptance_source", "")
    ax.set_title("Acceptance by draft position" + (" (warm-up)" if source == "warm-up requests" else ""))
    ax.legend(fontsize=8, loc="lower left")


def _cost_panel(ax: Any, summary: dict[str, Any]) -> None:
    base, spec = summary["baseline"], summary["speculative"]
    costs = [base["by_role"]["target"]["cost_usd"], spec["by_role"]["target"]["cost_usd"], spec["by_role"]["draft"]["cost_usd"]]
    priced = all(c is not None for c in costs) and any(Decimal(c) > 0 for c in costs)
    labels = ["target alone", "speculative"]
    if priced:
        base_target = float(Decimal(costs[0]))
        spec_target, spec_draft = float(Decimal(costs[1])), float(Decimal(costs[2]))
        ax.bar(labels, [base_target, spec_target], color=_TARGET, label="target")
        ax.bar(labels, [0.0, spec_draft], bottom=[base_target, spec_target], color=_DRAFT, label="draft")
        ax.set_ylabel("USD (all measured requests)")
        ax.set_ylim(0, max(base_target, spec_target + spec_draft) * 1.2)
        ratio = summary["cost_ratio"]
        ax.set_title("Cost per role" + (f" ({ratio:.1f}x)" if ratio else ""))
        for i, total in enumerate([base_target, spec_target + spec_draft]):
            ax.text(i, total, f"${total:.5f}", ha="center", va="bottom", fontsize=8)
    else:
        roles = [base["by_role"]["target"], spec["by_role"]["target"]]
        draft = spec["by_role"]["draft"]
        prompt = [roles[0]["prompt_tokens"], roles[1]["prompt_tokens"]]
        completion = [roles[0]["completion_tokens"], roles[1]["completion_tokens"]]
        ax.bar(labels, prompt, color=_TARGET, label="target prompt")
        ax.bar(labels, completion, bottom=prompt, color="#85c1e9", label="target completion")
        ax.bar(labels, [0, draft["prompt_tokens"] + draft["completion_tokens"]], bottom=[p + c for p, c in zip(prompt, completion)], color=_DRAFT, label="draft")
        ax.set_ylabel("billed tokens (prices are zero)")
        ax.set_title("Billed tokens per role")
    ax.legend(fontsize=8)


def scenario_png(summary: dict[str, Any]) -> bytes:
    """The four plots of one scenario in one image."""
    figure = Figure(figsize=(11, 7), layout="constrained")
    axes = figure.subplots(2, 2)
    _latency_panel(axes[0][0], summary)
    _rounds_panel(axes[0][1], summary)
    _acceptance_panel(axes[1][0], summary)
    _cost_panel(axes[1][1], summary)
    figure.suptitle(summary["name"], fontsize=13, fontweight="bold")
    return _png(figure)


def learning_png(summary: dict[str, Any]) -> bytes:
    """Speedup against request number, for scenarios where the client learns from traffic."""
    figure = Figure(figsize=(11, 3.6), layout="constrained")
    ax = figure.add_subplot()
    requests = [r for r in summary["requests"] if r.get("speedup") is not None]
    numbers = [r["index"] + 1 for r in requests]
    speedups = [r["speedup"] for r in requests]
    ax.plot(numbers, speedups, color=_SPEC, marker="o", label="speedup of this request")
    ax.axhline(1.0, color="black", linewidth=1)
    warmed = summary.get("after_warmup") or {}
    if warmed.get("from_request"):
        ax.axvspan(0.5, warmed["from_request"] + 0.5, color="#eeeeee", label="warm-up (the client is learning)")
    if warmed.get("speedup") is not None:
        ax.axhline(warmed["speedup"], color=_GOOD, linestyle="--", label=f"after warm-up: {warmed['speedup']:.2f}x")
    ax.set_xlabel("request number")
    ax.set_ylabel("time alone / time with speculation")
    ax.set_title("Speedup as the suffix index learns from earlier requests")
    ax.legend(fontsize=8)
    return _png(figure)


_CSS = """
body { font-family: -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1180px; color: #222; }
h1 { margin-bottom: 0.2em; } .muted { color: #666; }
table { border-collapse: collapse; margin: 1em 0; font-size: 14px; }
th, td { border-bottom: 1px solid #ddd; padding: 6px 10px; text-align: right; }
th { background: #f4f6f8; } td:first-child, th:first-child { text-align: left; }
.good { color: #1e8449; font-weight: bold; } .bad { color: #b03a2e; font-weight: bold; } .even { color: #9a7d0a; font-weight: bold; }
section { margin-top: 2.5em; border-top: 2px solid #eee; padding-top: 1em; }
.explanation { background: #f8f9fa; border-left: 4px solid #2e86de; padding: 0.8em 1em; line-height: 1.5; }
.alarm { border-left-color: #c0392b; background: #fdedec; }
img { max-width: 100%; } code { background: #f4f6f8; padding: 1px 4px; }
"""


def _cell(value: Any, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def _speedup_cell(value: float | None) -> str:
    if value is None:
        return "<td>–</td>"
    css = "good" if value >= 1.05 else ("bad" if value <= 0.95 else "even")
    return f'<td class="{css}">{value:.2f}x</td>'


def _summary_rows(report: dict[str, Any]) -> str:
    rows = []
    for s in report["scenarios"]:
        base, spec = s["baseline"], s["speculative"]
        prediction = s.get("prediction") or {}
        aim = s.get("aim")
        aim_cell = "–"
        if aim and aim.get("met") is not None:
            aim_cell = f"{'&lt;' if aim['below'] else '≥'}{aim['speedup']:g}x " + ("<span class=good>met</span>" if aim["met"] else "<span class=bad>missed</span>")
        exact = "<span class=good>yes</span>" if s["exact_outputs"] else "<span class=bad>NO</span>"
        best = "–" if s["best_draft_length"] is None else f"{s['best_draft_length']} ({prediction.get('best_speedup', 0):.2f}x)"
        cost = _cell(s["cost_ratio"], ".2f", "x") if s["cost_ratio"] is not None else f"free ({_cell(s.get('billed_tokens_ratio'), '.1f', 'x')} tokens)"
        rows.append(
            "<tr>"
            f"<td><a href='#{escape(s['name'])}'>{escape(s['name'])}</a></td>"
            f"<td>{_cell(base['wall_s'], '.3f')} s ({_cell(base['ttft_s'], '.3f')})</td>"
            f"<td>{_cell(spec['wall_s'], '.3f')} s ({_cell(spec['ttft_s'], '.3f')})</td>"
            f"{_speedup_cell(s['speedup'])}<td>{_cell(s['predicted_speedup'], '.2f', 'x')}</td><td>{best}</td>"
            f"<td>{_cell(s['acceptance_rate'])}</td>"
            f"<td>{'never' if s['break_even_acceptance'] is None and prediction else _cell(s['break_even_acceptance'])}</td>"
            f"<td>{cost}</td><td>{exact}</td><td>{aim_cell}</td>"
            "</tr>"
        )
    return "\n".join(rows)


def _image(png: bytes, alt: str) -> str:
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


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
            + _image(scenario_png(s), f"plots for {s['name']}")
            + (_image(learning_png(s), f"speedup by request for {s['name']}") if s.get("after_warmup") else "")
            + "</section>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>specapi bench</title>"
        f"<style>{_CSS}</style></head><body>"
        f"<h1>specapi bench</h1><p class=muted>specapi {escape(report['specapi_version'])}, {escape(report['mode'])}. "
        "Speedup = time per request with the target alone / time with speculation (above 1: speculation wins). "
        "Predicted from the measured acceptance and call latencies with speculation.md's arithmetic.</p>"
        "<table><tr><th>scenario</th><th>target alone (TTFT)</th><th>speculative (TTFT)</th><th>speedup</th><th>predicted</th>"
        "<th>best K (pred.)</th><th>acceptance</th><th>break-even</th><th>cost ratio</th><th>exact</th><th>aim</th></tr>"
        f"{_summary_rows(report)}</table>"
        + _image(overview_png(report), "achieved and predicted speedup per scenario")
        + "".join(sections)
        + "</body></html>\n"
    )


def write_html(report: dict[str, Any], path: str | Path) -> None:
    """Write `render_html(report)` to `path`."""
    Path(path).write_text(render_html(report), encoding="utf-8")
