"""Verifiers: one target call that scores every draft position and yields one more token.

`EchoVerifier` uses `/v1/completions` with `echo` + `logprobs` + `max_tokens: 1` (vLLM, SGLang, Together,
OpenAI base models). `ChatPromptLogprobsVerifier` uses vLLM's chat `prompt_logprobs` with
`continue_final_message`, so chat requests verify exactly too. Both also serve plain target steps.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ._calls import Meter, RoleClient
from ._wire import WireError, chat_tokens, completion_tokens, prompt_logprob_tokens
from .acceptance import DEFAULT_EOS_TOKENS, RoundDecision
from .alignment import ScoredToken, complete_utf8_prefix, locate_suffix, token_bytes
from .context import Context, Prefill
from .dialects.openai import openai_format

__all__ = [
    "Verification",
    "Verifier",
    "VerifierBase",
    "EchoVerifier",
    "ChatPromptLogprobsVerifier",
    "generation_request",
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
    scored: Sequence[ScoredToken], start: int, straddle: int, bonus: ScoredToken | None, choice: dict, latency: float, usage: dict
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
        body = {"prompt": prompt, "echo": True, "logprobs": top_k, "max_tokens": 1, **context.sampling_body(next_seed())}
        started = self.client.clock()
        response = await self.client.post("/completions", body, meter, options=context.options)
        latency = self.client.clock() - started
        try:
            return self._read(response, prompt, draft_text, latency)
        except (KeyError, IndexError, TypeError, WireError) as exc:
            raise self.client.error(f"echo response cannot be verified against ({exc})", malformed=True) from exc

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
        seed = next_seed()
        body = {
            "messages": context.chat_messages(draft_text),
            "max_tokens": 1,
            "logprobs": True,
            "top_logprobs": top_k,
            "prompt_logprobs": top_k,
            "return_token_ids": True,
            **context.sampling_body(seed),
        }
        if context.accepted or draft_text:
            body.update({"continue_final_message": True, "add_generation_prompt": False})
        started = self.client.clock()
        response = await self.client.post("/chat/completions", body, meter, options=context.options)
        latency = self.client.clock() - started
        try:
            choice = response["choices"][0]
            token_ids = response.get("prompt_token_ids") or choice.get("prompt_token_ids")
            scored = prompt_logprob_tokens(response.get("prompt_logprobs"), token_ids)
            generated = chat_tokens((choice.get("logprobs") or {}).get("content"))
            found = locate_suffix(scored, draft_text.encode("utf-8"))
            if found is None:
                raise WireError("the scored prompt does not end with the draft text")
            start, straddle = found
            content = (choice.get("message") or {}).get("content") or ""
            bonus = _bonus(generated, content, choice.get("finish_reason"))
        except (KeyError, IndexError, TypeError, WireError) as exc:
            raise self.client.error(f"prompt_logprobs response cannot be verified against ({exc})", malformed=True) from exc
        return _verification(scored, start, straddle, bonus, choice, latency, response.get("usage") or {})


def generation_request(
    context: Context, max_tokens: int | None, seed: int | None, stop: list[str] | None, prefill: Prefill = Prefill()
) -> tuple[str, dict]:
    """The path and body of a request in which the target generates from the context by itself
    (`max_tokens` None: none is sent, and the server's own limit applies)."""
    form = openai_format(context)
    body: dict = {**context.sampling_body(seed)}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    if stop:
        body["stop"] = stop
    body.update(form.prompt_fields(context, prefill=prefill))
    return form.path, body
