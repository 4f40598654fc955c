"""The text of one answer as it grows: new tokens in, text safe to hand out back. Pure; no I/O.

`Output` applies the target's tokens (end of text, the caller's `max_tokens`, stop strings) and says
what may be handed out. The functions around it are the rules it and the engine share: where a stop
string begins, what of a tail could still grow into one, the tokens within the caller's limit, the
tokens that end on a complete character, the room left in the target's context window, and the checks
that the target read its own output back with the token boundaries it generated (each returns why
not, or None).
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..core.acceptance import Emitted
from ..core.alignment import ScoredToken, complete_utf8_prefix, token_bytes
from ..core.context import Context
from ..dialects.logprobs import TokenScore

__all__ = [
    "Output",
    "with_pick_scores",
    "find_stop",
    "stop_prefix_len",
    "within_limit",
    "complete_characters",
    "room",
    "token_boundary_split",
    "token_count_split",
    "prompt_count_split",
]


@dataclass
class Output:
    """The text so far: applies new tokens (end of text, max_tokens, stop strings) and says what may
    be handed out. Tokens are bytes: text is decoded only up to the last complete character, so a token
    holding part of a character waits for the rest. A tail that could still grow into a stop string
    is held back, so nothing that may be cut is ever sent."""

    start: Context  # the request's context
    max_tokens: int | None  # the caller's limit (None: the server's own)
    stop: tuple[str, ...] = ()
    context: Context = field(init=False)  # the start with the text so far
    text: str = ""
    sent: int = 0
    produced: int = 0
    finish_reason: str = "length"
    ended: bool = False
    #: Byte offsets in the generated text where a single target token began (0: the prompt's end).
    token_starts: list[int] = field(default_factory=lambda: [0])
    data: bytearray = field(default_factory=bytearray)
    #: Holds back the bytes of an unfinished character; bytes that can never be UTF-8 become U+FFFD.
    decoder: codecs.IncrementalDecoder = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace"))
    #: The text so far holds U+FFFD for bytes that are not UTF-8: a text API cannot send them back.
    invalid_bytes: bool = False
    #: The caller's logprobs: the target's scores of every counted token, kept while `scores` is a list
    #: (None: not asked). `scores_lost`: a counted token came without its own scores.
    scores: list[TokenScore] | None = None
    scores_lost: bool = False
    released: int = 0  # the scores handed out so far (`take_scores`)

    def __post_init__(self) -> None:
        self.context = self.start
        if self.start.logprobs is not None:
            self.scores = []

    def restart_after(self, kept: int) -> None:
        """Forget all text after its first `kept` characters (those the caller already has)."""
        sent = self.text[:kept]
        self.sent = kept
        self.text, self.data, self.produced = sent, bytearray(sent.encode("utf-8")), 0
        self.decoder.reset()
        self.token_starts = [0]
        self.context = self.start.advanced(sent)
        if self.scores is not None:
            # The text after the kept characters is written again: so are the scores of its tokens.
            self.scores = [s for s in self.scores[: self.released]]
            self.scores_lost = self.scores_lost or sum(len(s.data) for s in self.scores) != len(sent.encode("utf-8"))

    @property
    def remaining(self) -> int | None:
        limit = self.max_tokens
        return None if limit is None else limit - self.produced

    def add(self, new: list[Emitted]) -> str:
        before = len(self.text)
        limit, stops = self.max_tokens, self.stop
        ids: list[int] | None = []  # the target's ids of the new tokens, while all are known
        for index, token in enumerate(new):
            if token.eos:
                # A target's end-of-text token is one it generated, and servers count it (a plain
                # step's finish mark has count 0: the step's own count already holds it).
                self.produced += token.count
                self.finish_reason, self.ended = token.finish_reason, True
                break
            if ids is not None and token.ids is not None and len(token.ids) == token.count:
                ids.extend(token.ids)
            else:
                ids = None
            if self.scores is not None:
                self._score(token)
            if token.data:
                if token.count == 1 and self.token_starts[-1] != len(self.data):
                    self.token_starts.append(len(self.data))
                self.data += token.data
                added = self.decoder.decode(token.data)
                self.invalid_bytes = self.invalid_bytes or added.count("\ufffd") > token.data.count(b"\xef\xbf\xbd")
                self.text += added
            self.produced += token.count
            if stops and token.data and find_stop(self.text, stops, before) is not None:
                # The target stops at the token that completes a stop string: later tokens of the
                # round were never its own, and are not counted (cut below).
                break
            if limit is not None and self.produced >= limit:
                # The end of text right after the last allowed token still counts as a stop.
                if any(t.eos and t.finish_reason == "stop" for t in new[index + 1 : index + 2]):
                    self.finish_reason, self.ended = "stop", True
                break
        done = self.ended or (limit is not None and self.produced >= limit)
        if done:
            # Only a server's own final text can end inside a character, and it says how (U+FFFD).
            self.text += self.decoder.decode(b"", final=True)
        cut = find_stop(self.text, stops, before)
        if cut is not None:
            self.text = self.text[:cut]
            self.finish_reason, self.ended = "stop", True
            done = True
        self.context = self.context.advanced(self.text[before:], ids)
        safe = len(self.text) if done else len(self.text) - stop_prefix_len(self.text, stops)
        if safe <= self.sent:
            return ""
        piece, self.sent = self.text[self.sent : safe], safe
        return piece


    def _score(self, token: Emitted) -> None:
        """Keep the target's scores of `token` (before its text is added: its offset is the text's length)."""
        assert self.scores is not None
        if token.count != 1 or (token.logprob is None and not token.top and token.listed is None):
            self.scores_lost = self.scores_lost or token.count > 0
            return
        last = self.scores[-1] if self.scores else None
        spelled = last.spelled + len(last.text) if last is not None else 0
        self.scores.append(
            TokenScore(text=token.token, data=token.data, logprob=token.logprob, top=token.top, offset=len(self.text), listed=token.listed, spelled=spelled)
        )

    def take_scores(self, final: bool) -> list[TokenScore]:
        """The scores of the tokens whose text has been handed out (all of them once `final`), each once."""
        if self.scores is None:
            return []
        end = len(self.scores)
        if not final:
            # A token is out once the text handed out reaches past its start (a token held back whole
            # waits); the last one may still be cut by a stop string only if the text ends after it.
            end = self.released
            while end < len(self.scores) and self.scores[end].offset < self.sent:
                end += 1
        taken, self.released = self.scores[self.released : end], end
        return taken


def with_pick_scores(tokens: list[Emitted], picks: Sequence[ScoredToken | None]) -> list[Emitted]:
    """Fan-out's tokens with the scores of the calls that picked them (token i: call i's pick), spelled as
    the target spelled them; a token whose pick showed no scores keeps none (the caller's logprobs then
    say so rather than show a placeholder)."""
    scored = []
    for index, token in enumerate(tokens):
        pick = picks[index] if index < len(picks) else None
        if token.eos:
            scored.append(token)
        elif pick is not None and pick.logprob is not None and token_bytes(pick.text) == token.data:
            scored.append(replace(token, token=pick.text, logprob=pick.logprob, top=dict(pick.top or {})))
        else:
            scored.append(replace(token, logprob=None, top=None))
    return scored


def stop_prefix_len(text: str, stops: Sequence[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string."""
    longest = 0
    for stop in stops:
        for size in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:size]):
                longest = size
                break
    return longest


