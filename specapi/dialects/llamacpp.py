"""llama.cpp's `llama-server` native API (checked on the build from llama-cpp-python 0.3.36's sources).

- `POST /completion` takes `prompt` as a token-id array, or a list of prompts: it then answers a JSON
  array, one result per prompt (each with its `index`). A prompt given as ids gets no BOS added.
- `n_predict` bounds the tokens, `n_probs` lists the top tokens of each generated one in
  `completion_probabilities` (`{id, token, bytes, logprob, top_logprobs}`), `return_tokens` adds the
  generated ids in `tokens` (the end-of-text token included), `stop_type` says why it stopped
  (`eos`, `limit`, `word`), `tokens_evaluated` counts the prompt, `cache_prompt` reuses a slot's cache.
- `POST /tokenize` (`content`, `add_special`) answers `{tokens: [...]}`.

One request scores every draft position of a round: the prompts `context + d[:j]` go together, and
the server evaluates them in its parallel slots, reusing cached prefixes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..transport._calls import Meter, RoleClient
from .base import Generated, Pick, count, reading, server_root

__all__ = ["LlamaCppDialect", "Processed", "native_fields"]

#: A distribution after the server's sampler chain, as `post_sampling_probs` lists it: id -> (prob, bytes).
Processed = dict[int, tuple[float, bytes]]

#: OpenAI-format sampling fields and the names `/completion` knows them by (the rest are the same).
_RENAMED = {"max_tokens": "n_predict"}
#: Fields of the OpenAI endpoints that `/completion` does not take.
_DROPPED = {"logprobs", "top_logprobs", "echo", "stream_options", "n", "user", "model"}


def native_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The caller's sampling fields as `/completion` names them."""
    return {_RENAMED.get(k, k): v for k, v in fields.items() if k not in _DROPPED}


