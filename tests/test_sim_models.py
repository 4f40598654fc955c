"""The simulated language models: proper, deterministic distributions whose agreement depends on the text."""

import math
from dataclasses import replace

import numpy as np
import pytest

from specapi.sim.corpus import EOS_TOKEN_ID, UNIVERSE_SIZE, decode_text, encode_text, load_corpus, token_str
from specapi.sim.generation import generate, score_prompt, text_offsets
from specapi.sim.models import MODEL_SPECS, ModelSpec, get_model
from specapi.sim.template import render_chat

CODE = [
    'class Stack:\n    """A simple stack."""\n\n    def __init__(self):\n        self.items = []\n\n'
    "    def push(self, item):\n        self.items.append(item)\n",
    "import os\nimport sys\nimport json\n\ndef load(path):\n    with open(path) as f:\n"
    "        return json.load(f)\n\ndef save(path, data):\n",
    'def parse_args(argv=None):\n    parser = argparse.ArgumentParser(description="Process some files.")\n'
    '    parser.add_argument("paths", nargs="+", help="files to read")\n',
    '    def __repr__(self):\n        return f"{self.__class__.__name__}({self.name!r})"\n\n'
    "    def __eq__(self, other):\n        if not isinstance(other, type(self)):\n            return NotImplemented\n",
]
PROSE = [
    "My grandmother kept a small garden behind the house, where she grew tomatoes, beans and a tangle of "
    "flowers whose names I never learned. Every summer evening we would sit on the porch",
    "The committee met on Tuesday to discuss the budget for next year. Several members argued that the "
    "library needed more funding, while others wanted to repair the roads before winter.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle. The story should be "
    "sad but hopeful, and it should take place during a storm in late autumn.",
    "Honestly, I think the best part of travelling is not the places you see but the people you meet "
    "along the way, the strangers who share a meal or a story with you on a long train ride.",
]


@pytest.fixture(scope="module")
def target():
    return get_model("sim-target")


@pytest.fixture(scope="module")
def draft():
    return get_model("sim-draft")


def greedy_agreement(target, draft, texts):
    agree = total = 0
    for text in texts:
        ids = encode_text(text)
        for i in range(1, len(ids)):
            agree += target.greedy(ids[:i]) == draft.greedy(ids[:i])
            total += 1
    return agree / total


def test_registry_has_target_and_draft_tiers():
    assert MODEL_SPECS["sim-target"].tier == "target"
    assert MODEL_SPECS["sim-draft"].tier == "draft"
    assert MODEL_SPECS["sim-target"].order > MODEL_SPECS["sim-draft"].order


def test_get_model_is_cached_and_rejects_unknown_names(target):
    assert get_model("sim-target") is target
    with pytest.raises(KeyError, match="sim-target"):
        get_model("no-such-model")


def test_corpus_is_bounded_and_has_both_kinds():
    corpus = load_corpus()
    kinds = {d.kind for d in corpus.documents}
    assert kinds == {"code", "prose"}
    assert sum(len(d.text) for d in corpus.documents) <= 410_000
    assert all(t[-1] == EOS_TOKEN_ID for t in corpus.tokens)


@pytest.mark.parametrize("name", ["sim-target", "sim-draft", "sim-draft-small"])
@pytest.mark.parametrize("context", ["", "def f(x):\n    return", "The quick brown fox", "self.items = []\n" * 3])
def test_distribution_sums_to_one(name, context):
    model = get_model(name)
    ids, probs = model.next_distribution(encode_text(context))
    assert np.all(probs > 0)
    assert len(set(ids.tolist())) == len(ids)
    total = probs.sum() + (UNIVERSE_SIZE - len(ids)) * model.tail_prob
    assert total == pytest.approx(1.0, abs=1e-9)


def test_every_token_has_a_nonzero_probability(target):
    context = encode_text("for i in range(10):\n")
    rare = int(np.setdiff1d(np.arange(1000, 2000), target.vocab_ids)[0])  # a token the corpus never shows
    assert target.logprob(context, rare) == pytest.approx(math.log(target.tail_prob))
    assert math.isfinite(target.logprob(context, EOS_TOKEN_ID))


