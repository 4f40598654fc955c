"""vLLM's token-id prompts on `/v1/completions`.

`prompt` may be a list of token ids, or a list of such lists (one choice per prompt, in order, as
`index`); `return_token_ids: true` adds `prompt_token_ids` and `token_ids` to each choice. `/tokenize`
(`{model, prompt, add_special_tokens}` → `{count, max_model_len, tokens}`) lives at the server's root.
A request without prompt logprobs reads the prefix cache, so one-token calls on a long cached context
cost only their new tokens, where echo verification re-prefills the whole context every round.

vLLM's extras to the OpenAI formats live here too: `prompt_logprobs: k` scores every prompt token
(with the top k), answered at the top level of a chat response (`prompt_logprobs`, null first, then
`{token_id: {logprob, rank, decoded_token}}` per position), and `return_token_ids: true` adds
`prompt_token_ids`, which says which token each position holds. With `continue_final_message`, a
chat request scores a draft written as the assistant's text (`ChatPromptLogprobsVerifier`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..transport._calls import Meter, RoleClient
from ..core.alignment import ScoredToken, token_bytes
from ..core.context import Context
from .base import UNREADABLE, Generated, Pick, SampledStep, count, reading, rendered_bytes, server_root
from .logprobs import chat_tokens, prompt_logprob_tokens
from .openai import Prefill, chat_request, fixed_sampling, sampling_fields

__all__ = ["VllmDialect", "prompt_scores_finding", "prompt_scores_note", "prompt_scores_probe", "prompt_scores_request", "read_prompt_scores", "scores_prompt"]


def prompt_scores_request(context: Context, draft_text: str, top_k: int, seed: int | None) -> tuple[str, dict[str, Any]]:
    """A chat request that scores the messages with `draft_text` as the assistant's text (its prompt
    tokens and their top `top_k`) and generates one token after them, with `top_k` alternatives."""
    body: dict[str, Any] = {
        "messages": context.chat_messages(draft_text),
        "max_tokens": 1,
        "logprobs": True,
        "top_logprobs": top_k,
        **_prompt_scores(top_k),
        **sampling_fields(context, seed),
    }
    body.update(Prefill().fields(bool(context.accepted or draft_text)))
    return "/chat/completions", body


def prompt_scores_probe(messages: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The probe's request: does the endpoint score a continued chat prompt (one alternative, greedy)?"""
    path, body = chat_request(messages, 1, fixed_sampling(0), prefill=Prefill())
    return path, {**body, **_prompt_scores(1)}


def prompt_scores_finding(scored: bool) -> dict[str, bool]:
    """The probe's finding, as the `Capabilities` field (and `specapi probe --json`) names it."""
    return {"prompt_logprobs": scored}


def prompt_scores_note(scored: bool) -> str:
    return "chat prompt_logprobs: " + ("yes" if scored else "no")


def _prompt_scores(top_k: int) -> dict[str, Any]:
    return {"prompt_logprobs": top_k, "return_token_ids": True}


def read_prompt_scores(response: Mapping[str, Any]) -> tuple[list[ScoredToken], list[ScoredToken], Mapping[str, Any]]:
    """The scored prompt tokens, the generated ones and the choice of a `prompt_scores_request` answer
    (raises what `reading` maps when the answer lacks them)."""
    choice = response["choices"][0]
    token_ids = response.get("prompt_token_ids") or choice.get("prompt_token_ids")
    scored = prompt_logprob_tokens(response.get("prompt_logprobs"), token_ids)
    generated = chat_tokens((choice.get("logprobs") or {}).get("content"))
    return scored, generated, choice


def scores_prompt(response: Mapping[str, Any] | None) -> bool:
    """The probe's answer scored the prompt as `prompt_scores_probe` asked."""
    if response is None or response.get("prompt_logprobs") is None:
        return False
    try:
        token_ids = response.get("prompt_token_ids") or response["choices"][0].get("prompt_token_ids")
        prompt_logprob_tokens(response["prompt_logprobs"], token_ids)
    except UNREADABLE:
        return False
    return True


def _data(text: Any) -> bytes | None:
    """A token's bytes from its rendering; None when the rendering lost them (U+FFFD, token_id:N, and
    "": vLLM renders a token that holds part of a character as "", and holds its bytes back from the text)."""
    if not isinstance(text, str) or not text or "\ufffd" in text:
        return None
    return token_bytes(text)


