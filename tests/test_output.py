"""output.py: the text of an answer as tokens arrive, with hand-made token lists (no HTTP).

Characters of several bytes (CJK, emoji, a combining mark) split across tokens, stop strings that
arrive in pieces, the caller's limit, and the checks that the target read its own output back with the
token boundaries it generated."""

from __future__ import annotations

from specapi.core.acceptance import Emitted
from specapi.core.context import Context
from specapi.engine.output import (
    Output,
    complete_characters,
    find_stop,
    prompt_count_split,
    room,
    stop_prefix_len,
    token_boundary_split,
    token_count_split,
    within_limit,
)


def tok(data: bytes | str, count: int = 1) -> Emitted:
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return Emitted(token=raw.decode("utf-8", errors="replace"), data=raw, count=count)


def end(reason: str = "stop", count: int = 1) -> Emitted:
    return Emitted(token="", data=b"", eos=True, finish_reason=reason, count=count)


def output(max_tokens: int | None = None, stop: tuple[str, ...] = ()) -> Output:
    return Output(start=Context(prompt="p"), max_tokens=max_tokens, stop=stop)


# ----------------------------------------------------------------------------- characters split across tokens


def test_a_cjk_character_split_across_tokens_is_handed_out_once_whole():
    out = output()
    zhong = "中".encode("utf-8")  # e4 b8 ad
    assert out.add([tok(zhong[:2])]) == ""
    assert out.text == "" and out.produced == 1
    assert out.add([tok(zhong[2:]), tok("文")]) == "中文"
    assert out.text == "中文" and out.produced == 3 and out.context.accepted == "中文"
    assert not out.invalid_bytes


def test_an_emoji_in_four_one_byte_tokens_waits_for_its_last_byte():
    out = output()
    grin = "😀".encode("utf-8")
    pieces = [out.add([tok(grin[i : i + 1])]) for i in range(4)]
    assert pieces == ["", "", "", "😀"]
    assert out.produced == 4


def test_a_combining_mark_split_across_tokens_follows_its_base_letter():
    out = output()
    mark = "\u0301".encode("utf-8")  # cc 81: the letter goes out, the half mark waits
    assert out.add([tok(b"e" + mark[:1])]) == "e"
    assert out.add([tok(mark[1:])]) == "\u0301"
    assert out.text == "e\u0301"


def test_bytes_that_can_never_be_utf8_are_marked_and_shown_as_replacement():
    out = output()
    out.add([tok(b"a\xff")])
    assert out.invalid_bytes and out.text == "a\ufffd"
    clean = output()
    clean.add([tok("\ufffd")])  # a real U+FFFD the target wrote is text, not invalid bytes
    assert not clean.invalid_bytes


def test_an_unfinished_character_at_the_end_of_text_is_rendered_as_replacement():
    out = output()
    out.add([tok("ok"), tok("中".encode("utf-8")[:2]), end()])
    assert out.ended and out.finish_reason == "stop" and out.text == "ok\ufffd"


def test_complete_characters_drops_the_trailing_tokens_that_end_inside_a_character():
    zhong = "中".encode("utf-8")
    tokens = [tok("a"), tok(zhong[:1]), tok(zhong[1:2])]
    assert complete_characters(tokens) == tokens[:1]
    whole = [tok("a"), tok(zhong[:1]), tok(zhong[1:])]
    assert complete_characters(whole) == whole
    assert complete_characters([tok(b"e\xcc")]) == []  # a token cannot be split: it waits whole
    grin = "😀".encode("utf-8")
    assert complete_characters([tok(grin[:3]), tok(grin[3:] + b"!")]) == [tok(grin[:3]), tok(grin[3:] + b"!")]


def test_token_starts_record_where_single_tokens_began_in_bytes():
    out = output()
    out.add([tok("中"), tok("ab", count=2), tok("x")])
    # "中" (3 bytes) starts at the prompt's end (0); a step of 2 tokens at once says nothing of where
    # its tokens begin, so only the single token after it (at byte 5) adds a start
    assert out.token_starts == [0, 5]


# ----------------------------------------------------------------------------- stop strings


def test_a_tail_that_could_grow_into_a_stop_string_is_held_back():
    out = output(stop=("END",))
    assert out.add([tok("abcE")]) == "abc"
    assert out.add([tok("N")]) == ""
    assert out.add([tok("D and more")]) == ""
    assert out.ended and out.finish_reason == "stop" and out.text == "abc"


