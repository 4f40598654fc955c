"""The default path on real vLLM: the target's own token ids, exact, never rewritten for re-tokenization.

On vLLM specapi's default verification keeps the context as the target's token ids (the prompt tokenized
once by the server, a chat's messages rendered and tokenized by its `/tokenize`), and checks a draft by
the scoring that recomputes least (one prompt scored with prompt logprobs, or K + 1 prompts on the
cached context). The target never reads text back, so it never sees its own output split at other token
boundaries, and no answer is written again alone for that reason.

Over code, prose, Chinese, Japanese, emoji and trailing whitespace (tests/real/vllm_prompts.py),
completions and chat, plain and streamed, greedy: text, finish_reason and usage equal the target
alone's. And each round is one target request, counted by the server itself (`/metrics`).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx2
import pytest

import vllm_prompts
from real_helpers import ServerPair, client_for, oracle_post, oracle_stream, within_deadline

MAX_TOKENS = 32
COMPLETIONS = vllm_prompts.completion_prompts()
CHATS = vllm_prompts.chat_messages()
#: The tokens a fixed policy drafts a round: rounds happen whatever the default policy would predict of
#: these cheap tiny models (it turns speculation off where the target alone is faster).
FIXED = {"policy": "fixed"}
#: Prompts in flight at once (vLLM batches concurrent requests).
CONCURRENCY = 8
REWRITE = "re-read its own output"


def _cases() -> list[tuple[bool, Any]]:
    return [(False, p) for p in COMPLETIONS] + [(True, m) for m in CHATS]


async def _own(pair: ServerPair, chat: bool, stream: bool, request: dict[str, Any]) -> tuple[str, str | None, tuple[int, int]]:
    """The target alone's text, finish_reason and usage for the request."""
    path = "/chat/completions" if chat else "/completions"
    if not stream:
        data = await oracle_post(pair.target, path, request)
        choice = data["choices"][0]
        text = (choice["message"]["content"] or "") if chat else choice["text"]
        usage = data["usage"]
        return text, choice["finish_reason"], (usage["prompt_tokens"], usage["completion_tokens"])
    pieces, finish, usage = [], None, None
    for chunk in await oracle_stream(pair.target, path, {**request, "stream_options": {"include_usage": True}}):
        usage = chunk.get("usage") or usage
        for choice in chunk.get("choices") or []:
            pieces.append(((choice.get("delta") or {}).get("content") or "") if chat else (choice.get("text") or ""))
            finish = choice.get("finish_reason") or finish
    assert usage is not None
    return "".join(pieces), finish, (usage["prompt_tokens"], usage["completion_tokens"])


async def _specapi(client: Any, chat: bool, stream: bool, request: dict[str, Any]) -> tuple[str, str | None, tuple[int, int], Any]:
    create = client.chat.completions.create if chat else client.completions.create
    if not stream:
        result = await create(**request)
        choice = result.choices[0]
        text = (choice.message.content or "") if chat else choice.text
        return text, choice.finish_reason, (result.usage.prompt_tokens, result.usage.completion_tokens), result.speculative
    result = await create(**request, stream=True, stream_options={"include_usage": True})
    pieces, finish, usage = [], None, None
    async for chunk in result:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            pieces.append(((choice.delta.content or "") if chat else choice.text) or "")
            finish = choice.finish_reason or finish
    assert usage is not None, "the stream carried no usage"
    return "".join(pieces), finish, (usage.prompt_tokens, usage.completion_tokens), result.speculative


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_default_path_equals_the_target_alone_and_never_rewrites(vllm: ServerPair, stream: bool) -> None:
    """>= 40 prompts (streamed: every third), completions and chat: the default client's text,
    finish_reason and usage are the target alone's; no answer is rewritten for re-tokenization."""
    cases = _cases() if not stream else _cases()[::3]
    rewrites, rounds, failures = 0, 0, []
    semaphore = asyncio.Semaphore(CONCURRENCY)
    async with client_for(vllm, **FIXED) as client:

        async def both(chat: bool, prompt: Any) -> tuple[Any, Any]:
            request = {"messages" if chat else "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
            async with semaphore:
                own = await _own(vllm, chat, stream, request)
                return own, await within_deadline(_specapi(client, chat, stream, request), f"chat={chat} stream={stream} {prompt!r}")

        answers = await asyncio.gather(*(both(chat, prompt) for chat, prompt in cases))
        for (chat, prompt), (own, (text, finish, usage, stats)) in zip(cases, answers):
            rewrites += REWRITE in (stats.fallback_reason or "")
            rounds += stats.num_rounds
            if (text, finish, usage) != own or not stats.exact:
                failures.append((chat, prompt, (text, finish, usage), own, stats.verification, stats.exact_reason, stats.fallback_reason))
            if stats.speculated:
                assert stats.verification == "token-ids", (prompt, stats.verification, stats.fallback_reason)
    assert not failures, f"{len(failures)} of {len(cases)} differ from the target alone; first: {failures[0]}"
    assert rewrites == 0
    assert len(cases) >= (40 if not stream else 20) and rounds >= len(cases)


def _engine_requests(root: str) -> float:
    """The requests the server's engine finished (`vllm:request_success_total`, every finish reason):
    one per prompt, a request of K + 1 prompts counting K + 1."""
    text = httpx2.get(root + "/metrics", timeout=10.0).text
    return sum(float(m.group(1)) for m in re.finditer(r"^vllm:request_success_total\{[^}]*\} ([0-9.e+]+)$", text, re.M))


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
async def test_one_target_request_a_round(vllm: ServerPair, chat: bool) -> None:
    """Where the draft is checked by one scored prompt (short contexts), a round is one request for the
    server's engine: counted by the server, every target
    request specapi made (the prompt's tokenize call aside) is one engine request, and rounds happened."""
    # A short prompt: its contexts stay under 60 tokens, which one scored prompt checks whatever the
    # server's block size (16 or more; scoring.choose_scoring), so every round is one engine request. Its
    # answer is ASCII: a token that ends inside a character is drawn again by a plain step (more requests).
    prompt = [{"role": "user", "content": "List three colours."}] if chat else "class Point:\n"
    request = {"messages" if chat else "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    async with client_for(vllm, **FIXED) as client:
        await _specapi(client, chat, False, request)  # the probe, once per client
        before = _engine_requests(vllm.target.root)
        *_, stats = await _specapi(client, chat, False, request)
        after = _engine_requests(vllm.target.root)
    assert stats.verification == "token-ids" and stats.num_rounds >= 2, stats
    tokenize = 1
    assert after - before == stats.target.requests - tokenize
    assert stats.target.requests - tokenize <= stats.num_rounds + 2  # + a plain step or two (the last tokens)
