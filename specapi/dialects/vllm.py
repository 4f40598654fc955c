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
from dataclasses import dataclass, field
from typing import Any

from ..transport._calls import Meter, RoleClient
from ..core.alignment import ScoredToken, token_bytes
from ..core.context import Context
from ..core.scoring import PrefixCache
from .base import UNREADABLE, Generated, Listed, Pick, SampledStep, count, reading, rendered_bytes, server_root
from .logprobs import chat_tokens, prompt_logprob_tokens
from .openai import Prefill, chat_request, fixed_sampling, sampling_fields

__all__ = ["CHAT_TEMPLATE_FIELDS", "ScoredPick", "VllmDialect", "prompt_scores_finding", "prompt_scores_note", "prompt_scores_probe", "prompt_scores_request", "read_cache_config", "read_prompt_scores", "read_scored_picks", "scores_prompt"]


#: Fields of a chat request that change how its messages are rendered: on token ids they go to
#: `/tokenize` with the messages, and not to the completions requests that continue the ids.
CHAT_TEMPLATE_FIELDS = ("chat_template", "chat_template_kwargs", "add_special_tokens", "documents", "mm_processor_kwargs")


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
    """A token's bytes from its rendering; None when the rendering lost them (U+FFFD, token_id:N, or
    nothing at all: vLLM renders a token that holds part of a character as "", like a special token, and
    a later step's text from a prompt that ends inside a character is not to be trusted)."""
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
    #: `/tokenize` takes a chat's messages (`tokenize_chat`).
    tokenizes_chat: bool = True
    #: A token-id prompt scored with `prompt_logprobs` (`scored_next`); the cache from `/metrics`.
    scores_prompts: bool = True
    #: Picks and generations carry the caller's logprobs (`logprobs=N`): each kept token's entry is the
    #: target's own scoring of its position, rendered by the server.
    carries_logprobs: bool = True

    async def tokenize(
        self, client: RoleClient, text: str, meter: Meter, *, special: bool, options: Mapping[str, Any] | None = None
    ) -> list[tuple[int, bytes | None]]:
        body = {"model": client.endpoint.model, "prompt": text, "add_special_tokens": special}
        response = await client.post(server_root(client) + "/tokenize", body, meter, options=options)
        with reading(client, "/tokenize"):
            return [(int(t), None) for t in response["tokens"]]

    async def tokenize_chat(
        self, client: RoleClient, messages: Sequence[Mapping[str, Any]], fields: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any] | None = None
    ) -> list[int]:
        """The ids vLLM's chat endpoint would run for `messages`: the chat template rendered with the
        assistant's turn opened (`add_generation_prompt`), tokenized without adding special tokens again
        (the template writes them), as `/v1/chat/completions` does by default."""
        body: dict[str, Any] = {"model": client.endpoint.model, "messages": list(messages), "add_generation_prompt": True, "add_special_tokens": False}
        body.update({k: v for k, v in fields.items() if k in CHAT_TEMPLATE_FIELDS})
        response = await client.post(server_root(client) + "/tokenize", body, meter, options=options)
        with reading(client, "chat /tokenize"):
            return [int(t) for t in response["tokens"]]

    async def prefix_cache(self, client: RoleClient) -> PrefixCache | None:
        """The target's prefix cache (block size, on or off), from its `/metrics`; None where not shown."""
        try:
            text = await client.get(server_root(client) + "/metrics", Meter(client.endpoint))
        except Exception:  # no metrics endpoint, or not reachable now: the default estimate stands
            return None
        return read_cache_config(text) if isinstance(text, str) else None

    async def scored_next(
        self, client: RoleClient, context: Sequence[int], draft: Sequence[int], fields: Mapping[str, Any], meter: Meter, *,
        options: Mapping[str, Any], logprobs: int | None = None,
    ) -> list[Pick]:
        """The target's greedy picks after `context + d1..dj` for j = 0..K, from one prompt `context +
        draft` scored with prompt logprobs (the top entry at each draft position) and one generated token.
        `logprobs`: the caller's top count, listed at every position (prompt logprobs by id, the
        generated token's own logprobs)."""
        prompt = list(context) + list(draft)
        listed = max(1, logprobs or 0)
        body = {**fields, "prompt": prompt, "max_tokens": 1, "logprobs": listed if logprobs is None else logprobs, "prompt_logprobs": listed, "return_token_ids": True}
        response = await client.post("/completions", body, meter, options=options)
        with reading(client, "scored token-id /completions"):
            choice = response["choices"][0]
            prompt_ids = choice.get("prompt_token_ids") or response.get("prompt_token_ids")
            if list(prompt_ids or ()) != prompt:
                raise ValueError("the scored prompt is not the one sent")
            scored = read_scored_picks(choice.get("prompt_logprobs") or response.get("prompt_logprobs"), prompt_ids, len(context), len(draft), listed)
            usage = response.get("usage") or {}
            prompt_tokens = count(usage.get("prompt_tokens"))
            own = prompt_tokens - len(draft) if prompt_tokens is not None else None
            picks = [
                Pick(id=p.id, data=_data(p.text), prompt_tokens=own, token=p.listed.pairs[0][0] if logprobs is not None and p.listed and p.listed.pairs else None,
                     logprob=p.logprob if logprobs is not None else None, listed=p.listed if logprobs is not None else None)
                for p in scored
            ]  # fmt: skip
            return picks + [_pick(choice, own, listed=logprobs is not None)]

    async def next_tokens(
        self, client: RoleClient, prompts: Sequence[Sequence[int]], fields: Mapping[str, Any], meter: Meter, *,
        options: Mapping[str, Any], logprobs: int | None = None,
    ) -> list[Pick]:
        """The target's next token after each prompt (one choice each, in order); `logprobs`: the caller's
        top count, each pick then carrying its position's entry as the target alone would list it."""
        body = {**fields, "prompt": [list(p) for p in prompts] if len(prompts) > 1 else list(prompts[0])}
        body.update({"max_tokens": 1, "logprobs": 1 if logprobs is None else logprobs, "return_token_ids": True})
        response = await client.post("/completions", body, meter, options=options)
        with reading(client, "token-id /completions"):
            choices = sorted(response["choices"], key=lambda c: int(c.get("index", 0)))
            if len(choices) != len(prompts):
                raise ValueError(f"{len(choices)} choices for {len(prompts)} prompts")
            usage = response.get("usage") or {}
            single = usage.get("prompt_tokens") if len(prompts) == 1 else None
            # Each choice's prompt_token_ids (return_token_ids) say what its prompt was billed: a batch's
            # usage sums them all.
            counts = [count(single) if single is not None else _prompt_count(choice) for choice in choices]
            return [_pick(choice, n, listed=logprobs is not None) for choice, n in zip(choices, counts)]

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

    async def detokenize(self, client: RoleClient, ids: Sequence[int], meter: Meter) -> str:
        response = await client.post(server_root(client) + "/detokenize", {"model": client.endpoint.model, "tokens": list(ids)}, meter)
        with reading(client, "/detokenize"):
            text = response["prompt"]
            if not isinstance(text, str):
                raise TypeError("prompt is not a string")
            return text

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
        logprobs: int | None = None,
    ) -> Generated:
        """The target alone continues `ids`; `logprobs`: the caller's top count (`Generated.logprobs`)."""
        body: dict[str, Any] = {**fields, "prompt": list(ids), "return_token_ids": True}
        if logprobs is not None:
            body["logprobs"] = logprobs
        if whole_characters and body.get("logprobs") is None:
            body["logprobs"] = 0  # each token's rendering: "" for one inside a character
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
            completion_tokens = len(token_ids) if count(completion) is None else completion
            held = _held_back(choice, token_ids) if whole_characters and finish == "length" else 0
            return Generated(
                ids=token_ids[: len(token_ids) - held],
                data=text.encode("utf-8"),
                finish_reason="length" if finish == "length" else "stop",
                prompt_tokens=count(usage.get("prompt_tokens")),
                completion_tokens=completion_tokens - held,
                held_back=held,
                logprobs=choice.get("logprobs") if logprobs is not None else None,
            )