def test_a_held_tail_that_does_not_become_the_stop_string_is_sent():
    out = output(stop=("END",))
    assert out.add([tok("abcE")]) == "abc"
    assert out.add([tok("x")]) == "Ex"
    assert not out.ended


def test_a_cjk_stop_string_cuts_the_text_and_later_tokens_of_the_round_are_not_counted():
    out = output(stop=("。",))
    out.add([tok("你好"), tok("。"), tok("再见")])
    assert out.text == "你好" and out.finish_reason == "stop" and out.ended
    assert out.produced == 2  # the stop string's token counts, the tokens after it were never the target's


def test_stop_prefix_len_and_find_stop():
    assert stop_prefix_len("abcEN", ("END",)) == 2
    assert stop_prefix_len("abc", ("END",)) == 0
    assert stop_prefix_len("中文。", ("。。", "x")) == 1
    assert find_stop("xxENDyy", ("END",), 4) == 2  # a match involving new text (from 4 on)
    assert find_stop("xxENDyy", ("END",), 5) is None  # the match lies wholly in old text
    assert find_stop("a😀b😀", ("b😀", "😀"), 0) == 1  # the earliest of several


# ----------------------------------------------------------------------------- the caller's limit


def test_the_limit_stops_the_text_at_max_tokens():
    out = output(max_tokens=2)
    assert out.add([tok("a"), tok("b"), tok("c")]) == "ab"
    assert out.produced == 2 and out.remaining == 0 and out.finish_reason == "length"


def test_an_end_of_text_right_after_the_last_allowed_token_counts_as_a_stop():
    out = output(max_tokens=2)
    out.add([tok("a"), tok("b"), end()])
    assert out.ended and out.finish_reason == "stop"


def test_within_limit_counts_tokens_a_step_returned_at_once():
    tokens = [tok("ab", count=2), tok("c"), tok("d")]
    assert within_limit(tokens, None) == tokens
    assert within_limit(tokens, 3) == tokens[:2]
    assert within_limit([tok("a"), end(), tok("b")], 1) == [tok("a"), end()]  # the end right after counts
    assert within_limit([tok("a"), tok("b")], 0) == []


def test_restart_after_keeps_the_text_the_caller_has():
    out = output()
    out.add([tok("héllo"), tok(" 世界")])
    out.restart_after(3)
    assert out.text == "hél" and out.sent == 3 and out.produced == 0
    assert out.context.accepted == "hél" and out.token_starts == [0]
    assert out.add([tok("p!")]) == "p!"


def test_room_left_in_the_context_window():
    assert room(100, 30, 20) == 50
    assert room(None, 30, 20) is None
    assert room(100, None, 20) is None


# ----------------------------------------------------------------------------- exactness checks


def test_token_boundary_split_finds_a_generated_token_start_the_target_merged_over():
    # 6 bytes of output, a 3-byte draft; the output's tokens began at 0 and 3
    assert token_boundary_split(frozenset({3, 6, 9}), 6, 3, [0, 3]) is None
    reason = token_boundary_split(frozenset({3, 9}), 6, 3, [0, 3])
    assert reason is not None and "3 bytes before the newest text" in reason
    # a start further back than the tokens the server showed cannot be checked
    assert token_boundary_split(frozenset({3}), 6, 3, [0]) is None


def test_prompt_count_split_compares_the_billed_prompt_with_prompt_plus_output():
    assert prompt_count_split(15, 0, True, 10, 5) is None
    reason = prompt_count_split(16, 0, True, 10, 5)
    assert reason is not None and "16 tokens instead of 15" in reason
    assert prompt_count_split(99, 0, False, 10, 0) is None  # the prompt alone: nothing generated to re-read
    assert prompt_count_split(None, 0, True, 10, 5) is None and prompt_count_split(16, 0, True, None, 5) is None
    assert "12 tokens instead of 11" in (prompt_count_split(12, 1, False, 10, 0) or "")


def test_token_count_split_checks_each_fanout_call_whose_pick_was_used():
    assert token_count_split((15, 16, 18), 1, True, 10, 5) is None  # the third call's pick was not used
    reason = token_count_split((15, 16, 18), 2, True, 10, 5)
    assert reason is not None and "18 tokens instead of 17" in reason
    assert token_count_split((99, 11), 1, False, 10, 0) is None  # nothing generated yet: the first call is the prompt
