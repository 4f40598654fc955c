"""`specapi serve` with speculation on relays the streams the engine leaves to the target alone from
their first token (`Engine.relay_alone`, `AloneStream`, `server/relay.py`): the target's own chunks,
its usage when asked, the engine's statistics on the last chunk, what the policy and the suffix index
learn, metrics, and the failures (named, a stream cut short ends in an error event). The oracle is the
toy target's own output for the same request (`toyserver.TARGET`, and the toy server asked directly)."""

from __future__ import annotations

import asyncio

import httpx2
import openai
import pytest
from openai.types import Completion
from openai.types.chat import ChatCompletionChunk

from test_server_stream import leave_after_the_first_chunk
from test_server_support import PROXY_KEY, UPSTREAM_KEY, breaking_target, metric, no_sleep, parse_sse, proxy_pair, running_proxy
from specapi import AsyncSpeculativeOpenAI, Endpoint
from specapi.transport._calls import Meter
from specapi.parts.policy import SPECULATE, TARGET_ALONE, Decision, PolicyBase, PolicyState, Start
from toyserver import TARGET, ToyServer, render_chat

MAX_TOKENS = 16
AUTH = {"authorization": f"Bearer {PROXY_KEY}"}
REASON = "test: the target alone from the start"


class Alone(PolicyBase):
    """Hands every request to the target alone: at its start (`at="start"`), or at its first round's
    choice (`at="round"`); records what the target alone's streams taught it."""

    name = "alone"

    def __init__(self, at: str = "start") -> None:
        self.at = at
        self.plain: list[tuple[int, float]] = []

    def start_request(self) -> Start:
        return Start(TARGET_ALONE if self.at == "start" else SPECULATE, REASON)

    def choose(self, state: PolicyState) -> Decision:
        return Decision(0, REASON)

    def observe(self, record: object) -> None:
        pass

    def observe_plain(self, tokens: int, latency_s: float) -> None:
        self.plain.append((tokens, latency_s))


def options(policy: Alone) -> dict:
    return {"client_options": {"policy": policy, "sleep": no_sleep}}


@pytest.fixture(scope="module")
def upstream():
    with ToyServer(api_key=UPSTREAM_KEY) as srv:
        yield srv


def post_stream(url: str, path: str, body: dict, key: str = PROXY_KEY) -> httpx2.Response:
    with httpx2.Client(base_url=url, headers={"authorization": f"Bearer {key}"}, timeout=30) as client:
        return client.post(path, json={"model": "target", "stream": True, **body})


def choices_and_usage(events: list) -> list:
    """What a stream says, chunk by chunk, without the fields each response has its own of."""
    return [{"choices": e["choices"], **({"usage": e["usage"]} if "usage" in e else {})} for e in events if e != "[DONE]"]


@pytest.mark.parametrize("at", ["start", "round"])
@pytest.mark.parametrize("usage", [True, False], ids=["usage", "no-usage"])
def test_a_completion_left_to_the_target_is_relayed_as_the_target_wrote_it(upstream, at, usage):
    policy = Alone(at)
    body = {"prompt": "c eda", "max_tokens": MAX_TOKENS, "temperature": 0, **({"stream_options": {"include_usage": True}} if usage else {})}
    with running_proxy(upstream, **options(policy)) as proxy:
        before = len(upstream.log)
        relayed = parse_sse(post_stream(proxy.url, "/v1/completions", body).text)
        sent = upstream.log[before:]
    direct = parse_sse(post_stream(upstream.base_url.removesuffix("/v1"), "/v1/completions", body, key=UPSTREAM_KEY).text)
    assert relayed[-1] == "[DONE]" and "[DONE]" not in relayed[:-1]
    # The target's own chunks, one for one (the statistics on the last one aside).
    assert choices_and_usage(relayed) == choices_and_usage(direct)
    text, finish = TARGET.greedy("c eda", MAX_TOKENS)
    assert "".join(c["text"] for e in relayed[:-1] for c in e["choices"]) == text
    [Completion.model_validate({**e, "choices": [{**c, "finish_reason": c["finish_reason"] or "length"} for c in e["choices"]]}) for e in relayed[:-1]]
    assert [e for e in relayed[:-1] if "speculative" in e] == [relayed[-2]]
    stats = relayed[-2]["speculative"]
    assert (stats["speculated"], stats["fallback_reason"], stats["generated_tokens"]) == (False, REASON, MAX_TOKENS)
    assert stats["target"]["requests"] == 1 and stats["target"]["completion_tokens"] == MAX_TOKENS and stats["draft"]["requests"] == 0
    assert stats["ttft_s"] is not None and 0 <= stats["ttft_s"] <= stats["wall_s"]
    assert bool(relayed[-2].get("usage")) == usage and (not usage or relayed[-2]["usage"]["completion_tokens"] == MAX_TOKENS)
    # One call: the engine's own target-alone request (usage asked for the statistics), which the policy learnt from.
    generations = [r for r in sent if r.body.get("stream")]
    assert len(generations) == 1 and generations[0].body["stream_options"] == {"include_usage": True}
    assert [tokens for tokens, _ in policy.plain] == [MAX_TOKENS] and policy.plain[0][1] > 0


