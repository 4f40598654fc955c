"""Drafts that learn from traffic: a suffix index over past prompts and outputs, and the drafter on it.

SuffixDecoding (Oliaro et al., arXiv 2411.04975) drafts with no model: it remembers the token
sequences of finished requests and, each round, continues the current text the way it continued
before, as far as the match's frequency statistics say it is likely to hold.

- `SuffixIndex`: a generalized suffix automaton over token sequences (cl100k ids), with per-state
  occurrence counts and recency, bounded in tokens: when a new sequence would overflow `max_tokens`,
  the oldest sequences leave (down to three quarters of the cap) and the automaton is rebuilt from
  the rest. A query finds the longest suffix of the current text that occurs in the index (as a
  substring of one stored sequence) and walks forward along the most frequent continuation
  (most recent on ties), with a confidence per position.
- `SuffixDrafter`: the `Drafter` on an index. Zero network calls; the proposal is a point mass
  (logprob 0), so sampled output stays exact; its length follows the confidence.
- `learn(index, context, text)`: called by the client when a request finishes (the end of the prompt,
  and the output).
- `screen_prediction(draft)`: what of a suffix draft is worth sending as a Predicted Output.
- `FreeDraftGate` / `gate_free_drafts` (specapi/parts/free_gate.py): per request, lets a request the index
  knows speculate with free drafts where the client's policy would otherwise let the target generate
  alone.

The confidence of a step from a matched string s (of length L, occurring n times, followed by K
different tokens) to the token c (occurring after s m times) is m / (n + (K - 1) + 1/L): a frequency,
discounted for short matches seen once (a single occurrence after a 2-token match is worth less than
after a 40-token one) and, as in Witten-Bell smoothing, for every different continuation seen after
s beyond the first: each is a sign that the next text may go yet another way. Where s always went
on the same way (K = 1) the step keeps m / (n + 1/L). A position's confidence is the product of the
steps up to it.

Why K counts: every chat request's text ends in the same assistant header, whatever it asks. After
two earlier answers that began differently (at the header: n = 2, K = 2, L = 5), m / (n + 1/L) gave a
new question a 0.45 chance of starting like one of them; with K counted it is 0.31, and the steps
after it fall below the drafter's threshold (how an answer's start is matched: `_continuation`). Seen
in a cold burst through `specapi serve` (`benchmarks/proxy_load.py`): new chat questions drafted 5
tokens from an earlier answer, 0 accepted.

arctic-inference (Snowflake's C++ suffix cache) was tried as the index: it builds from its sdist here
(CPU only, ~3.5 min with g++), but does not declare its numpy dependency, needs a compiler on every
install, and bounds its cache in requests, not tokens; so specapi keeps this pure-Python index.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..transport._calls import Meter
from ..core.alignment import ScoredToken
from ..core.context import Context
from .drafters import CombinedDrafter, Draft, DrafterBase, _encoding  # _encoding: the drafters' tokenizer, loaded once and shared

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "PROMPT_TAIL_CHARS",
    "PROMPT_TAIL_TOKENS",
    "Proposal",
    "SuffixIndex",
    "SuffixDrafter",
    "context_text",
    "expected_continuation",
    "indexes",
    "learn",
    "learned_tokens",
    "load_tokenizer",
    "screen_prediction",
    "with_index",
    "without_suffix",
]


#: Default cap of one index, in tokens (about 13 MB of Python objects when full of code; an eviction
#: rebuilds three quarters of it, 32–34 ms; learning costs 1.4–2.4 µs per token: specapi's own source
#: added in pieces of 300 tokens, two runs).
DEFAULT_MAX_TOKENS = 32_768
#: Longest suffix-link walk when counting a new position (bounds the work per token).
_MAX_WALK = 512


@dataclass(frozen=True)
class Proposal:
    """A continuation: token ids and, per position, the confidence that it holds up to there."""

    tokens: tuple[int, ...]
    confidence: tuple[float, ...]
    match_length: int  # tokens of the current text matched in the index
    occurrences: int  # how often the matched text occurs in the index


class SuffixIndex:
    """A bounded generalized suffix automaton over token sequences, with occurrence counts.

    Args:
        max_tokens: the most tokens held; the oldest sequences leave first.
        max_match: the longest suffix of a query that is matched (longer ones are cut to it).
    """

    def __init__(self, *, max_tokens: int = DEFAULT_MAX_TOKENS, max_match: int = 64) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {max_tokens!r}")
        if max_match < 1:
            raise ValueError("max_match must be >= 1")
        self.max_tokens = max_tokens
        self.max_match = max_match
        self._sequences: deque[tuple[int, tuple[int, ...]]] = deque()  # (serial, tokens), oldest first
        self._serial = 0
        self.tokens = 0
        self._reset()

    # -- the automaton ------------------------------------------------------------------------
    def _reset(self) -> None:
        self._next: list[dict[int, int]] = [{}]
        self._link: list[int] = [-1]
        self._len: list[int] = [0]
        self._count: list[int] = [0]  # (sequence, end position) pairs where the state's strings end
        self._recent: list[int] = [-1]  # the newest sequence that contains them

    def _state(self, length: int, link: int, nxt: dict[int, int], count: int, recent: int) -> int:
        self._next.append(nxt)
        self._link.append(link)
        self._len.append(length)
        self._count.append(count)
        self._recent.append(recent)
        return len(self._len) - 1

    def _clone(self, q: int, length: int) -> int:
        return self._state(length, self._link[q], dict(self._next[q]), self._count[q], self._recent[q])

    def _extend(self, last: int, c: int) -> int:
        nxt, link, size = self._next, self._link, self._len
        q = nxt[last].get(c)
        if q is not None:  # the string is already known (generalized automaton: a new sequence)
            if size[q] == size[last] + 1:
                return q
            clone = self._clone(q, size[last] + 1)
            p = last
            while p != -1 and nxt[p].get(c) == q:
                nxt[p][c] = clone
                p = link[p]
            link[q] = clone
            return clone
        cur = self._state(size[last] + 1, 0, {}, 0, -1)
        p = last
        while p != -1 and c not in nxt[p]:
            nxt[p][c] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][c]
            if size[p] + 1 == size[q]:
                link[cur] = q
            else:
                clone = self._clone(q, size[p] + 1)
                while p != -1 and nxt[p].get(c) == q:
                    nxt[p][c] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        return cur

    def _insert(self, serial: int, tokens: Sequence[int]) -> None:
        last = 0
        count, recent, link = self._count, self._recent, self._link
        for c in tokens:
            last = self._extend(last, c)
            v, steps = last, 0
            # Every suffix of the text so far ends here once more. The walk visits one state per class
            # of suffixes, a handful in real text; in degenerate text (one token repeated thousands of
            # times) it is cut, which only under-counts the shortest suffixes there.
            while v > 0 and steps < _MAX_WALK:
                count[v] += 1
                recent[v] = serial
                v = link[v]
                steps += 1

    # -- the public interface -----------------------------------------------------------------
    @property
    def states(self) -> int:
        return len(self._len)

    @property
    def sequences(self) -> int:
        return len(self._sequences)

    def add(self, tokens: Iterable[int]) -> None:
        """Remember one sequence (its last `max_tokens` tokens), evicting the oldest if needed."""
        seq = tuple(tokens)[-self.max_tokens :]
        if not seq:
            return
        if self.tokens + len(seq) > self.max_tokens:
            low = max(self.max_tokens * 3 // 4, len(seq))
            while self._sequences and self.tokens + len(seq) > low:
                self.tokens -= len(self._sequences.popleft()[1])
            self._reset()
            for serial, old in self._sequences:
                self._insert(serial, old)
        self._serial += 1
        self._sequences.append((self._serial, seq))
        self.tokens += len(seq)
        self._insert(self._serial, seq)

    def clear(self) -> None:
        self._sequences.clear()
        self.tokens = 0
        self._reset()

    def match(self, query: Sequence[int]) -> tuple[int, int]:
        """(state, length) of the longest suffix of `query` (at most `max_match` tokens) in the index."""
        nxt, link, size = self._next, self._link, self._len
        v, length = 0, 0
        for c in query[-self.max_match :]:
            while v and c not in nxt[v]:
                v = link[v]
                length = size[v]
            if c in nxt[v]:
                v = nxt[v][c]
                length += 1
        return v, length

    def count(self, query: Sequence[int]) -> int:
        """How often `query` occurs in the stored sequences (0 if it does not)."""
        v = 0
        for c in query:
            v = self._next[v].get(c, -1)
            if v < 0:
                return 0
        return self._count[v] if query else self.tokens

    def continuations(self, query: Sequence[int]) -> dict[int, int]:
        """For the longest matched suffix s of `query`: each token c with the occurrences of s + c."""
        v, length = self.match(query)
        if length == 0:
            return {}
        return {c: self._count[u] for c, u in self._next[v].items()}

    def propose(self, query: Sequence[int], max_tokens: int, *, min_confidence: float = 0.0, min_match: int = 1) -> Proposal:
        """The most frequent continuation of `query`'s longest matched suffix (ties: most recent),
        up to `max_tokens` tokens and while the confidence stays at least `min_confidence`."""
        v, length = self.match(query)
        if length < min_match:
            return Proposal((), (), length, 0)
        occurrences = self._count[v]
        tokens: list[int] = []
        confidence: list[float] = []
        cumulative = 1.0
        count, recent = self._count, self._recent
        while len(tokens) < max_tokens and self._next[v]:
            following = self._next[v]
            c, u = max(following.items(), key=lambda item: (count[item[1]], recent[item[1]]))
            cumulative *= min(1.0, count[u] / (count[v] + (len(following) - 1) + 1.0 / length))
            if cumulative < min_confidence:
                break
            tokens.append(c)
            confidence.append(cumulative)
            v, length = u, length + 1
        return Proposal(tuple(tokens), tuple(confidence), length - len(tokens), occurrences)


# -- text ---------------------------------------------------------------------------------------

#: How much of the current text a query encodes: the last `_QUERY_FIRST_CHARS` characters, which hold
#: `max_match` tokens and more in all but unusual text (a token of English is about four characters,
#: one of Chinese one or two), else the last `_QUERY_CHARS`. Encoding is most of a query's cost, paid at
#: every round: on 4,000-character prompts a round's draft cost 206 µs (code) and 342 µs (Chinese) of CPU
#: with 2,048 characters encoded, 87 and 126 µs with 512 (`benchmarks/suffix_cost.py`).
_QUERY_FIRST_CHARS = 512
_QUERY_CHARS = 2048
#: What a chat request's text has between the messages and the answer (`context_text`).
_ANSWER_HEADER = "<|assistant|>\n"
_SHORT_ANSWER_CHARS = 64  # an answer this long is taken to have min_match tokens (true but for long runs of one character)
#: How much of a finished request's prompt the index learns: its last `PROMPT_TAIL_TOKENS` tokens, read
#: from its last `PROMPT_TAIL_CHARS` characters (about a quarter as many tokens in English; in Chinese
#: the token cap is what holds, where 1,024 characters were 1,024 to 1,117 tokens to insert).
PROMPT_TAIL_CHARS = 1024
PROMPT_TAIL_TOKENS = 256


def load_tokenizer() -> None:
    """Load the tokenizer the index counts in now (0.3 s of CPU), rather than in the first request."""
    _encoding()


def encode(text: str) -> list[int]:
    """`text`'s token ids, special tokens' text taken as ordinary text."""
    return _encoding().encode_ordinary(text)


def _tail_tokens(text: str, chars: int) -> list[int]:
    """The tokens of `text`'s last `chars` characters, without the first where the text was cut there
    (a fragment of a token the whole text has)."""
    tokens = encode(text[-chars:])
    return tokens[1:] if len(text) > chars else tokens


@functools.cache
def _header_tokens() -> int:
    return len(encode(_ANSWER_HEADER))


def context_text(context: Context, output: str | None = None) -> str:
    """The text the index sees for a request: the prompt (chat messages rendered with their roles)
    followed by the output so far (`context.accepted`) or the final `output`."""
    tail = context.accepted if output is None else output
    if not context.is_chat:
        return (context.prompt or "") + tail
    rendered = "".join(f"<|{m.get('role', '')}|>\n{m.get('content') or ''}\n" for m in context.messages or ())
    return rendered + _ANSWER_HEADER + tail


def learned_tokens(context: Context, output: str) -> list[int]:
    """What the index remembers of a finished request: the end of its prompt (what leads into an
    answer) and its output.

    Only the end of the prompt is kept (`PROMPT_TAIL_TOKENS`): what an output repeats from its own
    prompt is prompt lookup's job, and agents resend long histories that would fill the index. The
    prompt and the output are encoded apart: a later request with this prompt asks the index with the
    prompt's own tokens (its output is not there yet), and they lead on into this output's.
    """
    prompt = _tail_tokens(context_text(context, ""), PROMPT_TAIL_CHARS)[-PROMPT_TAIL_TOKENS:]
    return prompt + encode(output)


def learn(index: SuffixIndex, context: Context, output: str) -> list[int]:
    """Remember a finished request in `index` (see `learned_tokens`); returns the tokens added."""
    tokens = learned_tokens(context, output)
    index.add(tokens)
    return tokens


def _query(context: Context, min_match: int, max_match: int) -> tuple[list[int], int]:
    """The tokens the index is asked to continue, and how many of the last ones are a chat answer's
    header and its first words (0 when the answer is longer than `min_match` tokens, or not chat).

    Every chat request's text ends in the same header (`_ANSWER_HEADER`), whatever it asks. A match
    made of the header, the answer's first words and fewer than `min_match` tokens of the question
    says nothing about this question: it is read at the header instead, where the index holds every
    earlier answer's start (`_continuation`)."""
    text = context_text(context)
    tokens = _tail_tokens(text, _QUERY_FIRST_CHARS)
    if len(text) > _QUERY_FIRST_CHARS and len(tokens) < max_match + 16:  # unusual text: long tokens
        tokens = _tail_tokens(text, _QUERY_CHARS)
    if context.is_chat and len(context.accepted) < _SHORT_ANSWER_CHARS:
        answer = len(encode(_ANSWER_HEADER + context.accepted))
        if answer - _header_tokens() < min_match and answer < len(tokens):
            return tokens, answer
    return tokens, 0