def test_paths_agree_bit_for_bit(target):
    context = encode_text("    def __init__(self, name):\n        self.")
    ids, probs = target.next_distribution(context)
    top = target.top_logprobs(context, 20)
    dense = dict(zip(ids.tolist(), probs.tolist()))
    for token, lp in top:
        assert lp == math.log(dense[token])
        assert lp == target.logprob(context, token)
    best = max(dense.values())
    assert top[0][0] == min(t for t, p in dense.items() if p == best)
    assert target.greedy(context) == top[0][0]
    assert [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)


def test_models_are_deterministic_across_calls(target, draft):
    context = encode_text(PROSE[0])
    assert target.top_logprobs(context, 5) == target.top_logprobs(list(context), 5)
    assert draft.greedy(context) == draft.greedy(context)


def test_target_and_draft_differ_but_correlate(target, draft):
    context = encode_text(CODE[0])
    t_ids, t_p = target.next_distribution(context)
    d_ids, d_p = draft.next_distribution(context)
    assert not np.array_equal(t_p, d_p)
    shared = np.intersect1d(t_ids, d_ids)
    t = dict(zip(t_ids.tolist(), t_p.tolist()))
    d = dict(zip(d_ids.tolist(), d_p.tolist()))
    overlap = sum(min(t[i], d[i]) for i in shared.tolist())
    assert 0.2 < overlap < 0.999


def test_greedy_agreement_is_higher_on_code_than_on_prose(target, draft):
    code = greedy_agreement(target, draft, CODE)
    prose = greedy_agreement(target, draft, PROSE)
    assert code > prose + 0.1, (code, prose)


def greedy_speculation_acceptance(target, draft, texts, tokens=40, k=4):
    """Accepted / drafted tokens of greedy speculative decoding with draft length k."""
    accepted = drafted = 0
    for text in texts:
        context = encode_text(text)
        goal = len(context) + tokens
        while len(context) < goal:
            proposal = []
            for _ in range(k):
                proposal.append(draft.greedy(context + proposal))
            for token in proposal:
                best = target.greedy(context)
                context.append(best)
                if best != token:
                    break
                accepted += 1
            drafted += k
    return accepted / drafted


def test_speculation_accepts_more_on_code_than_on_prose(target, draft):
    code = greedy_speculation_acceptance(target, draft, CODE)
    prose = greedy_speculation_acceptance(target, draft, PROSE)
    assert code > 1.5 * prose, (code, prose)


def test_a_clone_draft_always_agrees(target):
    clone = get_model("sim-target-clone")
    assert greedy_agreement(target, clone, PROSE[:1]) == 1.0


def test_boilerplate_is_copied_from_the_context(target):
    line = "    parser.add_argument('--alpha', type=int"
    comma = encode_text(",")[0]
    fresh = target.logprob(encode_text(line), comma)
    repeated_ids = encode_text(line + ", default=1)\n" + line)
    repeated = target.logprob(repeated_ids, comma)
    assert target.greedy(repeated_ids) == comma
    assert math.exp(repeated) > 2 * math.exp(fresh)


def test_greedy_generation_does_not_cycle_forever(target):
    out = generate(target, encode_text("import os\n"), max_tokens=120, temperature=0.0, top_p=1.0,
                   rng=np.random.default_rng(0))
    lines = [line for line in out.text.splitlines() if line.strip()]
    assert len(set(lines)) > len(lines) // 2


def test_sampling_is_seeded_and_follows_the_distribution(draft):
    context = encode_text("    def ")
    a = [draft.sample(context, temperature=1.0, rng=np.random.default_rng(7)) for _ in range(3)]
    b = [draft.sample(context, temperature=1.0, rng=np.random.default_rng(7)) for _ in range(3)]
    assert a == b
    rng = np.random.default_rng(1)
    draws = [draft.sample(context, temperature=1.0, rng=rng) for _ in range(3000)]
    for token, lp in draft.top_logprobs(context, 3):
        expected = math.exp(lp)
        observed = draws.count(token) / len(draws)
        assert abs(observed - expected) < 4 * math.sqrt(expected * (1 - expected) / len(draws)) + 0.005


def test_temperature_zero_is_argmax_and_low_temperature_sharpens(draft):
    context = encode_text("    def ")
    best = draft.greedy(context)
    assert draft.sample(context, temperature=0.0, rng=np.random.default_rng(3)) == best
    rng = np.random.default_rng(2)
    cold = [draft.sample(context, temperature=0.3, rng=rng) for _ in range(400)]
    hot = [draft.sample(context, temperature=1.0, rng=rng) for _ in range(400)]
    assert cold.count(best) > hot.count(best)


