"""Generating and scoring tokens with a simulated model, as a server does for one request.

``generate`` samples up to ``max_tokens`` tokens (greedy at temperature 0), stopping at end-of-text or at a
stop string, and keeps what the response needs: each token's logprob and top alternatives (temperature 1,
as vLLM reports them), the text, the finish reason. ``score_prompt`` gives the same records for prompt
tokens (echo, prompt logprobs). ``text_offsets`` gives each token's offset in code points.

The end-of-text token is kept among the tokens (it is generated and billed) but adds no text. A stop
string ends generation: the text is cut where it starts; the tokens generated up to it stay listed.
Generation is deterministic for a given random generator, and the same whether it runs in one call or
token by token (the model is a pure function of the context).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .corpus import EOS_TOKEN_ID, incremental_decoder, token_bytes
from .models import Mixture, NGramModel

Sampler = Callable[[NGramModel, Mixture, np.random.Generator], int]
"""Draws the next token from a model's mixture: ``sampler(model, mix, rng)``."""

__all__ = ["Generation", "Sampler", "TokenRecord", "generate", "score_prompt", "stop_reason", "rendered_offsets", "text_offsets"]


@dataclass(frozen=True)
class TokenRecord:
    """One token and what the model said about it (``logprob``/``top``/``rank`` when asked for)."""

    token_id: int
    logprob: float | None = None
    top: tuple[tuple[int, float], ...] | None = None
    rank: int | None = None


@dataclass(frozen=True)
class Generation:
    """The outcome of one ``generate`` call."""

    tokens: tuple[TokenRecord, ...]
    text: str
    finish_reason: str  # "stop" or "length"

    @property
    def token_ids(self) -> list[int]:
        return [t.token_id for t in self.tokens]


def generate(
    model: NGramModel,
    prompt_ids: Sequence[int],
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    rng: np.random.Generator,
    stop: Sequence[str] = (),
    top_k: int | None = None,
    sampler: Sampler | None = None,
) -> Generation:
    """Generate after ``prompt_ids``. ``top_k``: record logprobs with that many alternatives
    (``None`` = no logprobs, ``-1`` = every token). ``sampler``: draws each token instead of the model's
    own temperature-then-top-p sampling (a server's own sampler chain, e.g. llama-server's)."""
    n = len(prompt_ids)
    context = np.empty(n + max_tokens, dtype=np.int64)
    context[:n] = prompt_ids
    decoder = incremental_decoder()
    longest_stop = max((len(s) for s in stop), default=0)
    records: list[TokenRecord] = []
    text = ""
    finish = "length"
    for step in range(max_tokens):
        mix = model.mixture(context[: n + step])
        token = sampler(model, mix, rng) if sampler is not None else model.sample_from(mix, temperature, top_p, rng)
        context[n + step] = token
        if top_k is None:
            records.append(TokenRecord(token))
        else:
            records.append(TokenRecord(token, model.logprob_from(mix, token), tuple(model.top_from(mix, top_k))))
        if token == EOS_TOKEN_ID:
            finish = "stop"
            break
        before = len(text)
        text += decoder.decode(token_bytes(token))
        if stop:
            cut = _find_stop(text, stop, max(0, before - longest_stop + 1))
            if cut is not None:
                return Generation(tuple(records), text[:cut], "stop")
    text += decoder.decode(b"", final=True)
    return Generation(tuple(records), text, finish)


def stop_reason(gen: Generation, stop: Sequence[str], *, eos: bool) -> str | int | None:
    """What ended a generation, as vLLM's ``stop_reason`` / SGLang's ``matched_stop`` say it: the stop
    string that cut it; the end-of-text id when ``eos`` (SGLang names it, vLLM does not); else ``None``."""
    if gen.tokens and gen.tokens[-1].token_id == EOS_TOKEN_ID:
        return EOS_TOKEN_ID if eos else None
    if gen.finish_reason != "stop":
        return None
    full = b"".join(token_bytes(t) for t in gen.token_ids).decode("utf-8", errors="replace")
    hits = [(full.find(s, len(gen.text)), s) for s in stop if s and full.find(s, len(gen.text)) >= 0]
    return min(hits)[1] if hits else None


def _find_stop(text: str, stop: Sequence[str], start: int) -> int | None:
    hits = [i for i in (text.find(s, start) for s in stop if s) if i >= 0]
    return min(hits) if hits else None


def score_prompt(
    model: NGramModel, prompt_ids: Sequence[int], *, top_k: int, with_rank: bool, start: int = 1
) -> list[TokenRecord]:
    """Records for the prompt tokens from position ``start - 1`` on; that first one has no logprob
    (position 0 has nothing before it; SGLang leaves the token at ``logprob_start_len`` unscored too)."""
    if not prompt_ids:
        return []
    first = max(0, start - 1)
    scored = model.score(prompt_ids, k=top_k, start=first + 1, with_rank=with_rank)
    return [TokenRecord(int(prompt_ids[first]))] + [
        TokenRecord(s.token_id, s.logprob, s.top, s.rank) for s in scored
    ]


def rendered_offsets(token_ids: Sequence[int], render: Callable[[int], str]) -> list[int]:
    """Each token's offset as vLLM counts it: the lengths of the tokens before it as rendered."""
    offsets, length = [], 0
    for token in token_ids:
        offsets.append(length)
        length += len(render(token))
    return offsets


def text_offsets(token_ids: Sequence[int]) -> list[int]:
    """Code-point offset of each token in the decoded text of ``token_ids`` (tokens holding part of a
    character sit where that character starts once it is complete)."""
    decoder = incremental_decoder()
    offsets = []
    length = 0
    for token in token_ids:
        offsets.append(length)
        length += len(decoder.decode(token_bytes(token)))
    return offsets
