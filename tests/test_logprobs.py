"""The caller's logprobs speculate: every token's logprob and top list are the target's own, read from the
verification calls (echo, prompt logprobs) and the target-alone steps, equal to what the target alone
returns for the same request (the oracle: the same simulated or toy server, asked directly through the
openai SDK). Paths that cannot score each kept token leave the request to the target alone, and say why.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import httpx2
import openai
import pytest

from specapi import AsyncSpeculativeOpenAI, Endpoint
from specapi.engine.plan import plan
from specapi.parts.probe import Capabilities
from specapi.sim import SimProvider, SimTransport, simulated_endpoints
from test_plan import GREEDY, SAMPLED, Ids, Lists, Picks, Whole, path, request
from toyserver import ToyServer

#: CJK and emoji: byte-level tokens that end inside a character (their `bytes` fields, "bytes:" spellings).
CJK_PROMPT = "🐱 " + "中文测试，龘靐齉。" * 6
CODE = "def fibonacci(n):\n    if n < 2:\n        return n\n"
MESSAGES = [{"role": "user", "content": "中文测试，龘靐齉。" * 6}]


def _sim(profile: str) -> tuple[SimProvider, openai.AsyncOpenAI]:
    provider = SimProvider(capabilities=profile, latency="instant", seed=0)
    sdk = openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", http_client=httpx2.AsyncClient(transport=SimTransport(provider)), max_retries=0)
    return provider, sdk


def _client(provider: SimProvider, **options: Any) -> AsyncSpeculativeOpenAI:
    target, draft = simulated_endpoints(provider=provider)
    return AsyncSpeculativeOpenAI(target=target, draft=draft, **{"policy": "fixed", "num_speculative_tokens": 4, **options})


def same_completion_logprobs(got: Any, own: Any) -> None:
    """Completions arrays: tokens and offsets equal, values and top lists within float rounding."""
    assert got.tokens == own.tokens
    assert got.text_offset == own.text_offset
    assert got.token_logprobs == pytest.approx(own.token_logprobs, abs=1e-9)
    assert [set(t) for t in got.top_logprobs] == [set(t) for t in own.top_logprobs]
    assert all(a == pytest.approx(b, abs=1e-9) for a, b in zip(got.top_logprobs, own.top_logprobs))


def same_chat_logprobs(got: list[Any], own: list[Any]) -> None:
    """Chat items: token, bytes and the top list's tokens in order equal, values within float rounding."""
    assert [(c.token, c.bytes) for c in got] == [(c.token, c.bytes) for c in own]
    assert [c.logprob for c in got] == pytest.approx([c.logprob for c in own], abs=1e-9)
    assert [[(t.token, t.bytes) for t in c.top_logprobs] for c in got] == [[(t.token, t.bytes) for t in c.top_logprobs] for c in own]
    assert [t.logprob for c in got for t in c.top_logprobs] == pytest.approx([t.logprob for c in own for t in c.top_logprobs], abs=1e-9)


async def _completion_stream(stream: Any) -> tuple[str, dict[str, list], str | None]:
    """A streamed completion's text, its chunks' logprobs joined, and its finish reason."""
    text, joined, finish = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}, None
    async for chunk in stream:
        for choice in chunk.choices:
            text += choice.text
            finish = choice.finish_reason or finish
            if choice.logprobs is not None:
                for name in joined:
                    joined[name] += getattr(choice.logprobs, name)
    return text, joined, finish


def _partial_tokens(tokens: list[str]) -> int:
    return sum(t.startswith("bytes:") for t in tokens)


# ----------------------------------------------------------------------------- completions, echo verification


