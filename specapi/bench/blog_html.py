"""The seed-blog section of the HTML report: the three-way table and its charts, and the lossy sweep.

Charts follow the report's rules (`charts.py`) (legends below the axes, units on every axis, SVG with text as text):
time per way (wall time, time to first token marked), cost and billed tokens per way and role, and
the sweep's speedup against divergence, one point per acceptance setting.
"""

from __future__ import annotations

from decimal import Decimal
from html import escape
from typing import Any

from matplotlib.figure import Figure

from .charts import BASE, DRAFT, LINE, SPEC, TARGET, figure_html, legend_below, svg

__all__ = ["seed_blog_svg", "sweep_svg", "seed_blog_section"]


def seed_blog_svg(result: dict[str, Any]) -> str:
    """Time per way, and cost per way split by role (billed tokens when no price is known)."""
    rows = result["rows"]
    names = [r["name"] for r in rows]
    figure = Figure(figsize=(11, 3.6), layout="constrained")
    time_ax, cost_ax = figure.subplots(1, 2)
    xs = list(range(len(rows)))
    colours = [BASE if r["name"] == "target alone" else SPEC for r in rows]
    time_ax.bar(xs, [r["wall_s"] for r in rows], color=colours, label="wall time")
    ttft = [(x, r["ttft_s"]) for x, r in zip(xs, rows) if r["ttft_s"] is not None]
    time_ax.scatter([x for x, _ in ttft], [t for _, t in ttft], marker="_", s=400, color="black", zorder=3, label="first token")
    for x, r in zip(xs, rows):
        time_ax.text(x, r["wall_s"], f"{r['wall_s']:.2f}", ha="center", va="bottom", fontsize=8)
    time_ax.set_xticks(xs, names, fontsize=8)
    time_ax.set_ylabel("seconds (one request)")
    time_ax.set_title("Time: the blog's loop, the target alone, specapi")
    time_ax.set_ylim(0, max([r["wall_s"] for r in rows] + [0.001]) * 1.15)
    legend_below(time_ax, columns=2)

    priced = all(r["cost_usd"] is not None for r in rows)
    if priced:
        total = [float(Decimal(r["cost_usd"])) * 1000 for r in rows]
        target_cost = [float(Decimal(r["target_cost_usd"])) * 1000 for r in rows]
        cost_ax.bar(xs, target_cost, color=TARGET, label="target")
        cost_ax.bar(xs, [t - c for t, c in zip(total, target_cost)], bottom=target_cost, color=DRAFT, label="draft")
        cost_ax.set_ylabel("USD per 1,000 such requests")
        cost_ax.set_title("Cost (genai-prices)")
        for x, value in zip(xs, total):
            cost_ax.text(x, value, f"{value:.2f}", ha="center", va="bottom", fontsize=8)
        cost_ax.set_ylim(0, max(total + [0.001]) * 1.15)
    else:
        draft = [sum(r["draft_tokens"]) for r in rows]
        target = [sum(r["target_tokens"]) for r in rows]
        cost_ax.bar(xs, target, color=TARGET, label="target")
        cost_ax.bar(xs, draft, bottom=target, color=DRAFT, label="draft")
        cost_ax.set_ylabel("billed tokens (prompt + completion)")
        cost_ax.set_title("Billed tokens (no price known)")
    cost_ax.set_xticks(xs, names, fontsize=8)
    legend_below(cost_ax, columns=2)
    return svg(figure)