@dataclass
class VllmDialect:
    name: str = "vllm"
    batches: bool = True
    lists_processed: bool = False
    #: Each prompt of an unseeded request draws with its own generator: independent draws.
    batches_sampled: bool = True

    async def tokenize(self, client: RoleClient, text: str, meter: Meter, *, special: bool) -> list[tuple[int, bytes | None]]:
        body = {"model": client.endpoint.model, "prompt": text, "add_special_tokens": special}
        response = await client.post(server_root(client) + "/tokenize", body, meter)
        with reading(client, "/tokenize"):
            return [(int(t), None) for t in response["tokens"]]

    async def next_tokens(
        self, client: RoleClient, prompts: Sequence[Sequence[int]], fields: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any]
    ) -> list[Pick]:
        body = {**fields, "prompt": [list(p) for p in prompts] if len(prompts) > 1 else list(prompts[0])}
        body.update({"max_tokens": 1, "logprobs": 1, "return_token_ids": True})
        response = await client.post("/completions", body, meter, options=options)
        with reading(client, "token-id /completions"):
            choices = sorted(response["choices"], key=lambda c: int(c.get("index", 0)))
            if len(choices) != len(prompts):
                raise ValueError(f"{len(choices)} choices for {len(prompts)} prompts")
            usage = response.get("usage") or {}
            single = usage.get("prompt_tokens") if len(prompts) == 1 else None
            # Each choice's prompt_token_ids (return_token_ids) say what its prompt was billed: a batch's
            # usage sums them all.
            return [_pick(choice, count(single) if single is not None else _prompt_count(choice)) for choice in choices]

    async def ids_draft(
        self, client: RoleClient, ids: Sequence[int], k: int, fields: Mapping[str, Any], alternatives: int, meter: Meter, *, options: Mapping[str, Any]
    ) -> list[tuple[int, tuple[int, ...]]]:
        """Up to `k` tokens the draft generates after `ids`, each with the `alternatives` next most likely
        ids at its position: `return_tokens_as_token_ids` names every listed token by its id."""
        body = {**fields, "prompt": list(ids), "max_tokens": k, "logprobs": 1 + alternatives, "return_tokens_as_token_ids": True}
        response = await client.post("/completions", body, meter, options=options)
        with reading(client, "token-id draft /completions"):
            logprobs = response["choices"][0].get("logprobs") or {}
            chain: list[tuple[int, tuple[int, ...]]] = []
            for token, top in zip(logprobs.get("tokens") or [], logprobs.get("top_logprobs") or []):
                chosen = _token_id(token)
                others = sorted(((-float(lp), _token_id(t)) for t, lp in (top or {}).items() if _token_id(t) != chosen))
                chain.append((chosen, tuple(i for _, i in others[:alternatives])))
            return chain

    async def sampled_drafts(
        self, client: RoleClient, ids: Sequence[int], k: int, fields: Mapping[str, Any], n: int, listed: int, meter: Meter, *, options: Mapping[str, Any]
    ) -> list[tuple[SampledStep, ...]]:
        """`n` chains of up to `k` tokens the draft samples after `ids` (one request, `n` choices): `logprobs:
        listed` gives each sampled token's log-probability and the `listed` likeliest at its position,
        `return_tokens_as_token_ids` names every token by its id."""
        body = {**fields, "prompt": list(ids), "max_tokens": k, "n": n, "logprobs": listed, "return_tokens_as_token_ids": True}
        response = await client.post("/completions", body, meter, options=options)
        with reading(client, "sampled token-id draft /completions"):
            return [_sampled_chain(choice.get("logprobs") or {}) for choice in response["choices"]]

    async def detokenize(self, client: RoleClient, ids: Sequence[int], meter: Meter) -> bytes | None:
        response = await client.post(server_root(client) + "/detokenize", {"model": client.endpoint.model, "tokens": list(ids)}, meter)
        with reading(client, "/detokenize"):
            return rendered_bytes(response["prompt"])

    async def generate(
        self,
        client: RoleClient,
        ids: Sequence[int],
        fields: Mapping[str, Any],
        max_tokens: int | None,
        stop: Sequence[str] | None,
        meter: Meter,
        *,
        options: Mapping[str, Any],
        stream: bool = False,
        whole_characters: bool = False,
    ) -> Generated:
        body: dict[str, Any] = {**fields, "prompt": list(ids), "return_token_ids": True}
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        if stop:
            body["stop"] = list(stop)
        response = await client.post("/completions", body, meter, options=options)
        with reading(client, "token-id /completions"):
            choice = response["choices"][0]
            text = choice["text"]
            if not isinstance(text, str):
                raise TypeError("text is not a string")
            finish = choice.get("finish_reason") or "length"
            token_ids = tuple(int(t) for t in choice.get("token_ids") or ())
            usage = response.get("usage") or {}
            completion = usage.get("completion_tokens")
            return Generated(
                ids=token_ids,
                data=text.encode("utf-8"),
                finish_reason="length" if finish == "length" else "stop",
                prompt_tokens=count(usage.get("prompt_tokens")),
                completion_tokens=len(token_ids) if count(completion) is None else completion,
            )


def _prompt_count(choice: Mapping[str, Any]) -> int | None:
    ids = choice.get("prompt_token_ids")
    return len(ids) if isinstance(ids, list) else None


def _token_id(rendered: Any) -> int:
    """A token rendered as `token_id:N`."""
    if not isinstance(rendered, str) or not rendered.startswith("token_id:"):
        raise ValueError(f"expected a token rendered as token_id:N, got {rendered!r}")
    return int(rendered.removeprefix("token_id:"))


def _sampled_chain(logprobs: Mapping[str, Any]) -> tuple[SampledStep, ...]:
    """A sampled choice's tokens, each with its log-probability and the ones listed at its position."""
    tokens = logprobs.get("tokens") or []
    chosen = logprobs.get("token_logprobs") or [None] * len(tokens)
    tops = logprobs.get("top_logprobs") or [None] * len(tokens)
    steps = []
    for token, logprob, top in zip(tokens, chosen, tops, strict=True):
        listed = tuple((_token_id(t), float(lp)) for t, lp in (top or {}).items() if lp is not None)
        steps.append(SampledStep(id=_token_id(token), logprob=None if logprob is None else float(logprob), listed=listed))
    return tuple(steps)


def _pick(choice: Mapping[str, Any], prompt_tokens: int | None) -> Pick:
    token_ids = choice.get("token_ids") or []
    text = choice.get("text")
    if choice.get("finish_reason") == "stop" and not text:
        return Pick(id=None, data=None, end=True, prompt_tokens=prompt_tokens, uncounted=len(token_ids))
    if len(token_ids) != 1:
        raise ValueError(f"expected one generated token id, got {token_ids!r}")
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    data = _data(tokens[0]) if tokens else None
    if data and text == "":
        data = b""  # a special token other than the end (e.g. a BOS): listed by its name, left out of the text
    if data is None and text:
        data = rendered_bytes(text)
    return Pick(id=int(token_ids[0]), data=data, prompt_tokens=prompt_tokens)
