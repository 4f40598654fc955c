"""llama-server's native dialect: token-id verification is the server's own greedy output, on code and
on CJK text whose characters the tiny model writes in 2-3 tokens, with one target HTTP call per round
(one multi-prompt `/completion`), and never a re-tokenization flag.

The oracle is the same server's own `/v1/completions` answer to the same request (greedy,
`repeat_penalty` 1). Requests are counted at the HTTP layer of the client's own connection pool.
"""

from __future__ import annotations

import collections

import httpx2
import openai
import pytest

from real_helpers import ServerPair, oracle_text
from specapi import AsyncSpeculativeOpenAI, Endpoint, SpeculativeStats

PROMPTS = {
    "code-fib": "def fibonacci(n):",
    "code-class": "class Counter:\n    def increment(self",
    "zh-weather": "今天天气很好，我们",
    "ja-tokyo": "東京は日本の",
    "zh-program": "这个程序读取",
}
NEUTRAL = {"repeat_penalty": 1.0}


def _counting(calls: collections.Counter[str]) -> httpx2.AsyncClient:
    async def count(request: httpx2.Request) -> None:
        calls[request.url.path] += 1

    return httpx2.AsyncClient(event_hooks={"request": [count]}, timeout=30.0)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("prompt", list(PROMPTS.values()), ids=list(PROMPTS))
async def test_native_token_ids_are_the_servers_own_greedy_output(ls: ServerPair, prompt: str, stream: bool) -> None:
    expected = await oracle_text(ls.target, chat=False, stream=stream, prompt=prompt, max_tokens=48, temperature=0, **NEUTRAL)
    target_calls: collections.Counter[str] = collections.Counter()
    async with _counting(target_calls) as http:
        sdk = openai.AsyncOpenAI(base_url=ls.target.base_url, api_key="none", http_client=http, max_retries=0)
        target = Endpoint(base_url=ls.target.base_url, model=ls.target.model, client=sdk, name="llama-server target")
        text, stats = await _complete(target, ls, prompt, stream)
    assert stats is not None
    assert stats.verification == "token-ids", stats.summary()
    assert stats.exact and stats.exact_reason is None, stats.summary()
    assert text == expected, f"{prompt!r}: specapi {text!r} != server {expected!r}; {stats.summary()}"
    assert stats.num_rounds > 0 and stats.accepted_tokens > 0, stats.summary()
    # One /completion call per round scores every draft position; any other /completion call is a
    # plain step of the target alone, which adds at least one token of its own (a step that stopped
    # inside a character is asked once more per missing token).
    in_rounds = sum(r.emitted for r in stats.rounds)
    plain_tokens = stats.generated_tokens - in_rounds
    assert stats.num_rounds <= target_calls["/completion"] <= stats.num_rounds + 3 * plain_tokens, (dict(target_calls), stats.summary())
    if plain_tokens == 0:
        assert target_calls["/completion"] == stats.num_rounds
    # The probe's check that it takes ids, the prompt, and the check that the draft shares the tokenizer.
    assert target_calls["/tokenize"] <= 3, dict(target_calls)
    # Every POST is counted in the response's statistics (the probe's GETs bill nothing).
    gets = target_calls["/props"] + target_calls["/v1/models"] + target_calls["/version"] + target_calls["/get_model_info"]
    assert stats.target.requests == sum(target_calls.values()) - gets, (dict(target_calls), stats.target)


async def _complete(target: Endpoint, ls: ServerPair, prompt: str, stream: bool) -> tuple[str, SpeculativeStats | None]:
    async with AsyncSpeculativeOpenAI(target=target, draft=ls.draft.endpoint(), policy="fixed", num_speculative_tokens=4) as client:
        result = await client.completions.create(prompt=prompt, max_tokens=48, temperature=0, extra_body=NEUTRAL, stream=stream)
        if stream:
            text = "".join([chunk.choices[0].text async for chunk in result if chunk.choices])
        else:
            text = result.choices[0].text
        return text, result.speculative
