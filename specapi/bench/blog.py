"""The blog experiment specapi started from, reproduced: its algorithm, the target alone and specapi.

The post ("用 30 行 Python 让 LLM 推理速度翻倍") asks `解释一下 Transformer 的注意力机制，用类比说明` of
gpt-4o with gpt-4o-mini drafting 4 tokens per round at temperature 0.7, 60 tokens. Its algorithm, as
the post describes it and as written here (`blog_generate`):

* each round the draft writes K tokens by chat, then the target writes K + 1 tokens for the same
  prompt (the question, and the text kept so far as an assistant message to continue);
* both are split into words (runs between whitespace), compared case-insensitively with punctuation
  stripped (`word_key`), and the matching prefix of the draft's words is kept, then the target's next
  word (our reading: the post keeps "the matching prefix"; without the target's word a round that
  matches nothing would add nothing);
* it stops after 20 rounds or 60 words, or when a round keeps nothing.

Its `ACCEPTANCE_THRESHOLD = 0.7` is declared and never used; specapi's `acceptance="threshold"` is that
rule made real (`specapi.core.lossy`), and `lossy_sweep` measures what it buys and what it costs.

Chinese has no spaces: a whole clause between spaces is one "word" (its punctuation removed, so a
comma joins clauses), and it matches only if draft and target wrote the same clause to the last
character. A K-token draft cut inside a clause never does, so on Chinese text the blog's rule keeps
almost nothing of the draft: each round keeps the target's own first word.

`seed_blog` runs the three ways on the same question, models and settings and returns plain data
(`format_table` prints it): wall time, time to first token, billed tokens per role, cost (genai-prices),
acceptance, and whether the text is the target's own, checked against the target's own output for the
same request at the blog's temperature and again greedy, where the target's own text is unique.
"""

from __future__ import annotations

import re
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any

from ..surface.client import AsyncSpeculativeOpenAI
from ..transport.endpoint import Endpoint
from ..core.stats import RoleUsage, SpeculativeStats, money

__all__ = [
    "QUESTION",
    "SHORT_SWEEP",
    "SWEEP",
    "SWEEP_PROMPTS",
    "BlogRound",
    "BlogRun",
    "Word",
    "blog_generate",
    "format_sweep",
    "format_table",
    "lossy_sweep",
    "matching_words",
    "seed_blog",
    "split_words",
    "word_key",
]

QUESTION = "解释一下 Transformer 的注意力机制，用类比说明"
#: The post's settings.
DRAFT_TOKENS, TEMPERATURE, MAX_TOKENS, MAX_ROUNDS, MAX_WORDS = 4, 0.7, 60, 20, 60
#: What the simulator's pair stands for, for prices (genai-prices).
SIM_PRICE_MODELS = ("gpt-4o", "gpt-4o-mini")

Clock = Callable[[], float]


# -- the blog's word rule -------------------------------------------------------------------------


@dataclass(frozen=True)
class Word:
    """A word as written (`text`, with the whitespace after it) and as compared (`key`)."""

    text: str
    key: str


def word_key(word: str) -> str:
    """The word as the blog compares it: lower case, punctuation (Unicode category P*) removed."""
    return "".join(ch for ch in word.lower() if not unicodedata.category(ch).startswith("P"))


def split_words(text: str) -> list[Word]:
    """Runs of non-whitespace; the first word also carries any whitespace before it, so that the words'
    texts joined give `text` back."""
    return [Word(text=m.group(0), key=word_key(m.group(0).strip())) for m in re.finditer(r"\s*\S+\s*", text)]


def matching_words(draft: Sequence[Word], target: Sequence[Word]) -> int:
    """How many leading words the two agree on."""
    count = 0
    for a, b in zip(draft, target):
        if a.key != b.key:
            break
        count += 1
    return count


# -- the blog's algorithm -------------------------------------------------------------------------


@dataclass(frozen=True)
class BlogRound:
    draft_text: str
    target_text: str
    draft_words: int
    matched: int
    kept: str


@dataclass
class BlogRun:
    """What the blog's loop produced and what it was billed."""

    text: str = ""
    rounds: list[BlogRound] = field(default_factory=list)
    wall_s: float = 0.0
    ttft_s: float | None = None
    draft: RoleUsage = field(default_factory=RoleUsage)
    target: RoleUsage = field(default_factory=RoleUsage)

    @property
    def proposed_words(self) -> int:
        return sum(r.draft_words for r in self.rounds)

    @property
    def accepted_words(self) -> int:
        return sum(r.matched for r in self.rounds)

    @property
    def acceptance(self) -> float:
        return self.accepted_words / self.proposed_words if self.proposed_words else 0.0