def _pieces(chunks: Sequence[tuple[bytes, float]]) -> tuple[list[str], list[float]]:
    """Token bytes as text pieces that are whole UTF-8 characters (a character split over tokens
    becomes one piece, with the confidence of its last token); a trailing fragment is dropped."""
    pieces: list[str] = []
    kept: list[float] = []
    pending = b""
    for data, conf in chunks:
        pending += data
        try:
            piece = pending.decode("utf-8")
        except UnicodeDecodeError:
            continue
        pending = b""
        if piece:
            pieces.append(piece)
            kept.append(conf)
    return pieces, kept


def _continuation(index: SuffixIndex, context: Context, k: int, min_confidence: float, min_match: int) -> list[tuple[bytes, float]]:
    """The proposal for `context` as (bytes, confidence) per token.

    At a chat answer's start (`_query` says how many of the last tokens are the header and the
    answer's first words), unless the match also covers `min_match` tokens of the question before
    them, only they are matched, and whole: the index's statistics there are those of every earlier
    answer's start, which say how
    alike answers begin (an agent's tool calls alike, answers to different questions not). The
    longest match would otherwise turn on how the question's last character was tokenized with the
    header's newline, and one earlier answer matched that way looked certain.

    The current text's last token may be the start of a longer one (text cut mid-word re-encodes
    differently than the whole text did), so the query first leaves it out and keeps a proposal that
    begins with its bytes, minus them; else the whole query is used.
    """
    query, answer = _query(context, min_match, index.max_match)
    if answer and index.match(query)[1] < answer + min_match:
        query, min_match = query[-answer:], answer - 1  # the last token may be left out (below)
    decode = _encoding().decode_single_token_bytes
    if len(query) > 1:
        tail = decode(query[-1])
        proposal = index.propose(query[:-1], k + 1, min_confidence=min_confidence, min_match=min_match)
        chunks = [(decode(t), c) for t, c in zip(proposal.tokens, proposal.confidence)]
        data = b"".join(d for d, _ in chunks)
        if data.startswith(tail) and len(data) > len(tail):
            skip = len(tail)
            while chunks and skip >= len(chunks[0][0]):
                skip -= len(chunks.pop(0)[0])
            if skip:
                chunks[0] = (chunks[0][0][skip:], chunks[0][1])
            return chunks
    proposal = index.propose(query, k, min_confidence=min_confidence, min_match=min_match)
    return [(decode(t), c) for t, c in zip(proposal.tokens, proposal.confidence)]


