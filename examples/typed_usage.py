"""The SDK's parameters and types, checked statically: `mypy examples/` runs in the tests.

    python examples/typed_usage.py

`create` takes the openai SDK's own keyword arguments; `stream=True` returns a stream of the SDK's
chunk types, otherwise the SDK's response type with `speculative` statistics.
"""

from __future__ import annotations

import asyncio
from typing_extensions import assert_type  # typing has it from Python 3.11 only

from openai.types import Completion
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

from specapi import AsyncSpeculativeOpenAI, SpeculativeChatCompletion, SpeculativeCompletion, SpeculativeOpenAI, SpeculativeStats
from specapi.sim import simulated_endpoints
from specapi.surface.streaming import SpeculativeStream
from specapi.surface.sync import SyncSpeculativeStream

MESSAGES: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Write a function that reverses a list."}]


async def asynchronous() -> None:
    target, draft = simulated_endpoints(profile="vllm", latency="instant")
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        resp = await client.completions.create(prompt="def fib(n):", max_tokens=32, temperature=0, stop=["\n\n"], seed=7)
        assert_type(resp, SpeculativeCompletion)
        text: str = resp.choices[0].text
        stats: SpeculativeStats | None = resp.speculative
        print(text, stats.summary() if stats else "")

        stream = await client.chat.completions.create(messages=MESSAGES, max_tokens=32, temperature=0, stream=True)
        assert_type(stream, SpeculativeStream[ChatCompletionChunk])
        async for chunk in stream:
            print(chunk.choices[0].delta.content or "" if chunk.choices else "", end="")
        print()

        chat = await client.chat.completions.create(messages=MESSAGES, max_completion_tokens=16, top_p=1.0)
        assert_type(chat, SpeculativeChatCompletion)
        models = await client.models.list()
        print(chat.choices[0].message.content, [m.id for m in models.data])


def synchronous() -> None:
    target, draft = simulated_endpoints(profile="vllm", latency="instant")
    with SpeculativeOpenAI(target=target, draft=draft) as client:
        resp = client.completions.create(prompt="def fib(n):", max_tokens=16, temperature=0)
        assert_type(resp, SpeculativeCompletion)
        chunks = client.completions.create(prompt="def fib(n):", max_tokens=16, temperature=0, stream=True)
        assert_type(chunks, SyncSpeculativeStream[Completion])
        print(resp.choices[0].text == "".join(c.choices[0].text for c in chunks if c.choices))
        raw = client.chat.completions.with_raw_response.create(messages=MESSAGES, max_tokens=8)
        print(raw.headers.get("x-specapi-num-rounds"))


if __name__ == "__main__":
    asyncio.run(asynchronous())
    synchronous()
