"""plan.py: each gate that decides a request's rounds before its first call, given the path, the
target's capabilities and the request (pure: no HTTP, no policy)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from specapi.core.acceptance import SamplingParams
from specapi.core.context import Context
from specapi.dialects.openai import Prefill
from specapi.core.lossy import AcceptanceRule
from specapi.parts.paths import VerificationPath
from specapi.engine.plan import plan
from specapi.parts.probe import Capabilities
from specapi.engine.request import GenerationRequest
from specapi.parts.verifiers import VerifierBase


class Lists(VerifierBase):
    """A path that scores the draft's tokens from the target's lists (echo)."""

    name = "echo"


class Picks(VerifierBase):
    """A path that keeps the target's own picks (fan-out)."""

    name = "prefill-fanout"
    draws_target_tokens = True


class Ids(VerifierBase):
    """Token-id verification: the target's own picks, on the prompt's ids."""

    name = "token-ids"
    draws_target_tokens = True
    sends_token_ids = True


@dataclass
class Whole:
    name: str = "prefix-match"


GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=0.8)


def request(sampling: SamplingParams = GREEDY, *, chat: bool = False, max_tokens: int | None = 32, **context: object) -> GenerationRequest:
    where = {"messages": [{"role": "user", "content": "你好"}]} if chat else {"prompt": "def f(x):"}
    return GenerationRequest(context=Context(sampling=sampling, **where, **context), max_tokens=max_tokens)  # type: ignore[arg-type]


def path(verifier: VerifierBase | None = None, **fields: object) -> VerificationPath:
    name = verifier.name if verifier is not None else "none"  # type: ignore[attr-defined]
    return VerificationPath(name, verifier=verifier, **fields)  # type: ignore[arg-type]


def test_a_greedy_request_asks_for_the_argmax_only():
    planned = plan(request(), path(Lists()), None, top_k=20, has_drafter=True)
    assert planned.top_k == 1 and planned.speculate and planned.fallback_reason is None
    assert planned.request == request()


def test_the_typical_rule_reads_whole_lists_even_when_greedy():
    sampling = replace(GREEDY, acceptance=AcceptanceRule(mode="typical"))
    planned = plan(request(sampling), path(Lists()), None, top_k=20, has_drafter=True)
    assert planned.top_k == 20 and planned.acceptance == "typical" and planned.acceptance_note is None


def test_a_sampled_request_keeps_the_lists_up_to_what_the_path_accepted():
    planned = plan(request(SAMPLED), path(Lists(), max_logprobs=5), None, top_k=20, has_drafter=True)
    assert planned.top_k == 5 and planned.speculate


def test_a_lossy_rule_on_a_path_of_picks_is_decided_exactly_and_says_why():
    sampling = replace(SAMPLED, acceptance=AcceptanceRule(mode="threshold"))
    planned = plan(request(sampling), path(Picks()), None, top_k=20, has_drafter=True)
    assert planned.acceptance == "exact" and not planned.request.context.sampling.acceptance.lossy
    assert "prefill-fanout path" in (planned.acceptance_note or "")


def test_a_lossy_rule_without_a_path_is_unused():
    sampling = replace(GREEDY, acceptance=AcceptanceRule(mode="threshold"))
    planned = plan(request(sampling), path(), None, top_k=20, has_drafter=False)
    assert not planned.speculate and planned.fallback_reason is None
    assert planned.acceptance == "exact" and "unused" in (planned.acceptance_note or "")


def test_a_whole_answer_path_plans_no_rounds():
    whole = VerificationPath("prefix-match", whole=Whole())  # type: ignore[arg-type]
    planned = plan(request(SAMPLED, max_tokens=None), whole, Capabilities(default_max_tokens=16), top_k=20, has_drafter=True)
    assert not planned.speculate and planned.fallback_reason is None
    assert planned.request.max_tokens is None  # the target writes the answer: its own limit applies
    sampling = replace(SAMPLED, acceptance=AcceptanceRule(mode="typical"))
    lossy = plan(request(sampling), whole, None, top_k=20, has_drafter=True)
    assert lossy.acceptance == "exact" and "prefix-match path" in (lossy.acceptance_note or "")


def test_no_drafter_no_speculation_and_no_reason_of_the_plan():
    planned = plan(request(), path(Lists()), None, top_k=20, has_drafter=False)
    assert not planned.speculate and planned.fallback_reason is None


def test_the_paths_raw_logprobs_setting_reaches_sampled_requests_only():
    sampled = plan(request(SAMPLED), path(Lists(), raw_logprobs=False), None, top_k=20, has_drafter=True)
    assert sampled.request.context.sampling.raw_logprobs is False
    greedy = plan(request(), path(Lists(), raw_logprobs=False), None, top_k=20, has_drafter=True)
    assert greedy.request.context.sampling.raw_logprobs is True


def test_server_defaults_fill_what_the_caller_left_out():
    caps = Capabilities(sampler_defaults={"temperature": 0.6, "top_p": 0.9, "top_k": 0, "min_p": 0.0})
    left_out = replace(SAMPLED, explicit=frozenset())
    planned = plan(request(left_out), path(Lists()), caps, top_k=20, has_drafter=True)
    sampling = planned.request.context.sampling
    assert (sampling.temperature, sampling.top_p) == (0.6, 0.9) and planned.speculate
    assert planned.request.context.extras == {"top_k": 0, "min_p": 0.0}
    explicit = plan(request(SAMPLED), path(Lists()), caps, top_k=20, has_drafter=True)
    assert explicit.request.context.sampling.temperature == 0.8  # the caller's own value stays