@pytest.mark.parametrize("profile", ["vllm", "sglang"])
@pytest.mark.parametrize("prompt", [CJK_PROMPT, CODE], ids=["cjk", "code"])
async def test_completions_logprobs_speculate_and_equal_the_targets(profile: str, prompt: str) -> None:
    provider, sdk = _sim(profile)
    async with _client(provider, verification="echo") as client, sdk:
        got = await client.completions.create(prompt=prompt, max_tokens=40, temperature=0, logprobs=3)
        own = await sdk.completions.create(model="sim-target", prompt=prompt, max_tokens=40, temperature=0, logprobs=3)
    s = got.speculative
    assert s.verification == "echo" and s.accepted_tokens > 0 and s.exact, s.fallback_reason
    assert got.choices[0].text == own.choices[0].text and got.choices[0].finish_reason == own.choices[0].finish_reason
    same_completion_logprobs(got.choices[0].logprobs, own.choices[0].logprobs)
    assert got.usage.completion_tokens == own.usage.completion_tokens == len(own.choices[0].logprobs.tokens)


async def test_cjk_logprobs_hold_tokens_that_end_inside_a_character() -> None:
    """The CJK case above is a real one: the target's answer holds byte tokens ("bytes:\\x..") whose
    offsets sit where their character starts, and specapi lists them the same way."""
    provider, sdk = _sim("vllm")
    async with _client(provider, verification="echo") as client, sdk:
        got = await client.completions.create(prompt=CJK_PROMPT, max_tokens=40, temperature=0, logprobs=2)
        own = await sdk.completions.create(model="sim-target", prompt=CJK_PROMPT, max_tokens=40, temperature=0, logprobs=2)
    assert _partial_tokens(own.choices[0].logprobs.tokens) > 0
    assert got.speculative.accepted_tokens > 0
    same_completion_logprobs(got.choices[0].logprobs, own.choices[0].logprobs)


async def test_streamed_completions_logprobs_join_to_the_targets() -> None:
    provider, sdk = _sim("vllm")
    async with _client(provider, verification="echo") as client, sdk:
        stream = await client.completions.create(prompt=CJK_PROMPT, max_tokens=40, temperature=0, logprobs=3, stream=True)
        text, joined, finish = await _completion_stream(stream)
        own = await sdk.completions.create(model="sim-target", prompt=CJK_PROMPT, max_tokens=40, temperature=0, logprobs=3)
    assert stream.speculative is not None and stream.speculative.accepted_tokens > 0
    assert (text, finish) == (own.choices[0].text, own.choices[0].finish_reason)
    assert joined["tokens"] == own.choices[0].logprobs.tokens and joined["text_offset"] == own.choices[0].logprobs.text_offset
    assert joined["token_logprobs"] == pytest.approx(own.choices[0].logprobs.token_logprobs, abs=1e-9)
    assert joined["top_logprobs"] == own.choices[0].logprobs.top_logprobs


async def test_logprobs_with_a_stop_string_list_the_tokens_the_target_counts() -> None:
    """The target lists every token it generated, the one that completes the stop string included."""
    provider, sdk = _sim("vllm")
    async with sdk:
        full = await sdk.completions.create(model="sim-target", prompt=CODE, max_tokens=40, temperature=0)
        stop = full.choices[0].text[25:28]
        own = await sdk.completions.create(model="sim-target", prompt=CODE, max_tokens=40, temperature=0, logprobs=2, stop=[stop])
        async with _client(provider, verification="echo") as client:
            got = await client.completions.create(prompt=CODE, max_tokens=40, temperature=0, logprobs=2, stop=[stop])
    assert own.choices[0].finish_reason == "stop"
    assert got.choices[0].text == own.choices[0].text
    same_completion_logprobs(got.choices[0].logprobs, own.choices[0].logprobs)
    assert got.usage.completion_tokens == own.usage.completion_tokens


async def test_sampled_logprobs_are_the_targets_scores_of_the_sampled_text() -> None:
    """Sampled, the text is a draw; its logprobs must be the target's (raw) scores of that text, which the
    target's own echo of the prompt and the text gives."""
    provider, sdk = _sim("vllm")
    async with _client(provider, verification="echo") as client, sdk:
        got = await client.completions.create(prompt=CODE, max_tokens=30, temperature=0.8, logprobs=2, seed=7)
        text = got.choices[0].text
        scored = await sdk.completions.create(model="sim-target", prompt=CODE + text, max_tokens=1, temperature=0, logprobs=2, echo=True)
    assert got.speculative.accepted_tokens > 0 and got.speculative.verification == "echo"
    listed = scored.choices[0].logprobs
    start = listed.text_offset.index(len(CODE))
    count = len(got.choices[0].logprobs.tokens)
    assert got.choices[0].logprobs.tokens == listed.tokens[start : start + count]
    assert got.choices[0].logprobs.token_logprobs == pytest.approx(listed.token_logprobs[start : start + count], abs=1e-9)
    assert all(math.isfinite(v) for v in got.choices[0].logprobs.token_logprobs)


