"""`specapi.dialects.logprobs`: the logprob payload shapes of providers.md, read into `ScoredToken`s."""

from __future__ import annotations

import pytest

from specapi.dialects.logprobs import WireError, chat_tokens, completion_tokens, prompt_logprob_tokens
from specapi.core.alignment import ScoredToken


def test_openai_completion_arrays_with_echo():
    # OpenAI / vLLM echo: position 0 has null logprob and null top list.
    payload = {
        "tokens": ["Hello", " world", "!"],
        "token_logprobs": [None, -1.5, -0.25],
        "top_logprobs": [None, {" world": -1.5, " there": -0.9}, {"!": -0.25, ".": -1.8}],
        "text_offset": [0, 5, 11],
    }
    tokens = completion_tokens(payload)
    assert [t.text for t in tokens] == ["Hello", " world", "!"]
    assert tokens[0].logprob is None and tokens[0].top is None
    assert tokens[1].logprob == -1.5
    assert tokens[1].top == {" world": -1.5, " there": -0.9}
    assert tokens[2].distribution() == {"!": -0.25, ".": -1.8}


def test_completion_arrays_without_top_lists():
    tokens = completion_tokens({"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2], "top_logprobs": None})
    assert tokens == [ScoredToken("a", -0.1), ScoredToken("b", -0.2)]
    assert all(t.top is None for t in tokens)


def test_llama_cpp_chat_shaped_completion_logprobs():
    payload = {
        "content": [
            {"token": "Hi", "logprob": -0.3, "bytes": [72, 105], "top_logprobs": [{"token": "Hi", "logprob": -0.3}, {"token": "Yo", "logprob": -1.6}]},
            {"token": "!", "logprob": -0.05, "bytes": [33], "top_logprobs": []},
        ]
    }
    tokens = completion_tokens(payload)
    assert [t.text for t in tokens] == ["Hi", "!"]
    assert tokens[0].top == {"Hi": -0.3, "Yo": -1.6}
    assert tokens[1].top == {} and tokens[1].distribution() == {"!": -0.05}


def test_chat_content_items_skip_alternatives_without_logprob():
    tokens = chat_tokens([{"token": "a", "logprob": -1.0, "top_logprobs": [{"token": "b", "logprob": None}, {"token": "c", "logprob": -2.0}]}])
    assert tokens[0].top == {"c": -2.0}


@pytest.mark.parametrize(
    "payload",
    [
        {"tokens": ["a", "b"], "token_logprobs": [-0.1], "top_logprobs": [None, None]},
        {"tokens": ["a", "b"], "token_logprobs": [-0.1, -0.2], "top_logprobs": [None]},
        {"tokens": ["a"], "token_logprobs": [-0.1, -0.2]},
    ],
)
def test_mismatched_array_lengths_are_refused(payload):
    with pytest.raises(WireError, match="length"):
        completion_tokens(payload)


@pytest.mark.parametrize("payload", [None, [], {"tokens": ["a"]}, {"token_logprobs": [-1.0]}, {"tokens": "ab", "token_logprobs": None}])
def test_missing_completion_logprobs_are_refused(payload):
    with pytest.raises(WireError):
        completion_tokens(payload)


@pytest.mark.parametrize("content", [None, [{"logprob": -1.0}], ["a"]])
def test_malformed_chat_content_is_refused(content):
    with pytest.raises(WireError):
        chat_tokens(content)


def test_wire_error_is_a_value_error():
    assert issubclass(WireError, ValueError)


# ----------------------------------------------------------------------------- vLLM prompt_logprobs


def test_vllm_prompt_logprobs_with_prompt_token_ids():
    entries = [
        None,
        {"7": {"logprob": -0.5, "rank": 1, "decoded_token": "b"}, "3": {"logprob": -1.2, "rank": 2, "decoded_token": "x"}},
        {"9": {"logprob": -2.5, "rank": 3, "decoded_token": "c"}, "1": {"logprob": -0.2, "rank": 1, "decoded_token": "d"}},
    ]
    tokens = prompt_logprob_tokens(entries, [4, 7, 9])
    assert [t.text for t in tokens] == ["", "b", "c"]
    assert tokens[0].logprob is None and tokens[0].top is None
    assert tokens[1].logprob == -0.5 and tokens[1].distribution() == {"b": -0.5, "x": -1.2}
    assert tokens[2].logprob == -2.5 and tokens[2].distribution() == {"d": -0.2, "c": -2.5}


@pytest.mark.parametrize(
    ("entries", "ids"),
    [
        ([None, {"5": {"logprob": -1.0, "rank": 1, "decoded_token": "a"}}], [1]),  # lengths differ
        ([None, None], [1, 2]),  # a hole after position 0
        ([None, {"6": {"logprob": -1.0, "rank": 1, "decoded_token": "a"}}], [1, 5]),  # the prompt token is absent
        ([None, ["not", "a", "mapping"]], [1, 5]),
        (None, [1]),
        ([None], None),
    ],
)
def test_malformed_prompt_logprobs_are_refused(entries, ids):
    with pytest.raises(WireError):
        prompt_logprob_tokens(entries, ids)
