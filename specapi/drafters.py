"""Drafters: things that propose the next tokens. Each returns `Draft` tokens with the draft's logprobs."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ._calls import Meter, RoleClient
from ._wire import WireError, chat_tokens, completion_tokens
from .acceptance import DEFAULT_EOS_TOKENS
from .alignment import ScoredToken, complete_utf8_prefix, token_bytes
from .context import Context

__all__ = ["Draft", "Drafter", "ModelDrafter"]


@dataclass(frozen=True)
class Draft:
    """Proposed tokens. `tokens` may be empty (nothing to propose). `text` is what the target will score."""

    tokens: tuple[ScoredToken, ...]
    latency_s: float = 0.0
    drafter: str = ""

    @property
    def text(self) -> str:
        return b"".join(t.data for t in self.tokens).decode("utf-8")


class Drafter(Protocol):
    name: str

    async def draft(self, context: Context, k: int, meter: Meter, seed: int | None) -> Draft: ...


def usable_prefix(tokens: Sequence[ScoredToken]) -> tuple[ScoredToken, ...]:
    """The longest run of tokens whose bytes are known and end on a whole UTF-8 character.

    A draft can only be sent back as text, so a trailing partial character, a token whose bytes the
    server hid, or an end-of-text token ends the proposal there.
    """
    kept: list[ScoredToken] = []
    data = b""
    best = 0
    for token in tokens:
        piece = token_bytes(token.text)
        if piece is None or token.logprob is None or token.text in DEFAULT_EOS_TOKENS or not piece:
            break
        data += piece
        kept.append(token)
        if complete_utf8_prefix(data) == data:
            best = len(kept)
    return tuple(kept[:best])


@dataclass
class ModelDrafter:
    """Drafts with a model: `/v1/completions` with logprobs, or chat logprobs for chat requests.

    For completion requests on an endpoint that refuses completions, it falls back to chat (the draft
    is only a proposal, so any proposal distribution with known probabilities keeps the output exact).
    """

    client: RoleClient
    name: str = "draft-model"

    def __post_init__(self) -> None:
        self._completions_ok = True

    def _top_k(self, context: Context) -> int:
        return 1 if context.sampling.greedy else min(self.client.endpoint.max_logprobs, 20)

    async def draft(self, context: Context, k: int, meter: Meter, seed: int | None) -> Draft:
        started = time.perf_counter()
        if not context.is_chat and self._completions_ok:
            body = {
                "prompt": context.completion_prompt(),
                "max_tokens": k,
                "logprobs": self._top_k(context),
                **context.sampling_body(seed),
            }
            try:
                response = await self.client.post("/completions", body, meter)
            except Exception as exc:
                status = getattr(exc, "status_code", None)
                if status in (400, 404, 405, 422):
                    self._completions_ok = False  # e.g. a chat-only model: use chat from now on
                else:
                    raise
            else:
                tokens = self._parse(response, chat=False)
                return Draft(tokens=tokens, latency_s=time.perf_counter() - started, drafter=self.name)
        body = {
            "messages": self._chat_messages(context),
            "max_tokens": k,
            "logprobs": True,
            "top_logprobs": self._top_k(context),
            **context.sampling_body(seed),
        }
        if context.accepted or not context.is_chat:
            body.update({"continue_final_message": True, "add_generation_prompt": False})
        response = await self.client.post("/chat/completions", body, meter)
        tokens = self._parse(response, chat=True)
        return Draft(tokens=tokens, latency_s=time.perf_counter() - started, drafter=self.name)

    @staticmethod
    def _chat_messages(context: Context) -> list[dict]:
        if context.is_chat:
            return context.chat_messages()
        return [{"role": "assistant", "content": context.completion_prompt()}]

    def _parse(self, response: dict, *, chat: bool) -> tuple[ScoredToken, ...]:
        try:
            choice = response["choices"][0]
            tokens = chat_tokens((choice.get("logprobs") or {}).get("content")) if chat else completion_tokens(choice.get("logprobs"))
        except (KeyError, IndexError, TypeError, WireError) as exc:
            raise self.client.error(f"draft response has no usable logprobs ({exc})", malformed=True) from exc
        return usable_prefix(tokens)