def test_top_p_keeps_only_the_nucleus(draft):
    context = encode_text("    def ")
    top = draft.top_logprobs(context, 50)
    cumulative, nucleus = 0.0, set()
    for token, lp in top:
        nucleus.add(token)
        cumulative += math.exp(lp)
        if cumulative >= 0.5:
            break
    rng = np.random.default_rng(5)
    draws = {draft.sample(context, temperature=1.0, top_p=0.5, rng=rng) for _ in range(300)}
    assert draws <= nucleus


def test_generated_logprobs_equal_the_echoed_prompt_logprobs(target):
    prompt = encode_text(CODE[1])
    out = generate(target, prompt, max_tokens=20, temperature=0.8, top_p=1.0, rng=np.random.default_rng(11), top_k=5)
    scored = score_prompt(target, prompt + out.token_ids, top_k=5, with_rank=True)
    for record, echoed in zip(out.tokens, scored[len(prompt):]):
        assert echoed.token_id == record.token_id
        assert echoed.logprob == record.logprob
        assert echoed.top == record.top
        assert echoed.rank >= 1


def test_rescoring_a_grown_prompt_matches_direct_scoring(target):
    prompt = encode_text(CODE[2])
    first = target.score(prompt, k=3)
    grown = target.score(prompt + encode_text(" x = 1"), k=3)
    assert grown[: len(first)] == first
    for pos, scored in enumerate(grown, start=1):
        context = (prompt + encode_text(" x = 1"))[:pos]
        assert scored.logprob == target.logprob(context, scored.token_id)
        assert list(scored.top) == target.top_logprobs(context, 3)


def test_greedy_in_one_call_equals_token_by_token(target):
    prompt = encode_text(PROSE[2])
    whole = generate(target, prompt, max_tokens=30, temperature=0.0, top_p=1.0, rng=np.random.default_rng(0))
    context = list(prompt)
    for _ in range(30):
        step = generate(target, context, max_tokens=1, temperature=0.0, top_p=1.0, rng=np.random.default_rng(9))
        context += step.token_ids
        if step.finish_reason == "stop":
            break
    assert context[len(prompt):] == whole.token_ids


def test_stop_strings_cut_the_text():
    model = get_model("sim-target")
    prompt = encode_text(CODE[0])
    free = generate(model, prompt, max_tokens=40, temperature=0.0, top_p=1.0, rng=np.random.default_rng(0))
    stop = free.text[5:8]
    cut = generate(model, prompt, max_tokens=40, temperature=0.0, top_p=1.0, rng=np.random.default_rng(0), stop=[stop])
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[: free.text.index(stop)]
    assert stop not in cut.text


def test_end_of_text_stops_generation(target):
    # Training documents end with end-of-text: some document endings make it the greedy choice.
    endings = [doc[-9:-1].tolist() for doc in load_corpus().tokens]
    stopping = [ctx for ctx in endings if target.greedy(ctx) == EOS_TOKEN_ID]
    assert stopping
    out = generate(target, stopping[0], max_tokens=50, temperature=0.0, top_p=1.0, rng=np.random.default_rng(0))
    assert out.token_ids == [EOS_TOKEN_ID]
    assert out.finish_reason == "stop"
    assert out.text == ""


def test_text_offsets_count_code_points():
    ids = encode_text("naïve café ☕ ok")
    offsets = text_offsets(ids)
    assert offsets[0] == 0
    assert offsets == sorted(offsets)
    assert decode_text(ids) == "naïve café ☕ ok"
    assert max(offsets) < len("naïve café ☕ ok")


def test_partial_utf8_tokens_are_rendered_as_bytes():
    partial = [t for t in encode_text("☕☕") if token_str(t).startswith("bytes:")]
    assert partial, "expected a token holding part of a character"
    assert token_str(partial[0]).startswith("bytes:\\x")


def test_chat_template():
    text = render_chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
    open_text = render_chat(
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hel"}], continue_final_message=True
    )
    assert open_text.endswith("<|assistant|>\nHel")
    with pytest.raises(ValueError):
        render_chat([{"role": "wizard", "content": "x"}])


