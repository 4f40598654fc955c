"""From measurements to the report: per-side figures, the prediction beside the result, the explanation.

`summarize(run)` returns the JSON-ready dict of one scenario (the shape other tools read, see
`REQUIRED_KEYS`); `report(runs)` wraps several. Money stays `Decimal` until it is written as a string.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from decimal import Decimal
from typing import Any

from ..core.stats import MODEL_DRAFTER, PIPELINED, RoleUsage, RoundRecord, money
from . import predict as arithmetic
from .explain import explain
from .runner import Calibration, Sample, ScenarioRun
from .scenarios import BenchRequest
from .spread import Spread, percentiles, spread_of, verdict_class
from .sweep import sweep_summary

__all__ = ["REQUIRED_KEYS", "SIDE_KEYS", "latency_model", "latency_percentiles", "merge_repeats", "report", "side_summary", "summarize"]

#: Keys every scenario object carries (other tools rely on them).
REQUIRED_KEYS = (
    "name",
    "description",
    "baseline",
    "speculative",
    "speedup",
    "cost_ratio",
    "acceptance_rate",
    "acceptance_by_position",
    "predicted_speedup",
    "best_draft_length",
    "break_even_acceptance",
    "exact_outputs",
    "explanation",
)
#: Keys of the `baseline` and `speculative` objects.
SIDE_KEYS = ("wall_s", "tokens_per_s", "ttft_s", "cost_usd", "requests", "prompt_tokens", "completion_tokens")

#: Achieved and predicted speedups further apart than this get their difference explained.
PREDICTION_TOLERANCE = 0.15

def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return statistics.fmean(values) if values else None


def _round(value: float | None, digits: int = 6) -> float | None:
    return None if value is None else round(value, digits)


_money = money  # one money format everywhere: a decimal string in USD, or None when unknown


def _total_cost(samples: Sequence[Sample]) -> Decimal | None:
    total: Decimal | None = Decimal(0)
    for s in samples:
        for usage in (s.target, s.draft):
            total = None if total is None or usage.cost_usd is None else total + usage.cost_usd
    return total


def _usage_dict(usage: RoleUsage) -> dict[str, Any]:
    return {
        "requests": usage.requests,
        "failed_requests": usage.failed_requests,
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "cached_tokens": usage.cached_tokens,
        "latency_s": round(usage.latency_s, 6),
        "cost_usd": _money(usage.cost_usd),
    }


def latency_percentiles(samples: Sequence[Sample]) -> dict[str, dict[str, float | None]]:
    """Time to first token over requests, inter-token latency over every gap between text chunks, and
    time per output token over requests (after the first token): p50, p90 and p99 in seconds."""
    ok = [s for s in samples if s.error is None]
    tpot = [(s.wall_s - s.ttft_s) / (s.generated_tokens - 1) for s in ok if s.ttft_s is not None and s.generated_tokens > 1]
    found = {
        "ttft_s": percentiles(s.ttft_s for s in ok if s.ttft_s is not None),
        "itl_s": percentiles(gap for s in ok for gap in s.itl_s),
        "tpot_s": percentiles(tpot),
    }
    return {name: {q: _round(v) for q, v in values.items()} for name, values in found.items()}


def side_summary(samples: Sequence[Sample], span_s: float = 0.0) -> dict[str, Any]:
    """Figures of one side over its successful requests: means per request, percentiles, totals billed;
    with `span_s` (first request sent to last answered), the throughput."""
    ok = [s for s in samples if s.error is None]
    target = sum((s.target for s in ok), RoleUsage())
    draft = sum((s.draft for s in ok), RoleUsage())
    total_wall = sum(s.wall_s for s in ok)
    generated = sum(s.generated_tokens for s in ok)
    cost = _total_cost(ok)
    return {
        "requests": len(ok),
        "failed": len(samples) - len(ok),
        "wall_s": _round(_mean(s.wall_s for s in ok)),
        "total_wall_s": round(total_wall, 6),
        "ttft_s": _round(_mean(s.ttft_s for s in ok if s.ttft_s is not None)),
        "tokens_per_s": round(generated / total_wall, 3) if total_wall > 0 else None,
        "generated_tokens": generated,
        "prompt_tokens": target.prompt_tokens + draft.prompt_tokens,
        "completion_tokens": target.completion_tokens + draft.completion_tokens,
        "http_requests": target.requests + draft.requests,
        "cost_usd": _money(cost),
        "cost_per_request_usd": _money(cost / len(ok)) if cost is not None and ok else None,
        "by_role": {"target": _usage_dict(target), "draft": _usage_dict(draft)},
        "percentiles": latency_percentiles(ok),
        "span_s": _round(span_s) if span_s else None,
        "throughput_tokens_per_s": round(generated / span_s, 3) if span_s > 0 else None,
    }


def _acceptance_by_position(rounds: Sequence[RoundRecord]) -> list[float]:
    """Per draft position: the fraction of rounds drafting it in which it was accepted."""
    kept: list[int] = []
    seen: list[int] = []
    for r in rounds:
        for i, ok in enumerate(r.accepted_by_position):
            if i == len(seen):
                kept.append(0)
                seen.append(0)
            seen[i] += 1
            kept[i] += bool(ok)
    return [k / n for k, n in zip(kept, seen)]


def _is_model_draft(record: RoundRecord) -> bool:
    return record.drafter.startswith(MODEL_DRAFTER)


def _is_pipelined(record: RoundRecord) -> bool:
    return record.drafter.endswith(PIPELINED)


def _fit_if_varied(lengths: Sequence[int], latencies: Sequence[float]) -> tuple[float, float] | None:
    """A least-squares line, only when at least two draft lengths were seen in three rounds or more each
    (a few short last rounds of a fixed-length run would make the slope noise)."""
    counts = Counter(lengths)
    if sum(1 for n in counts.values() if n >= 3) < 2:
        return None
    return arithmetic.fit_line(lengths, latencies)


def latency_model(
    baseline: Sequence[Sample], rounds: Sequence[RoundRecord], calibration: Calibration | None
) -> tuple[arithmetic.LatencyModel, dict[str, str]] | None:
    """Fixed and per-token costs of each call, with where each figure came from; None without a baseline.

    Target alone: per request, (last - first token) / (tokens - 1) per token, first token minus one
    token fixed (medians). Draft: a least-squares fit over the sequential model-drafted rounds when
    they drafted at least two lengths (three rounds each); otherwise the per-token cost of the two
    calibration calls and the fixed cost from the rounds (a fixed draft length cannot separate them).
    Verify: a fit against the draft length under the same condition, else the median verify call.
    """
    points = [s for s in baseline if s.error is None and s.ttft_s is not None and s.generated_tokens >= 2]
    if not points:
        return None
    per_token = statistics.median((s.wall_s - s.ttft_s) / (s.generated_tokens - 1) for s in points)  # type: ignore[operator]
    fixed = statistics.median(s.ttft_s - per_token for s in points)  # type: ignore[operator]
    sources = {"target": f"median of {len(points)} target-alone requests (first token, then per token)"}

    drafted = [r for r in rounds if _is_model_draft(r) and not _is_pipelined(r) and r.drafted > 0]
    draft_fixed = draft_per_token = 0.0
    fit = _fit_if_varied([r.drafted for r in drafted], [r.draft_latency_s for r in drafted])
    if fit is not None:
        draft_fixed, draft_per_token = fit
        sources["draft"] = f"least squares over {len(drafted)} sequential draft calls"
    elif calibration is not None:
        draft_per_token = calibration.per_token_s
        if drafted:
            draft_fixed = max(0.0, statistics.median(r.draft_latency_s - r.drafted * draft_per_token for r in drafted))
            sources["draft"] = (
                f"per token from two draft calls timed alone ({calibration.short_tokens} and {calibration.long_tokens} tokens); "
                f"fixed cost from {len(drafted)} sequential draft calls"
            )
        else:
            draft_fixed = calibration.fixed_s
            sources["draft"] = f"two draft calls timed alone ({calibration.short_tokens} and {calibration.long_tokens} tokens)"
    elif drafted:
        draft_fixed = statistics.median(r.draft_latency_s for r in drafted)
        sources["draft"] = f"median of {len(drafted)} draft calls (one draft length: no per-token cost)"
    else:
        sources["draft"] = "no draft calls"

    verified = [r for r in rounds if r.verify_latency_s > 0]
    verify_fixed = verify_per_token = 0.0
    if verified:
        fit = _fit_if_varied([r.drafted for r in verified], [r.verify_latency_s for r in verified])
        if fit is None:
            verify_fixed = statistics.median(r.verify_latency_s for r in verified)
            sources["verify"] = f"median of {len(verified)} verify calls"
        else:
            verify_fixed, verify_per_token = fit
            sources["verify"] = f"least squares over {len(verified)} verify calls"
    share = sum(1 for r in rounds if _is_model_draft(r)) / len(rounds) if rounds else 1.0
    model = arithmetic.LatencyModel(
        target_fixed_s=max(0.0, fixed),
        target_per_token_s=max(0.0, per_token),
        draft_fixed_s=draft_fixed,
        draft_per_token_s=draft_per_token,
        verify_fixed_s=verify_fixed,
        verify_per_token_s=verify_per_token,
        draft_share=share,
    )
    return model, sources


def _by_drafter(
    model: arithmetic.LatencyModel, rounds: Sequence[RoundRecord], n_tokens: float, *, pipelined: bool
) -> tuple[float, list[dict[str, Any]]] | None:
    """Rounds drafted without a call and rounds drafted by the model, predicted apart and weighed by
    their share of the rounds: the speculative speedup and each part. None unless both kinds ran.

    Each part drafts its own most common length with its own acceptance by position; a free round costs
    its verify call only, a model round its draft call too (pipelined as measured). One length and one
    acceptance table for both would describe neither: a suffix index repeating an answer drafts long and
    keeps every token, the model drafts a few tokens on new text and loses some."""
    parts: list[dict[str, Any]] = []
    tokens_per_round = seconds_per_round = 0.0
    for name, share in (("free", 0.0), ("model", 1.0)):
        group = [r for r in rounds if _is_model_draft(r) == bool(share)]
        k = Counter(r.drafted for r in group).most_common(1)[0][0] if group else 0
        if k <= 0:
            return None
        conditional = arithmetic.conditional_acceptance([r.accepted_by_position for r in group])
        own = dataclasses.replace(model, draft_share=share)
        tokens = arithmetic.expected_tokens_by_position(conditional, k)
        seconds = arithmetic.round_time(own, k, conditional, pipelined=pipelined and bool(share))
        weight = len(group) / len(rounds)
        tokens_per_round += weight * tokens
        seconds_per_round += weight * seconds
        parts.append(
            {"drafter": name, "share_of_rounds": round(weight, 4), "draft_length": k,
             "expected_tokens_per_round": round(tokens, 4), "round_s": round(seconds, 6)}
        )
    return arithmetic.speedup_of_rounds(model, tokens_per_round, seconds_per_round, n_tokens), parts


def _first_difference(a: str, b: str) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def _mismatches(run: ScenarioRun) -> list[dict[str, Any]]:
    base = {s.index: s for s in run.baseline if s.error is None}
    found = []
    for spec in run.speculative:
        other = base.get(spec.index)
        if spec.error is not None or other is None or spec.text == other.text:
            continue
        at = _first_difference(other.text, spec.text)
        found.append(
            {
                "request": spec.index,
                # False when the response itself said it was approximate (and why): honest, not a bug.
                "claimed_exact": spec.stats is None or spec.stats.exact,
                "engine_reason": None if spec.stats is None else spec.stats.exact_reason,
                "first_difference_at_char": at,
                "target_alone": other.text[max(0, at - 20) : at + 40],
                "speculative": spec.text[max(0, at - 20) : at + 40],
            }
        )
    return found


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def summarize(run: ScenarioRun) -> dict[str, Any]:
    """The JSON-ready report of one scenario."""
    scenario = run.scenario
    baseline = side_summary(run.baseline, run.baseline_span_s)
    speculative = side_summary(run.speculative, run.speculative_span_s)
    answered = [s for s in run.speculative if s.error is None]
    through_proxy = any(s.totals is not None for s in answered)
    measured_rounds = [r for s in run.speculative if s.error is None for r in s.rounds]
    warmup_rounds = [r for s in run.warmup if s.error is None for r in s.rounds]
    rounds = measured_rounds or warmup_rounds
    rounds_source = "measured requests" if measured_rounds else ("warm-up requests" if warmup_rounds else "none")

    drafted = sum(s.drafted_tokens for s in answered)
    accepted = sum(s.accepted_tokens for s in answered)
    num_rounds = sum(s.num_rounds for s in answered)
    acceptance_rate = accepted / drafted if drafted else None
    by_position = _acceptance_by_position(rounds)
    conditional = arithmetic.conditional_acceptance([r.accepted_by_position for r in rounds])

    speedup = _ratio(baseline["wall_s"], speculative["wall_s"])
    base_cost = Decimal(baseline["cost_usd"]) if baseline["cost_usd"] is not None else None
    spec_cost = Decimal(speculative["cost_usd"]) if speculative["cost_usd"] is not None else None
    cost_ratio = float(spec_cost / base_cost) if base_cost and spec_cost is not None else None

    generated = sum(s.generated_tokens for s in run.speculative if s.error is None)
    from_rounds = sum(r.emitted for r in measured_rounds)
    speculated_share = min(1.0, from_rounds / generated) if generated else 0.0
    fallbacks = [s.stats.fallback_reason for s in answered if s.stats is not None and not s.num_rounds and s.stats.fallback_reason]

    overheads = [
        (s.wall_s - sum(r.draft_latency_s + r.verify_latency_s for r in s.rounds)) / len(s.rounds)
        for s in run.speculative
        if s.error is None and s.rounds and sum(r.emitted for r in s.rounds) >= s.generated_tokens
    ]
    fitted = latency_model(run.baseline, rounds, run.calibration)
    prediction: arithmetic.Prediction | None = None
    predicted_speedup = None
    pipelined = any(_is_pipelined(r) for r in rounds)
    k_used = Counter(r.drafted for r in rounds).most_common(1)[0][0] if rounds else scenario.draft_length
    n_tokens = _mean(s.generated_tokens for s in run.baseline if s.error is None) or float(scenario.max_tokens)
    mixed: tuple[float, list[dict[str, Any]]] | None = None
    if fitted is not None and rounds and k_used > 0 and n_tokens > 0:
        prediction = arithmetic.predict(fitted[0], conditional, k_used, n_tokens, pipelined=pipelined)
        mixed = _by_drafter(fitted[0], rounds, n_tokens, pipelined=pipelined)
        speculating = mixed[0] if mixed is not None else prediction.speedup
        # Tokens the target generated alone (adaptive fallback) go at the target's own speed.
        predicted_speedup = 1.0 / (speculated_share / speculating + (1.0 - speculated_share))
    elif fitted is not None and not rounds and not through_proxy:
        predicted_speedup = 1.0  # nothing speculated: the target alone, through specapi

    temperature_zero = scenario.temperature == 0.0
    mismatches = _mismatches(run) if temperature_zero else []
    compared = any(s.error is None for s in run.speculative) and any(s.error is None for s in run.baseline)
    if temperature_zero:
        exact = bool(compared) and not mismatches
        exactness_check = "text compared with the target alone's (temperature 0)"
    else:
        exact = bool(compared) and all(s.stats is not None and s.stats.exact for s in run.speculative if s.error is None)
        exactness_check = "the engine's exactness flag (sampled outputs differ from run to run by design)"
    inexact = sorted({s.stats.exact_reason or "approximate" for s in run.speculative if s.stats is not None and not s.stats.exact})

    per_request = []
    base_by_index = {s.index: s for s in run.baseline}
    for spec in run.speculative:
        base = base_by_index.get(spec.index)
        request = scenario.requests[spec.index] if spec.index < len(scenario.requests) else None
        per_request.append(
            {
                "index": spec.index,
                "label": request.short() if request else "",
                "baseline_wall_s": _round(base.wall_s) if base else None,
                "speculative_wall_s": _round(spec.wall_s),
                "baseline_ttft_s": _round(base.ttft_s) if base else None,
                "speculative_ttft_s": _round(spec.ttft_s),
                "generated_tokens": spec.generated_tokens,
                "num_rounds": spec.num_rounds,
                "accepted_tokens": spec.accepted_tokens,
                "drafted_tokens": spec.drafted_tokens,
                "fallback_reason": spec.stats.fallback_reason if spec.stats else None,
                "verification": spec.stats.verification if spec.stats else None,
                "identical_output": (base.text == spec.text) if base and base.error is None and spec.error is None else None,
                "speedup": _round(_ratio(base.wall_s, spec.wall_s), 4) if base and base.error is None and spec.error is None else None,
                "drafters": dict(Counter(r.drafter.split(" ")[0].removesuffix(PIPELINED) for r in spec.rounds)),
                "errors": [e for e in (base.error if base else None, spec.error) if e],
                "speculative": spec.stats.to_dict() if spec.stats is not None else None,
            }
        )

    warmed = _after_learning(run) if scenario.learning_requests else None
    judged = warmed["speedup"] if warmed is not None else speedup
    speculated = num_rounds > 0
    aim = None
    if scenario.aim is not None:
        met = None if judged is None else (judged < scenario.aim if scenario.aim_below else judged >= scenario.aim)
        aim = {"speedup": scenario.aim, "below": scenario.aim_below, "met": met}
        if warmed is not None:
            aim["judged_on"] = "after warm-up"

    summary: dict[str, Any] = {
        "name": scenario.name,
        "description": scenario.description,
        "settings": scenario.settings(),
        "variant": {"scenario": scenario.sweep[0], "draft_length": scenario.sweep[1]} if scenario.sweep else None,
        "target": run.target_label,
        "draft": run.draft_label,
        "baseline": baseline,
        "speculative": {
            **speculative,
            "num_rounds": num_rounds,
            "drafted_tokens": drafted,
            "accepted_tokens": accepted,
            "tokens_per_round": _round(from_rounds / len(measured_rounds), 4) if measured_rounds else None,
            "speculated_share": None if through_proxy else round(speculated_share, 4),
            "pipelined_rounds": sum(1 for r in measured_rounds if _is_pipelined(r)),
            "overhead_per_round_s": _round(statistics.median(overheads)) if overheads else None,
            "lookup_rounds": sum(1 for r in measured_rounds if not _is_model_draft(r)),
            "verification": sorted({s.stats.verification for s in answered if s.stats is not None and s.num_rounds}),
            "requests_served_by_target_alone": len(fallbacks),
            "fallback_reasons": sorted(set(fallbacks)),
        },
        "speedup": _round(speedup, 4),
        # "win", "even", "loss" or "no speculation" (see `spread.verdict_class`; with --repeat, from the spread).
        "verdict": verdict_class(judged, speculated=speculated),
        "speculated": speculated,
        "repeated_prompts": _repeated_prompts(run),
        "ttft_speedup": _round(_ratio(baseline["ttft_s"], speculative["ttft_s"]), 4),
        "cost_ratio": _round(cost_ratio, 4),
        "billed_tokens_ratio": _round(
            _ratio(speculative["prompt_tokens"] + speculative["completion_tokens"], baseline["prompt_tokens"] + baseline["completion_tokens"]), 4
        ),
        "acceptance_rate": _round(acceptance_rate, 4),
        "acceptance_by_position": [round(a, 4) for a in by_position],
        "conditional_acceptance": [round(a, 4) for a in conditional],
        "acceptance_source": rounds_source,
        "predicted_speedup": _round(predicted_speedup, 4),
        "best_draft_length": prediction.best_draft_length if prediction else None,
        "break_even_acceptance": _round(prediction.break_even_acceptance, 4) if prediction else None,
        "prediction": prediction.to_dict() if prediction else None,
        # Rounds with and without a draft call predicted apart, when both ran (see `_by_drafter`).
        "prediction_by_drafter": mixed[1] if mixed is not None else None,
        "latency_model": (
            {
                "target_fixed_s": round(fitted[0].target_fixed_s, 6),
                "target_per_token_s": round(fitted[0].target_per_token_s, 6),
                "draft_fixed_s": round(fitted[0].draft_fixed_s, 6),
                "draft_per_token_s": round(fitted[0].draft_per_token_s, 6),
                "verify_fixed_s": round(fitted[0].verify_fixed_s, 6),
                "verify_per_token_s": round(fitted[0].verify_per_token_s, 6),
                "draft_share": round(fitted[0].draft_share, 4),
                "pipelined": pipelined,
                "tokens": round(n_tokens, 2),
                "sources": fitted[1],
            }
            if fitted
            else None
        ),
        "prediction_gap": _round(speedup / predicted_speedup - 1.0, 4) if speedup and predicted_speedup else None,
        "tokens_per_round": [r.emitted for r in measured_rounds],
        "round_latencies_s": [[round(r.draft_latency_s, 6), round(r.verify_latency_s, 6)] for r in measured_rounds],
        "exact_outputs": exact,
        "exactness_check": exactness_check,
        "mismatches": mismatches,
        "engine_inexact_reasons": inexact,
        "errors": [e for item in per_request for e in item["errors"]],
        "aim": aim,
        "after_warmup": warmed,
        "requests": per_request,
        "elapsed_s": round(run.elapsed_s, 3),
    }
    summary["explanation"] = explain(summary, note=scenario.note)
    summary.update(run.extras)
    return summary


def _repeated_prompts(run: ScenarioRun) -> int:
    """Measured requests whose prompt the speculative client had already seen in this run (a warm-up or
    an earlier measured request) while it could draft from what it learnt (the suffix index): their
    speedup says how fast a repeated request is, not a new one. 0 with `fresh_prompts`."""
    scenario = run.scenario
    if scenario.fresh_prompts or not scenario.uses_suffix_index:
        return 0
    def key(request: BenchRequest) -> str:
        return request.prompt if request.prompt is not None else repr(request.messages)

    seen = {key(scenario.requests[i % len(scenario.requests)]) for i in range(len(run.warmup))}
    repeated = 0
    for request in scenario.requests:
        repeated += key(request) in seen
        seen.add(key(request))
    return repeated


def _after_learning(run: ScenarioRun) -> dict[str, Any]:
    """Both sides over the requests after the scenario's `learning_requests` (the client has warmed up)."""
    first = run.scenario.learning_requests
    baseline = side_summary([s for s in run.baseline if s.index >= first])
    speculative = side_summary([s for s in run.speculative if s.index >= first])
    base_cost = Decimal(baseline["cost_usd"]) if baseline["cost_usd"] is not None else None
    spec_cost = Decimal(speculative["cost_usd"]) if speculative["cost_usd"] is not None else None
    return {
        "from_request": first,
        "requests": speculative["requests"],
        "speedup": _round(_ratio(baseline["wall_s"], speculative["wall_s"]), 4),
        "baseline_wall_s": baseline["wall_s"],
        "speculative_wall_s": speculative["wall_s"],
        "baseline_cost_usd": baseline["cost_usd"],
        "speculative_cost_usd": speculative["cost_usd"],
        "cost_ratio": _round(float(spec_cost / base_cost), 4) if base_cost and spec_cost is not None else None,
    }