async def test_toy_server_offsets_are_learnt_from_the_first_target_step() -> None:
    """A server specapi does not recognise counts `text_offset` its own way (the toy: from the answer's
    start, as vLLM): the request's first token comes from a target-alone step, whose offsets tell."""
    with ToyServer() as srv:
        target = Endpoint(base_url=srv.base_url, model="target", api_key="x")
        draft = Endpoint(base_url=srv.base_url, model="draft", api_key="x")
        async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy="fixed", num_speculative_tokens=4) as client:
            got = await client.completions.create(prompt="cafe", max_tokens=30, temperature=0, logprobs=3)
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0) as sdk:
            own = await sdk.completions.create(model="target", prompt="cafe", max_tokens=30, temperature=0, logprobs=3)
    assert got.speculative.accepted_tokens > 0, got.speculative.fallback_reason
    assert got.choices[0].text == own.choices[0].text
    same_completion_logprobs(got.choices[0].logprobs, own.choices[0].logprobs)


# ----------------------------------------------------------------------------- chat on vLLM: token ids (the default)


@pytest.mark.parametrize("top", [0, 3])
async def test_chat_logprobs_speculate_and_equal_the_targets(top: int) -> None:
    """vLLM's default path runs chat on the target's token ids, each kept token's entry its own pick's."""
    provider, sdk = _sim("vllm")
    async with _client(provider) as client, sdk:
        got = await client.chat.completions.create(messages=MESSAGES, max_tokens=40, temperature=0, logprobs=True, top_logprobs=top)
        own = await sdk.chat.completions.create(model="sim-target", messages=MESSAGES, max_tokens=40, temperature=0, logprobs=True, top_logprobs=top)
    s = got.speculative
    assert s.verification == "token-ids" and s.accepted_tokens > 0 and s.exact, s.fallback_reason
    assert got.choices[0].message.content == own.choices[0].message.content
    same_chat_logprobs(got.choices[0].logprobs.content, own.choices[0].logprobs.content)
    assert all(len(c.top_logprobs) == top for c in got.choices[0].logprobs.content)
    assert _partial_tokens([c.token for c in own.choices[0].logprobs.content]) > 0  # bytes of part of a character


async def test_streamed_chat_logprobs_join_to_the_targets() -> None:
    provider, sdk = _sim("vllm")
    async with _client(provider) as client, sdk:
        stream = await client.chat.completions.create(messages=MESSAGES, max_tokens=40, temperature=0, logprobs=True, top_logprobs=2, stream=True)
        text, items = "", []
        async for chunk in stream:
            for choice in chunk.choices:
                text += choice.delta.content or ""
                items += choice.logprobs.content if choice.logprobs is not None else []
        own = await sdk.chat.completions.create(model="sim-target", messages=MESSAGES, max_tokens=40, temperature=0, logprobs=True, top_logprobs=2)
    s = stream.speculative
    assert s is not None and s.verification == "token-ids" and s.accepted_tokens > 0 and s.exact, s.fallback_reason
    assert text == own.choices[0].message.content
    same_chat_logprobs(items, own.choices[0].logprobs.content)


