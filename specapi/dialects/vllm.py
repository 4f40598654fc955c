"""vLLM's token-id prompts on `/v1/completions`.

`prompt` may be a list of token ids, or a list of such lists (one choice per prompt, in order, as
`index`); `return_token_ids: true` adds `prompt_token_ids` and `token_ids` to each choice. `/tokenize`
(`{model, prompt, add_special_tokens}` → `{count, max_model_len, tokens}`) lives at the server's root.
A request without prompt logprobs reads the prefix cache, so one-token calls on a long cached context
cost only their new tokens, where echo verification re-prefills the whole context every round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._calls import Meter, RoleClient
from ..alignment import token_bytes
from .base import Generated, Pick, count, reading, rendered_bytes, server_root

__all__ = ["VllmDialect"]


def _data(text: Any) -> bytes | None:
    """A token's bytes from its rendering; None when the rendering lost them (U+FFFD, token_id:N)."""
    if not isinstance(text, str) or "\ufffd" in text:
        return None
    return token_bytes(text)


@dataclass
class VllmDialect:
    name: str = "vllm"
    batches: bool = True

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
            return [_pick(choice, count(single)) for choice in choices]

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


def _pick(choice: Mapping[str, Any], prompt_tokens: int | None) -> Pick:
    token_ids = choice.get("token_ids") or []
    text = choice.get("text")
    if choice.get("finish_reason") == "stop" and not text:
        return Pick(id=None, data=None, end=True, prompt_tokens=prompt_tokens, uncounted=len(token_ids))
    if len(token_ids) != 1:
        raise ValueError(f"expected one generated token id, got {token_ids!r}")
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    data = _data(tokens[0]) if tokens else None
    if data is None and text:
        data = rendered_bytes(text)
    return Pick(id=int(token_ids[0]), data=data, prompt_tokens=prompt_tokens)
