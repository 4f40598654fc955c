"""Verifiers: one target call that scores every draft position and yields one more token.

`EchoVerifier` has the target score the prompt and the draft in one completions request that echoes
them (vLLM, SGLang, Together, OpenAI base models). `ChatPromptLogprobsVerifier` has vLLM score a chat
request's messages with the draft as the assistant's text, so chat requests verify exactly too. The
bodies come from the dialects (`dialects/openai.py`, `dialects/vllm.py`), and so does reading them.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._calls import Meter, RoleClient
from .acceptance import DEFAULT_EOS_TOKENS, RoundDecision
from .alignment import ScoredToken, complete_utf8_prefix, locate_suffix, token_bytes
from .context import Context
from .dialects.base import UNREADABLE, reading
from .dialects.logprobs import WireError, completion_tokens
from .dialects.openai import Prefill, completion_request, generation_request, openai_format, sampling_fields
from .dialects.vllm import prompt_scores_request, read_prompt_scores

__all__ = [
    "Verification",
    "Verifier",
    "EchoVerifier",
    "ChatPromptLogprobsVerifier",
    "PlainStep",
    "generation_request",
    "plain_step",
    "plain_stream",
    "plain_stream_batches",
]


@dataclass(frozen=True)
class Verification:
    """The target's view of a draft: `positions` cover the draft text (the first carries `straddle`
    bytes of committed text); `bonus` is the token the target generated after it (None at end of text)."""

    positions: tuple[ScoredToken, ...]
    straddle: int
    bonus: ScoredToken | None
    finish_reason: str | None
    latency_s: float
    prompt_tokens: int | None = None
    #: Where the scored text's tokens start, in bytes counted back from its end (None: not known).
    starts_from_end: frozenset[int] | None = None
    #: Fan-out: the prompt tokens billed for the call that continued the context plus j draft tokens.
    prompt_counts: tuple[int | None, ...] = ()
    #: Fan-out: the seed of the call that continued the context plus j draft tokens.
    seeds: tuple[int | None, ...] = ()
    #: Token-id verification decides the round itself (the target's own picks, compared by id).
    decision: RoundDecision | None = None


SeedSource = Callable[[], "int | None"]


class Verifier(Protocol):
    name: str

    async def verify(
        self, context: Context, draft: Sequence[ScoredToken], meter: Meter, next_seed: SeedSource, top_k: int, draft_meter: Meter | None = None
    ) -> Verification: ...


def _text(draft: Sequence[ScoredToken]) -> str:
    return b"".join(t.data for t in draft).decode("utf-8")


def _bonus(tokens: list[ScoredToken], generated_text: str, finish_reason: str | None) -> ScoredToken | None:
    """The generated token, or None when the target ended the text instead."""
    real = [t for t in tokens if t.text not in DEFAULT_EOS_TOKENS and token_bytes(t.text)]
    if not real:
        return None
    data = token_bytes(real[0].text) or b""
    # A token holding part of a character shows in the text as nothing or U+FFFD, by server.
    partial = complete_utf8_prefix(data) != data and generated_text in ("", "\ufffd")
    if len(real) > 1 or (data != generated_text.encode("utf-8") and not partial):
        raise WireError(f"generated token {real[0].text!r} does not match generated text {generated_text!r}")
    return real[0]


def _verification(
    scored: Sequence[ScoredToken], start: int, straddle: int, bonus: ScoredToken | None, choice: Mapping[str, Any], latency: float, usage: dict
) -> Verification:
    """The positions from `start` on; the request's own prompt tokens are the billed ones minus the draft's."""
    prompt_tokens = usage.get("prompt_tokens")
    starts, covered = set(), 0
    for token in reversed(scored):
        data = token_bytes(token.text)
        if not data:
            break
        covered += len(data)
        starts.add(covered)
    return Verification(
        starts_from_end=frozenset(starts),
        positions=tuple(scored[start:]),
        straddle=straddle,
        bonus=bonus,
        finish_reason=choice.get("finish_reason"),
        latency_s=latency,
        prompt_tokens=prompt_tokens - (len(scored) - start) if isinstance(prompt_tokens, int) else None,
    )


@dataclass
class EchoVerifier:
    client: RoleClient
    name: str = "echo"

    async def verify(
        self, context: Context, draft: Sequence[ScoredToken], meter: Meter, next_seed: SeedSource, top_k: int, draft_meter: Meter | None = None
    ) -> Verification:
        draft_text = _text(draft)
        prompt = context.completion_prompt(draft_text)
        path, body = completion_request(prompt, 1, sampling_fields(context, next_seed()), top_k=top_k, echo=True)
        started = self.client.clock()
        response = await self.client.post(path, body, meter, options=context.options)
        latency = self.client.clock() - started
        with reading(self.client, "echo"):
            return self._read(response, prompt, draft_text, latency)

    @staticmethod
    def _read(response: dict, prompt: str, draft_text: str, latency: float) -> Verification:
        choice = response["choices"][0]
        tokens = completion_tokens(choice.get("logprobs"))
        text = choice.get("text") or ""
        if not text.startswith(prompt):
            raise WireError("echoed text does not start with the prompt")
        generated = text[len(prompt) :]
        usage = response.get("usage") or {}
        reported = usage.get("completion_tokens")
        candidates = [reported] if isinstance(reported, int) and 0 <= reported <= 1 else []
        candidates += [n for n in (1, 0) if n not in candidates]
        draft = draft_text.encode("utf-8")
        for n_generated in candidates:
            scored = tokens[: len(tokens) - n_generated]
            found = locate_suffix(scored, draft)
            if found is None:
                continue
            start, straddle = found
            bonus = _bonus(tokens[len(scored) :], generated, choice.get("finish_reason"))
            if bonus is None and generated:
                continue
            return _verification(scored, start, straddle, bonus, choice, latency, usage)
        raise WireError("the echoed tokens do not spell the draft text")


@dataclass
class ChatPromptLogprobsVerifier:
    client: RoleClient
    name: str = "prompt-logprobs"

    async def verify(
        self, context: Context, draft: Sequence[ScoredToken], meter: Meter, next_seed: SeedSource, top_k: int, draft_meter: Meter | None = None
    ) -> Verification:
        draft_text = _text(draft)
        path, body = prompt_scores_request(context, draft_text, top_k, next_seed())
        started = self.client.clock()
        response = await self.client.post(path, body, meter, options=context.options)
        latency = self.client.clock() - started
        with reading(self.client, "prompt-scoring chat"):
            scored, generated, choice = read_prompt_scores(response)
            found = locate_suffix(scored, draft_text.encode("utf-8"))
            if found is None:
                raise WireError("the scored prompt does not end with the draft text")
            start, straddle = found
            content = (choice.get("message") or {}).get("content") or ""
            bonus = _bonus(generated, content, choice.get("finish_reason"))
        return _verification(scored, start, straddle, bonus, choice, latency, response.get("usage") or {})


@dataclass(frozen=True)
class PlainStep:
    text: str
    finish_reason: str | None
    completion_tokens: int
    prompt_tokens: int | None
    latency_s: float
    #: The generated bytes (when the server showed each token's) and the target's ids of the tokens.
    data: bytes | None = None
    ids: tuple[int, ...] | None = None


async def plain_step(
    client: RoleClient,
    context: Context,
    max_tokens: int | None,
    meter: Meter,
    seed: int | None,
    stop: list[str] | None,
    *,
    count_tokens: bool = False,
    prefill: Prefill = Prefill(),
) -> PlainStep:
    """The target alone generates up to `max_tokens` tokens from the context (exact by construction).

    With `count_tokens`, logprobs are requested just to count the tokens exactly; an end-of-text
    token counts, as servers count it in usage (the target alone's usage does).
    """
    form = openai_format(context)
    path, body = generation_request(context, max_tokens, seed, stop, prefill, count_tokens=count_tokens and max_tokens != 1)
    started = client.clock()
    response = await client.post(path, body, meter, options=context.options)
    latency = client.clock() - started
    with reading(client, "generation"):
        choice = response["choices"][0]
        text = form.text(choice, context.accepted, prefill)
    usage = response.get("usage") or {}
    completion = usage.get("completion_tokens")
    if max_tokens == 1 and choice.get("finish_reason") != "length":
        completion = 1  # the one token: text, a stop string's last token or the end of text
    elif count_tokens:
        try:
            completion = len(form.tokens(choice))
        except UNREADABLE:
            pass  # keep the billed count
    return PlainStep(
        text=text,
        finish_reason=choice.get("finish_reason"),
        completion_tokens=completion if isinstance(completion, int) else 0,
        prompt_tokens=usage.get("prompt_tokens"),
        latency_s=latency,
    )


async def plain_stream_batches(
    client: RoleClient,
    context: Context,
    max_tokens: int | None,
    meter: Meter,
    seed: int | None,
    stop: list[str] | None,
    *,
    prefill: Prefill = Prefill(),
    usage: dict | None = None,
) -> AsyncIterator[list[tuple[str, str | None]]]:
    """`plain_stream`'s `(text, finish_reason)` pairs, those of chunks that arrived together in one
    list (see `RoleClient.stream_batches`). Does not check that a finish_reason came."""
    form = openai_format(context)
    path, body = generation_request(context, max_tokens, seed, stop, prefill, stream_usage=True)
    async with contextlib.aclosing(client.stream_batches(path, body, meter, options=context.options)) as batches:
        async for chunks in batches:
            out: list[tuple[str, str | None]] = []
            for chunk in chunks:
                if usage is not None and isinstance(chunk.get("usage"), dict):
                    usage.update(chunk["usage"])
                for choice in chunk.get("choices") or []:
                    if choice.get("index", 0) != 0:
                        continue
                    text = form.delta(choice)
                    finish = choice.get("finish_reason")
                    if text or finish is not None:
                        out.append((text, finish))
            if out:
                yield out


async def plain_stream(
    client: RoleClient,
    context: Context,
    max_tokens: int | None,
    meter: Meter,
    seed: int | None,
    stop: list[str] | None,
    *,
    prefill: Prefill = Prefill(),
    usage: dict | None = None,
) -> AsyncIterator[tuple[str, str | None]]:
    """Like `plain_step`, streamed: yields `(text, finish_reason)` per chunk (finish_reason None until
    the end). The billed usage, when the server sends it, is copied into `usage`."""
    finished = False
    batches = plain_stream_batches(client, context, max_tokens, meter, seed, stop, prefill=prefill, usage=usage)
    async with contextlib.aclosing(batches):
        async for batch in batches:
            for text, finish in batch:
                finished = finished or finish is not None
                yield text, finish
    if not finished:
        raise client.malformed("the stream ended without a finish_reason: the text may be incomplete")
