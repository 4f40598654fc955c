"""SGLang's native `/generate` with token ids.

`input_ids` is one list or a batch of lists (then the answer is a list, in order); `sampling_params`
holds `max_new_tokens`, `temperature`, `top_p`, `top_k`, `stop` and the seed (`sampling_seed`);
`return_logprob` with `return_text_in_logprobs` lists each output token as `[logprob, id, text]` in
`meta_info.output_token_logprobs`. `logprob_start_len` is set to the prompt's last position: 0 would
bypass the radix cache (`cached_tokens` 0 on every turn). `meta_info` also has `prompt_tokens`,
`completion_tokens`, `cached_tokens` and `finish_reason` (`{"type": "stop"|"length", ...}`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._calls import Meter, RoleClient
from .base import Generated, Pick, reading, server_root

__all__ = ["SglangDialect", "sampling_params"]

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")


def sampling_params(fields: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI-format sampling fields as SGLang's `sampling_params`."""
    params = {k: v for k, v in fields.items() if k in _SAMPLING}
    if fields.get("seed") is not None:
        params["sampling_seed"] = fields["seed"]
    return params


def _text_data(text: Any) -> bytes | None:
    if not isinstance(text, str) or "\ufffd" in text:
        return None
    return text.encode("utf-8")


@dataclass
class SglangDialect:
    name: str = "sglang"
    batches: bool = True

    async def tokenize(self, client: RoleClient, text: str, meter: Meter, *, special: bool) -> list[tuple[int, bytes | None]]:
        body = {"model": client.endpoint.model, "prompt": text, "add_special_tokens": special}
        response = await client.post(server_root(client) + "/tokenize", body, meter)
        with reading(client, "/tokenize"):
            return [(int(t), None) for t in response["tokens"]]

    def _body(self, prompts: Sequence[Sequence[int]], fields: Mapping[str, Any], max_new_tokens: int | None) -> dict[str, Any]:
        params = sampling_params(fields)
        if max_new_tokens is not None:
            params["max_new_tokens"] = max_new_tokens
        batch = len(prompts) > 1
        start = [max(0, len(p) - 1) for p in prompts]
        return {
            "input_ids": [list(p) for p in prompts] if batch else list(prompts[0]),
            "sampling_params": params,
            "return_logprob": True,
            "top_logprobs_num": 1,
            "return_text_in_logprobs": True,
            "logprob_start_len": start if batch else start[0],
        }

    async def next_tokens(
        self, client: RoleClient, prompts: Sequence[Sequence[int]], fields: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any]
    ) -> list[Pick]:
        body = self._body(prompts, fields, 1)
        response = await client.post(server_root(client) + "/generate", body, meter, options=options, array_ok=True)
        with reading(client, "/generate"):
            results = response if isinstance(response, list) else [response]
            if len(results) != len(prompts):
                raise ValueError(f"{len(results)} results for {len(prompts)} prompts")
            return [_pick(r) for r in results]

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
        body = self._body([ids], fields, max_tokens)
        if stop:
            body["sampling_params"]["stop"] = list(stop)
        response = await client.post(server_root(client) + "/generate", body, meter, options=options, array_ok=True)
        with reading(client, "/generate"):
            result = response[0] if isinstance(response, list) else response
            meta = result["meta_info"]
            items = meta.get("output_token_logprobs") or []
            finish = (meta.get("finish_reason") or {}).get("type")
            text = result["text"]
            if not isinstance(text, str):
                raise TypeError("text is not a string")
            ids_out = tuple(int(item[1]) for item in items)
            if finish == "stop" and ids_out and items[-1][2] == "":
                ids_out = ids_out[:-1]  # the end-of-text token renders as nothing
            return Generated(
                ids=ids_out,
                data=text.encode("utf-8"),
                finish_reason="length" if finish == "length" else "stop",
                prompt_tokens=meta.get("prompt_tokens") if isinstance(meta.get("prompt_tokens"), int) else None,
                completion_tokens=int(meta.get("completion_tokens") or len(ids_out)),
            )


def _pick(result: Mapping[str, Any]) -> Pick:
    meta = result["meta_info"]
    finish = meta.get("finish_reason") or {}
    prompt_tokens = meta.get("prompt_tokens") if isinstance(meta.get("prompt_tokens"), int) else None
    items = meta.get("output_token_logprobs") or []
    if finish.get("type") == "stop" and not result.get("text"):
        return Pick(id=None, data=None, end=True, prompt_tokens=prompt_tokens, uncounted=int(meta.get("completion_tokens") or 0))
    if len(items) != 1:
        raise ValueError(f"expected one output token, got {len(items)}")
    return Pick(id=int(items[0][1]), data=_text_data(items[0][2]), prompt_tokens=prompt_tokens)
