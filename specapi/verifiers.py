"""Verifiers: one target call that scores every draft position and yields one more token.

`EchoVerifier` has the target score the prompt and the draft in one completions request that echoes
them (vLLM, SGLang, Together, OpenAI base models). `ChatPromptLogprobsVerifier` has vLLM score a chat
request's messages with the draft as the assistant's text, so chat requests verify exactly too. The
bodies come from the dialects (`dialects/openai.py`, `dialects/vllm.py`), and so does reading them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._calls import Meter, RoleClient
from .acceptance import DEFAULT_EOS_TOKENS, RoundDecision
from .alignment import ScoredToken, complete_utf8_prefix, locate_suffix, token_bytes
from .context import Context
from .dialects.base import reading
from .dialects.logprobs import WireError, completion_tokens
from .dialects.openai import completion_request, sampling_fields
from .dialects.vllm import prompt_scores_request, read_prompt_scores

__all__ = [
    "Verification",
    "Verifier",
    "VerifierBase",
    "EchoVerifier",
    "ChatPromptLogprobsVerifier",
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
    """One target call per round that scores the draft (`verify`); the members below say what else the
    path does, so the engine asks them rather than the verifier's name (`VerifierBase` has the defaults)."""

    name: str
    #: The kept tokens are the target's own picks (fan-out, token ids), whatever the draft proposed.
    draws_target_tokens: bool
    #: Plain steps on this path ask for logprobs to count their tokens exactly (echo, prompt logprobs).
    counts_plain_tokens: bool
    #: The context goes to the target as token ids: the prompt is tokenized once (`prompt_ids`), and
    #: target-alone steps on a context kept as ids go through `plain`.
    sends_token_ids: bool

    async def verify(
        self, context: Context, draft: Sequence[ScoredToken], meter: Meter, next_seed: SeedSource, top_k: int, draft_meter: Meter | None = None
    ) -> Verification: ...

    async def prompt_ids(self, context: Context, meter: Meter) -> tuple[int, ...]: ...

    async def native_draft(self, context: Context, k: int, meter: Meter, draft_meter: Meter, seed: int | None) -> tuple[ScoredToken, ...] | None:
        """Draft tokens from the draft server's own call on the context's ids (whole distributions);
        None: draft the usual way."""
        ...

    async def plain(
        self, context: Context, max_tokens: int | None, meter: Meter, seed: int | None, stop: list[str] | None, *, streamed: bool = False
    ) -> Any:  # a `target_alone.PlainStep` (that module builds on this one)
        ...


class VerifierBase:
    """The defaults of `Verifier`'s members for a path on text that scores the draft's own tokens."""

    draws_target_tokens = False
    counts_plain_tokens = False
    sends_token_ids = False

    async def prompt_ids(self, context: Context, meter: Meter) -> tuple[int, ...]:
        raise NotImplementedError(f"{type(self).__name__} sends text, not token ids")

    async def native_draft(self, context: Context, k: int, meter: Meter, draft_meter: Meter, seed: int | None) -> tuple[ScoredToken, ...] | None:
        return None

    async def plain(
        self, context: Context, max_tokens: int | None, meter: Meter, seed: int | None, stop: list[str] | None, *, streamed: bool = False
    ) -> Any:
        raise NotImplementedError(f"{type(self).__name__} sends text, not token ids")


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
class EchoVerifier(VerifierBase):
    client: RoleClient
    name: str = "echo"
    counts_plain_tokens = True

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
class ChatPromptLogprobsVerifier(VerifierBase):
    client: RoleClient
    name: str = "prompt-logprobs"
    counts_plain_tokens = True

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