# ----------------------------------------------------------------------------- fan-out: each kept token a pick


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_fan_out_picks_carry_the_callers_logprobs(chat: bool) -> None:
    """Each kept token is the pick of a one-token call, whose own logprobs entry is the target's for that
    position. Completions on OpenAI's profile (no echo with logprobs; offsets learnt: the prompt's
    start); chat on vLLM's (OpenAI continues no assistant message)."""
    provider, sdk = _sim("vllm" if chat else "openai")
    async with _client(provider, verification="prefill-fanout") as client, sdk:
        if chat:
            got = await client.chat.completions.create(messages=MESSAGES, max_tokens=40, temperature=0, logprobs=True, top_logprobs=3)
            own = await sdk.chat.completions.create(model="sim-target", messages=MESSAGES, max_tokens=40, temperature=0, logprobs=True, top_logprobs=3)
            assert got.choices[0].message.content == own.choices[0].message.content
            same_chat_logprobs(got.choices[0].logprobs.content, own.choices[0].logprobs.content)
        else:
            got = await client.completions.create(prompt=CJK_PROMPT, max_tokens=40, temperature=0, logprobs=3)
            own = await sdk.completions.create(model="sim-target", prompt=CJK_PROMPT, max_tokens=40, temperature=0, logprobs=3)
            assert got.choices[0].text == own.choices[0].text
            assert own.choices[0].logprobs.text_offset[0] == len(CJK_PROMPT)
            same_completion_logprobs(got.choices[0].logprobs, own.choices[0].logprobs)
    s = got.speculative
    assert s.verification == "prefill-fanout" and s.accepted_tokens > 0 and s.exact, (s.fallback_reason, s.exact_reason)


# ----------------------------------------------------------------------------- where the target alone answers


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_paths_that_cannot_score_kept_tokens_leave_logprobs_to_the_target(chat: bool) -> None:
    """llama.cpp's profile verifies by fan-out: its picks carry no caller-sized lists, and llama-server
    lists one entry per character. The target alone answers, with its own logprobs and the reason."""
    provider, sdk = _sim("llamacpp")
    async with _client(provider) as client, sdk:
        if chat:
            got = await client.chat.completions.create(messages=MESSAGES, max_tokens=30, temperature=0, logprobs=True, top_logprobs=2)
            own = await sdk.chat.completions.create(model="sim-target", messages=MESSAGES, max_tokens=30, temperature=0, logprobs=True, top_logprobs=2)
            same_chat_logprobs(got.choices[0].logprobs.content, own.choices[0].logprobs.content)
        else:
            got = await client.completions.create(prompt=CJK_PROMPT, max_tokens=30, temperature=0, logprobs=2)
            own = await sdk.completions.create(model="sim-target", prompt=CJK_PROMPT, max_tokens=30, temperature=0, logprobs=2)
            assert got.choices[0].logprobs.model_dump() == own.choices[0].logprobs.model_dump()
    s = got.speculative
    assert not s.speculated and s.fallback_reason is not None and s.fallback_reason.startswith("logprobs:")


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_a_streamed_answer_of_the_target_alone_streams_its_own_logprobs(chat: bool) -> None:
    """Where the target alone answers, a streaming caller gets its chunks' own logprobs as they come."""
    provider, sdk = _sim("llamacpp")
    asked: dict[str, Any] = {"max_tokens": 30, "temperature": 0, "stream": True}
    asked |= {"messages": MESSAGES, "logprobs": True, "top_logprobs": 2} if chat else {"prompt": CJK_PROMPT, "logprobs": 2}
    create = (lambda c: c.chat.completions.create) if chat else (lambda c: c.completions.create)
    async with _client(provider) as client, sdk:
        mine = [chunk async for chunk in await create(client)(**asked)]
        theirs = [chunk async for chunk in await create(sdk)(model="sim-target", **asked)]

    def items(chunks: list[Any]) -> tuple[str, list[Any]]:
        text, found = "", []
        for chunk in chunks:
            for choice in chunk.choices:
                text += (choice.delta.content or "") if chat else choice.text
                logprobs = choice.logprobs.model_dump() if choice.logprobs is not None else {}
                found += logprobs.get("content") or []
        return text, found

    assert items(mine) == items(theirs) and items(theirs)[1]
    assert sum(bool(c.choices and c.choices[0].logprobs) for c in mine) > 1  # as they come, not at the end
    assert mine[-1].speculative.fallback_reason.startswith("logprobs:")