def _held_back(choice: Mapping[str, Any], token_ids: Sequence[int]) -> int:
    """How many of a step's last tokens hold an unfinished character: vLLM renders each as "" and keeps
    their bytes out of the text until a later token finishes it. A step the text goes on from leaves them
    out (the next step draws them again): a token-id prompt that ends inside a character has vLLM's text
    start with the prompt's own text again."""
    tokens = (choice.get("logprobs") or {}).get("tokens")
    if not isinstance(tokens, list) or len(tokens) != len(token_ids):
        return 0
    held = 0
    while held < len(tokens) and tokens[len(tokens) - 1 - held] == "":
        held += 1
    return held


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


def _pick(choice: Mapping[str, Any], prompt_tokens: int | None, *, listed: bool = False) -> Pick:
    """One generated token of a choice; `listed`: with its logprobs entry as the server rendered it."""
    token_ids = choice.get("token_ids") or []
    text = choice.get("text")
    scores = _own_entry(choice) if listed else {}
    if choice.get("finish_reason") == "stop" and not text:
        return Pick(id=None, data=None, end=True, prompt_tokens=prompt_tokens, uncounted=len(token_ids), **scores)
    if len(token_ids) != 1:
        raise ValueError(f"expected one generated token id, got {token_ids!r}")
    tokens = (choice.get("logprobs") or {}).get("tokens") or []
    data = _data(tokens[0]) if tokens else None
    if data and text == "":
        data = b""  # a special token other than the end (e.g. a BOS): listed by its name, left out of the text
    if data is None and text and not tokens:
        # Only without the token's own rendering: after a prompt that ends inside a character, vLLM's
        # text starts with the prompt's text again, so a token rendered "" leaves its bytes unknown.
        data = rendered_bytes(text)
    return Pick(id=int(token_ids[0]), data=data, prompt_tokens=prompt_tokens, **scores)