@dataclass
class SuffixDrafter(DrafterBase):
    """Drafts by continuing the current text the way past requests continued it (a `SuffixIndex`).

    It proposes up to `k` tokens, fewer where the confidence drops below `min_confidence`, and
    nothing when less than `min_match` tokens of the current text match. No network calls.
    """

    index: SuffixIndex
    min_confidence: float = 0.3
    min_match: int = 3
    name: str = "suffix"

    async def draft(self, context: Context, k: int, meter: Meter, seed: int | None) -> Draft:
        if k <= 0 or not self.index.tokens:
            return Draft(tokens=(), drafter=self.name)
        chunks = _continuation(self.index, context, k, self.min_confidence, self.min_match)
        pieces, confidence = _pieces(chunks)
        pieces, confidence = pieces[:k], confidence[:k]
        tokens = tuple(ScoredToken(text=p, logprob=0.0, top={p: 0.0}) for p in pieces)
        return Draft(tokens=tokens, drafter=self.name, confidence=tuple(confidence))


def screen_prediction(draft: Draft, *, min_confidence: float = 0.5, min_expected_tokens: float = 4.0) -> Draft:
    """What of a draft to send as a Predicted Output.

    A draft that says how sure it is (`draft.confidence`, the suffix drafter's) is cut where its
    confidence falls below `min_confidence`, so each predicted token is likelier accepted than
    rejected (rejected ones are billed as output); it is sent only if it is expected to save at least
    `min_expected_tokens` tokens of generation. Drafts without confidence (a user's prediction,
    prompt lookup) pass unchanged.
    """
    confidence = draft.confidence
    if not confidence or not draft.tokens:
        return draft
    keep = 0
    while keep < len(draft.tokens) and keep < len(confidence) and confidence[keep] >= min_confidence:
        keep += 1
    if sum(confidence[:keep]) < min_expected_tokens:
        keep = 0
    return replace(draft, tokens=draft.tokens[:keep], confidence=tuple(confidence[:keep]))


