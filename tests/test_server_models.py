"""The proxy serves every model of the target's server (`served.py`): `/v1/models` lists them, a request
naming one of them is verified against it (drafted by the configured draft) and gives that model's own
output; unknown names get 404 before any generation request."""

from __future__ import annotations

import asyncio

import httpx2
import openai
import pytest

from simclient import answer
from specapi.server import ServerConfig, create_app
from specapi.server.served import ServedModels
from specapi.sim import SimProvider, SimTransport, simulated_endpoints

QUESTION = [{"role": "user", "content": "Write a function that returns the area of a circle. 圆 ✨"}]
CODE = "def fibonacci(n):\n    "
MAX_TOKENS = 24
OTHER = "sim-draft-small"  # another model of the target's server


async def _alone(provider: SimProvider, model: str, *, chat: bool) -> tuple[str, str]:
    """`model`'s own greedy answer, from the openai SDK straight to the simulated provider."""
    http = httpx2.AsyncClient(transport=SimTransport(provider))
    async with openai.AsyncOpenAI(base_url="http://sim/v1", api_key="x", http_client=http, max_retries=0) as sdk:
        if chat:
            return answer(await sdk.chat.completions.create(model=model, messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0))
        return answer(await sdk.completions.create(model=model, prompt=CODE, max_tokens=MAX_TOKENS, temperature=0))


def _proxy(provider: SimProvider) -> openai.AsyncOpenAI:
    target, draft = simulated_endpoints(provider=provider)
    app = create_app(ServerConfig(target=target, draft=draft, client_options={"policy": "fixed"}))
    http = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), base_url="http://proxy")
    return openai.AsyncOpenAI(base_url="http://proxy/v1", api_key="x", http_client=http, max_retries=0)


async def test_models_lists_the_configured_target_then_every_other_model_of_its_server():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    async with _proxy(provider) as proxy:
        listed = [model.id async for model in proxy.models.list()]
        clone = await proxy.models.retrieve("sim-target-clone")
        with pytest.raises(openai.NotFoundError):
            await proxy.models.retrieve("gpt-4o")
    assert listed == ["sim-target", "sim-draft", "sim-draft-small", "sim-target-clone"]
    assert clone.id == "sim-target-clone"


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("stream", [False, True])
async def test_another_model_of_the_targets_server_speculates_and_gives_its_own_output(chat: bool, stream: bool):
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    # sim-target-clone answers as sim-target does: a model that answers otherwise shows whose output came back.
    expected = await _alone(provider, OTHER, chat=chat)
    assert expected != await _alone(provider, "sim-target", chat=chat)
    before = len(provider.calls)
    async with _proxy(provider) as proxy:
        create = proxy.chat.completions.create if chat else proxy.completions.create
        request = {"messages": QUESTION} if chat else {"prompt": CODE}
        raw = await create(model=OTHER, max_tokens=MAX_TOKENS, temperature=0, stream=stream, **request)
        if stream:
            pieces, finish, summary = [], None, None
            async for chunk in raw:
                if chunk.choices:
                    choice = chunk.choices[0]
                    pieces.append((choice.delta.content if chat else choice.text) or "")
                    finish = choice.finish_reason or finish
                summary = (chunk.model_extra or {}).get("speculative", summary)
            got, model = ("".join(pieces), finish), chunk.model
        else:
            got, model, summary = answer(raw), raw.model, raw.model_extra["speculative"]
    assert got == expected and model == OTHER
    assert summary["speculated"] and summary["num_rounds"] > 0
    generations = [c for c in provider.calls[before:] if c.method == "POST" and isinstance(c.body, dict) and c.body.get("model")]
    assert {c.model for c in generations} == {OTHER, "sim-draft"}  # verified against it, drafted by the configured draft


async def test_a_model_the_targets_server_does_not_list_gets_404_before_any_generation():
    provider = SimProvider(capabilities="vllm", latency="instant", seed=0)
    async with _proxy(provider) as proxy:
        with pytest.raises(openai.NotFoundError) as info:
            await proxy.chat.completions.create(model="gpt-4o", messages=QUESTION, max_tokens=4)
    assert info.value.code == "model_not_found" and "`sim-target-clone`" in info.value.message
    assert not [c for c in provider.calls if c.method == "POST"]


class _Listing:
    """A target's model list that records every reading; `fail` makes the next readings raise."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.reads = 0
        self.fail = False
        self.gate = asyncio.Event()
        self.gate.set()

    async def __call__(self) -> list[str]:
        self.reads += 1
        await self.gate.wait()
        if self.fail:
            raise ConnectionError("down")
        return list(self.names)


async def test_served_models_read_again_for_an_unknown_name_at_most_once_per_interval():
    now = [0.0]
    listing = _Listing(["big", "other"])
    served = ServedModels("big", listing, clock=lambda: now[0], refresh_after_s=10.0)
    assert served.names == ("big",)  # before any listing: the configured model alone
    await served.refresh(force=True)
    assert served.names == ("big", "other") and listing.reads == 1
    listing.names = ["other", "big", "new"]
    assert not await served.knows("new") and listing.reads == 1  # read 0 s ago: not again
    now[0] = 11.0
    assert await served.knows("new") and listing.reads == 2
    assert served.names == ("big", "other", "new")  # the configured model first
    assert await served.knows("other") and not await served.knows(None) and listing.reads == 2


async def test_served_models_share_one_reading_and_keep_the_last_list_when_it_fails():
    now = [100.0]
    listing = _Listing(["big", "other"])
    served = ServedModels("big", listing, clock=lambda: now[0], refresh_after_s=10.0)
    listing.gate.clear()
    waiting = [asyncio.ensure_future(served.knows("other")) for _ in range(5)]
    await asyncio.sleep(0)
    listing.gate.set()
    assert await asyncio.gather(*waiting) == [True] * 5 and listing.reads == 1
    listing.fail = True
    now[0] += 60
    await served.refresh()
    assert served.names == ("big", "other") and listing.reads == 2
    await served.close()
