"""Prefill fan-out: verification for servers that only report logprobs of tokens they generate
(llama.cpp, Ollama, OpenAI completions without echo).

For a draft d1..dK, K+1 requests go out at once; request i continues the text `accepted + d1..di` and
asks for one token. The target's own pick s(i+1) at each position then decides: d(i+1) is kept while
it equals s(i+1), and the first differing s is emitted. Each emitted token is a genuine target sample
given its prefix, so this is exact at every temperature, without needing top-k coverage. The price is
K+1 target requests per round, each billing the whole context.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from ..transport._calls import Meter, RoleClient
from ..core.acceptance import DEFAULT_EOS_TOKENS
from ..core.alignment import ScoredToken, complete_utf8_prefix, token_bytes
from ..core.context import Context
from ..dialects.base import reading
from ..dialects.openai import Prefill, next_token_request, openai_format
from .verifiers import SeedSource, Verification, VerifierBase

__all__ = ["PrefillFanoutVerifier", "END_OF_TEXT"]

END_OF_TEXT = "<|endoftext|>"


@dataclass
class PrefillFanoutVerifier(VerifierBase):
    """Verifies through one `max_tokens: 1` request per draft position, sent concurrently."""

    client: RoleClient
    name: str = "prefill-fanout"
    prefill: Prefill = Prefill()
    #: Every kept token is one the target drew itself, so any sampler settings are reproduced.
    draws_target_tokens: bool = True

    async def verify(
        self, context: Context, draft: Sequence[ScoredToken], meter: Meter, next_seed: SeedSource, top_k: int, draft_meter: Meter | None = None,
        limit: int | None = None,
    ) -> Verification:
        seeds = [next_seed() for _ in range(len(draft) + 1)]
        # Each prefix is sent as text, so it may only end on a whole character: a draft token that
        # ends inside one is scored only together with the token that completes it.
        prefixes: list[str | None] = [""]
        data = b""
        for token in draft:
            data += token.data
            whole = complete_utf8_prefix(data)
            prefixes.append(data.decode("utf-8") if whole == data else None)
        started = self.client.clock()
        answers = await asyncio.gather(*(self._pick(context, prefix, meter, seed, top_k) for prefix, seed in zip(prefixes, seeds)))
        latency = self.client.clock() - started
        picks = [pick for pick, _, _ in answers]
        positions = []
        for token, pick in zip(draft, picks):
            if pick is None:
                positions.append(ScoredToken(text=token.text))  # no pick here: the round ends before it
            elif pick != END_OF_TEXT and token_bytes(pick) == token.data:
                positions.append(ScoredToken(text=token.text, logprob=0.0, top={token.text: 0.0}))
            else:
                positions.append(ScoredToken(text=token.text, logprob=None, top={pick: 0.0}))
        bonus_pick = picks[len(draft)]
        if bonus_pick is None:
            bonus = None
        else:
            bonus = None if bonus_pick == END_OF_TEXT else ScoredToken(text=bonus_pick, logprob=0.0, top={bonus_pick: 0.0})
        return Verification(
            positions=tuple(positions),
            straddle=0,
            bonus=bonus,
            finish_reason="stop" if bonus_pick == END_OF_TEXT else "length",
            latency_s=latency,
            prompt_tokens=answers[0][1],  # the context alone, as the target tokenized it
            prompt_counts=tuple(count for _, count, _ in answers),
            seeds=tuple(seeds),
            picks=tuple(scored for _, _, scored in answers),
        )

    async def _pick(
        self, context: Context, prefix: str | None, meter: Meter, seed: int | None, top_k: int
    ) -> tuple[str | None, int | None, ScoredToken | None]:
        """The target's next token after `accepted + prefix` (END_OF_TEXT when it ends the text, None
        when it cannot be known: no whole-character prefix, or a partial character with no bytes
        shown), the prompt tokens it was billed, and the token with its scores when the server listed them."""
        if prefix is None:
            return None, None, None
        path, body = next_token_request(context, prefix, top_k, seed, self.prefill)
        response = await self.client.post(path, body, meter, options=context.options)
        with reading(self.client, "fan-out"):
            form = openai_format(context)
            choice = response["choices"][0]
            text = form.text(choice, context.accepted + prefix, self.prefill)
            tokens = form.tokens(choice) if choice.get("logprobs") else []
        real = [t for t in tokens if t.text not in DEFAULT_EOS_TOKENS]
        prompt_tokens = (response.get("usage") or {}).get("prompt_tokens")
        prompt_tokens = prompt_tokens if isinstance(prompt_tokens, int) else None
        finish = choice.get("finish_reason")
        if len(real) == 1 and token_bytes(real[0].text):
            token = real[0].text
            if text.encode("utf-8") == token_bytes(token) or (finish == "length" and text in ("", "\ufffd")):
                return token, prompt_tokens, real[0]  # the token as the server spelled it (its bytes, if partial)
        if not text:
            if finish == "stop":
                return END_OF_TEXT, prompt_tokens, None
            if finish == "length":
                return None, prompt_tokens, None  # part of a character, and no logprobs show which bytes
            raise self.client.malformed("fan-out response generated nothing and did not stop")
        if text.endswith("\ufffd") and finish == "length":
            return None, prompt_tokens, None
        return text, prompt_tokens, None