async def test_the_longest_top_list_the_server_takes_speculates_too() -> None:
    provider, sdk = _sim("vllm")
    async with _client(provider, verification="echo") as client, sdk:
        got = await client.completions.create(prompt=CODE, max_tokens=10, temperature=0, logprobs=20)
        own = await sdk.completions.create(model="sim-target", prompt=CODE, max_tokens=10, temperature=0, logprobs=20)
    assert got.speculative.accepted_tokens > 0
    same_completion_logprobs(got.choices[0].logprobs, own.choices[0].logprobs)


# ----------------------------------------------------------------------------- the plan's gates (pure)


def test_verification_asks_at_least_the_callers_top_count() -> None:
    planned = plan(request(logprobs=7), path(Lists(), max_logprobs=20), None, top_k=20, has_drafter=True)
    assert planned.speculate and planned.top_k == 7  # greedy needs the argmax only; the caller needs 7
    assert planned.logprob_shape is not None and planned.logprob_shape.top == 7


@pytest.mark.parametrize(
    ("verifier", "fields", "caps", "sampling", "why"),
    [
        (Lists(), {"max_logprobs": 5}, None, GREEDY, "longer than the 5"),
        (Picks(), {}, None, GREEDY, "longer than the 5"),  # fan-out's completions calls list up to 5
        (Ids(), {}, Capabilities(server="vllm"), GREEDY, "token-ids path"),
        (Lists(), {}, Capabilities(server="llama-cpp-python"), GREEDY, "empty strings"),
        (Lists(), {}, Capabilities(server="sglang"), SAMPLED, "raw ones"),
        (Lists(), {}, None, replace(SAMPLED, raw_logprobs=False), "raw ones"),
    ],
    ids=["cap", "fan-out-cap", "token-ids", "llama-cpp-python", "sglang-sampled", "processed"],
)
def test_where_the_callers_logprobs_cannot_be_written_the_target_alone_answers(verifier, fields, caps, sampling, why) -> None:  # type: ignore[no-untyped-def]
    planned = plan(request(sampling, logprobs=6), path(verifier, **fields), caps, top_k=20, has_drafter=True)
    assert not planned.speculate
    assert planned.fallback_reason is not None and planned.fallback_reason.startswith("logprobs:") and why in planned.fallback_reason
    assert planned.logprob_shape is not None  # the target's own list is written as it is


def test_a_whole_answer_path_leaves_logprobs_to_the_target() -> None:
    planned = plan(request(logprobs=2), path(None, whole=Whole()), None, top_k=20, has_drafter=True)
    assert planned.path.whole is None and not planned.speculate
    assert planned.fallback_reason is not None and "prefix-match" in planned.fallback_reason


@pytest.mark.parametrize(
    ("server", "base", "chosen", "learn"),
    [("vllm", 0, True, False), ("sglang", None, False, False), (None, len("def f(x):"), False, True)],
)
def test_the_offsets_and_lists_follow_the_server(server, base, chosen, learn) -> None:  # type: ignore[no-untyped-def]
    caps = Capabilities(server=server) if server else None
    shape = plan(request(logprobs=2), path(Lists()), caps, top_k=20, has_drafter=True).logprob_shape
    assert shape is not None and (shape.offset_base, shape.with_chosen, shape.learn_offsets) == (base, chosen, learn)


@pytest.mark.parametrize(
    "arguments",
    [{"top_logprobs": 2}, {"logprobs": True, "top_logprobs": 21}, {"logprobs": "yes"}],
    ids=repr,
)
async def test_bad_chat_logprobs_arguments_fail_before_any_request(arguments: dict[str, Any]) -> None:
    provider, _ = _sim("vllm")
    async with _client(provider) as client:
        with pytest.raises(openai.BadRequestError):
            await client.chat.completions.create(messages=MESSAGES, max_tokens=5, temperature=0, **arguments)
    assert [c for c in provider.calls if c.model == "sim-target" and "logprobs" in str(c.body)] == []


