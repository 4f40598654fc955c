"""The suffix index against a brute-force search, its memory bound, and the suffix drafter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specapi.transport._calls import Meter
from specapi.core.acceptance import SamplingParams
from specapi.core.context import Context
from specapi.transport.endpoint import Endpoint
from specapi.parts.suffix import SuffixDrafter, SuffixIndex, context_text, learn, screen_prediction
from specapi.parts.suffix import expected_continuation as expected_tokens

tokens = st.lists(st.integers(0, 3), max_size=14)
corpora = st.lists(tokens, min_size=1, max_size=6)


def occurrences(sequences: list[list[int]], pattern: list[int]) -> list[tuple[int, int]]:
    """(sequence number, end) of every occurrence of `pattern` (brute force)."""
    n = len(pattern)
    return [(i, end) for i, seq in enumerate(sequences) for end in range(n, len(seq) + 1) if seq[end - n : end] == pattern]


def longest_match(sequences: list[list[int]], query: list[int], max_match: int) -> int:
    for length in range(min(len(query), max_match), 0, -1):
        if occurrences(sequences, query[len(query) - length :]):
            return length
    return 0


def brute_propose(sequences: list[list[int]], query: list[int], k: int, max_match: int) -> tuple[list[int], list[float]]:
    length = longest_match(sequences, query, max_match)
    if length == 0:
        return [], []
    current = query[len(query) - length :]
    out: list[int] = []
    conf: list[float] = []
    cumulative = 1.0
    while len(out) < k:
        here = occurrences(sequences, current)
        following: dict[int, tuple[int, int]] = {}
        for i, end in here:
            if end < len(sequences[i]):
                c = sequences[i][end]
                count, newest = following.get(c, (0, -1))
                following[c] = (count + 1, max(newest, i))
        if not following:
            break
        c = max(following, key=lambda t: following[t])
        cumulative *= following[c][0] / (len(here) + (len(following) - 1) + 1.0 / len(current))
        out.append(c)
        conf.append(cumulative)
        current = current + [c]
    return out, conf


@settings(max_examples=300, deadline=None)
@given(corpora, tokens)
def test_longest_match_and_counts_agree_with_brute_force(sequences, query):
    index = SuffixIndex(max_tokens=10_000, max_match=6)
    for seq in sequences:
        index.add(seq)
    v, length = index.match(query)
    assert length == longest_match(sequences, query, 6)
    matched = query[len(query) - length :]
    if length:
        assert index.count(matched) == len(occurrences(sequences, matched))
        expected: dict[int, int] = {}
        for i, end in occurrences(sequences, matched):
            if end < len(sequences[i]):
                expected[sequences[i][end]] = expected.get(sequences[i][end], 0) + 1
        assert index.continuations(query) == expected
    for start in range(len(query)):
        for end in range(start + 1, len(query) + 1):
            assert index.count(query[start:end]) == len(occurrences(sequences, query[start:end]))


@settings(max_examples=300, deadline=None)
@given(corpora, tokens, st.integers(1, 8))
def test_proposal_agrees_with_brute_force(sequences, query, k):
    index = SuffixIndex(max_tokens=10_000, max_match=5)
    for seq in sequences:
        index.add(seq)
    proposal = index.propose(query, k)
    expected_tokens, expected_conf = brute_propose(sequences, query, k, 5)
    assert list(proposal.tokens) == expected_tokens
    assert list(proposal.confidence) == pytest.approx(expected_conf)
    assert all(a >= b for a, b in zip(proposal.confidence, proposal.confidence[1:]))  # products only shrink


@settings(max_examples=100, deadline=None)
@given(st.lists(tokens, min_size=1, max_size=30), st.integers(5, 40))
def test_the_index_holds_at_most_its_cap_and_keeps_the_newest_sequences(sequences, cap):
    index = SuffixIndex(max_tokens=cap)
    kept_from = 0
    for n, seq in enumerate(sequences):
        index.add(seq)
        assert index.tokens <= cap
        assert index.states <= 2 * index.tokens + 1
    # What it holds is the newest sequences (each cut to the cap), oldest first out.
    total = 0
    for kept_from in range(len(sequences) - 1, -1, -1):
        total += min(len(sequences[kept_from]), cap)
        if total > index.tokens:
            break
    held = [seq[-cap:] for seq in sequences if seq]
    stored = [list(seq) for _, seq in index._sequences]
    assert stored == held[len(held) - len(stored) :]
    assert sum(map(len, stored)) == index.tokens
    # Every stored sequence is findable, and the index agrees with a brute force over what it holds.
    for seq in stored:
        assert index.count(seq) == len(occurrences(stored, seq))


def test_a_long_stream_of_sequences_stays_within_the_cap():
    index = SuffixIndex(max_tokens=2_000)
    for n in range(300):
        index.add([n % 97, (n * 7) % 89, 5, 6, 7, 8] * 5)
        assert index.tokens <= 2_000
    assert index.states <= 2 * 2_000 + 1
    assert index.count([299 % 97, (299 * 7) % 89, 5, 6]) >= 1  # the newest is there
    assert index.count([0, 0, 5, 6, 7, 8, 0, 0]) == 0  # the first (n = 0) has left


def test_a_sequence_longer_than_the_cap_keeps_its_end():
    index = SuffixIndex(max_tokens=10)
    index.add(list(range(25)))
    assert index.tokens == 10
    assert index.count(list(range(15, 25))) == 1 and index.count([14]) == 0


def test_bad_caps_are_refused():
    with pytest.raises(ValueError):
        SuffixIndex(max_tokens=0)


# ------------------------------------------------------------------------------- the drafter

GREEDY = SamplingParams(temperature=0.0)
CALL = '{"tool": "edit_file", "path": "src/app.py", "old": "retrun x", "new": "return x"}'


def meter() -> Meter:
    return Meter(Endpoint(base_url="http://unused/v1", model="m"))


async def test_the_suffix_drafter_continues_text_seen_in_earlier_requests():
    index = SuffixIndex()
    drafter = SuffixDrafter(index)
    first = Context(prompt="Task 1: fix the typo.\nCall:\n", sampling=GREEDY)
    assert not (await drafter.draft(first, 8, meter(), None)).tokens  # nothing learnt yet
    learn(index, first, CALL)
    later = Context(prompt="Task 2: fix the typo.\nCall:\n", sampling=GREEDY)
    draft = await drafter.draft(later, 64, meter(), None)
    assert draft.drafter == "suffix"
    assert CALL.startswith(draft.text) and len(draft.text) > 20
    assert all(t.logprob == 0.0 for t in draft.tokens)  # a point mass: sampled output stays exact
    assert len(draft.confidence) == len(draft.tokens)
    short = await drafter.draft(later, 3, meter(), None)
    assert len(short.tokens) == 3 and draft.text.startswith(short.text)
    halfway = await drafter.draft(later.advanced(CALL[:30]), 64, meter(), None)
    assert CALL[30:].startswith(halfway.text) and halfway.text


async def test_the_draft_is_cut_where_confidence_falls():
    index = SuffixIndex()
    context = Context(prompt="The next tool call:\n", sampling=GREEDY)
    for i in range(3):
        learn(index, context, '{"tool": "read_file", "path": "a.py"}')
    learn(index, context, '{"tool": "run_tests", "path": "b.py"}')
    sure = await SuffixDrafter(index, min_confidence=0.7).draft(context, 64, meter(), None)
    assert sure.text == '{"tool": "'  # the tool name differs between requests (3 to 1): not sure enough
    # 3 of 4 went on with read_file, one other way: about 0.6 for the step, under 0.5 with the steps before it.
    unsure = await SuffixDrafter(index, min_confidence=0.4).draft(context, 64, meter(), None)
    assert unsure.text.startswith('{"tool": "read') and len(unsure.text) > len(sure.text)


def test_chat_requests_are_indexed_with_their_roles():
    context = Context(messages=({"role": "system", "content": "tools"}, {"role": "user", "content": "go"}), sampling=GREEDY)
    assert context_text(context, "done") == "<|system|>\ntools\n<|user|>\ngo\n<|assistant|>\ndone"
    assert context_text(context.advanced("do")) == "<|system|>\ntools\n<|user|>\ngo\n<|assistant|>\ndo"


async def test_a_new_chat_question_is_not_drafted_from_answers_that_began_differently():
    # Every chat request's text ends in the same assistant header, so after two answers that began
    # differently the header says nothing about how a third question's answer begins.
    index = SuffixIndex()
    drafter = SuffixDrafter(index)

    def ask(question: str) -> Context:
        return Context(messages=({"role": "user", "content": question},), sampling=GREEDY)

    learn(index, ask("import os\nimport sys"), "import os\nimport sys\n\n\ndef main():\n    return 0\n")
    learn(index, ask("    def __repr__(self):"), "    def __repr__(self):\n        return f'{self.name}'\n")
    new = ask("Exceptions can be raised with the raise statement")
    assert expected_tokens(index, new, 16) < 1.0
    assert len((await drafter.draft(new, 16, meter(), None)).tokens) <= 1
    # The same question again is drafted from its own earlier answer.
    again = await drafter.draft(ask("    def __repr__(self):"), 16, meter(), None)
    assert again.text.startswith("    def __repr__(self):\n        return")
    # Answers that always began the same way (an agent's tool calls) are still drafted at the header.
    calls = SuffixIndex()
    for question in ("fix a.py", "fix b.py", "fix c.py"):
        learn(calls, ask(question), CALL)
    draft = await SuffixDrafter(calls).draft(ask("lint d.py"), 16, meter(), None)
    assert CALL.startswith(draft.text) and len(draft.tokens) >= 4


async def test_a_prediction_is_sent_only_as_far_as_it_is_likely_to_hold():
    index = SuffixIndex()
    context = Context(prompt="The next tool call:\n", sampling=GREEDY)
    for _ in range(3):
        learn(index, context, '{"tool": "read_file", "path": "a.py"}')
    learn(index, context, '{"tool": "run_tests", "path": "b.py"}')
    draft = await SuffixDrafter(index, min_confidence=0.0).draft(context, 64, meter(), None)
    sent = screen_prediction(draft, min_confidence=0.5, min_expected_tokens=2)
    assert draft.text.startswith(sent.text) and 0 < len(sent.tokens) < len(draft.tokens)
    assert all(c >= 0.5 for c in sent.confidence)
    assert not screen_prediction(draft, min_confidence=0.5, min_expected_tokens=50).tokens  # would not pay


def test_degenerate_repetition_is_indexed_in_bounded_time_and_proposes_the_repetition():
    index = SuffixIndex(max_tokens=50_000)
    index.add([7] * 20_000)  # one token repeated: the worst case for counting
    assert index.tokens == 20_000
    proposal = index.propose([1, 7, 7, 7], 5)
    assert proposal.tokens == (7, 7, 7, 7, 7)
    assert all(0.0 < c <= 1.0 for c in proposal.confidence)


# ------------------------------------------------------------------------------- the free-draft gate

from specapi.parts.policy import SPECULATE, TARGET_ALONE, PolicyState, Start  # noqa: E402
from specapi.parts.free_gate import FreeDraftGate  # noqa: E402


class Alone:
    """A client policy that has decided the target alone is faster; `pays` is its verdict on free drafts."""

    name = "adaptive"

    def __init__(self, pays: bool | None) -> None:
        self.pays = pays
        self.seen: list[str] = []

    def start_request(self) -> Start:
        return Start(TARGET_ALONE, "the target alone is faster")

    def choose(self, state: PolicyState) -> int:
        return 0

    def observe(self, record) -> None:  # type: ignore[no-untyped-def]
        self.seen.append("round")

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        self.seen.append("plain")

    def free_drafts_pay(self, expected: float, k: int, remaining: int) -> bool | None:
        return self.pays


def test_the_gate_speculates_with_free_drafts_only_where_they_pay():
    restricted: list[bool] = []
    gate = FreeDraftGate(Alone(pays=True), 12.0, lambda: restricted.append(True), max_length=16, remaining=96)
    assert gate.start_request().mode == SPECULATE and restricted == [True]
    assert gate.choose(PolicyState(96, 0)).length == 16
    gate.observe_plain(1, 0.03)  # a round without a free proposal: the target finishes alone
    assert gate.choose(PolicyState(95, 1)).length == 0 and gate.inner.seen == ["plain"]

    for inner, expected in ((Alone(pays=False), 12.0), (Alone(pays=None), 2.0)):
        restricted.clear()
        gate = FreeDraftGate(inner, expected, lambda: restricted.append(True), max_length=16, remaining=96)
        assert gate.start_request() == Start(TARGET_ALONE, "the target alone is faster") and not restricted
    unmeasured = FreeDraftGate(Alone(pays=None), 12.0, lambda: None, max_length=16, remaining=96)
    assert unmeasured.start_request().mode == SPECULATE  # costs unknown: a confident index is enough


# ----------------------------------------------------------------------------- long texts: what a query encodes, what is learnt

LONG_TEXTS = {  # long, and not one block repeated (a repeated prompt is rightly continued with itself)
    "code": "".join(f"def handle_{i}(request):\n    user = request.users[{i * 7}]\n    return render(request, 'p{i}.html')\n" for i in range(40)),
    "chinese": "".join(f"第{i}条：推测解码在第{i * 3}轮接受了{i % 7}个词元，目标模型验证草稿。" for i in range(90)),
    "japanese": "".join(f"第{i}回：投機的デコーディングでは{i * 3}個の下書きを大きなモデルが検証します。" for i in range(80)),
    "emoji and combining marks": "".join(f"Cafe\u0301 n°{i} 👩‍💻 naïve résumé {i * 11} 🇯🇵 e\u0301\u0301; " for i in range(90)),
    "runs of spaces": "".join(f"x{i}" + " " * 300 for i in range(12)),  # tokens of many characters: the wider window is read
}


@pytest.mark.parametrize("name", sorted(LONG_TEXTS))
async def test_a_long_prompt_seen_before_is_continued_with_the_answer_it_had(name: str) -> None:
    """A query encodes only the end of a long text (its first 512 characters, or 2,048 where the
    tokens are long): the end of the learnt prompt is still found, and leads into the learnt answer."""
    text = LONG_TEXTS[name]
    assert len(text) > 2048
    index = SuffixIndex()
    output = "    return response  # 完了 ✅\n"
    learn(index, Context(prompt=text, sampling=GREEDY), output)
    draft = await SuffixDrafter(index, min_confidence=0.0).draft(Context(prompt=text, sampling=GREEDY), 8, meter(), None)
    assert len(draft.tokens) >= 4 and output.startswith(draft.text), draft.text


@pytest.mark.parametrize("name", sorted(LONG_TEXTS))
def test_a_long_prompt_teaches_the_index_its_last_tokens_and_the_whole_output(name: str) -> None:
    from specapi.parts.suffix import PROMPT_TAIL_TOKENS, encode

    index = SuffixIndex()
    output = "推测解码是一种加速方法。" * 5
    learn(index, Context(prompt=LONG_TEXTS[name], sampling=GREEDY), output)
    answer = len(encode(output))
    assert answer + 4 <= index.tokens <= answer + PROMPT_TAIL_TOKENS  # Chinese: 256 tokens, not the ~1,000 of 1,024 characters


async def test_where_the_texts_end_has_few_tokens_the_query_reads_further_back() -> None:
    """Two prompts that differ only before their last 600 characters, all spaces (a handful of
    tokens): the query reaches back to what tells them apart, and each gets its own answer."""
    index = SuffixIndex()
    for name, answer in (("alpha", " = 1\n"), ("beta", " = 2\n")):
        learn(index, Context(prompt=f"settings for {name}:" + " " * 600, sampling=GREEDY), f"{name}{answer}")
    for name, answer in (("alpha", " = 1\n"), ("beta", " = 2\n")):
        draft = await SuffixDrafter(index).draft(Context(prompt=f"settings for {name}:" + " " * 600, sampling=GREEDY), 8, meter(), None)
        assert draft.text and f"{name}{answer}".startswith(draft.text), (name, draft.text)
