"""SGLang's native `/generate` with token ids.

`input_ids` is one list or a batch of lists (then the answer is a list, in order); `sampling_params`
holds `max_new_tokens`, `temperature`, `top_p`, `top_k`, `stop` and the seed (`sampling_seed`);
a result is `{text, output_ids, meta_info}`, `meta_info` with `prompt_tokens`, `completion_tokens`,
`cached_tokens` and `finish_reason` (`{"type": "length", ...}` or `{"type": "stop", "matched": ...}`).
Verification asks no logprobs: with `return_logprob`, a `logprob_start_len` of 0 would bypass the radix
cache (`cached_tokens` 0 on every turn); the token ids and the text say all a token-id round needs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..transport._calls import Meter, RoleClient
from .base import Generated, Pick, count, reading, rendered_bytes, server_root

__all__ = ["SglangDialect", "sampling_params"]

_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty")


def sampling_params(fields: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI-format sampling fields as SGLang's `sampling_params`."""
    params = {k: v for k, v in fields.items() if k in _SAMPLING}
    if fields.get("seed") is not None:
        params["sampling_seed"] = fields["seed"]
    return params


@dataclass
class SglangDialect:
    name: str = "sglang"
    batches: bool = True
    batches_sampled: bool = False
    tokenizes_chat: bool = False
    scores_prompts: bool = False
    carries_logprobs: bool = False
    lists_processed: bool = False
    _added: list[int] | None = field(default=None, repr=False)

    async def tokenize(
        self, client: RoleClient, text: str, meter: Meter, *, special: bool, options: Mapping[str, Any] | None = None
    ) -> list[tuple[int, bytes | None]]:
        """SGLang has no tokenize endpoint of its own here: `/generate` with `max_new_tokens` 0 and input
        logprobs from position 0 lists the prompt's ids (a prefill, billed as one). Without `special`,
        the tokens the server adds to every text (BOS) are left out: found once, from a one-token text."""
        tokens = await self._prompt_tokens(client, text, meter, options)
        if special:
            return tokens
        if self._added is None:
            # "a" is one token in every tokenizer: what comes before it, the server adds to every text.
            self._added = [i for i, _ in await self._prompt_tokens(client, "a", meter)][:-1]
        added = self._added or []
        return tokens[len(added) :] if [i for i, _ in tokens[: len(added)]] == added else tokens

    async def _prompt_tokens(self, client: RoleClient, text: str, meter: Meter, options: Mapping[str, Any] | None = None) -> list[tuple[int, bytes | None]]:
        body = {
            "text": text,
            "sampling_params": {"max_new_tokens": 0},
            "return_logprob": True,
            "logprob_start_len": 0,
            "return_text_in_logprobs": True,
        }
        response = await client.post(server_root(client) + "/generate", body, meter, array_ok=True, options=options)
        with reading(client, "/generate (tokenizing)"):
            result = response[0] if isinstance(response, list) else response
            return [(int(item[1]), rendered_bytes(item[2])) for item in result["meta_info"]["input_token_logprobs"]]

    @staticmethod
    def _body(prompts: Sequence[Sequence[int]], fields: Mapping[str, Any], max_new_tokens: int | None) -> dict[str, Any]:
        """No logprobs are asked: `output_ids` and `text` say what was generated, and a request without
        `return_logprob` uses the radix cache in full."""
        params = sampling_params(fields)
        if max_new_tokens is not None:
            params["max_new_tokens"] = max_new_tokens
        batch = len(prompts) > 1
        return {"input_ids": [list(p) for p in prompts] if batch else list(prompts[0]), "sampling_params": params}

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
        stop: tuple[str, ...],
        meter: Meter,
        *,
        options: Mapping[str, Any],
        stream: bool = False,
        whole_characters: bool = False,
    ) -> Generated:
        body = self._body([ids], fields, max_tokens)
        if stop:
            body["sampling_params"]["stop"] = list(stop)
        response = await client.post(server_root(client) + "/generate", body, meter, options=options, array_ok=True)
        with reading(client, "/generate"):
            result = response[0] if isinstance(response, list) else response
            meta = result["meta_info"]
            finish = meta.get("finish_reason") or {}
            text = result["text"]
            if not isinstance(text, str):
                raise TypeError("text is not a string")
            ids_out = tuple(int(i) for i in result.get("output_ids") or ())
            if finish.get("type") == "stop" and ids_out and finish.get("matched") == ids_out[-1]:
                ids_out = ids_out[:-1]  # stopped by an end-of-text token: listed, but no text
            return Generated(
                ids=ids_out,
                data=text.encode("utf-8"),
                finish_reason="length" if finish.get("type") == "length" else "stop",
                prompt_tokens=count(meta.get("prompt_tokens")),
                completion_tokens=int(meta.get("completion_tokens") or len(ids_out)),
            )


def _pick(result: Mapping[str, Any]) -> Pick:
    meta = result["meta_info"]
    finish = meta.get("finish_reason") or {}
    prompt_tokens = count(meta.get("prompt_tokens"))
    ids = result.get("output_ids") or []
    if finish.get("type") == "stop" and not result.get("text"):
        return Pick(id=None, data=None, end=True, prompt_tokens=prompt_tokens, uncounted=int(meta.get("completion_tokens") or 0))
    if len(ids) != 1:
        raise ValueError(f"expected one output token, got {ids!r}")
    return Pick(id=int(ids[0]), data=rendered_bytes(result.get("text")), prompt_tokens=prompt_tokens)