def test_building_and_scoring_a_long_prompt():
    # Speed is measured by the benchmarks, not asserted here: this machine is shared and noisy.
    get_model(ModelSpec(name="timing-check", order=4, tier="target", noise=0.5, seed=9))
    model = get_model("sim-target")
    ids = encode_text(" ".join(CODE + PROSE) * 3)[:500]
    scored = model.score(ids, k=5)
    assert len(scored) == 499


def test_copy_terms_in_python_equal_the_vectorised_ones(target, monkeypatch):
    """The copy part has two implementations (plain Python for a few earlier occurrences of the context's
    last two tokens, arrays for many); on contexts full of repeats, loops and near-repeats they agree."""
    from specapi.sim import models

    rng = np.random.default_rng(7)
    base = encode_text(CODE[0] + CODE[3])
    contexts = [np.array(base, dtype=np.int64)]
    for _ in range(60):
        period = int(rng.integers(2, 9))
        unit = rng.choice(base[:40], size=period).tolist()
        noise = rng.choice(base, size=int(rng.integers(0, 6))).tolist()
        ids = (unit * int(rng.integers(2, 7)) + noise + unit[: int(rng.integers(0, period + 1))])
        contexts.append(np.array(base[: int(rng.integers(0, 30))] + ids, dtype=np.int64))
    seen_copy = seen_loop = 0
    for model in (target, get_model("sim-draft")):
        for context in contexts:
            monkeypatch.setattr(models, "_FEW_ENDS", 10_000)
            few = model._copy_terms(context)
            monkeypatch.setattr(models, "_FEW_ENDS", -1)
            vectorised = model._copy_terms(context)
            assert few[0] == vectorised[0]
            for a, b in zip(few[1:], vectorised[1:]):
                assert a.dtype == b.dtype and a.tolist() == b.tolist()
            seen_copy += few[1].size > 0
            seen_loop += few[3].size > 0
    assert seen_copy > 20 and seen_loop > 10  # both the copy and the loop branch were compared


def test_cached_distributions_cannot_be_changed_by_a_caller(target):
    context = np.array(encode_text(CODE[1]), dtype=np.int64)
    mix = target.mixture(context)
    assert target.mixture(context.copy()) is mix  # the same context is not computed twice
    with pytest.raises(ValueError):
        mix.probs[0] = 1.0
    ids, probs = target.next_distribution(context)
    probs[0] = 1.0  # the dense copy is the caller's own
    assert target.next_distribution(context)[1][0] != 1.0


def test_greedy_top_one_equals_the_general_top_list(target):
    """Greedy asks for the top token only, computed without sorting; it is the head of the general top list."""
    from specapi.sim.models import Mixture

    draft = get_model("sim-draft")
    checked = 0
    for model in (target, draft):
        for text in CODE + PROSE:
            ids = encode_text(text)
            for cut in range(1, len(ids), 3):
                mix = model.mixture(np.array(ids[:cut], dtype=np.int64))
                fast_ids, fast_probs = model._compute_top1(mix)
                ids_k, probs_k = model._compute_top(mix, 1)
                assert fast_ids.tolist() == ids_k.tolist() and fast_probs.tolist() == probs_k.tolist()
                checked += 1
    # A tie between the best named token and the best unnamed one goes to the lower id.
    unnamed = int(target._unigram_rank[0])
    tied = target.tail_prob + 0.5 * float(target._unigram_by_id[unnamed])
    for named in (unnamed - 1, unnamed + 1):
        mix = Mixture(np.array([named], dtype=np.int64), np.array([tied]), 0.5)
        assert target._compute_top1(mix)[0].tolist() == target._compute_top(mix, 1)[0].tolist() == [min(named, unnamed)]
    assert checked > 100



def _assistant_turn() -> list[int]:
    return list(encode_text(render_chat([{"role": "user", "content": "Tell me about the weather 🌦 in 東京."}])))


def _without_turn_end(spec: ModelSpec, name: str):
    return get_model(replace(spec, name=name, turn_end_by=0))