@dataclass
class LlamaCppDialect:
    name: str = "llama.cpp"
    batches: bool = True
    batches_sampled: bool = False
    tokenizes_chat: bool = False
    scores_prompts: bool = False
    carries_logprobs: bool = False
    lists_processed: bool = True

    async def tokenize(
        self, client: RoleClient, text: str, meter: Meter, *, special: bool, options: Mapping[str, Any] | None = None
    ) -> list[tuple[int, bytes | None]]:
        body = {"content": text, "add_special": special, "with_pieces": True}
        response = await client.post(server_root(client) + "/tokenize", body, meter, options=options)
        with reading(client, "/tokenize"):
            return [_piece(t) for t in response["tokens"]]

    async def next_tokens(
        self, client: RoleClient, prompts: Sequence[Sequence[int]], fields: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any]
    ) -> list[Pick]:
        results = await _one_token_each(client, prompts, fields, meter, options=options, n_probs=1)
        with reading(client, "/completion"):
            return [_pick(r) for r in results]

    async def processed_next(
        self, client: RoleClient, prompts: Sequence[Sequence[int]], fields: Mapping[str, Any], n_probs: int, meter: Meter, *, options: Mapping[str, Any]
    ) -> tuple[list[Processed | None], int | None]:
        """The target's distribution after its sampler chain following each prompt (one request), as
        `post_sampling_probs` lists it, None where the server listed nothing (it lists nothing when the
        token it drew itself holds part of a character); and the first prompt's tokens as billed."""
        results = await _one_token_each(client, prompts, fields, meter, options=options, n_probs=n_probs, post_sampling_probs=True)
        with reading(client, "/completion"):
            out: list[Processed | None] = []
            for result in results:
                entries = result.get("completion_probabilities") or []
                out.append(_processed(entries[0]["top_probs"]) if entries else None)
            return out, count(results[0].get("tokens_evaluated"))

    async def processed_draft(
        self, client: RoleClient, ids: Sequence[int], k: int, fields: Mapping[str, Any], n_probs: int, meter: Meter, *, options: Mapping[str, Any]
    ) -> list[tuple[int, bytes, Processed]]:
        """Up to `k` tokens the server draws after `ids`, each with the distribution it was drawn from
        (after the sampler chain). It stops before an entry that stands for several tokens (a character
        split over tokens) and at the end of the text: those have no distribution of their own."""
        body = {
            **native_fields(fields),
            "prompt": list(ids),
            "n_predict": k,
            "n_probs": n_probs,
            "post_sampling_probs": True,
            "return_tokens": True,
            "cache_prompt": True,
        }
        response = await client.post(server_root(client) + "/completion", body, meter, options=options, array_ok=True)
        with reading(client, "/completion"):
            result = response[0] if isinstance(response, list) else response
            tokens = [int(t) for t in result.get("tokens") or []]
            drawn: list[tuple[int, bytes, Processed]] = []
            for index, entry in enumerate(result.get("completion_probabilities") or []):
                token = int(entry["id"])
                dist = _processed(entry["top_probs"])
                data = _token_data(entry)
                # One token per entry: the entry's id is the token drawn there, and its bytes are that
                # token's own (an entry for a run of tokens carries the run's bytes).
                if index >= len(tokens) or tokens[index] != token or token not in dist or dist[token][1] != data or not data:
                    break
                drawn.append((token, data, dist))
            return drawn

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
        body: dict[str, Any] = {**native_fields(fields), "prompt": list(ids), "return_tokens": True, "cache_prompt": True}
        body["n_predict"] = -1 if max_tokens is None else max_tokens
        if stop:
            body["stop"] = list(stop)
        if stream:
            return await self._streamed(client, body, meter, options)
        # The bytes of what it generates (`_generated`): `content` renders a step that starts inside a
        # character (the context's last token began it) with U+FFFD for the bytes that finish it.
        body.setdefault("n_probs", 1)
        response = await client.post(server_root(client) + "/completion", body, meter, options=options, array_ok=True)
        with reading(client, "/completion"):
            result = response[0] if isinstance(response, list) else response
            return _generated(result, max_tokens if whole_characters else None)


    async def _streamed(self, client: RoleClient, body: dict[str, Any], meter: Meter, options: Mapping[str, Any]) -> Generated:
        """The text as the server streams it: a stream holds back a character it has not finished, and
        at the end leaves it out, with the rest of the token that began it, where `content` shows U+FFFD."""
        pieces: list[str] = []
        last: Mapping[str, Any] = {}
        async with contextlib.aclosing(client.stream(server_root(client) + "/completion", body, meter, options=options)) as chunks:
            async for chunk in chunks:
                pieces.append(chunk.get("content") or "")
                last = chunk
        with reading(client, "streamed /completion"):
            if not last.get("stop"):
                raise ValueError("the stream ended without its last chunk")
            predicted, evaluated = last.get("tokens_predicted"), last.get("tokens_evaluated")
            return Generated(
                ids=None,
                data="".join(pieces).encode("utf-8"),
                finish_reason="stop" if last.get("stop_type") in ("eos", "word") else "length",
                prompt_tokens=count(evaluated),
                completion_tokens=count(predicted) or 0,
            )


def _piece(item: Any) -> tuple[int, bytes | None]:
    """A `/tokenize` entry: an id, or `{id, piece}` with the piece as text or (partial UTF-8) a byte list."""
    if not isinstance(item, Mapping):
        return int(item), None
    piece = item.get("piece")
    data = bytes(piece) if isinstance(piece, list) else piece.encode("utf-8") if isinstance(piece, str) else None
    return int(item["id"]), data


def _processed(top: Sequence[Mapping[str, Any]]) -> Processed:
    return {int(c["id"]): (float(c["prob"]), _token_data(c)) for c in top}


def _token_data(item: Mapping[str, Any]) -> bytes:
    raw = item.get("bytes")
    if isinstance(raw, list):
        return bytes(raw)
    return str(item["token"]).encode("utf-8")


def _pick(result: Mapping[str, Any]) -> Pick:
    """One prompt's next token. A token that holds part of a character comes with no
    `completion_probabilities` at all: its id is known, its bytes are not."""
    prompt_tokens = result.get("tokens_evaluated")
    prompt_tokens = count(prompt_tokens)
    if result.get("stop_type") == "eos":
        predicted = result.get("tokens_predicted")
        return Pick(id=None, data=None, end=True, prompt_tokens=prompt_tokens, uncounted=count(predicted) or 0)
    tokens = result.get("tokens") or []
    probs = result.get("completion_probabilities") or []
    if len(tokens) != 1:
        raise ValueError(f"expected one generated token id, got {tokens!r}")
    data = _token_data(probs[0]) if probs else None
    return Pick(id=int(tokens[0]), data=data, prompt_tokens=prompt_tokens)


