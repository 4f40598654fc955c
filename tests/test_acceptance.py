"""`specapi.core.acceptance.decide_round`: what the target keeps of a draft, with hand-made logprob lists."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from scipy.stats import chisquare

from specapi.core.acceptance import DEFAULT_EOS_TOKENS, SamplingParams, decide_round
from specapi.core.alignment import ScoredToken
from specapi.core.sampling import TokenDist, sample_token

GREEDY = SamplingParams(temperature=0.0)
T1 = SamplingParams(temperature=1.0)


def at(text: str, **alternatives: float) -> ScoredToken:
    """A target position holding `text`, with its top list given as probabilities (token=prob)."""
    top = {_name(k): math.log(v) for k, v in alternatives.items()}
    return ScoredToken(text=text, logprob=top.get(text), top=top)


def _name(key: str) -> str:
    return {"eos": "<|endoftext|>", "sp": " "}.get(key, key)


def draft(*texts: str) -> list[ScoredToken]:
    return [ScoredToken(text=t, logprob=-0.1, top={t: -0.1}) for t in texts]


def text_of(decision) -> bytes:
    return b"".join(e.data for e in decision.emitted)


# ----------------------------------------------------------------------------- greedy


def test_greedy_accepts_every_token_that_is_the_argmax():
    positions = [at("a", a=0.6, b=0.4), at("b", b=0.9, c=0.1), at("c", c=0.5, a=0.2)]
    d = decide_round(positions, 0, draft("a", "b", "c"), GREEDY, random.Random(0))
    assert [e.token for e in d.emitted] == ["a", "b", "c"]
    assert d.accepted == 3 and d.accepted_by_position == (True, True, True)
    assert d.all_accepted and not d.stalled


def test_greedy_emits_the_argmax_at_the_first_mismatch_and_stops():
    positions = [at("a", a=0.6, b=0.4), at("b", c=0.7, b=0.3), at("c", c=0.9, a=0.1)]
    d = decide_round(positions, 0, draft("a", "b", "c"), GREEDY, random.Random(0))
    assert [e.token for e in d.emitted] == ["a", "c"]
    assert text_of(d) == b"ac"
    assert d.accepted == 1 and d.accepted_by_position == (True, False, False)
    assert not d.all_accepted and not d.stalled
    assert d.emitted[1].logprob == pytest.approx(math.log(0.7))


def test_greedy_mismatch_at_the_first_position_emits_one_target_token():
    d = decide_round([at("x", y=0.8, x=0.2)], 0, draft("x"), GREEDY, random.Random(0))
    assert [e.token for e in d.emitted] == ["y"] and d.accepted == 0


def test_greedy_tie_keeps_the_draft_token():
    d = decide_round([at("b", a=0.5, b=0.5)], 0, draft("b"), GREEDY, random.Random(0))
    assert d.accepted == 1 and d.all_accepted


def test_greedy_end_of_text_replacement_is_marked_eos():
    positions = [at("a", a=0.9, b=0.1), at("b", eos=0.6, b=0.4)]
    d = decide_round(positions, 0, draft("a", "b"), GREEDY, random.Random(0))
    assert [e.eos for e in d.emitted] == [False, True]
    assert d.emitted[1].data == b"" and d.emitted[1].token == "<|endoftext|>"
    assert text_of(d) == b"a"
    assert "<|endoftext|>" in DEFAULT_EOS_TOKENS


def test_greedy_custom_end_of_text_tokens():
    positions = [at("a", STOP=0.9, a=0.1)]
    d = decide_round(positions, 0, draft("a"), GREEDY, random.Random(0), eos_tokens={"STOP"})
    assert d.emitted[0].eos
    plain = decide_round(positions, 0, draft("a"), GREEDY, random.Random(0))
    assert not plain.emitted[0].eos and plain.emitted[0].data == b"STOP"


@pytest.mark.parametrize("top", [{"hel": 0.9, "he": 0.1}, {"help": 0.7, "hel": 0.3}])
def test_greedy_straddling_token_stalls_whatever_the_target_prefers(top):
    # Committed text ends in "h"; the draft is "el..."; the target tokenized "h|el" as "hel". Its score
    # there is conditioned on a split of the text its own generation never had (it generated "h" as a
    # token), so neither keeping "hel" nor emitting its argmax is sound: the round stalls and the
    # engine takes a plain target step.
    positions = [at("hel", **top), at("lo", lo=0.8, la=0.2)]
    d = decide_round(positions, 1, draft("el", "lo"), GREEDY, random.Random(0))
    assert d.emitted == () and d.stalled and not d.all_accepted and d.accepted == 0


def test_greedy_replacement_contradicting_committed_bytes_stalls():
    # The target's argmax at the straddling position does not start with the committed "h":
    # emitting it would rewrite text already sent, so nothing is decided this round.
    positions = [at("hel", wor=0.7, hel=0.3)]
    d = decide_round(positions, 1, draft("el"), GREEDY, random.Random(0))
    assert d.emitted == () and d.stalled and not d.all_accepted


def test_position_without_any_list_stalls_the_round():
    positions = [ScoredToken(text="a", logprob=None, top=None), at("b", b=1.0)]
    d = decide_round(positions, 0, draft("a", "b"), GREEDY, random.Random(0))
    assert d.emitted == () and d.stalled and d.accepted == 0


def test_position_without_a_list_after_accepted_tokens_keeps_them():
    positions = [at("a", a=0.9, b=0.1), ScoredToken(text="b")]
    d = decide_round(positions, 0, draft("a", "b"), GREEDY, random.Random(0))
    assert [e.token for e in d.emitted] == ["a"]
    assert not d.stalled and not d.all_accepted and d.accepted_by_position == (True, False)


def test_greedy_different_tokenization_counts_draft_tokens_by_bytes():
    # Draft "a","bc" vs target "ab","c": the first draft token is accepted once "ab" is (its bytes lie inside).
    positions = [at("ab", ab=0.9, a=0.1), at("c", d=0.6, c=0.4)]
    d = decide_round(positions, 0, draft("a", "bc"), GREEDY, random.Random(0))
    assert text_of(d) == b"abd"
    assert d.accepted_by_position == (True, False)


def test_greedy_multibyte_tokens_keep_whole_characters_together():
    positions = [
        ScoredToken(text=r"bytes:\xe2\x82", logprob=-0.1, top={r"bytes:\xe2\x82": -0.1}),
        ScoredToken(text=r"bytes:\xac", logprob=-0.1, top={r"bytes:\xac": -0.1}),
    ]
    d = decide_round(positions, 0, [ScoredToken(text="€", logprob=-0.1)], GREEDY, random.Random(0))
    assert text_of(d) == "€".encode()
    assert d.accepted_by_position == (True,)


# ----------------------------------------------------------------------------- sampled


def _chi2_pvalue(counts: Counter, probs: dict[str, float]) -> float:
    keys = sorted(probs)
    n = sum(counts.values())
    assert set(counts) <= set(keys), f"impossible outputs {set(counts) - set(keys)}"
    return float(chisquare([counts.get(k, 0) for k in keys], [probs[k] * n for k in keys]).pvalue)


CASES = [
    ({"a": 0.5, "b": 0.3, "c": 0.15, "d": 0.05}, {"a": 0.1, "b": 0.2, "c": 0.3, "d": 0.4}),
    ({"a": 0.7, "b": 0.1, "c": 0.1, "d": 0.1}, {"a": 0.25, "b": 0.25, "c": 0.25, "d": 0.25}),
    ({"a": 0.05, "b": 0.05, "c": 0.45, "d": 0.45}, {"a": 0.45, "b": 0.45, "c": 0.05, "d": 0.05}),
]


@pytest.mark.parametrize(("p", "q"), CASES)
def test_sampled_round_output_follows_the_target_not_the_draft(p, q):
    rng = random.Random(1234)
    q_dist = TokenDist(probs=q)
    p_top = {t: math.log(v) for t, v in p.items()}
    q_top = {t: math.log(v) for t, v in q.items()}
    counts: Counter = Counter()
    accepted = 0
    n = 20_000
    for _ in range(n):
        x = sample_token(q_dist, rng)
        d = decide_round(
            [ScoredToken(text=x, logprob=p_top[x], top=p_top)],
            0,
            [ScoredToken(text=x, logprob=q_top[x], top=q_top)],
            T1,
            rng,
        )
        assert len(d.emitted) == 1 and d.gap == 0.0
        counts[d.emitted[0].token] += 1
        accepted += d.accepted
    assert _chi2_pvalue(counts, p) > 1e-3, counts
    assert _chi2_pvalue(counts, q) < 1e-6, counts  # the test can tell p from q
    expected_acceptance = sum(min(p[t], q[t]) for t in p)
    assert accepted / n == pytest.approx(expected_acceptance, abs=0.02)


def test_sampled_unaligned_tokenization_samples_the_target_directly():
    # The target scored "ab" where the draft proposed "a","b": no q for "ab", so the position is drawn from p.
    p = {"ab": 0.5, "ac": 0.3, "b": 0.2}
    top = {t: math.log(v) for t, v in p.items()}
    rng = random.Random(99)
    counts: Counter = Counter()
    for _ in range(10_000):
        d = decide_round([ScoredToken(text="ab", logprob=top["ab"], top=top)], 0, draft("a", "b"), T1, rng)
        token = d.emitted[0].token
        counts[token] += 1
        assert d.accepted_by_position == ((True, True) if token == "ab" else (False, False))
    assert _chi2_pvalue(counts, p) > 1e-3, counts


def test_sampled_straddling_token_without_aligned_draft_stalls():
    top = {"hel": math.log(0.6), "he": math.log(0.4)}
    d = decide_round([ScoredToken(text="hel", logprob=top["hel"], top=top)], 1, draft("el"), T1, random.Random(0))
    assert d.stalled and d.emitted == ()


def test_sampled_position_that_short_lists_cannot_decide_goes_to_the_target():
    p_top = {"a": math.log(0.5), "b": math.log(0.3)}  # 0.2 of the target's mass unseen
    q_top = {"a": math.log(0.9), "b": math.log(0.1)}
    d = decide_round(
        [ScoredToken(text="a", logprob=p_top["a"], top=p_top)],
        0,
        [ScoredToken(text="a", logprob=q_top["a"], top=q_top)],
        T1,
        random.Random(0),
    )
    assert d.handover and d.emitted == () and not d.all_accepted


def test_positions_before_an_undecidable_one_are_still_decided():
    full = {"a": math.log(0.7), "b": math.log(0.3)}
    short = {"a": math.log(0.5), "b": math.log(0.3)}
    point = {"a": 0.0}
    d = decide_round(
        [ScoredToken(text="a", logprob=full["a"], top=full), ScoredToken(text="a", logprob=short["a"], top=short)],
        0,
        [ScoredToken(text="a", logprob=0.0, top=point), ScoredToken(text="a", logprob=0.0, top=point)],
        T1,
        random.Random(3),  # the first uniform is below 0.7: the first token is kept
    )
    assert d.handover and [e.token for e in d.emitted] == ["a"] and d.accepted == 1


def test_scored_token_outside_a_truncated_list_is_outside_the_nucleus():
    # Top-2 list holds 0.9 of the mass; with top_p 0.8 the nucleus is {"a", "b"}: the scored draft
    # token "z" (outside the list, logprob known) must never be kept, whatever the draft's q.
    p_top = {"a": math.log(0.6), "b": math.log(0.3)}
    params = SamplingParams(temperature=1.0, top_p=0.8)
    kept = 0
    for seed in range(300):
        d = decide_round(
            [ScoredToken(text="z", logprob=math.log(0.05), top=p_top)],
            0,
            [ScoredToken(text="z", logprob=0.0, top={"z": 0.0})],
            params,
            random.Random(seed),
        )
        assert not d.handover
        kept += d.accepted
        assert d.emitted[0].token in ("a", "b")
    assert kept == 0


def test_a_temperature_near_zero_is_stable():
    p_top = {"a": math.log(0.6), "b": math.log(0.3)}
    d = decide_round(
        [ScoredToken(text="a", logprob=p_top["a"], top=p_top)],
        0,
        [ScoredToken(text="a", logprob=0.0, top={"a": 0.0})],
        SamplingParams(temperature=1e-3),
        random.Random(0),
    )
    assert [e.token for e in d.emitted] == ["a"] and not d.handover


def test_sampled_rounds_repeat_under_the_same_seed():
    p_top = {"a": math.log(0.4), "b": math.log(0.6)}
    q_top = {"a": math.log(0.9), "b": math.log(0.1)}
    positions = [ScoredToken(text="a", logprob=p_top["a"], top=p_top)] * 3
    drafted = [ScoredToken(text="a", logprob=q_top["a"], top=q_top)] * 3

    def run(seed: int) -> list:
        rng = random.Random(seed)
        return [decide_round(positions, 0, drafted, T1, rng).emitted for _ in range(30)]

    assert run(5) == run(5)
    assert run(5) != run(6)


def test_a_point_mass_target_decides_whatever_the_drafts_list_leaves_unseen():
    """Fan-out positions are the target's own picks: a draft list that leaves mass unseen does not
    make them undecidable (keep the draft token when it is the pick, else emit the pick)."""
    short_q = {"a": math.log(0.3), "b": math.log(0.2)}  # half of the draft's mass unseen
    params = SamplingParams(temperature=0.9)
    kept = decide_round([ScoredToken(text="a", logprob=0.0, top={"a": 0.0})], 0,
                        [ScoredToken(text="a", logprob=short_q["a"], top=short_q)], params, random.Random(0))
    replaced = decide_round([ScoredToken(text="a", logprob=None, top={"b": 0.0})], 0,
                            [ScoredToken(text="a", logprob=short_q["a"], top=short_q)], params, random.Random(0))
    assert not kept.handover and kept.accepted == 1
    assert not replaced.handover and [e.token for e in replaced.emitted] == ["b"]