def test_an_assistant_turn_ends_by_itself_greedy_by_halfway_and_sampled_sooner():
    """A chat request without a limit gets an answer of a chat model's length, not the context window."""
    spec = MODEL_SPECS["sim-target"]
    model = get_model(spec)
    prompt = _assistant_turn()
    greedy = generate(model, prompt, max_tokens=4000, temperature=0.0, top_p=1.0, rng=np.random.default_rng(0))
    assert greedy.finish_reason == "stop" and greedy.token_ids[-1] == EOS_TOKEN_ID
    assert spec.turn_end_from < len(greedy.tokens) <= (spec.turn_end_from + spec.turn_end_by) // 2 + 1
    for seed in range(5):
        sampled = generate(model, prompt, max_tokens=4000, temperature=1.0, top_p=1.0, rng=np.random.default_rng(seed))
        assert sampled.finish_reason == "stop" and len(sampled.tokens) <= spec.turn_end_by


def test_the_end_of_turn_weight_is_in_every_reading_of_the_distribution():
    spec = MODEL_SPECS["sim-target"]
    model, plain = get_model(spec), _without_turn_end(spec, "sim-target-no-turn-end")
    ramp = spec.turn_end_by - spec.turn_end_from
    context = _assistant_turn() + list(range(1000, 1000 + spec.turn_end_from + ramp // 4))  # a quarter up the ramp
    weight = (ramp // 4) / ramp
    keep = 1 - spec.tail_mass
    assert math.exp(model.logprob(context, EOS_TOKEN_ID)) == pytest.approx(
        weight * keep + (1 - weight) * math.exp(plain.logprob(context, EOS_TOKEN_ID)) + weight * plain.tail_prob, rel=1e-9
    )
    assert math.exp(model.logprob(context, 1000)) == pytest.approx(
        (1 - weight) * math.exp(plain.logprob(context, 1000)) + weight * plain.tail_prob, rel=1e-9
    )
    # What the turn's end takes comes out of the other tokens: the whole distribution still sums as before.
    assert float(np.sum(model.next_distribution(context)[1])) == pytest.approx(float(np.sum(plain.next_distribution(context)[1])), abs=1e-9)
    [scored] = model.score(context + [EOS_TOKEN_ID], k=5, start=len(context))
    assert scored.logprob == model.logprob(context, EOS_TOKEN_ID)
    assert scored.top == tuple(model.top_logprobs(context, 5))


def test_no_end_of_turn_outside_the_chat_template_and_a_new_marker_starts_a_new_turn():
    spec = MODEL_SPECS["sim-target"]
    model, plain = get_model(spec), _without_turn_end(spec, "sim-target-no-turn-end-2")
    code = encode_text("def area(r):\n    return 3.14159 * r * r\n" * 60)  # a completion: no role marker
    answer = _assistant_turn() + code
    new_turn = answer + encode_text("\n<|user|>\nthanks\n")
    assert len(code) > spec.turn_end_by
    for context in (code, new_turn):
        assert model.top_logprobs(context, 5) == plain.top_logprobs(context, 5)
        assert model.logprob(context, EOS_TOKEN_ID) == plain.logprob(context, EOS_TOKEN_ID)
    assert model.greedy(answer) == EOS_TOKEN_ID != plain.greedy(answer)  # past turn_end_by: the turn is over


def test_sharpness_keeps_greedy_text_and_concentrates_the_mass(target):
    """A power on the mass above the tail: every ranking stays (greedy text is the same), the distribution
    still sums to one, and the most likely token holds more of it than the smoothed counts give."""
    flat = get_model(replace(MODEL_SPECS["sim-target"], sharpness=1.0))
    assert target.spec.sharpness > 1.0
    for text in CODE[:2] + PROSE[:1]:
        context = encode_text(text)
        for _ in range(12):
            assert target.greedy(context) == flat.greedy(context)
            ids, probs = target.next_distribution(context)
            assert float(probs.sum()) + target.tail_prob * (UNIVERSE_SIZE - len(ids)) == pytest.approx(1.0, abs=1e-9)
            assert [t for t, _ in target.top_logprobs(context, 1)] == [t for t, _ in flat.top_logprobs(context, 1)]
            context = context + [target.greedy(context)]
    sharp_top = np.mean([math.exp(target.top_logprobs(encode_text(t), 1)[0][1]) for t in CODE + PROSE])
    flat_top = np.mean([math.exp(flat.top_logprobs(encode_text(t), 1)[0][1]) for t in CODE + PROSE])
    assert sharp_top > flat_top + 0.05, (sharp_top, flat_top)
    with pytest.raises(ValueError, match="sharpness"):
        replace(MODEL_SPECS["sim-target"], sharpness=0.5)
