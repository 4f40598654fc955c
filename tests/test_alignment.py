"""`specapi.core.alignment`: token bytes, and finding the tokens that cover a draft at the end of a scored prompt."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specapi.core.alignment import ScoredToken, complete_utf8_prefix, held_text, streamed_pieces, locate_suffix, spans, token_bytes


def toks(*texts: str) -> list[ScoredToken]:
    return [ScoredToken(text=t, logprob=-1.0) for t in texts]


# ----------------------------------------------------------------------------- token_bytes


def test_token_bytes_of_plain_text_is_its_utf8():
    assert token_bytes("héllo") == "héllo".encode()
    assert token_bytes("") == b""


def test_token_bytes_decodes_openai_partial_utf8_spelling():
    # OpenAI spells a token that is part of a character as the literal text  bytes:\xe2\x80
    assert token_bytes(r"bytes:\xe2\x80") == b"\xe2\x80"
    assert token_bytes(r"bytes:\xe2\x80") + token_bytes(r"bytes:\x99") == "\u2019".encode()


def test_token_bytes_is_none_when_the_server_hides_the_bytes():
    assert token_bytes("token_id:12") is None
    assert token_bytes("bytes:\u00e9") is None  # not an escape sequence: cannot be trusted


def test_scored_token_data_refuses_hidden_bytes():
    with pytest.raises(ValueError):
        _ = ScoredToken(text="token_id:5").data


def test_scored_token_distribution_includes_the_token_itself():
    t = ScoredToken(text="b", logprob=-2.0, top={"a": -0.5})
    assert t.distribution() == {"a": -0.5, "b": -2.0}
    listed = ScoredToken(text="a", logprob=-0.7, top={"a": -0.5})
    assert listed.distribution() == {"a": -0.5}  # the list's own value is kept
    assert ScoredToken(text="a").distribution() == {}


# ----------------------------------------------------------------------------- locate_suffix


def test_locate_suffix_exact_cover():
    tokens = toks("He", "llo", " wor", "ld")
    assert locate_suffix(tokens, b" world") == (2, 0)
    assert locate_suffix(tokens, b"ld") == (3, 0)
    assert locate_suffix(tokens, b"Hello world") == (0, 0)


def test_locate_suffix_reports_a_straddling_token():
    tokens = toks("He", "llo", " wor", "ld")
    # "orld": " wor" carries 2 bytes (" w") from before the draft.
    assert locate_suffix(tokens, b"orld") == (2, 2)
    assert locate_suffix(tokens, b"d") == (3, 1)


def test_locate_suffix_refuses_mismatching_bytes():
    tokens = toks("He", "llo", " wor", "ld")
    assert locate_suffix(tokens, b" word") is None
    assert locate_suffix(tokens, b"xHello world") is None  # longer than everything scored


def test_locate_suffix_ignores_extra_tokens_before_the_prompt():
    # A BOS-like token the server puts in front of the prompt does not disturb alignment from the end.
    tokens = toks("<s>", "a", "bc", "d")
    assert locate_suffix(tokens, b"cd") == (2, 1)
    assert locate_suffix(tokens, b"abcd") == (1, 0)


def test_locate_suffix_stops_at_hidden_token_bytes():
    assert locate_suffix(toks("ab", "token_id:7"), b"c") is None


def test_locate_suffix_of_nothing_is_past_the_end():
    assert locate_suffix(toks("a", "b"), b"") == (2, 0)


def test_locate_suffix_with_partial_utf8_tokens():
    tokens = toks("caf", r"bytes:\xc3", r"bytes:\xa9", "!")
    assert locate_suffix(tokens, "é!".encode()) == (1, 0)
    assert locate_suffix(tokens, b"\xa9!") == (2, 0)


@st.composite
def tokenized_texts(draw):
    """A random text (with multi-byte characters), cut into random byte tokens, and a suffix start."""
    text = draw(st.text(alphabet="ab é€😀\n", min_size=1, max_size=20))
    data = text.encode()
    cuts = sorted(draw(st.sets(st.integers(1, len(data) - 1), max_size=len(data) - 1)) if len(data) > 1 else [])
    bounds = [0, *cuts, len(data)]
    pieces = [data[a:b] for a, b in zip(bounds, bounds[1:])]
    start = draw(st.integers(0, len(data) - 1))  # the draft is data[start:], never empty
    return pieces, start


def _spell(piece: bytes) -> str:
    """How a server spells a token: text when it is whole UTF-8, OpenAI's bytes: escape otherwise."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in piece)


@settings(max_examples=300, deadline=None)
@given(case=tokenized_texts())
def test_locate_suffix_finds_the_token_holding_the_first_draft_byte(case):
    pieces, start = case
    tokens = toks(*map(_spell, pieces))
    data = b"".join(pieces)
    found = locate_suffix(tokens, data[start:])
    offsets = [0]
    for piece in pieces:
        offsets.append(offsets[-1] + len(piece))
    index = max(i for i in range(len(pieces)) if offsets[i] <= start)
    assert found == (index, start - offsets[index])