def _usage(response: Any, latency: float) -> RoleUsage:
    usage = getattr(response, "usage", None)
    if usage is None:
        return RoleUsage(requests=1, latency_s=latency, cost_usd=None)
    details = getattr(usage, "prompt_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    return RoleUsage(
        requests=1, prompt_tokens=int(usage.prompt_tokens or 0), completion_tokens=int(usage.completion_tokens or 0), cached_tokens=cached,
        latency_s=latency, cost_usd=None,
    )


async def blog_generate(
    draft: Endpoint,
    target: Endpoint,
    question: str = QUESTION,
    *,
    draft_tokens: int = DRAFT_TOKENS,
    temperature: float = TEMPERATURE,
    max_rounds: int = MAX_ROUNDS,
    max_words: int = MAX_WORDS,
    seed: int | None = None,
    clock: Clock = time.perf_counter,
) -> BlogRun:
    """The blog's loop (module docstring), over two OpenAI-format chat endpoints."""
    draft_sdk, target_sdk = draft.build_client(), target.build_client()
    run = BlogRun()
    started = clock()
    words = 0
    for number in range(max_rounds):
        messages: list[dict[str, str]] = [{"role": "user", "content": question}]
        if run.text:
            messages.append({"role": "assistant", "content": run.text})
        common: dict[str, Any] = {"messages": messages, "temperature": temperature}
        if seed is not None:
            common["seed"] = seed + number
        sent = clock()
        drafted = await draft_sdk.chat.completions.create(model=draft.model, max_tokens=draft_tokens, **common)
        run.draft += _usage(drafted, clock() - sent)
        sent = clock()
        checked = await target_sdk.chat.completions.create(model=target.model, max_tokens=draft_tokens + 1, **common)
        run.target += _usage(checked, clock() - sent)
        draft_text = drafted.choices[0].message.content or ""
        target_text = checked.choices[0].message.content or ""
        draft_words, target_words = split_words(draft_text), split_words(target_text)
        matched = matching_words(draft_words, target_words)
        kept_words = [w.text for w in draft_words[:matched]] + [w.text for w in target_words[matched : matched + 1]]
        kept = "".join(kept_words)
        run.rounds.append(BlogRound(draft_text=draft_text, target_text=target_text, draft_words=len(draft_words), matched=matched, kept=kept))
        if not kept:
            break
        if run.ttft_s is None:
            run.ttft_s = clock() - started
        run.text += kept
        words += len(kept_words)
        if words >= max_words:
            break
    run.wall_s = clock() - started
    return run


# -- the three ways -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Way:
    """One row of the table."""

    name: str
    text: str
    wall_s: float
    ttft_s: float | None
    draft: RoleUsage
    target: RoleUsage
    acceptance: str
    stats: SpeculativeStats | None = None


async def _target_alone(target: Endpoint, question: str, temperature: float, max_tokens: int, seed: int | None, clock: Clock) -> Way:
    sdk = target.build_client()
    body: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    if seed is not None:
        body["seed"] = seed
    started = clock()
    ttft, pieces, usage = None, [], RoleUsage(requests=1, cost_usd=None)
    stream = await sdk.chat.completions.create(model=target.model, messages=[{"role": "user", "content": question}], **body)
    async for chunk in stream:
        if getattr(chunk, "usage", None):
            usage = _usage(chunk, 0.0)
        for choice in chunk.choices or ():
            if choice.delta.content:
                ttft = ttft if ttft is not None else clock() - started
                pieces.append(choice.delta.content)
    wall = clock() - started
    return Way("target alone", "".join(pieces), wall, ttft, RoleUsage(cost_usd=None), replace(usage, latency_s=wall), "–")


