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

from ._calls import Meter, RoleClient
from ._wire import chat_tokens, completion_tokens
from .acceptance import DEFAULT_EOS_TOKENS
from .alignment import ScoredToken
from .context import Context, Prefill
from .verifiers import SeedSource, Verification

__all__ = ["PrefillFanoutVerifier", "END_OF_TEXT"]

END_OF_TEXT = "<|endoftext|>"


@dataclass
class PrefillFanoutVerifier:
    """Verifies through one `max_tokens: 1` request per draft position, sent concurrently."""

    client: RoleClient
    name: str = "prefill-fanout"
    prefill: Prefill = Prefill()

    async def verify(self, context: Context, draft: Sequence[ScoredToken], meter: Meter, next_seed: SeedSource, top_k: int) -> Verification:
        seeds = [next_seed() for _ in range(len(draft) + 1)]
        prefixes = [""]
        for token in draft:
            prefixes.append(prefixes[-1] + token.data.decode("utf-8", errors="strict"))
        started = self.client.clock()
        answers = await asyncio.gather(*(self._pick(context, prefix, meter, seed, top_k) for prefix, seed in zip(prefixes, seeds)))
        latency = self.client.clock() - started
        picks = [pick for pick, _ in answers]
        positions = []
        for token, pick in zip(draft, picks):
            positions.append(ScoredToken(text=token.text, logprob=0.0 if pick == token.text else None, top={pick: 0.0}))
        bonus_pick = picks[len(draft)]
        bonus = None if bonus_pick == END_OF_TEXT else ScoredToken(text=bonus_pick, logprob=0.0, top={bonus_pick: 0.0})
        return Verification(
            positions=tuple(positions),
            straddle=0,
            bonus=bonus,
            finish_reason="stop" if bonus is None else "length",
            latency_s=latency,
            prompt_tokens=answers[0][1],  # the context alone, as the target tokenized it
        )

    async def _pick(self, context: Context, prefix: str, meter: Meter, seed: int | None, top_k: int) -> tuple[str, int | None]:
        """The target's next token after `accepted + prefix` (END_OF_TEXT when it ends the text), and
        the prompt tokens it was billed."""
        body = {"max_tokens": 1, **context.sampling_body(seed)}
        if context.is_chat:
            body.update({"messages": context.chat_messages(prefix), "logprobs": True, "top_logprobs": min(top_k, 20)})
            body.update(self.prefill.fields(bool(context.accepted or prefix)))
            response = await self.client.post("/chat/completions", body, meter)
        else:
            body.update({"prompt": context.completion_prompt(prefix), "logprobs": min(top_k, 5)})
            response = await self.client.post("/completions", body, meter)
        try:
            choice = response["choices"][0]
            if context.is_chat:
                text = self.prefill.strip((choice.get("message") or {}).get("content") or "", context.accepted + prefix)
                tokens = chat_tokens((choice.get("logprobs") or {}).get("content") or [])
            else:
                text = choice.get("text") or ""
                tokens = completion_tokens(choice.get("logprobs")) if choice.get("logprobs") else []
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise self.client.error(f"fan-out response is unreadable ({exc})", malformed=True) from exc
        real = [t for t in tokens if t.text not in DEFAULT_EOS_TOKENS]
        prompt_tokens = (response.get("usage") or {}).get("prompt_tokens")
        prompt_tokens = prompt_tokens if isinstance(prompt_tokens, int) else None
        if not text:
            if choice.get("finish_reason") == "stop":
                return END_OF_TEXT, prompt_tokens
            raise self.client.error("fan-out response generated nothing and did not stop", malformed=True)
        if real and real[-1].text and text.endswith(real[-1].text):
            return real[-1].text, prompt_tokens  # the token as the server spelled it
        return text, prompt_tokens