def test_a_chat_left_to_the_target_is_openai_shaped_and_the_sdk_reads_it(upstream):
    messages = [{"role": "user", "content": "ab"}]
    with running_proxy(upstream, **options(Alone())) as proxy:
        relayed = parse_sse(post_stream(proxy.url, "/v1/chat/completions", {"messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0}).text)
        with openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as sdk:
            chunks = list(sdk.chat.completions.create(model="target", messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True))
    [ChatCompletionChunk.model_validate(e) for e in relayed[:-1]]  # strict validation
    expected = TARGET.greedy(render_chat(messages), MAX_TOKENS)[0]
    assert "".join(c["delta"].get("content") or "" for e in relayed[:-1] for c in e["choices"]) == expected
    assert not any(e.get("usage") for e in relayed[:-1])  # asked of the target for the statistics, not passed on
    assert relayed[-2]["speculative"]["fallback_reason"] == REASON
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected
    assert chunks[-1].model_extra["speculative"]["generated_tokens"] == MAX_TOKENS


def test_n_choices_left_to_the_target_are_each_their_own_stream(upstream):
    """A handover relays one target stream as the whole answer: with n > 1 each choice runs (and is left
    to the target alone) on its own, and the stream holds every choice."""
    policy = Alone()
    body = {"prompt": "c eda", "max_tokens": MAX_TOKENS, "temperature": 0, "n": 2}
    with running_proxy(upstream, **options(policy)) as proxy:
        relayed = parse_sse(post_stream(proxy.url, "/v1/completions", body).text)
    text, _ = TARGET.greedy("c eda", MAX_TOKENS)
    texts = ["", ""]
    for event in relayed[:-1]:
        for choice in event["choices"]:
            texts[choice["index"]] += choice["text"]
    assert texts == [text, text]
    assert relayed[-2]["speculative"]["generated_tokens"] == 2 * MAX_TOKENS


def test_speculating_requests_still_go_through_the_engine(upstream):
    with running_proxy(upstream) as proxy:  # the fixed policy: every request speculates
        events = parse_sse(post_stream(proxy.url, "/v1/completions", {"prompt": "ab", "max_tokens": MAX_TOKENS, "temperature": 0}).text)
    assert "".join(c["text"] for e in events[:-1] for c in e["choices"]) == TARGET.greedy("ab", MAX_TOKENS)[0]
    assert events[-2]["speculative"]["speculated"] is True


def test_what_the_engine_learns_from_a_handed_over_stream():
    """Without the proxy: the client's stream hands the answer over (`next_data`), the caller reads it,
    and the engine settles the books and learns the text into the suffix index (`on_learn` hears it)."""

    async def run(srv: ToyServer) -> tuple:
        target = Endpoint(model="target", base_url=srv.base_url, api_key=UPSTREAM_KEY, max_retries=0)
        draft = Endpoint(model="draft", base_url=srv.base_url, api_key=UPSTREAM_KEY, max_retries=0)
        async with AsyncSpeculativeOpenAI(target=target, draft=draft, policy=Alone(), sleep=no_sleep) as client:
            learnt: list[tuple[str, list[int]]] = []
            await client._probe(Meter(target))  # probed beforehand, as the proxy's client is: the request's one call is its own
            client._runtime.relay_alone = True
            client._runtime.on_learn = lambda model, tokens: learnt.append((model, tokens))
            stream = await client.completions.create(model="target", prompt="ab", max_tokens=MAX_TOKENS, temperature=0, stream=True)
            assert await stream.next_data() == {} and stream.handover is not None
            texts = [c.get("text") for batch in [b async for b in stream.handover.batches()] for chunk in batch for c in chunk["choices"]]
            rest = [await stream.next_data() for _ in range(2)]
            await stream.close()
            return "".join(t or "" for t in texts), stream.handover.text, rest, stream.speculative, learnt

    with ToyServer(api_key=UPSTREAM_KEY) as srv:
        relayed, recorded, rest, stats, learnt = asyncio.run(run(srv))
    expected = TARGET.greedy("ab", MAX_TOKENS)[0]
    assert relayed == recorded == expected
    assert rest[-1] is None and stats is not None and stats.generated_tokens == MAX_TOKENS and stats.fallback_reason == REASON
    assert stats.target.requests == 1 and stats.ttft_s is not None
    assert len(learnt) == 1 and learnt[0][0] == "target" and learnt[0][1]


def test_handed_over_streams_are_counted_in_the_metrics():
    with proxy_pair(**options(Alone())) as (_, proxy):
        for _ in range(2):
            assert post_stream(proxy.url, "/v1/completions", {"prompt": "ab", "max_tokens": 8, "temperature": 0}).status_code == 200
        metrics = httpx2.get(proxy.url + "/metrics").text
    assert metric(metrics, "specapi_requests_total", route="/v1/completions", status="200") == 2
    assert metric(metrics, "specapi_responses_total", route="/v1/completions", speculated="false", exact="true") == 2
    assert metric(metrics, "specapi_generated_tokens_total") == 16
    assert metric(metrics, "specapi_request_duration_seconds_count", route="/v1/completions") == 2
    assert metric(metrics, "specapi_in_flight_requests") == 0


def test_a_handed_over_stream_whose_target_fails_at_once_gets_a_real_http_error():
    with proxy_pair(**options(Alone())) as (srv, proxy), openai.OpenAI(base_url=proxy.url + "/v1", api_key=PROXY_KEY, max_retries=0) as client:
        client.completions.create(model="target", prompt="ab", max_tokens=4, stream=True).close()  # probed, paths known
        srv.fail_next(100, status=500, model="target")
        with pytest.raises(openai.InternalServerError) as info:
            client.completions.create(model="target", prompt="ab", max_tokens=8, stream=True)
        assert info.value.status_code == 502 and info.value.body["role"] == "target"
        metrics = httpx2.get(proxy.url + "/metrics").text
    assert metric(metrics, "specapi_in_flight_requests") == 0


@pytest.mark.parametrize("clean", [False, True], ids=["dropped", "ended-without-finish"])
def test_a_handed_over_stream_cut_short_ends_with_an_error_event(clean):
    target = breaking_target(clean, streams_only=True)
    with ToyServer() as unused, running_proxy(unused, target=target, draft=None, **options(Alone())) as proxy:
        response = post_stream(proxy.url, "/v1/completions", {"prompt": "ab", "max_tokens": 50})
        metrics = httpx2.get(proxy.url + "/metrics").text
    events = parse_sse(response.text)
    assert [c["text"] for e in events[:-1] for c in e.get("choices", [])] == ["ab", "cd"]  # what did arrive
    assert events[-1]["error"]["role"] == "target" and "[DONE]" not in events
    assert metric(metrics, "specapi_stream_errors_total", route="/v1/completions") == 1
    assert metric(metrics, "specapi_in_flight_requests") == 0


def test_a_client_that_leaves_a_handed_over_stream_closes_the_upstream_one():
    with proxy_pair(**options(Alone())) as (srv, proxy):
        leave_after_the_first_chunk(srv, proxy.url, AUTH)
        metrics = httpx2.get(proxy.url + "/metrics").text
    assert metric(metrics, "specapi_client_disconnects_total", route="/v1/completions") == 1
    assert metric(metrics, "specapi_in_flight_requests") == 0