async def _specapi(
    client: AsyncSpeculativeOpenAI, name: str, question: str, temperature: float, max_tokens: int, seed: int | None, clock: Clock, **extra: Any
) -> Way:
    body: dict[str, Any] = {"temperature": temperature, "max_tokens": max_tokens, "stream": True, **extra}
    if seed is not None:
        body["seed"] = seed
    started = clock()
    ttft, pieces = None, []
    stream = await client.chat.completions.create(messages=[{"role": "user", "content": question}], **body)
    async for chunk in stream:
        for choice in chunk.choices or ():
            if choice.delta.content:
                ttft = ttft if ttft is not None else clock() - started
                pieces.append(choice.delta.content)
    wall = clock() - started
    stats = stream.speculative
    assert stats is not None
    acceptance = f"{stats.acceptance_rate:.0%} of tokens ({stats.verification})" if stats.speculated else f"target alone ({stats.fallback_reason})"
    return Way(name, "".join(pieces), wall, ttft, stats.draft, stats.target, acceptance, stats)


def _price(model: str, usage: RoleUsage, provider: str | None) -> Decimal | None:
    """genai-prices' price of `usage` for `model` (None when it does not know the model)."""
    if not usage.requests:
        return Decimal(0)
    from genai_prices import Usage, calc_price

    try:
        price = calc_price(
            Usage(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens, cache_read_tokens=usage.cached_tokens or None),
            model_ref=model, provider_id=provider,
        )
    except LookupError:
        return None
    return price.total_price