def test_a_default_repeat_penalty_sends_the_target_alone_where_the_server_counts_only_generated_tokens():
    caps = Capabilities(sampler_defaults={"repeat_penalty": 1.1}, server="llama-cpp-python")
    planned = plan(request(), path(Lists()), caps, top_k=20, has_drafter=True)
    assert not planned.speculate
    assert "repeat_penalty 1.1: llama-cpp-python is not known to count the prompt" in (planned.fallback_reason or "")
    neutral = plan(request(extras={"repeat_penalty": 1.0}), path(Lists()), caps, top_k=20, has_drafter=True)
    assert neutral.speculate


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_penalties_speculate_where_the_server_counts_the_prompt_in_them(sampling: SamplingParams):
    """llama-server: a call on prompt + draft is penalised as the target alone is at that position, so the
    caller's penalties and the server's default ones speculate, sent explicitly to every target call."""
    caps = Capabilities(sampler_defaults={"frequency_penalty": 0.3, "repeat_penalty": 1.0}, server="llama-server", penalties_over_prompt=True)
    planned = plan(request(sampling, extras={"presence_penalty": 0.5, "repeat_penalty": 1.2}), path(Picks()), caps, top_k=20, has_drafter=True)
    assert planned.speculate and planned.fallback_reason is None
    assert planned.request.context.extras == {"presence_penalty": 0.5, "repeat_penalty": 1.2, "frequency_penalty": 0.3}


@pytest.mark.parametrize("caps", [None, Capabilities(server="vllm"), Capabilities()], ids=["unknown", "vllm", "openai"])
def test_penalties_keep_the_target_alone_elsewhere_and_say_which(caps: Capabilities | None):
    planned = plan(request(extras={"frequency_penalty": 0.5, "presence_penalty": 0.0}), path(Lists()), caps, top_k=20, has_drafter=True)
    assert not planned.speculate
    reason = planned.fallback_reason or ""
    assert reason.startswith("frequency_penalty 0.5: ") and "presence_penalty" not in reason  # 0: neutral
    assert "vllm" in reason if caps is not None and caps.server else "the target" in reason


def test_any_other_default_that_changes_the_pick_sends_the_target_alone():
    caps = Capabilities(sampler_defaults={"presence_penalty": 0.5, "typical_p": 1.0})
    planned = plan(request(), path(Lists()), caps, top_k=20, has_drafter=True)
    assert not planned.speculate and "presence_penalty 0.5" in (planned.fallback_reason or "")
    assert "typical_p" not in (planned.fallback_reason or "")  # at its neutral value


def test_a_truncating_sampler_is_reproduced_only_where_the_target_picks():
    caps = Capabilities(sampler_defaults={"top_k": 40})
    lists = plan(request(SAMPLED), path(Lists()), caps, top_k=20, has_drafter=True)
    assert not lists.speculate and "of the echo path" in (lists.fallback_reason or "")
    picks = plan(request(SAMPLED), path(Picks()), caps, top_k=20, has_drafter=True)
    assert picks.speculate and picks.request.context.sampling.target_sampler_only
    assert picks.request.context.sampling.point_mass_draft  # the draft proposes its most likely tokens


def test_greedy_requests_draft_as_they_are_on_paths_of_picks():
    planned = plan(request(), path(Picks()), None, top_k=20, has_drafter=True)
    assert not planned.request.context.sampling.point_mass_draft


def test_completions_without_a_limit_stop_where_the_server_would():
    assert plan(request(max_tokens=None), path(Lists()), None, top_k=20, has_drafter=True).request.max_tokens == 16
    llama = Capabilities(default_max_tokens=128)
    assert plan(request(max_tokens=None), path(Lists()), llama, top_k=20, has_drafter=True).request.max_tokens == 128
    to_the_end = Capabilities(default_max_tokens=None)
    assert plan(request(max_tokens=None), path(Lists()), to_the_end, top_k=20, has_drafter=True).request.max_tokens is None
    chat = plan(request(chat=True, max_tokens=None), path(Lists()), llama, top_k=20, has_drafter=True)
    assert chat.request.max_tokens is None  # chat runs to the end of text
    alone = plan(request(max_tokens=None), path(Lists()), llama, top_k=20, has_drafter=False)
    assert alone.request.max_tokens is None  # the target alone sends none


def test_a_seeded_drafter_drafts_where_the_drafts_decide_the_draws():
    assert plan(request(SAMPLED), path(Lists()), None, top_k=20, has_drafter=True, seeded_drafter=True).seeded_drafts
    assert not plan(request(SAMPLED), path(Picks()), None, top_k=20, has_drafter=True, seeded_drafter=True).seeded_drafts
    assert not plan(request(SAMPLED), path(Lists()), None, top_k=20, has_drafter=True).seeded_drafts


def test_token_ids_tokenize_the_prompt_and_choose_the_first_round_before():
    planned = plan(request(), path(Ids()), Capabilities(final_stretch=3), top_k=20, has_drafter=True)
    assert planned.tokenize_prompt and planned.first_before_tokenize and planned.stretch == 3
    short = plan(request(max_tokens=3), path(Ids()), Capabilities(final_stretch=3), top_k=20, has_drafter=True)
    assert short.tokenize_prompt and not short.first_before_tokenize  # one final call writes it all
    chat = plan(request(chat=True), path(Ids()), None, top_k=20, has_drafter=True)
    assert not chat.tokenize_prompt
    text = plan(request(), path(Lists()), None, top_k=20, has_drafter=True)
    assert not text.tokenize_prompt and not text.first_before_tokenize


def test_the_plan_keeps_the_path_and_its_prefill():
    fanout = path(Picks(), prefill=Prefill(style="trailing", echoes_prefix=True), note="auto chose prefill-fanout")
    planned = plan(request(chat=True), fanout, None, top_k=20, has_drafter=True)
    assert planned.path is fanout and planned.path.prefill.echoes_prefix