def sweep_svg(sweep: dict[str, Any]) -> str:
    """Speedup against divergence (divergent tokens per 100 generated), one labelled point per setting."""
    rows = sweep["rows"]
    figure = Figure(figsize=(11, 3.8), layout="constrained")
    ax, gap_ax = figure.subplots(1, 2)
    xs = [r["divergent_per_100"] for r in rows]
    ys = [r["speedup"] or 0.0 for r in rows]
    threshold = [(x, y) for r, x, y in zip(rows, xs, ys) if r["mode"] == "threshold"]
    ax.plot([x for x, _ in threshold], [y for _, y in threshold], color=LINE, linewidth=1, label="threshold rule")
    ax.scatter(xs, ys, color=[BASE if r["mode"] == "exact" else SPEC for r in rows], zorder=3, label="a setting (grey: exact)")
    for r, x, y in zip(rows, xs, ys):
        ax.annotate(r["acceptance"], (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.set_xlabel("divergent tokens per 100 generated (not the target's own choice)")
    ax.set_ylabel("speedup over the target alone")
    ax.set_title("Speedup against divergence")
    ax.set_ylim(0, max(ys + [1.0]) * 1.15)
    legend_below(ax, columns=2)
    labels = [r["acceptance"] for r in rows]
    positions = list(range(len(rows)))
    gap_ax.bar([p - 0.2 for p in positions], [r["acceptance_rate"] * 100 for r in rows], width=0.4, color=SPEC, label="draft tokens kept (%)")
    gap_ax.bar([p + 0.2 for p in positions], [r["mean_logprob_gap"] * 100 for r in rows], width=0.4, color=DRAFT,
               label="log-probability gap per 100 tokens (nats)")
    gap_ax.set_xticks(positions, labels, fontsize=8, rotation=20)
    gap_ax.set_ylabel("percent / nats per 100 tokens")
    gap_ax.set_title("What each setting keeps, and what it costs in fidelity")
    legend_below(gap_ax, columns=2)
    return svg(figure)


def _row(cells: list[str]) -> str:
    return "<tr>" + "".join(f"<td>{cell}</td>" for cell in cells) + "</tr>"


def seed_blog_section(summary: dict[str, Any]) -> str:
    """The HTML for a scenario's `seed_blog` and `sweep` results."""
    result, sweep = summary["seed_blog"], summary.get("sweep")
    head = (
        "<tr><th>way</th><th>wall s</th><th>first token s</th><th>draft tokens in/out</th><th>target tokens in/out</th>"
        "<th>cost USD</th><th>acceptance</th><th>= target's own (same seed)</th><th>= target's own (greedy)</th></tr>"
    )
    body = "".join(
        _row([
            escape(r["name"]), f"{r['wall_s']:.3f}", "–" if r["ttft_s"] is None else f"{r['ttft_s']:.3f}",
            "%d / %d" % tuple(r["draft_tokens"]), "%d / %d" % tuple(r["target_tokens"]), escape(r["cost_usd"] or "unknown"),
            escape(r["acceptance"]), "yes" if r["same_as_target_sampled"] else "no", "yes" if r["same_as_target_greedy"] else "no",
        ])
        for r in result["rows"]
    )
    blog, greedy = result["blog"], result["greedy"]
    notes = (
        f"<p>The blog's own statistics: {blog['rounds']} rounds, {blog['accepted_words']}/{blog['proposed_words']} draft words kept. "
        f"Word rule: {escape(result['word_rule'])}. Greedy, the blog's text "
        f"{'equals' if greedy['same'][0] else 'differs from'} the target's own (common prefix {greedy['blog_common_prefix_chars']} characters).</p>"
    )
    parts = [
        f"<h3>The blog experiment</h3><p class=muted>{escape(result['question'])}; target {escape(result['models']['target'])}, "
        f"draft {escape(result['models']['draft'])} (priced as {escape(', '.join(result['models']['priced_as']))})</p>",
        f"<table>{head}{body}</table>",
        notes,
        figure_html(seed_blog_svg(result), "time and cost of one request each way"),
    ]
    if sweep:
        sweep_head = "<tr><th>acceptance</th><th>s/request</th><th>speedup</th><th>draft tokens kept</th><th>divergent per 100</th><th>gap per token (nats)</th><th>same text as the target</th></tr>"
        sweep_body = "".join(
            _row([
                escape(r["acceptance"]), f"{r['mean_s']:.3f}", f"{r['speedup']:.2f}x", f"{r['acceptance_rate']:.0%}",
                f"{r['divergent_per_100']:.2f}", f"{r['mean_logprob_gap']:.3f}", f"{r['same_text_as_target']}/{sweep['requests']}",
            ])
            for r in sweep["rows"]
        )
        parts += [
            f"<h3>Lossy acceptance: speedup against divergence</h3><p class=muted>{sweep['requests']} requests of "
            f"{sweep['max_tokens']} tokens at temperature {sweep['temperature']:g}, draft model, 4 tokens per round; "
            f"target alone {sweep['target_alone_s']:.3f} s per request</p>",
            f"<table>{sweep_head}{sweep_body}</table>",
            figure_html(sweep_svg(sweep), "each acceptance setting: speedup against the share of tokens that are not the target's own"),
        ]
    return "".join(parts)