async def seed_blog(
    target: Endpoint,
    draft: Endpoint,
    *,
    price_models: tuple[str, str] | None = None,
    price_provider: str | None = "openai",
    greedy_check: tuple[Endpoint, Endpoint] | None = None,
    question: str = QUESTION,
    temperature: float = TEMPERATURE,
    max_tokens: int = MAX_TOKENS,
    seed: int | None = 1,
    clock: Clock = time.perf_counter,
    client_options: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The experiment: the blog's algorithm, the target alone, specapi's defaults and specapi with
    `prediction=` (an earlier answer of the target to the same question, the case Predicted Outputs is
    for), one request each at the blog's settings; then the same greedy on `greedy_check` endpoints
    (default: the same ones). Returns plain data (JSON types)."""
    models = price_models or (target.model, draft.model)
    options = dict(client_options or {})
    blog = await blog_generate(draft, target, question, temperature=temperature, seed=seed, clock=clock)
    alone = await _target_alone(target, question, temperature, max_tokens, seed, clock)
    # Clients are not closed here: they share the endpoints' connection pools with the other ways.
    client = AsyncSpeculativeOpenAI(target=target, draft=draft, clock=clock, **options)
    # One short warm-up request first (not counted): it opens connections and runs the capability
    # probe, which a long-lived client does once per endpoint, not per request.
    await client.chat.completions.create(messages=[{"role": "user", "content": question}], max_tokens=4, temperature=temperature)
    defaults = await _specapi(client, "specapi defaults", question, temperature, max_tokens, seed, clock)
    predicted = await _specapi(
        client, "specapi + prediction=", question, temperature, max_tokens, seed, clock, prediction={"type": "content", "content": alone.text}
    )
    blog_way = Way(
        "blog algorithm", blog.text, blog.wall_s, blog.ttft_s, blog.draft, blog.target,
        f"{blog.accepted_words}/{blog.proposed_words} draft words ({blog.acceptance:.0%})",
    )
    ways = [blog_way, alone, defaults, predicted]
    greedy = await _greedy_check(*(greedy_check or (target, draft)), question=question, max_tokens=max_tokens, options=options)
    rows = []
    for way, same_greedy in zip(ways, greedy["same"]):
        draft_cost = _price(models[1], way.draft, price_provider)
        target_cost = _price(models[0], way.target, price_provider)
        cost = None if draft_cost is None or target_cost is None else draft_cost + target_cost
        rows.append({
            "name": way.name,
            "wall_s": round(way.wall_s, 3),
            "ttft_s": None if way.ttft_s is None else round(way.ttft_s, 3),
            "draft_tokens": [way.draft.prompt_tokens, way.draft.completion_tokens],
            "target_tokens": [way.target.prompt_tokens, way.target.completion_tokens],
            "requests": [way.draft.requests, way.target.requests],
            "cost_usd": money(cost),
            "draft_cost_usd": money(draft_cost),
            "target_cost_usd": money(target_cost),
            "acceptance": way.acceptance,
            "same_as_target_sampled": way.text == alone.text,
            "same_as_target_greedy": same_greedy,
            "exact": None if way.stats is None else way.stats.exact,
            "text": way.text,
        })
    return {
        "question": question,
        "models": {"target": target.model, "draft": draft.model, "priced_as": list(models)},
        "settings": {"draft_tokens": DRAFT_TOKENS, "temperature": temperature, "max_tokens": max_tokens, "max_rounds": MAX_ROUNDS,
                     "max_words": MAX_WORDS, "seed": seed},
        "rows": rows,
        "blog": {
            "rounds": len(blog.rounds),
            "proposed_words": blog.proposed_words,
            "accepted_words": blog.accepted_words,
            "words_kept_per_round": [r.matched for r in blog.rounds],
            "first_rounds": [{"draft": r.draft_text, "target": r.target_text, "kept": r.kept} for r in blog.rounds[:3]],
        },
        "greedy": greedy,
        "word_rule": (
            "words are runs between whitespace, compared lower-cased without punctuation; Chinese has no spaces, so a "
            "whole clause is one word and matches only when draft and target wrote it identically"
        ),
    }


async def _greedy_check(target: Endpoint, draft: Endpoint, *, question: str, max_tokens: int, options: dict[str, Any]) -> dict[str, Any]:
    """The four ways at temperature 0, where the target's own text is unique: which of them give it."""
    clock = time.perf_counter
    blog = await blog_generate(draft, target, question, temperature=0.0, clock=clock)
    alone = await _target_alone(target, question, 0.0, max_tokens, None, clock)
    client = AsyncSpeculativeOpenAI(target=target, draft=draft, **options)
    defaults = await _specapi(client, "specapi defaults", question, 0.0, max_tokens, None, clock)
    predicted = await _specapi(
        client, "specapi + prediction=", question, 0.0, max_tokens, None, clock, prediction={"type": "content", "content": blog.text}
    )
    # The blog's loop stops at 60 words, not 60 tokens: compare it with the target's text up to its length too.
    texts = [blog.text, alone.text, defaults.text, predicted.text]
    return {
        "target_text": alone.text,
        "blog_text": blog.text,
        "same": [text == alone.text for text in texts],
        "blog_is_prefix_of_target": alone.text.startswith(blog.text) or blog.text.startswith(alone.text),
        "blog_common_prefix_chars": _common_prefix(blog.text, alone.text),
    }


def _common_prefix(a: str, b: str) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


# -- lossy acceptance: speedup against divergence -------------------------------------------------


SWEEP = (("exact", None), ("threshold", 1.0), ("threshold", 0.7), ("threshold", 0.5), ("threshold", 0.3), ("threshold", 0.1),
         ("threshold", 0.0), ("typical", None))
#: A shorter sweep (the example's default, to stay within a minute).
SHORT_SWEEP = (("exact", None), ("threshold", 1.0), ("threshold", 0.7), ("threshold", 0.3), ("threshold", 0.0), ("typical", None))
#: The sweep's requests: the blog's question, the same in English, and two code requests (where a draft agrees more).
SWEEP_PROMPTS = (
    QUESTION,
    "Explain the attention mechanism of the Transformer with an analogy.",
    'Complete this function:\ndef fnmatch(name, pat):\n    """Test whether FILENAME matches PATTERN.',
    'Complete this function:\ndef abstractmethod(funcobj):\n    """A decorator indicating abstract methods.',
)


async def lossy_sweep(
    target: Endpoint,
    draft: Endpoint,
    *,
    prompts: Sequence[str] = SWEEP_PROMPTS,
    settings: Sequence[tuple[str, float | None]] = SWEEP,
    max_tokens: int = MAX_TOKENS,
    temperature: float = 0.0,
    clock: Clock = time.perf_counter,
) -> dict[str, Any]:
    """Each acceptance setting on the same chat requests (draft model, fixed 4 tokens per round), against
    the target alone: mean seconds per request, speedup, acceptance and divergence per generated token.

    Greedy by default: there "divergent" means "not the target's own token", and the target's own text
    is unique. (Sampled, exact verification rejects a token for certain only outside the nucleus, so
    without top_p the count is 0 by definition and only the log-probability gap measures.)"""

    async def timed(client: AsyncSpeculativeOpenAI, prompt: str, seed: int, tokens: int) -> tuple[float, SpeculativeStats, str]:
        started = clock()
        response = await client.chat.completions.create(
            messages=[{"role": "user", "content": prompt}], max_tokens=tokens, temperature=temperature, seed=seed
        )
        assert response.speculative is not None
        return clock() - started, response.speculative, response.choices[0].message.content or ""

    async def measure(client: AsyncSpeculativeOpenAI) -> list[tuple[float, SpeculativeStats, str]]:
        await timed(client, prompts[0], 10_000, 4)  # warm-up: connections and the capability probe
        return [await timed(client, prompt, seed, max_tokens) for seed, prompt in enumerate(prompts)]

    common: dict[str, Any] = {"target": target, "draft": draft, "drafter": "model", "policy": "fixed", "num_speculative_tokens": 4, "clock": clock}
    alone = await measure(AsyncSpeculativeOpenAI(target=target, verification="none", clock=clock))
    alone_s = sum(w for w, _, _ in alone) / len(alone)
    rows = []
    for mode, value in settings:
        options = dict(common, acceptance=mode)
        if mode == "threshold" and value is not None:
            options["acceptance_threshold"] = value
        results = await measure(AsyncSpeculativeOpenAI(**options))
        stats = [s for _, s, _ in results]
        generated = sum(s.generated_tokens for s in stats) or 1
        mean_s = sum(w for w, _, _ in results) / len(results)
        drafted = sum(s.drafted_tokens for s in stats)
        rows.append({
            "acceptance": mode if value is None else f"{mode} {value:g}",
            "mode": mode,
            "threshold": value,
            "mean_s": round(mean_s, 4),
            "speedup": round(alone_s / mean_s, 3) if mean_s else None,
            "acceptance_rate": round(sum(s.accepted_tokens for s in stats) / drafted, 4) if drafted else 0.0,
            "divergent_per_100": round(100 * sum(s.divergent_tokens for s in stats) / generated, 2),
            "mean_logprob_gap": round(sum(s.logprob_gap for s in stats) / generated, 4),
            "same_text_as_target": sum(text == base for (_, _, text), (_, _, base) in zip(results, alone)),
            "exact": all(s.exact for s in stats),
            "verification": stats[0].verification if stats else "none",
        })
    return {"prompts": list(prompts), "requests": len(prompts), "max_tokens": max_tokens, "temperature": temperature,
            "target_alone_s": round(alone_s, 4), "rows": rows}


# -- text -----------------------------------------------------------------------------------------


def format_table(result: dict[str, Any]) -> str:
    """The three-way table (four rows) and what the checks found, as plain text."""
    head = f"{'':24} {'wall s':>7} {'TTFT s':>7} {'draft in/out':>13} {'target in/out':>14} {'cost USD':>11}  {'= target (T)':>12} {'= target (0)':>12}  acceptance"
    lines = [head]
    for r in result["rows"]:
        ttft = "–" if r["ttft_s"] is None else f"{r['ttft_s']:.3f}"
        lines.append(
            f"{r['name']:24} {r['wall_s']:7.3f} {ttft:>7} {'%d/%d' % tuple(r['draft_tokens']):>13} {'%d/%d' % tuple(r['target_tokens']):>14} "
            f"{(r['cost_usd'] or 'unknown'):>11}  {'yes' if r['same_as_target_sampled'] else 'no':>12} {'yes' if r['same_as_target_greedy'] else 'no':>12}  {r['acceptance']}"
        )
    blog, greedy = result["blog"], result["greedy"]
    lines += [
        "",
        f"blog's own statistics: {blog['rounds']} rounds, {blog['accepted_words']}/{blog['proposed_words']} draft words kept, "
        f"words kept per round {blog['words_kept_per_round']}",
        f"word rule: {result['word_rule']}",
        f"greedy check: the blog's text {'equals' if greedy['same'][0] else 'differs from'} the target's own "
        f"(common prefix {greedy['blog_common_prefix_chars']} characters; blog {len(greedy['blog_text'])}, target {len(greedy['target_text'])})",
    ]
    return "\n".join(lines)


def format_sweep(sweep: dict[str, Any]) -> str:
    lines = [f"lossy acceptance sweep ({sweep['requests']} requests, {sweep['max_tokens']} tokens, temperature {sweep['temperature']:g}; "
             f"target alone {sweep['target_alone_s']:.3f} s/request)",
             f"{'acceptance':15} {'s/req':>7} {'speedup':>8} {'accepted':>9} {'divergent/100':>14} {'gap/token':>10} {'same text':>10}"]
    for r in sweep["rows"]:
        lines.append(
            f"{r['acceptance']:15} {r['mean_s']:7.3f} {r['speedup']:7.2f}x {r['acceptance_rate']:9.0%} {r['divergent_per_100']:14.2f} "
            f"{r['mean_logprob_gap']:10.3f} {r['same_text_as_target']:>5}/{sweep['requests']}"
        )
    return "\n".join(lines)