def find_stop(text: str, stops: Sequence[str], new_from: int) -> int | None:
    """Where the earliest stop string begins, searching only matches that involve new text."""
    best: int | None = None
    for stop in stops:
        index = text.find(stop, max(0, new_from - len(stop) + 1))
        if index != -1 and (best is None or index < best):
            best = index
    return best


def within_limit(tokens: list[Emitted], remaining: int | None) -> list[Emitted]:
    """The tokens up to the caller's limit (an end of text right after it is kept: it counts as a stop)."""
    if remaining is None:
        return tokens
    kept: list[Emitted] = []
    used = 0
    for token in tokens:
        if used >= remaining and not token.eos:
            break
        kept.append(token)
        used += 0 if token.eos else token.count
        if token.eos:
            break
    return kept


def complete_characters(tokens: list[Emitted]) -> list[Emitted]:
    """The tokens without the trailing ones that end inside a UTF-8 character: text can only be sent
    back in complete characters. The next round re-derives them from the same text (exact for greedy decoding; a sampled
    one draws the token again, which the caller marks approximate when fewer tokens come back)."""
    data = b"".join(t.data for t in tokens)
    if complete_utf8_prefix(data) == data:
        return tokens
    kept = list(tokens)
    while kept and complete_utf8_prefix(b"".join(t.data for t in kept)) != b"".join(t.data for t in kept):
        kept.pop()
    return kept


def room(window: int | None, prompt_tokens: int | None, produced: int) -> int | None:
    """How many more tokens the target's context window holds after the output so far; None: unknown."""
    if window is None or prompt_tokens is None:
        return None
    return window - prompt_tokens - produced


def token_boundary_split(starts_from_end: frozenset[int], accepted: int, tail: int, starts: Sequence[int]) -> str | None:
    """Why the target read the text so far with other token boundaries than it generated, or None.

    Over a text API the target re-tokenizes what it is sent. Where the prompt's end or a generated
    token's start (`starts`, byte offsets in the output) is no longer a token boundary in the scored
    text (`starts_from_end`: its token starts counted back from its end, over `accepted` bytes of output
    and a draft of `tail` bytes), the target's view of the context differs from the one its own single
    call would have had, so the rest may differ from it too.
    """
    covered = max(starts_from_end, default=0)  # tokens whose bytes the server showed
    for start in starts:
        back = accepted - start + tail
        if start <= accepted and back <= covered and back not in starts_from_end:
            return (
                "approximate: the target re-tokenized the text across a token boundary of its own output "
                f"({accepted - start} bytes before the newest text), so it saw the context split differently "
                "than a single call would have"
            )
    return None


def prompt_count_split(count: int | None, extra: int, continued: bool, prompt_tokens: int | None, produced: int) -> str | None:
    """Why a call on the text so far (plus `extra` target tokens) was billed another count than the
    prompt plus the `produced` tokens the target generated (it re-tokenized its own output), or None.
    `continued`: the call's context holds generated text."""
    if prompt_tokens is None or count is None or (not continued and not extra):
        return None
    expected = prompt_tokens + produced + extra
    if count == expected:
        return None
    return (
        f"approximate: the target re-tokenized the text so far into {count} tokens instead of {expected} "
        "(prompt plus its own output), so it saw the context split differently than a single call would have"
    )


def token_count_split(prompt_counts: Sequence[int | None], accepted: int, continued: bool, prompt_tokens: int | None, produced: int) -> str | None:
    """The same check where no scored prompt is returned (fan-out): each call whose pick was used
    continued the text so far plus `j` draft tokens, each one a target token, so it must have been
    billed the prompt plus `produced + j` tokens; any other count means the target split the text
    differently than its own generation did."""
    for j, count in enumerate(prompt_counts[: accepted + 1]):
        if continued or j:
            reason = prompt_count_split(count, j, continued, prompt_tokens, produced)
            if reason is not None:
                return reason
    return None