def _own_entry(choice: Mapping[str, Any]) -> dict[str, Any]:
    """A one-token choice's logprobs entry: its token as rendered, its logprob and its top object (whose
    entries rendered alike share a key: `Listed.collapsed`). Empty where the answer lists none."""
    logprobs = choice.get("logprobs") or {}
    tokens, values, tops = logprobs.get("tokens") or [], logprobs.get("token_logprobs") or [], logprobs.get("top_logprobs") or []
    if len(tokens) != 1 or len(values) != 1 or not isinstance(tokens[0], str):
        return {}
    top = tops[0] if len(tops) == 1 and isinstance(tops[0], Mapping) else {}
    pairs = tuple((str(t), float(v)) for t, v in top.items() if v is not None)
    return {"token": tokens[0], "logprob": None if values[0] is None else float(values[0]), "listed": Listed(pairs, collapsed=True)}


def read_cache_config(metrics: str) -> PrefixCache | None:
    """The prefix cache a vLLM server runs with, from the text of its `/metrics`: the labels of
    `vllm:cache_config_info` (`block_size`, `enable_prefix_caching`). None where the text has none."""
    for line in metrics.splitlines():
        if not line.startswith("vllm:cache_config_info{"):
            continue
        labels = _labels(line[len("vllm:cache_config_info{") : line.rfind("}")])
        try:
            block = int(labels["block_size"])
        except (KeyError, ValueError):
            return None
        enabled = labels.get("enable_prefix_caching", "True").lower() == "true"
        return PrefixCache(block=block, enabled=enabled) if block > 0 else None
    return None


def _labels(text: str) -> dict[str, str]:
    """Prometheus labels `a="1",b="x"` (values without escaped quotes, as vLLM writes these)."""
    labels = {}
    for part in text.split('",'):
        name, _, value = part.partition("=")
        labels[name.strip()] = value.strip().strip('"')
    return labels


@dataclass(frozen=True)
class ScoredPick:
    """The target's greedy pick at one position of a scored prompt: its id, and its text as the server
    rendered it (None where the rendering lost the bytes: part of a character)."""

    id: int
    text: str | None
    #: The rank-1 token's logprob and the position's top entries by rank (every one: keyed by id).
    logprob: float | None = field(default=None, compare=False)
    listed: Listed | None = field(default=None, compare=False)


def read_scored_picks(entries: Any, prompt_ids: Any, context: int, k: int, top: int = 1) -> list[ScoredPick]:
    """The target's pick after `context + d1..dj` for j = 0..k-1, from vLLM's `prompt_logprobs` of a prompt
    `context + d1..dk` (`entries[i]` scores token i given the tokens before it: `{id: {logprob, rank,
    decoded_token}}`, the rank-1 entry being the target's most likely token there). Raises ValueError
    where the answer is not that (another prompt, no rank-1 entry at a draft position)."""
    if not isinstance(entries, Sequence) or not isinstance(prompt_ids, Sequence):
        raise ValueError("prompt_logprobs or prompt_token_ids is missing")
    if len(prompt_ids) != context + k or len(entries) != context + k:
        raise ValueError(f"{len(entries)} prompt scores for {len(prompt_ids)} prompt tokens, expected {context + k}")
    picks = []
    for position in range(context, context + k):
        entry = entries[position]
        if not isinstance(entry, Mapping):
            raise ValueError(f"no prompt scores at position {position}")
        best = [(key, value) for key, value in entry.items() if isinstance(value, Mapping) and value.get("rank") == 1]
        if len(best) != 1:
            raise ValueError(f"position {position} lists {len(best)} tokens of rank 1")
        key, value = best[0]
        text = value.get("decoded_token")
        ranked = sorted((v for v in entry.values() if isinstance(v, Mapping) and isinstance(v.get("rank"), int) and v.get("logprob") is not None), key=lambda v: v["rank"])
        pairs = tuple((str(v.get("decoded_token") or ""), float(v["logprob"])) for v in ranked if v["rank"] <= top)
        logprob = value.get("logprob")
        picks.append(ScoredPick(
            id=int(key), text=text if isinstance(text, str) and text and "\ufffd" not in text else None,
            logprob=float(logprob) if isinstance(logprob, (int, float)) else None, listed=Listed(pairs),
        ))  # fmt: skip
    return picks