@settings(max_examples=200, deadline=None)
@given(case=tokenized_texts(), flip=st.integers(0, 10_000))
def test_locate_suffix_refuses_any_changed_byte(case, flip):
    pieces, start = case
    data = b"".join(pieces)
    suffix = bytearray(data[start:])
    suffix[flip % len(suffix)] ^= 0x01
    assert locate_suffix(toks(*map(_spell, pieces)), bytes(suffix)) is None


# ----------------------------------------------------------------------------- utf-8 and spans


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"abc", b"abc"),
        (b"ab\xc3", b"ab"),
        ("é".encode(), "é".encode()),
        (b"a\xe2\x82", b"a"),
        ("a€".encode(), "a€".encode()),
        ("😀".encode()[:3], b""),
        (b"", b""),
    ],
)
def test_complete_utf8_prefix_drops_a_trailing_partial_character(data, expected):
    assert complete_utf8_prefix(data) == expected


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet="aé€😀 ", max_size=12), cut=st.integers(0, 60))
def test_complete_utf8_prefix_is_the_longest_whole_prefix(text, cut):
    data = text.encode()[:cut]
    prefix = complete_utf8_prefix(data)
    assert data.startswith(prefix)
    prefix.decode("utf-8")
    assert len(data) - len(prefix) <= 3
    whole = data.decode("utf-8", errors="ignore").encode()
    assert prefix == whole


def test_spans_are_consecutive_byte_ranges():
    assert spans(toks("ab", "é", "c")) == [(0, 2), (2, 4), (4, 5)]
    assert spans(toks("ab", "c"), start=-1) == [(-1, 1), (1, 2)]
    assert spans([]) == []


def test_held_text_gives_a_characters_bytes_to_the_token_that_completes_it() -> None:
    """vLLM renders a token holding part of a character as "": the token that completes it holds all of it."""
    data = "今天".encode()
    assert held_text([b"", "今".encode(), b"", "天".encode()], data, last_holds_rest=False) == [b"", "今".encode(), b"", "天".encode()]


def test_held_text_gives_text_no_token_shows_to_the_empty_token_before_it() -> None:
    """Bytes that make no character show in the server's text as U+FFFD and in no token: the "" token
    before the next shown token holds them, so the pieces spell the text exactly."""
    data = "\ufffdは、".encode()
    pieces = held_text([b"", "は".encode(), "、".encode()], data, last_holds_rest=False)
    assert pieces == ["\ufffd".encode(), "は".encode(), "、".encode()]
    assert b"".join(pieces) == data


def test_held_text_refuses_tokens_that_do_not_spell_the_text() -> None:
    assert held_text([b"a", b"c"], b"abc", last_holds_rest=False) is None  # "b" held by no "" token
    assert held_text([b"x"], b"abc", last_holds_rest=False) is None
    assert held_text([b"ab", b"zz"], b"abc", last_holds_rest=True) == [b"ab", b"c"]  # a token past a cut stop string


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=3), min_size=1, max_size=8))
def test_held_text_of_whole_tokens_is_the_tokens(texts: list[str]) -> None:
    shown = [t.encode() for t in texts]
    assert held_text(shown, b"".join(shown), last_holds_rest=False) == shown


# -- streamed_pieces: the text vLLM's stream adds at each token --------------------------------------------------


@pytest.mark.parametrize(
    ("tokens", "pieces"),
    [
        ([b"\xe4\xb8", b"\xad", b"a"], ["", "中", "a"]),  # a character across two tokens: added at the second
        ([b"\xe4\xb8", b"!"], ["", "\ufffd!"]),  # broken by the next token: U+FFFD, with that token's text
        ([b"a", b"\xf0\x9f", b"\x98"], ["a", "", ""]),  # unfinished at the end: its bytes are left out
        ([b"\xe4\xb8", b"\xe4\xb8", b"\xad"], ["", "", "\ufffd中"]),  # a second start waits with the first
        ([b"\xad", b"a"], ["", "\ufffda"]),  # a continuation byte first
    ],
)
def test_streamed_pieces_add_text_where_the_run_renders_without_a_trailing_replacement(tokens: list[bytes], pieces: list[str]) -> None:
    renders = [b"".join(tokens[: n + 1]).decode("utf-8", errors="replace") for n in range(len(tokens))]
    assert streamed_pieces(renders) == pieces


def test_streamed_pieces_refuse_a_rendering_that_does_not_extend_the_text_so_far() -> None:
    assert streamed_pieces(["ab", "axy"]) is None


@given(st.lists(st.binary(min_size=1, max_size=3), max_size=12))
def test_streamed_pieces_spell_the_run_once_it_renders_whole(tokens: list[bytes]) -> None:
    renders = [b"".join(tokens[: n + 1]).decode("utf-8", errors="replace") for n in range(len(tokens))]
    pieces = streamed_pieces(renders)
    assert pieces is not None and len(pieces) == len(tokens)
    shown = "".join(pieces)
    whole = [r for r in renders if not r.endswith("\ufffd")]
    # What was added is the run's rendering up to the last token at which it rendered whole.
    assert shown == (max(whole, key=len) if whole else "")
    if renders and not renders[-1].endswith("\ufffd"):
        assert shown == renders[-1]
