"""A sweep of draft lengths in one bench run (``specapi bench --draft-lengths 2,4,6``).

Each scenario runs once per fixed draft length and once with the default policy (adaptive, the client's
default draft length), every variant against the target alone in the same run, as the bench always
measures. `expand` makes the variants (plain scenarios, each carrying ``sweep``); `sweep_summary` groups
their summaries back into one object per scenario: the target alone's seconds per request, then a row per
setting (the JSON report's ``draft_length_sweep``, the terminal's sweep table).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from .scenarios import Scenario

__all__ = ["MAX_DRAFT_LENGTH", "DEFAULT_POLICY", "expand", "parse_lengths", "setting_label", "sweep_summary"]

#: The longest draft length a sweep takes (longer drafts are almost never accepted whole).
MAX_DRAFT_LENGTH = 32
#: The label of the variant that runs the client's default policy.
DEFAULT_POLICY = "default policy"


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"2,4,6"`` as (2, 4, 6): distinct whole numbers from 1 to `MAX_DRAFT_LENGTH`, in the order given."""
    parts = [part.strip() for part in text.split(",")]
    if not parts or any(not part for part in parts):
        raise ValueError("expected draft lengths separated by commas, e.g. 2,4,6")
    try:
        lengths = tuple(int(part) for part in parts)
    except ValueError:
        raise ValueError("expected whole numbers separated by commas, e.g. 2,4,6") from None
    wrong = [n for n in lengths if not 1 <= n <= MAX_DRAFT_LENGTH]
    if wrong:
        raise ValueError(f"each draft length must be from 1 to {MAX_DRAFT_LENGTH}, got {', '.join(map(str, wrong))}")
    if len(set(lengths)) != len(lengths):
        raise ValueError("a draft length is given twice")
    return lengths


def setting_label(length: int | None) -> str:
    return DEFAULT_POLICY if length is None else f"k={length}"


def expand(scenario: Scenario, lengths: Sequence[int]) -> list[Scenario]:
    """`scenario` with the default policy, then at each fixed draft length (drafter, pipelining and
    verification as the scenario sets them). The variants expect no speedup of their own (``aim`` None)."""
    variants = []
    for length in (None, *lengths):
        client = {k: v for k, v in scenario.client.items() if k not in ("policy", "num_speculative_tokens")}
        if length is None:
            said = "the default policy (adaptive)"
        else:
            client.update(policy="fixed", num_speculative_tokens=length)
            said = f"fixed {length} tokens per round"
        variants.append(
            replace(
                scenario,
                name=f"{scenario.name} {setting_label(length)}",
                description=f"{scenario.description}; in this sweep: {said}",
                client=client,
                aim=None,
                sweep=(scenario.name, length),
            )
        )
    return variants


def _median(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _figure(summary: dict[str, Any], name: str, value: Any) -> Any:
    """The median over repeated runs of figure `name` when there were several, else `value`."""
    spread = ((summary.get("repeats") or {}).get("figures") or {}).get(name)
    return spread["median"] if spread else value


def _row(summary: dict[str, Any]) -> dict[str, Any]:
    length = summary["variant"]["draft_length"]
    per_round = summary.get("tokens_per_round") or []
    return {
        "setting": setting_label(length),
        "draft_length": length,
        "policy": summary["settings"]["policy"],
        "scenario": summary["name"],
        "wall_s": _figure(summary, "speculative_wall_s", summary["speculative"]["wall_s"]),
        "baseline_wall_s": _figure(summary, "baseline_wall_s", summary["baseline"]["wall_s"]),
        "speedup": _figure(summary, "speedup", summary["speedup"]),
        "verdict": summary.get("verdict"),
        "acceptance_rate": _figure(summary, "acceptance_rate", summary["acceptance_rate"]),
        "tokens_per_round": round(statistics.fmean(per_round), 3) if per_round else None,
        "cost_ratio": summary["cost_ratio"],
        "exact_outputs": summary["exact_outputs"],
    }


def sweep_summary(scenarios: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One object per swept scenario, in the order run: the target alone (the median of its seconds per
    request over the variants' runs), a row per setting, and the fastest fixed draft length."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for summary in scenarios:
        if summary.get("variant"):
            grouped.setdefault(summary["variant"]["scenario"], []).append(_row(summary))
    out = []
    for name, rows in grouped.items():
        fixed = [r for r in rows if r["draft_length"] is not None and r["speedup"] is not None]
        best = max(fixed, key=lambda r: r["speedup"]) if fixed else None
        out.append({
            "scenario": name,
            "target_alone_wall_s": _median([r["baseline_wall_s"] for r in rows]),
            "rows": rows,
            "best_draft_length": best["draft_length"] if best else None,
        })
    return out
