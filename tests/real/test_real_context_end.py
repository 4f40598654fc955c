"""The end of the context window on the real llama-server: a completions request without `max_tokens`
runs until the window is full (finish "length"), and specapi's text is the target alone's to the last
character, plain and streamed, speculating every round (fixed policy) or as the default policy decides.

The prompt fills most of the slot's window (1024 tokens) and ends where the tiny target's greedy walk
runs on for about 420 tokens without an end of text, so the window ends the answer; the walk passes
CJK characters split over tokens (each token ends one character and begins the next), so steps of the
target alone end, and start, inside characters.
"""

from __future__ import annotations

import pytest

from real_helpers import ServerPair, oracle_post, speculate

#: Prompt words before the walk's start: 250 gives a 753-token prompt, so the window leaves 271 tokens.
WORDS = [200, 250, 300]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("policy", ["fixed", "adaptive"])
@pytest.mark.parametrize("words", WORDS)
async def test_a_request_to_the_end_of_the_window_is_the_target_alones_text(ls: ServerPair, words: int, policy: str, stream: bool) -> None:
    request = {"prompt": "word " * words + "The model", "temperature": 0}
    alone = await oracle_post(ls.target, "/completions", request)
    choice = alone["choices"][0]
    assert choice["finish_reason"] == "length" and alone["usage"]["prompt_tokens"] + alone["usage"]["completion_tokens"] == 1024
    answer = await speculate(ls, chat=False, stream=stream, client_options={"policy": policy}, **request)
    assert answer.text == choice["text"], answer.describe()
    assert answer.finish_reason == "length" and answer.stats.exact
    if policy == "fixed":
        assert answer.stats.num_rounds > 0  # speculation ran before the window's end handed over
