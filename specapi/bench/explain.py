"""Plain-language explanations of a scenario's result, from its summary dict. Pure functions.

The explanation says whether speculation won, why (a round's cost against the tokens it yields, per
docs/performance.md's arithmetic), what it cost and why (stateless APIs re-bill the context every call),
how far the prediction was from the result and what accounts for the gap, and whether every output
was the target's own.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

__all__ = ["explain", "gap_reasons", "verdict"]

_TOLERANCE = 0.15


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _acceptance(summary: dict[str, Any]) -> str:
    rate = summary.get("acceptance_rate")
    if rate is None:
        return f"n/a; {summary.get('acceptance_source', 'no rounds')} give the per-position rates"
    return f"{rate:.2f}"


def _against_the_target(model: dict[str, Any]) -> str:
    return f"against the target's {_ms(model['target_per_token_s'])} per token alone (plus {_ms(model['target_fixed_s'])} once per request)."


def verdict(speedup: float | None) -> str:
    """One phrase: faster, slower, or even."""
    if speedup is None:
        return "could not be compared (no successful requests on one side)"
    if speedup >= 1.05:
        return f"{speedup:.2f}x faster than the target alone"
    if speedup <= 0.95:
        return f"slower than the target alone: {speedup:.2f}x its speed ({1 / speedup:.1f}x the time)"
    return f"about even with the target alone ({speedup:.2f}x)"


def gap_reasons(summary: dict[str, Any]) -> list[str]:
    """What can separate the achieved speedup from the predicted one, among what this run shows."""
    spec = summary["speculative"]
    reasons = []
    if spec.get("requests_served_by_target_alone"):
        reasons.append(
            f"the policy let the target generate alone in {spec['requests_served_by_target_alone']} of "
            f"{spec['requests']} measured requests (the prediction counts those at the target's own speed)"
        )
    if spec.get("pipelined_rounds"):
        reasons.append(
            f"{spec['pipelined_rounds']} of {spec['num_rounds']} rounds used a draft prefetched during the previous verify "
            "call (pipelining); the prediction models the overlap only on average"
        )
    if spec.get("lookup_rounds") and spec["lookup_rounds"] != spec.get("num_rounds"):
        reasons.append(f"{spec['lookup_rounds']} rounds were drafted by prompt lookup (no call) and the rest by the draft model")
    if summary["settings"].get("policy") == "adaptive":
        reasons.append("the adaptive policy changes the draft length between rounds; the prediction uses the most common length")
    overhead = spec.get("overhead_per_round_s")
    prediction = summary.get("prediction")
    if overhead is not None and prediction and overhead > 0.05 * prediction["round_s"]:
        reasons.append(
            f"each round also spent {_ms(overhead)} outside the draft and verify calls (the client's own work: "
            "parsing the scored tokens, drafting by lookup, streaming), which the arithmetic leaves out"
        )
    ttft = summary.get("ttft_speedup")
    if ttft is not None and ttft < 0.9:
        reasons.append("the first round waits for a draft call before any text, so the first token comes later than the target's own")
    if not reasons:
        reasons.append("latency jitter from request to request, and how the last round of each request is cut short")
    return reasons


def _cost_sentence(summary: dict[str, Any]) -> str:
    base, spec = summary["baseline"], summary["speculative"]
    target, base_target = spec["by_role"]["target"], base["by_role"]["target"]
    resent = (
        f"The target was billed {target['prompt_tokens']:,} prompt tokens in {target['requests']} calls instead of "
        f"{base_target['prompt_tokens']:,} in {base_target['requests']}: the API keeps no state, so every verify call "
        "re-sends the whole context"
    )
    extra_calls = target["requests"] > base_target["requests"]
    if base["cost_usd"] is None or spec["cost_usd"] is None:
        return "Cost: unknown (no prices for one of the models)." + (f" {resent}." if extra_calls else "")
    base_cost, spec_cost = Decimal(base["cost_usd"]), Decimal(spec["cost_usd"])
    if base_cost == 0 and spec_cost == 0:
        text = "Cost: nothing at these (self-hosted) prices"
        return text + (f", but the load is not free: {resent[0].lower()}{resent[1:]}." if extra_calls else ".")
    ratio = summary.get("cost_ratio")
    text = f"Cost: {spec_cost:.6f} USD against {base_cost:.6f} USD alone" + (f" ({ratio:.1f}x)" if ratio is not None else "") + "."
    if extra_calls:
        text += f" {resent}"
        draft_cost = spec["by_role"]["draft"]["cost_usd"]
        if draft_cost is not None and Decimal(draft_cost) > 0:
            text += f"; the draft added {Decimal(draft_cost):.6f} USD"
        text += "."
    return text


def _failed_comparison(summary: dict[str, Any], note: str) -> str:
    """What to say when one side has no successful request: that, and why, with no figures."""
    errors = summary["errors"]
    sides = [name for name, key in (("the target alone", "baseline"), ("speculation", "speculative")) if not summary[key].get("requests")]
    which = " and ".join(sides) if sides else "one side"
    text = f"The comparison failed: no request succeeded with {which}, so there is no speedup or cost to report."
    if errors:
        text += f" {len(errors)} request(s) failed; the first: {errors[0]}"
    return text + (f" {note}" if note else "")


def explain(summary: dict[str, Any], *, note: str = "") -> str:
    """A short paragraph for one scenario's summary (see `summary.summarize`)."""
    spec = summary["speculative"]
    speedup = summary.get("speedup")
    if speedup is None:
        return _failed_comparison(summary, note)
    if summary.get("speculated") is False:
        sentences = [
            f"No speculation: no measured request ran a round, so both sides were the target generating alone "
            f"and the ratio ({speedup:.2f}x) is the noise between two runs of the same thing, not a gain."
        ]
    else:
        sentences = [f"Speculation was {verdict(speedup)}."]
    warmed = summary.get("after_warmup")
    if warmed and warmed.get("speedup") is not None:
        money = ""
        if warmed.get("baseline_cost_usd") is not None and warmed.get("speculative_cost_usd") is not None:
            money = (
                f"; {Decimal(warmed['speculative_cost_usd']):.6f} USD against {Decimal(warmed['baseline_cost_usd']):.6f} USD "
                f"for the target alone ({warmed['cost_ratio']:.2f}x)"
                if warmed.get("cost_ratio") is not None
                else ""
            )
        sentences.append(
            f"After the first {warmed['from_request']} requests (while the client learns from traffic), the other "
            f"{warmed['requests']} ran {warmed['speedup']:.2f}x the target alone's speed "
            f"({warmed['speculative_wall_s']:.3f} s against {warmed['baseline_wall_s']:.3f} s per request{money})."
        )
    aim = summary.get("aim")
    if aim and aim.get("met") is not None:
        judged = warmed["speedup"] if warmed and warmed.get("speedup") is not None else speedup
        bound = "below" if aim["below"] else "at least"
        outcome = "as expected" if aim["met"] else f"not reached on this run: {judged:.2f}x"
        where = " after warm-up" if warmed else ""
        sentences[-1] = sentences[-1][:-1] + f" (this scenario is expected to give{where} {bound} {aim['speedup']:.2f}x: {outcome})."

    model = summary.get("latency_model")
    prediction = summary.get("prediction")
    if spec.get("num_rounds") == 0:
        reasons = "; ".join(spec.get("fallback_reasons") or []) or "no rounds were run"
        sentences.append(f"No measured request speculated: {reasons}.")
    parts = summary.get("prediction_by_drafter")
    if model and prediction and parts:
        described = []
        for part in parts:
            who = "without a call (suffix index, prompt lookup, a prediction)" if part["drafter"] == "free" else "by the draft model"
            described.append(
                f"{part['share_of_rounds']:.0%} of the rounds were drafted {who}: drafting {part['draft_length']} tokens, "
                f"a round yields {part['expected_tokens_per_round']:.2f} tokens and costs {_ms(part['round_s'])}"
            )
        sentences.append(
            "; ".join(described)
            + f" (measured acceptance {_acceptance(summary)}; the prediction weighs the two by their share of the rounds), "
            + _against_the_target(model)
        )
    if model and prediction:
        k = prediction["draft_length"]
        draft_s = (model["draft_fixed_s"] + k * model["draft_per_token_s"]) * model["draft_share"]
        verify_s = model["verify_fixed_s"] + k * model["verify_per_token_s"]
        per_token = prediction["round_s"] / prediction["expected_tokens_per_round"]
        if not parts:  # rounds of one kind (with both, the sentence above describes them)
            sentences.append(
                f"A round drafting {k} tokens yields {prediction['expected_tokens_per_round']:.2f} tokens "
                f"(measured acceptance {_acceptance(summary)}) and costs "
                f"{_ms(prediction['round_s'])} (draft {_ms(draft_s)}, verify {_ms(verify_s)}"
                + (", part of the draft overlapped with verification" if model["pipelined"] else "")
                + f"): {_ms(per_token)} per token "
                + _against_the_target(model)
            )
        if "prefill-fanout" in spec.get("verification", []) and spec.get("num_rounds"):
            calls = spec["by_role"]["target"]["requests"] / spec["num_rounds"]
            sentences.append(
                f"This target does not score supplied tokens (no echo with logprobs, as OpenAI's API), so each round verifies "
                f"with one-token calls sent in parallel, one per draft position plus one (prefill-fanout): {calls:.1f} target calls per round."
            )
        fixed = model["draft_fixed_s"] * model["draft_share"] + model["verify_fixed_s"]
        if speedup is not None and speedup < 1.0 and fixed > 2 * model["target_per_token_s"] * prediction["expected_tokens_per_round"]:
            sentences.append(
                f"Fixed per-call costs dominate: every round pays {_ms(fixed)} of call overhead (time to first token, "
                f"network) for tokens worth {_ms(model['target_per_token_s'] * prediction['expected_tokens_per_round'])} "
                "of the target's own decoding."
            )
        break_even = summary.get("break_even_acceptance")
        if spec.get("verification") == ["predicted-outputs"]:
            # One target call per request, which generates the answer itself: the round arithmetic's
            # draft lengths and break-even say nothing about it.
            sentences.append(
                "With Predicted Outputs the target generates each answer in one call, taking accepted prediction "
                "tokens at prefill speed; rejected ones are billed as output."
            )
        elif break_even is None:
            sentences.append(
                "Even a draft that is always right would not pay off here at any draft length up to 16: "
                "the per-call costs exceed what a round can save."
            )
        else:
            at_k = prediction.get("break_even_acceptance_at_draft_length")
            sentences.append(
                f"Break-even acceptance: {break_even:.2f} at the best draft length"
                + (f", {at_k:.2f} at {k}" if at_k is not None else f" (none at {k})")
                + "."
            )
        best_k = prediction["best_draft_length"]
        extrapolated = ", extrapolating acceptance beyond the measured positions" if prediction["best_length_extrapolated"] else ""
        if spec.get("verification") == ["predicted-outputs"]:
            pass
        elif prediction["best_speedup"] < 1.0:
            sentences.append(
                f"No draft length wins at this acceptance: the least slow, {best_k}, would reach {prediction['best_speedup']:.2f}x{extrapolated}."
            )
        elif best_k != k:
            sentences.append(f"The arithmetic's best draft length is {best_k} (predicted {prediction['best_speedup']:.2f}x{extrapolated}).")
    base_ttft, spec_ttft = summary["baseline"]["ttft_s"], spec["ttft_s"]
    if base_ttft and spec_ttft and spec_ttft > 1.2 * base_ttft:
        if spec.get("num_rounds") == 0:
            why = "with speculation off, the target's answer came in one call that specapi does not stream, so the first token arrived with the last"
        elif model and model["draft_share"] == 0:
            why = "the first text waits for a whole verify call instead of the target's first token"
        else:
            why = "the first text waits for a whole round (a draft call, then a verify call) instead of the target's first token"
        sentences.append(f"Time to first token: {_ms(spec_ttft)} against {_ms(base_ttft)} alone: {why}.")
    predicted = summary.get("predicted_speedup")
    if predicted is not None and speedup is not None:
        gap = speedup / predicted - 1.0
        text = f"Predicted {predicted:.2f}x, achieved {speedup:.2f}x ({gap:+.0%})"
        if abs(gap) > _TOLERANCE:
            text += ": beyond the 15% tolerance; " + "; ".join(gap_reasons(summary))
        sentences.append(text + ".")
    sentences.append(_cost_sentence(summary))
    claimed = [m for m in summary["mismatches"] if m.get("claimed_exact", True)]
    flagged = [m for m in summary["mismatches"] if not m.get("claimed_exact", True)]
    if claimed:
        sentences.append(
            f"EXACTNESS FAILURE: {len(claimed)} output(s) differ from the target alone's at temperature 0 "
            f"while claiming to be exact (requests {', '.join(str(m['request']) for m in claimed)}): "
            "speculation must not change the text."
        )
    if flagged:
        sentences.append(
            f"{len(flagged)} output(s) differ from the target alone's, and each response said it was approximate "
            f"(requests {', '.join(str(m['request']) for m in flagged)}): {flagged[0]['engine_reason']}."
        )
    if summary["mismatches"]:
        pass  # said above
    elif summary["exact_outputs"]:
        sentences.append("Every output was the target's own.")
    elif summary.get("engine_inexact_reasons"):
        sentences.append(f"The engine marked some outputs approximate rather than exact: {summary['engine_inexact_reasons'][0]}.")
    if summary["errors"]:
        sentences.append(f"{len(summary['errors'])} request(s) failed: {summary['errors'][0]}")
    repeated = summary.get("repeated_prompts")
    if repeated:
        sentences.append(
            f"{repeated} of the {spec['requests'] + spec.get('failed', 0)} measured prompts had been sent before in this run (a warm-up or "
            "a repeat), and the client drafts from what it learnt of earlier requests (the suffix index): those run "
            "faster than a new prompt would; --fresh-prompts measures them as new."
        )
    if note:
        sentences.append(note)
    return " ".join(sentences)