def _generated(result: Mapping[str, Any], max_tokens: int | None = None) -> Generated:
    """The generated tokens and their text. The text is `content`, the server's own rendering (what its
    OpenAI endpoints return; U+FFFD where it ends inside a character), but for two ends of a step that
    a longer text goes on from, where `content` shows U+FFFD for bytes `completion_probabilities` holds
    (one entry per run of tokens that ends on a whole character, with the run's bytes):

    - a step that starts inside a character (the context's last token began it): its first bytes;
    - a step cut by its token budget (`max_tokens`, given where text follows the step) inside a
      character: the tokens of the unfinished run are left out (the next step draws them again, now
      that the context ends on a whole character), so that no U+FFFD stands for bytes the next step's
      text would finish. Where the caller's limit ends the text, the server's rendering is the answer.
    """
    tokens = [int(t) for t in result.get("tokens") or []]
    stop_type = result.get("stop_type")
    if stop_type == "eos" and tokens:
        tokens = tokens[:-1]  # the end-of-text token is listed, but it is no text
    content = result["content"]
    if not isinstance(content, str):
        raise TypeError("content is not a string")
    finish = "stop" if stop_type in ("eos", "word") else "length"
    prompt_tokens = result.get("tokens_evaluated")
    predicted = result.get("tokens_predicted")
    completion_tokens = len(tokens) if count(predicted) is None else predicted
    data = content.encode("utf-8")
    runs = result.get("completion_probabilities")
    held_back = 0
    if isinstance(runs, list) and runs and (content.startswith("\ufffd") or (content.endswith("\ufffd") and finish == "length" and len(tokens) == max_tokens)):
        listed, covered = _listed_runs(runs, tokens)
        shown = listed.decode("utf-8", errors="replace")
        if content.startswith(shown) and covered:
            data = listed + content[len(shown) :].encode("utf-8")
            if content.endswith("\ufffd") and finish == "length" and len(tokens) == max_tokens and covered < len(tokens):
                held_back = len(tokens) - covered  # the unfinished run, drawn again by the next step
                data, tokens, completion_tokens = listed, tokens[:covered], covered
    return Generated(
        ids=tuple(tokens), data=data, finish_reason=finish, prompt_tokens=count(prompt_tokens), completion_tokens=completion_tokens,
        held_back=held_back,
    )


def _listed_runs(runs: Any, tokens: Sequence[int]) -> tuple[bytes, int]:
    """The bytes of the runs `completion_probabilities` lists, and how many of `tokens` they cover (each
    run's entry carries its last token's id); (b"", 0) where the entries do not line up with the tokens."""
    if not isinstance(runs, list):
        return b"", 0
    listed, at = bytearray(), 0
    for run in runs:
        if not isinstance(run, Mapping) or not isinstance(run.get("bytes"), list):
            return b"", 0
        try:
            at = tokens.index(int(run["id"]), at) + 1
        except (KeyError, ValueError, TypeError):
            return b"", 0
        listed += bytes(run["bytes"])
    return bytes(listed), at


async def _one_token_each(
    client: RoleClient, prompts: Sequence[Sequence[int]], fields: Mapping[str, Any], meter: Meter, *, options: Mapping[str, Any], **extra: Any
) -> list[Any]:
    """One `/completion` request that draws one token after each prompt (a batch where there are
    several), with `extra` fields; its results in the prompts' order."""
    body = {
        **native_fields(fields),
        "prompt": [list(p) for p in prompts] if len(prompts) > 1 else list(prompts[0]),
        "n_predict": 1,
        **extra,
        "return_tokens": True,
        "cache_prompt": True,
    }
    response = await client.post(server_root(client) + "/completion", body, meter, options=options, array_ok=True)
    with reading(client, "/completion"):
        results = response if isinstance(response, list) else [response]
        if len(results) != len(prompts):
            raise ValueError(f"{len(results)} results for {len(prompts)} prompts")
        return sorted(results, key=lambda r: int(r.get("index", 0)))