# ----------------------------------------------------------------------------- completions on vLLM: token ids (the default)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("prompt", [CJK_PROMPT, CODE], ids=["cjk", "code"])
async def test_completions_logprobs_on_vllm_speculate_on_token_ids(prompt: str, stream: bool) -> None:
    """With the caller's logprobs, vLLM's default path stays on token ids and speculates: each kept
    token's entry is its own pick's or scored position's, the answer the target alone's."""
    provider, sdk = _sim("vllm")
    async with _client(provider) as client, sdk:
        asked = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "logprobs": 3}
        own = await sdk.completions.create(model="sim-target", **asked)
        if stream:
            response = await client.completions.create(**asked, stream=True)
            text, joined, finish = await _completion_stream(response)
            got: Any = openai.types.Completion.model_validate(
                {"id": "x", "created": 0, "model": "m", "object": "text_completion",
                 "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": joined}]}
            )  # fmt: skip
            s = response.speculative
        else:
            got = await client.completions.create(**asked)
            s = got.speculative
    assert s is not None and s.verification == "token-ids" and s.accepted_tokens > 0 and s.exact, (s and s.fallback_reason)
    assert (got.choices[0].text, got.choices[0].finish_reason) == (own.choices[0].text, own.choices[0].finish_reason)
    same_completion_logprobs(got.choices[0].logprobs, own.choices[0].logprobs)


def test_a_chat_list_is_read_back_from_a_completions_entry_where_it_can_be() -> None:
    """vLLM's completions top object merges entries rendered alike (tokens holding part of a character are
    all "" there), keeping the last value: a chat list of two is recovered, a longer one is not."""
    from specapi.core.alignment import Listed
    from specapi.dialects.logprobs import chat_listed

    whole = Listed((("a", -0.1), ("b", -2.0), ("c", -3.0)), collapsed=True)
    assert chat_listed(whole, "a", -0.1, 2) == Listed((("a", -0.1), ("b", -2.0)))
    assert chat_listed(Listed((("", -3.6),), collapsed=True), "", -3.5, 2) == Listed((("", -3.5), ("", -3.6)))
    assert chat_listed(Listed((("", -3.6), ("x", -4.0)), collapsed=True), "", -3.5, 3) is None
    assert chat_listed(Listed((("", -3.6),), collapsed=True), "", -3.5, 0) == Listed(())
    assert chat_listed(Listed((("", -3.5), ("", -3.6))), "", -3.5, 2) == Listed((("", -3.5), ("", -3.6)))  # by id: every one


def test_a_steps_tokens_hold_the_text_as_vllm_renders_them() -> None:
    """Observed on real vLLM: a token holding part of a character renders as "" (its bytes wait for the
    token that ends the character, which renders as the whole character), bytes that make no character
    show as U+FFFD in the text only, and the end of text is listed by its name, outside the text."""
    from specapi.dialects.base import Generated
    from specapi.dialects.logprobs import step_entries

    logprobs = {
        "tokens": ["", "。", "", "樇", "</s>"],
        "token_logprobs": [-3.5, -3.6, -2.7, -2.6, -0.5],
        "top_logprobs": [{"": -3.6}, {"。": -3.6, "ミ": -3.8}, {"": -3.5}, {"樇": -2.6, "": -3.5}, {"</s>": -0.5, "\n": -1.0}],
        "text_offset": [0, 0, 1, 1, 2],
    }
    text = "\ufffd。樇"
    generated = Generated(ids=(958, 990, 167, 234, 2), data=text.encode(), finish_reason="stop", prompt_tokens=5, completion_tokens=5, logprobs=logprobs)
    tokens = step_entries(generated, False, 2)
    assert tokens is not None
    assert [t.token for t in tokens] == logprobs["tokens"]
    assert [t.data for t in tokens] == ["\ufffd".encode(), "。".encode(), b"", "樇".encode(), b""]
    assert [t.ids for t in tokens] == [(958,), (990,), (167,), (234,), (2,)]
    chat = step_entries(generated, True, 2)
    assert chat is not None and chat[0].listed is not None and chat[0].listed.pairs == (("", -3.5), ("", -3.6))
    assert step_entries(replace(generated, data=b"other"), False, 2) is None  # entries that do not spell the text
