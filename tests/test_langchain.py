"""LangChain's `ChatOpenAI` built on specapi's resources (`client=`, `async_client=`): invoke and stream,
sync and async, give the target's own text, and the calls speculate."""

from __future__ import annotations

from langchain_openai import ChatOpenAI

from simclient import target_alone
from specapi import AsyncSpeculativeOpenAI, SpeculativeOpenAI
from specapi.sim import SimProvider, simulated_endpoints

QUESTION = "Write a function that returns the area of a circle."
MAX_TOKENS = 24


async def test_chat_openai_invokes_and_streams_with_the_targets_text():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    expected, _ = await target_alone(provider, messages=[{"role": "user", "content": QUESTION}], max_tokens=MAX_TOKENS)
    sync = SpeculativeOpenAI(target=simulated_endpoints(provider=provider)[0], draft=simulated_endpoints(provider=provider)[1])
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        llm = ChatOpenAI(
            client=sync.chat.completions, async_client=client.chat.completions,
            model="sim-target", api_key="unused", temperature=0, max_tokens=MAX_TOKENS,
        )
        before = len(provider.calls)
        invoked = llm.invoke(QUESTION).content
        streamed = "".join(str(chunk.content) for chunk in llm.stream(QUESTION))
        ainvoked = (await llm.ainvoke(QUESTION)).content
        astreamed = "".join([str(chunk.content) async for chunk in llm.astream(QUESTION)])
        sent = provider.calls[before:]
    sync.close()
    assert invoked == streamed == ainvoked == astreamed == expected
    assert any(call.method == "POST" and call.body.get("model") == "sim-draft" for call in sent)  # the draft proposed: speculation ran


async def test_chat_openai_sees_the_speculation_headers():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    target, draft = simulated_endpoints(provider=provider)
    async with AsyncSpeculativeOpenAI(target=target, draft=draft) as client:
        llm = ChatOpenAI(async_client=client.chat.completions, client=object(), model="sim-target", api_key="unused",
                         temperature=0, max_tokens=8, include_response_headers=True)
        message = await llm.ainvoke(QUESTION)
    headers = message.response_metadata["headers"]
    assert headers["x-specapi-speculated"] == "true" and int(headers["x-specapi-num-rounds"]) > 0