#: Figures given as median and spread over repeated runs: (name, path in a scenario's summary).
REPEATED_FIGURES = (
    ("speedup", ("speedup",)),
    ("speedup_after_warmup", ("after_warmup", "speedup")),
    ("predicted_speedup", ("predicted_speedup",)),
    ("baseline_wall_s", ("baseline", "wall_s")),
    ("speculative_wall_s", ("speculative", "wall_s")),
    ("baseline_ttft_s", ("baseline", "ttft_s")),
    ("speculative_ttft_s", ("speculative", "ttft_s")),
    ("baseline_throughput_tokens_per_s", ("baseline", "throughput_tokens_per_s")),
    ("speculative_throughput_tokens_per_s", ("speculative", "throughput_tokens_per_s")),
    ("acceptance_rate", ("acceptance_rate",)),
    ("cost_ratio", ("cost_ratio",)),
)


def _at(summary: dict[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(summary, dict):
            return None
        summary = summary.get(key)  # type: ignore[assignment]
    return summary


def _judged(summary: dict[str, Any]) -> float | None:
    warmed = summary.get("after_warmup") or {}
    return warmed.get("speedup") if warmed.get("speedup") is not None else summary.get("speedup")


def merge_repeats(runs: Sequence[ScenarioRun]) -> dict[str, Any]:
    """One scenario run several times: the run with the median speedup (its figures, charts and explanation),
    plus ``repeats`` (each figure's median, lowest and highest run), percentiles over every run's requests,
    the verdict from the spread, the aim judged on the median, and every run's errors and mismatches."""
    summaries = [summarize(run) for run in runs]
    if len(summaries) == 1:
        return summaries[0]
    judged = [_judged(s) for s in summaries]
    known = sorted((v, i) for i, v in enumerate(judged) if v is not None)
    chosen = dict(summaries[known[(len(known) - 1) // 2][1]] if known else summaries[0])
    figures = {name: spread_of(_at(s, path) for s in summaries) for name, path in REPEATED_FIGURES}
    judged_spread = spread_of(judged)
    speculated = any(s["speculated"] for s in summaries)
    for side in ("baseline", "speculative"):
        chosen[side] = {**chosen[side], "percentiles": latency_percentiles([x for run in runs for x in getattr(run, side)])}
    aim = chosen.get("aim")
    if aim is not None and judged_spread is not None:
        median = judged_spread.median
        aim = {**aim, "met": median < aim["speedup"] if aim["below"] else median >= aim["speedup"], "judged_on": "the median of the runs"}
    chosen.update(
        verdict=verdict_class(judged_spread, speculated=speculated),
        speculated=speculated,
        aim=aim,
        exact_outputs=all(s["exact_outputs"] for s in summaries),
        mismatches=[{**m, "run": n + 1} for n, s in enumerate(summaries) for m in s["mismatches"]],
        errors=[e for s in summaries for e in s["errors"]],
        repeats={
            "runs": len(summaries),
            "chosen_run": summaries.index(next(s for s in summaries if s["speedup"] == chosen["speedup"])) + 1,
            "figures": {name: spread.to_dict() for name, spread in figures.items() if spread is not None},
        },
    )
    for s in summaries:  # the blog experiment runs once, with the first repetition
        for key in ("seed_blog", "sweep", "seed_blog_skipped"):
            if key in s and key not in chosen:
                chosen[key] = s[key]
    chosen["explanation"] = _spread_sentence(chosen, judged_spread) + " " + chosen["explanation"]
    return chosen


def _spread_sentence(summary: dict[str, Any], judged: Spread | None) -> str:
    runs = summary["repeats"]["runs"]
    if judged is None:
        return f"Over {runs} runs no speedup could be measured."
    which = "after warm-up " if summary.get("after_warmup") else ""
    verdict = {
        "win": "every run was faster than the target alone",
        "loss": "every run was slower than the target alone",
        "even": "the runs do not show a difference from the target alone beyond their spread",
        "no speculation": "no request speculated, so the ratio compares the target with itself",
    }[summary["verdict"]]
    return (
        f"Over {runs} runs the speedup {which}was {judged.median:.2f}x (median; lowest {judged.low:.2f}x, highest {judged.high:.2f}x): "
        f"{verdict}. The figures below are the middle run's by speedup (run {summary['repeats']['chosen_run']})."
    )


def report(runs: Sequence[ScenarioRun | Sequence[ScenarioRun]], *, mode: str, version: str) -> dict[str, Any]:
    """The whole bench report: ``{"specapi_version", "mode", "scenarios": [...]}``; an item of `runs` that is
    a list holds one scenario's repeated runs (`merge_repeats`). With a sweep of draft lengths, also
    ``draft_length_sweep`` (`sweep.sweep_summary`)."""
    scenarios = [merge_repeats(run if isinstance(run, Sequence) else [run]) for run in runs]
    data = {
        "specapi_version": version,
        "mode": mode,
        "baseline_method": "the target alone through the openai SDK, streamed, timed by the same code as the speculative side",
        "prediction_tolerance": PREDICTION_TOLERANCE,
        "scenarios": scenarios,
    }
    swept = sweep_summary(scenarios)
    if swept:
        data["draft_length_sweep"] = swept
    return data
