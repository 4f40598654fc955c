"""Planning a request: from the verification path and what the target is known to do, what the rounds
will be, before any round. Pure: `plan(...)` reads its inputs and returns a `Plan`.

Each gate either rewrites the request into the one the target will run (its server's sampling
defaults, a lossy rule set back to exact where the path cannot apply it, ...) or turns speculation off
with the reason the response reports (`SpeculativeStats.fallback_reason`). What depends on the policy's
learnt state (its verdict at the request's start, the first round's length) and the prompt's token ids
(a tokenize call) is decided by the engine afterwards.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..dialects.logprobs import LogprobShape
from ..dialects.openai import OPENAI_LIST_CAP
from ..core.lossy import EXACT, lossy_path_note
from ..parts.paths import VerificationPath
from ..parts.probe import Capabilities
from ..parts.verifiers import Verifier
from .request import GenerationRequest

__all__ = ["PENALTIES", "Plan", "plan"]

from ..core.context import PENALTIES  # noqa: E402  (re-exported: the penalties are sampling settings)


@dataclass(frozen=True)
class Plan:
    """What a request will do, decided before its first call to the target."""

    path: VerificationPath
    #: The request as the rounds run it (server defaults filled in, the acceptance rule the path applies).
    request: GenerationRequest
    top_k: int  # the longest top-logprob list the verification asks for
    speculate: bool
    fallback_reason: str | None = None  # why the target generates alone (None while speculating)
    acceptance: str = "exact"  # the rule the rounds are decided with
    acceptance_note: str | None = None  # why the caller's lossy rule was not used
    #: A seeded sampled request on a path where the drafts decide the draws: the drafter and policy that
    #: learnt nothing from other requests' text draft it.
    seeded_drafts: bool = False
    #: The prompt goes to the target as token ids (token-id verification): it is tokenized first.
    tokenize_prompt: bool = False
    #: The first round's length is chosen before that tokenize call (a request the policy hands to the
    #: target alone spares it); False where the request is short enough to be one final target call.
    first_before_tokenize: bool = False
    #: The caller's last tokens come from one target call (`Capabilities.final_stretch`).
    stretch: int = 0
    #: How the caller's logprobs are written from the target's scores of the kept tokens (None: not asked).
    logprob_shape: LogprobShape | None = None


def plan(
    request: GenerationRequest, path: VerificationPath, caps: Capabilities | None, *, top_k: int, has_drafter: bool, seeded_drafter: bool = False
) -> Plan:
    """The plan of `request` on `path` (`caps`: the target's probed capabilities, None if unprobed).

    `top_k`: the endpoint's longest top-logprob list; `has_drafter`: something drafts; `seeded_drafter`:
    the client has a separate drafter for seeded sampled requests (see `Plan.seeded_drafts`)."""
    request, acceptance, acceptance_note = _lossy_where_possible(request, path)
    sampling = request.context.sampling
    if sampling.greedy and not sampling.acceptance.needs_distribution:
        # Greedy needs the argmax only; the typical rule (when this path applies it) reads the
        # target's whole list (its entropy) even when greedy.
        top_k = 1
    shape = _logprob_shape(request, caps)
    base = Plan(
        path=path, request=request, top_k=top_k, speculate=False, acceptance=acceptance, acceptance_note=acceptance_note, logprob_shape=shape
    )
    if path.whole is not None and request.context.logprobs is not None:
        reason = f"logprobs: the {path.whole.name} path scores no token: the target alone generates, with its own logprobs"
        return replace(base, path=VerificationPath("none", note=reason), fallback_reason=reason)
    if path.whole is not None:
        return base
    verifier = path.verifier
    draws = verifier is not None and verifier.draws_target_tokens
    if path.max_logprobs is not None:
        top_k = min(top_k, path.max_logprobs)
    request, penalty_reason = _as_the_path_runs_it(request, path, caps, draws)
    speculate, reason = verifier is not None and has_drafter, None
    if speculate and penalty_reason is not None:
        speculate, reason = False, penalty_reason
    if speculate and request.context.sampling.target_sampler_only and not draws:
        speculate, reason = False, (
            f"the request's sampler (top_k, min_p, ...) cannot be reproduced from the logprob lists of the "
            f"{verifier.name if verifier is not None else ''} path: the target alone generates"
        )
    if speculate and request.max_tokens is None and not request.context.is_chat:
        # The caller set no limit: the target alone would stop at its server's default for completions
        # (OpenAI's and vLLM's 16; llama-server's n_predict). Rounds end there too; None: the context's end.
        default = caps.default_max_tokens if caps is not None else Capabilities().default_max_tokens
        if default is not None:
            request = replace(request, max_tokens=default)
    if request.context.logprobs is not None:
        logprobs_reason = _logprobs_reason(request, path, caps)
        top_k = max(top_k, request.context.logprobs)
        if speculate and logprobs_reason is not None:
            speculate, reason = False, logprobs_reason
    stretch = caps.final_stretch if caps is not None else 0  # see Capabilities.final_stretch
    tokenize = speculate and verifier is not None and verifier.sends_token_ids and (not request.context.is_chat or verifier.verifies_chat)
    limit = request.max_tokens
    return replace(
        base, request=request, top_k=top_k, speculate=speculate, fallback_reason=reason, seeded_drafts=seeded_drafter and not draws,
        tokenize_prompt=tokenize, first_before_tokenize=tokenize and (limit is None or limit > stretch), stretch=stretch,
    )


def _as_the_path_runs_it(
    request: GenerationRequest, path: VerificationPath, caps: Capabilities | None, draws: bool
) -> tuple[GenerationRequest, str | None]:
    """The request with the sampling settings the rounds run it with on `path` (the path's raw logprobs,
    the server's sampler defaults, the target's own picks kept where the verifier `draws` them), and why
    its penalties keep it with the target alone (None: they do not)."""
    if path.raw_logprobs is not None and not request.context.sampling.greedy:
        request = _with_sampling(request, raw_logprobs=path.raw_logprobs)
    penalty_reason = None
    if caps is not None and caps.sampler_defaults:
        request, penalty_reason = _with_server_defaults(request, caps.sampler_defaults, caps)
    penalty_reason = penalty_reason or _penalty_reason(request.context.extras, caps)
    if not request.context.sampling.greedy and draws:
        # Only the target's own picks are kept here, whatever the draft proposed: a position is kept
        # with probability p(x) for a proposal x, most often for the draft's most likely token.
        request = _with_sampling(request, point_mass_draft=True)
    return request, penalty_reason


#: Servers whose own logprobs verification cannot write as they do: llama-server lists one entry per
#: character (a token that completes a character shows the character's bytes; the tokens before it are
#: not listed); llama-cpp-python renders tokens inside a character as empty strings.
_OWN_LOGPROB_SHAPES = {
    "llama-server": "lists one logprobs entry per character, not per token",
    "llama-cpp-python": "renders tokens inside a character as empty strings in its logprobs",
}


def _logprob_shape(request: GenerationRequest, caps: Capabilities | None) -> LogprobShape | None:
    """How the target alone writes the caller's logprobs (None: not asked). Completions offsets start at
    the prompt's start (OpenAI), at the answer's (vLLM), or are -1 (SGLang); on a server not known, the
    request's first token comes from a target-alone step, whose offsets show which."""
    context = request.context
    if context.logprobs is None:
        return None
    server = caps.server if caps is not None else None
    base: int | None = 0 if server == "vllm" else (None if server == "sglang" else len(context.prompt or ""))
    learn = not context.is_chat and server not in ("vllm", "sglang")  # the first target-alone step shows the convention
    # vLLM counts offsets in the lengths of the tokens as it renders them (observed), not in the text's characters.
    spelled = server == "vllm"
    return LogprobShape(
        chat=context.is_chat, top=context.logprobs, offset_base=base, with_chosen=server == "vllm" and not context.is_chat, learn_offsets=learn,
        offsets_spelled=spelled,
    )


def _logprobs_reason(request: GenerationRequest, path: VerificationPath, caps: Capabilities | None) -> str | None:
    """Why the caller's logprobs cannot be written from the verification's scores (then the target
    alone generates, and its own logprobs are the answer), or None."""
    context, verifier = request.context, path.verifier
    count = context.logprobs or 0
    server = caps.server if caps is not None else None
    alone = "the target alone generates, with its own logprobs"
    if verifier is None or (verifier.sends_token_ids and not _ids_carry_logprobs(verifier, context.sampling.greedy)):
        name = verifier.name if verifier is not None else path.name
        return f"logprobs: the {name} path does not score every kept token with the caller's top list: {alone}"
    if server in _OWN_LOGPROB_SHAPES:
        return f"logprobs: {server} {_OWN_LOGPROB_SHAPES[server]}, which verification cannot reproduce: {alone}"
    # Fan-out's one-token completions calls ask at most OpenAI's legacy list (see dialects/openai.py).
    cap = path.max_logprobs if not (verifier.draws_target_tokens and not context.is_chat) else min(path.max_logprobs or OPENAI_LIST_CAP, OPENAI_LIST_CAP)
    if cap is not None and count > cap:
        return f"logprobs: the caller's top {count} is longer than the {cap} the target lists when verifying: {alone}"
    if verifier.draws_target_tokens:
        return None  # each kept token is a pick of a one-token call (or a scored position): its logprobs are the target's own
    if not context.sampling.greedy and (not context.sampling.raw_logprobs or server == "sglang"):
        # Prompt scores are raw (temperature 1); the target's own logprobs of sampled tokens must be too.
        return f"logprobs: the target's logprobs of sampled tokens are not the raw ones its prompt scores give: {alone}"
    return None


def _ids_carry_logprobs(verifier: Verifier, greedy: bool) -> bool:
    """Token ids carry the caller's logprobs where the server's picks and steps list each position's entry
    as the target alone renders it (vLLM), on greedy requests (sampled ones draw in batches and trees)."""
    return greedy and verifier.carries_logprobs


def _with_sampling(request: GenerationRequest, **changes: Any) -> GenerationRequest:
    sampling = replace(request.context.sampling, **changes)
    return replace(request, context=replace(request.context, sampling=sampling))


def _lossy_where_possible(request: GenerationRequest, path: VerificationPath) -> tuple[GenerationRequest, str, str | None]:
    """A lossy rule needs the target's distribution per draft position: paths where the target shows
    only its own tokens (fan-out picks, whole answers) decide exactly, and the note says why. Returns
    the request, the rule its rounds apply and the note."""
    rule = request.context.sampling.acceptance
    if not rule.lossy:
        return request, "exact", None
    if path.whole is None and path.verifier is None:
        note = f"acceptance {rule.mode!r} unused: no verification path, the target alone generated"
    elif path.whole is not None or (path.verifier is not None and path.verifier.draws_target_tokens):
        note = lossy_path_note(rule, path.name)
    else:
        return request, rule.mode, None
    return _with_sampling(request, acceptance=EXACT), "exact", note


def _with_server_defaults(request: GenerationRequest, defaults: Mapping[str, float], caps: Capabilities) -> tuple[GenerationRequest, str | None]:
    """The request as the target server will run it: the settings the caller left out take the
    server's own defaults, sent explicitly (the same request, and the verification knows them).
    Returns the request and, if the defaults hold a setting verification cannot reproduce, why not."""
    context, server = request.context, caps.server or "the target"
    sampling, extras = context.sampling, dict(context.extras)
    changes: dict[str, Any] = {}
    for name in ("temperature", "top_p"):
        if name not in sampling.explicit and name in defaults:
            changes[name] = defaults[name]
    for name in ("top_k", "min_p", *PENALTIES):
        if name not in extras and name in defaults:
            extras[name] = defaults[name]
    sampling = replace(sampling, **changes)
    truncates = _number(extras.get("top_k")) > 0 or _number(extras.get("min_p")) > 0.0
    sampling = replace(sampling, target_sampler_only=sampling.target_sampler_only or (truncates and not sampling.greedy))
    # Every other default the server reports that changes its pick, at a value that does: the text would
    # differ from what the verification calls score. (Penalties: `_penalty_reason`, now that they are extras.)
    active = {
        name: defaults[name] for name, neutral in _NEUTRAL_DEFAULTS.items()
        if name not in extras and name in defaults and not neutral(_number(defaults[name]))
    }  # fmt: skip
    reason = None
    if active:
        settings = ", ".join(f"{name} {value:g}" for name, value in active.items())
        reason = (
            f"{server} applies {settings} to requests that do not set them, which verification cannot reproduce: "
            "the target alone generates (send the neutral values in extra_body to speculate)"
        )
    return replace(request, context=replace(context, sampling=sampling, extras=extras)), reason


def _penalty_reason(extras: Mapping[str, Any], caps: Capabilities | None) -> str | None:
    """Why the request's penalties (the caller's or its server's defaults) keep the target alone: a server
    that counts only generated tokens in them (OpenAI, vLLM) penalises a verification call, whose prompt
    holds the draft, otherwise than the target alone at that position. None where they are exact."""
    active = {name: extras[name] for name, neutral in PENALTIES.items() if name in extras and extras[name] != neutral}
    if not active or (caps is not None and caps.penalties_over_prompt):
        return None
    settings = ", ".join(f"{name} {value:g}" if isinstance(value, (int, float)) else f"{name} {value!r}" for name, value in active.items())
    server = caps.server if caps is not None and caps.server else "the target"
    return (
        f"{settings}: {server} is not known to count the prompt's tokens in penalties (llama-server does), so a "
        "verification call, whose prompt holds the draft, would be penalised otherwise: the target alone generates"
    )


#: llama-server's sampling settings (as `/props` reports its defaults) besides the penalties, and the values
#: that leave the target's pick alone: DRY, XTC, typical-p, top-n-sigma, mirostat or dynamic temperature at any
#: other value changes the distribution the target samples from, which the verification calls do not see.
_NEUTRAL_DEFAULTS: dict[str, Callable[[float], bool]] = {
    "dry_multiplier": lambda v: v == 0.0,
    "xtc_probability": lambda v: v == 0.0,
    "typical_p": lambda v: v >= 1.0,
    "top_n_sigma": lambda v: v <= 0.0,
    "mirostat": lambda v: v == 0,
    "dynatemp_range": lambda v: v == 0.0,
}


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
