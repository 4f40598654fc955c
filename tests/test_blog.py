"""The blog's algorithm as its post describes it: the word rule (case, punctuation, Chinese without
spaces), the loop against scripted endpoints, and the three-way experiment on the simulator."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx2
import pytest

from specapi import Endpoint
from specapi.bench.blog import QUESTION, blog_generate, format_sweep, format_table, lossy_sweep, matching_words, seed_blog, split_words, word_key
from specapi.sim import simulated_endpoints


# -- the word rule --------------------------------------------------------------------------------


def test_word_keys_ignore_case_and_punctuation() -> None:
    assert word_key("Hello,") == "hello"
    assert word_key("“Attention”!") == "attention"
    assert word_key("机制，用类比说明。") == "机制用类比说明"  # Chinese punctuation is punctuation too
    assert word_key("—") == ""


def test_words_keep_their_text_so_that_kept_words_rebuild_it() -> None:
    text = "  Hello, World!\nfoo  "
    words = split_words(text)
    assert [w.text for w in words] == ["  Hello, ", "World!\n", "foo  "]
    assert [w.key for w in words] == ["hello", "world", "foo"]
    assert "".join(w.text for w in words) == text
    assert split_words("   ") == []


def test_matching_prefix_is_case_insensitive_and_stops_at_the_first_difference() -> None:
    assert matching_words(split_words("The cat, sat down"), split_words("the CAT sat. up")) == 3
    assert matching_words(split_words("Transform"), split_words("Transformer")) == 0  # a cut word does not match
    assert matching_words(split_words("a b"), split_words("a")) == 1


def test_chinese_without_spaces_is_one_word_per_clause_run() -> None:
    # The whole question up to its space is one word: it matches only when written identically.
    assert len(split_words("解释一下Transformer的注意力机制，用类比说明")) == 1
    assert len(split_words(QUESTION)) == 3  # "解释一下", "Transformer", "的注意力机制，用类比说明"
    assert matching_words(split_words("注意力机"), split_words("注意力机制")) == 0
    assert matching_words(split_words("注意力机制，"), split_words("注意力机制")) == 1
    assert matching_words(split_words("注意力 机制像"), split_words("注意力 机制是")) == 1


# -- the loop against scripted endpoints ----------------------------------------------------------


class Scripted:
    """A chat endpoint that answers each request with the next scripted text, and records requests."""

    def __init__(self, replies: Iterator[str]) -> None:
        self.replies = replies
        self.requests: list[dict] = []  # type: ignore[type-arg]

    def handler(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        text = next(self.replies)
        return httpx2.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": body["max_tokens"], "total_tokens": 10 + body["max_tokens"]},
        })

    def endpoint(self, model: str) -> Endpoint:
        return Endpoint(model=model, base_url="http://scripted.test/v1", api_key="x", max_retries=0,
                        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(self.handler)))


def _forever(text: str) -> Iterator[str]:
    while True:
        yield text


async def test_a_round_keeps_the_matching_draft_words_then_the_targets_next_word() -> None:
    draft = Scripted(iter(["The Cat sat", "注意力机", "x"]))
    target = Scripted(iter(["the cat, is here", "注意力机制就像", ""]))
    run = await blog_generate(draft.endpoint("d"), target.endpoint("t"), "q", draft_tokens=4, temperature=0.7)
    assert [r.matched for r in run.rounds] == [2, 0, 0]
    assert [r.kept for r in run.rounds] == ["The Cat is ", "注意力机制就像", ""]  # the third keeps nothing: stop
    assert run.text == "The Cat is 注意力机制就像"
    assert (run.proposed_words, run.accepted_words) == (5, 2)
    # The draft is asked K tokens and the target K + 1, both continuing the text kept so far.
    assert [r["max_tokens"] for r in draft.requests] == [4, 4, 4] and [r["max_tokens"] for r in target.requests] == [5, 5, 5]
    assert draft.requests[1]["messages"] == [{"role": "user", "content": "q"}, {"role": "assistant", "content": "The Cat is "}]
    assert target.requests[1]["messages"] == draft.requests[1]["messages"] and draft.requests[0]["temperature"] == 0.7
    assert (run.draft.requests, run.target.requests, run.target.completion_tokens) == (3, 3, 15)


async def test_the_loop_stops_after_20_rounds() -> None:
    draft, target = Scripted(_forever("a")), Scripted(_forever("b"))
    run = await blog_generate(draft.endpoint("d"), target.endpoint("t"), "q")
    assert len(run.rounds) == 20 and run.text == "b" * 20 and run.accepted_words == 0


async def test_the_loop_stops_at_60_words() -> None:
    ten = "one two three four five six seven eight nine ten "
    draft, target = Scripted(_forever(ten)), Scripted(_forever(ten))
    run = await blog_generate(draft.endpoint("d"), target.endpoint("t"), "q")
    assert len(run.rounds) == 6 and len(split_words(run.text)) == 60


# -- the experiment on the simulator --------------------------------------------------------------


async def test_the_three_way_experiment_checks_each_text_against_the_targets_own() -> None:
    target, draft = simulated_endpoints(profile="openai", latency="instant")
    result = await seed_blog(target, draft, price_models=("gpt-4o", "gpt-4o-mini"))
    names = [r["name"] for r in result["rows"]]
    assert names == ["blog algorithm", "target alone", "specapi defaults", "specapi + prediction="]
    rows = {r["name"]: r for r in result["rows"]}
    greedy = result["greedy"]
    # The greedy check compares with the target's own greedy answer, asked here directly.
    sdk = target.build_client()
    own = await sdk.chat.completions.create(model=target.model, messages=[{"role": "user", "content": QUESTION}], max_tokens=60, temperature=0)
    assert greedy["target_text"] == own.choices[0].message.content
    assert greedy["same"][:2] == [greedy["blog_text"] == own.choices[0].message.content, True]
    assert rows["specapi defaults"]["same_as_target_greedy"] and rows["specapi + prediction="]["same_as_target_greedy"]
    assert rows["blog algorithm"]["same_as_target_greedy"] == (greedy["blog_text"] == own.choices[0].message.content)
    assert rows["target alone"]["same_as_target_sampled"]
    assert rows["blog algorithm"]["requests"] == [result["blog"]["rounds"]] * 2
    assert all(r["cost_usd"] is not None for r in result["rows"])  # priced as gpt-4o / gpt-4o-mini by genai-prices
    table = format_table(result)
    assert "blog algorithm" in table and "greedy check" in table and "one word" in table


async def test_the_sweep_reports_divergence_that_grows_as_the_threshold_falls() -> None:
    target, draft = simulated_endpoints(profile="vllm", latency="instant")
    sweep = await lossy_sweep(target, draft, prompts=("def add(a, b):", "解释一下注意力"), settings=(("exact", None), ("threshold", 0.0)), max_tokens=24)
    exact, loose = sweep["rows"]
    assert exact["exact"] and exact["divergent_per_100"] == 0 and exact["same_text_as_target"] == 2
    assert not loose["exact"] and loose["acceptance_rate"] == 1.0  # threshold 0 keeps every draft token
    assert loose["divergent_per_100"] > 0 and loose["mean_logprob_gap"] > 0
    assert "threshold 0" in format_sweep(sweep)


def test_bench_seed_blog_reports_the_experiment_and_the_sweep_with_plots(tmp_path, capsys) -> None:
    from specapi.cli import cli_logic

    json_path, html_path = tmp_path / "r.json", tmp_path / "r.html"
    assert cli_logic(["bench", "--scenario", "seed-blog", "--quick", "--json", str(json_path), "--html", str(html_path)]) == 0
    out = capsys.readouterr().out
    assert "blog algorithm" in out and "lossy acceptance sweep" in out
    (scenario,) = json.loads(json_path.read_text(encoding="utf-8"))["scenarios"]
    assert scenario["name"] == "seed-blog" and QUESTION in json.dumps(scenario, ensure_ascii=False)
    assert [r["name"] for r in scenario["seed_blog"]["rows"]][0] == "blog algorithm"
    modes = {r["mode"] for r in scenario["sweep"]["rows"]}
    assert modes == {"exact", "threshold", "typical"}
    html = html_path.read_text(encoding="utf-8")
    assert "The blog experiment" in html and "Speedup against divergence" in html
    assert html.count("<svg") >= 4  # the scenario's charts, the overview, and the two seed-blog charts