def with_index(drafter: Any, index: SuffixIndex) -> Any:
    """`drafter` with its suffix drafters reading `index` (a combined drafter keeps what it learnt)."""
    if isinstance(drafter, SuffixDrafter):
        return replace(drafter, index=index)
    if isinstance(drafter, CombinedDrafter):
        return drafter.with_drafters([with_index(d, index) for d in drafter.drafters])
    return drafter


def indexes(drafter: Any) -> Mapping[int, SuffixIndex]:
    """The suffix indexes a drafter reads (by id), for learning."""
    if isinstance(drafter, SuffixDrafter):
        return {id(drafter.index): drafter.index}
    found: dict[int, SuffixIndex] = {}
    for inner in drafter.drafters if isinstance(drafter, CombinedDrafter) else ():
        found.update(indexes(inner))
    return found


def expected_continuation(index: SuffixIndex, context: Context, k: int, *, min_confidence: float = 0.3, min_match: int = 3) -> float:
    """How many tokens the index expects to continue `context` with correctly (its confidence summed)."""
    if not index.tokens:
        return 0.0
    return sum(c for _, c in _continuation(index, context, k, min_confidence, min_match))


def without_suffix(drafter: Any) -> Any:
    """`drafter` without its suffix drafters (None if nothing else is left)."""
    if isinstance(drafter, SuffixDrafter):
        return None
    if isinstance(drafter, CombinedDrafter):
        return drafter.with_drafters([d for d in drafter.drafters if not isinstance(d, SuffixDrafter)])
    return drafter
