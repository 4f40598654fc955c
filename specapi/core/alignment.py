"""Token alignment: where a draft's text sits in a target's token list, in bytes.

Servers disagree on `text_offset` (from the prompt start, from the generated text, -1, code points or
bytes: see providers.md), so offsets are never trusted. Positions are found from the end of the scored
prompt instead: the prompt always ends with the draft text, so walking back over the token bytes finds
the tokens that cover it, and comparing those bytes with the draft proves the alignment or refutes it.
"""

from __future__ import annotations

import codecs
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Listed", "ScoredToken", "token_bytes", "locate_suffix", "complete_utf8_prefix", "spans", "held_text", "streamed_pieces"]


def token_bytes(token: str) -> bytes | None:
    """The bytes a token string stands for; None when the server hid them (e.g. "token_id:123").

    OpenAI spells tokens that are partial UTF-8 as "bytes:\\xe2\\x80"; such strings are decoded here.
    """
    if token.startswith("bytes:"):
        try:
            return codecs.escape_decode(token[len("bytes:") :].encode("ascii"))[0]
        except (ValueError, UnicodeEncodeError):
            return None
    if token.startswith("token_id:"):
        return None
    return token.encode("utf-8")


@dataclass(frozen=True)
class Listed:
    """A position's top entries as the target alone lists them for the caller: `(token, logprob)` pairs
    in the server's order. `collapsed`: read from a completions top-list object, where entries
    rendered alike (tokens holding part of a character, all `""` on vLLM) share one key, the last one's
    value kept; else every entry is there (vLLM's prompt logprobs, keyed by id)."""

    pairs: tuple[tuple[str, float], ...]
    collapsed: bool = False


@dataclass(frozen=True)
class ScoredToken:
    """A token at one position, with its logprob and the top alternatives a server listed there."""

    text: str
    logprob: float | None = None
    top: Mapping[str, float] | None = field(default=None, compare=False)
    #: The token's id in the server's vocabulary, when the server showed it.
    id: int | None = field(default=None, compare=False)
    #: The whole distribution the token was drawn from, by id, when a server listed it after its
    #: sampler chain (llama.cpp's `post_sampling_probs`, whose list covers the chain's support).
    drawn_from: Mapping[int, float] | None = field(default=None, compare=False)
    #: Other paths of ids the draft proposes from this position on, instead of this token and the ones
    #: after it (its next most likely ids, its sampled chains and the ids they list): with the draft's
    #: tokens they make a tree of proposals (a draft on token ids; see `drafttree.DraftTree`).
    branches: tuple[tuple[int, ...], ...] = field(default=(), compare=False)

    @property
    def data(self) -> bytes:
        data = token_bytes(self.text)
        if data is None:
            raise ValueError(f"token {self.text!r} does not reveal its bytes")
        return data

    def distribution(self) -> dict[str, float]:
        """The listed alternatives plus the token itself (a server always scores the token it saw)."""
        listed = dict(self.top or {})
        if self.logprob is not None:
            listed.setdefault(self.text, self.logprob)
        return listed

    def listed(self) -> dict[str, float]:
        """The server's top list alone: the head of the distribution (nothing unseen is likelier)."""
        return dict(self.top or {})

    def scored(self) -> dict[str, float]:
        """The token itself with its own logprob, which may lie outside the list."""
        return {} if self.logprob is None else {self.text: self.logprob}


def locate_suffix(tokens: Sequence[ScoredToken], suffix: bytes) -> tuple[int, int] | None:
    """Find the tokens that cover the last `len(suffix)` bytes.

    Returns `(index, straddle)`: `tokens[index:]` cover `suffix`, and the first of them also carries
    `straddle` bytes from before it (a token that merges context and draft). None when the bytes do not
    match: the server tokenized or spelled something that specapi cannot align, so nothing may be trusted.
    """
    if not suffix:
        return (len(tokens), 0)
    covered = 0
    pieces: list[bytes] = []
    for index in range(len(tokens) - 1, -1, -1):
        data = token_bytes(tokens[index].text)
        if data is None:
            return None
        pieces.append(data)
        covered += len(data)
        if covered >= len(suffix):
            joined = b"".join(reversed(pieces))
            if not joined.endswith(suffix):
                return None
            return (index, covered - len(suffix))
    return None


def complete_utf8_prefix(data: bytes) -> bytes:
    """The longest prefix of `data` that decodes as UTF-8 (drops a trailing partial character)."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            data[:cut].decode("utf-8")
            return data[:cut]
        except UnicodeDecodeError:
            continue
    return b""


def spans(tokens: Sequence[ScoredToken], start: int = 0) -> list[tuple[int, int]]:
    """Byte spans `[begin, end)` of consecutive tokens, the first beginning at `start`."""
    result = []
    position = start
    for token in tokens:
        end = position + len(token.data)
        result.append((position, end))
        position = end
    return result


def held_text(shown: Sequence[bytes], data: bytes, *, last_holds_rest: bool) -> list[bytes] | None:
    """The bytes of `data` (a server's generated text) each token holds, where `shown` is what each token
    renders as. A token rendered as "" (part of a character) holds none, the token that completes the
    character holds all of it, and text no token shows (U+FFFD for bytes that make no character) goes
    to the "" token before it. `last_holds_rest`: the last token holds whatever is left (the end of text
    shown by its name, or a token past a stop string the server cut). None where the tokens do not
    spell the text so."""
    pieces: list[bytes] = []
    cursor, empty = 0, None  # where the bytes not yet held start; the last token showing none
    for index, piece in enumerate(shown):
        found = data.find(piece, cursor) if piece else -1
        if piece and found >= 0 and (found == cursor or empty is not None):
            if found > cursor:
                pieces[empty] += data[cursor:found]  # type: ignore[index]
            pieces.append(piece)
            cursor, empty = found + len(piece), None
        elif piece and index == len(shown) - 1 and last_holds_rest:
            pieces.append(data[cursor:])
            cursor = len(data)
        elif piece:
            return None
        else:
            empty = len(pieces)
            pieces.append(b"")
    if cursor < len(data):
        if empty is None:
            return None
        pieces[empty] += data[cursor:]
    return pieces


def streamed_pieces(renders: Sequence[str]) -> list[str] | None:
    """What each of a run of generated tokens adds to the text as vLLM streams it, where `renders[i]` is
    the server's rendering of the run's first i + 1 tokens together (U+FFFD for bytes that make no
    character yet). A token adds text only where the run so far renders without a trailing U+FFFD (its
    character is finished, or shown as U+FFFD once a later byte breaks it); until then it adds "", and
    a run that ends so leaves those bytes out of the text. None where a rendering does not extend the text
    already added (a tokenizer whose rendering of a run is not its prefix's plus more)."""
    pieces: list[str] = []
    shown = ""
    for render in renders:
        if len(render) > len(shown) and not render.endswith("\ufffd"):
            if not render.startswith(shown):
                return None
            pieces.append(render[len(shown) :])
            shown = render
        else:
            pieces.append("")
    return pieces
