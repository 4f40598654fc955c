"""llama.cpp's ``llama-server`` native API, as the simulator serves it (``capabilities="llamacpp"``).

Shapes recorded from the real server (``tests/fixtures/llamacpp/``, ``tests/real/record_shapes.py``):

* ``POST /completion``: ``prompt`` is a string, a token-id array, a mixed array of strings and ids (one
  prompt), or a list of prompts (strings or id arrays), which gives a JSON array with one result per
  prompt, in order (``index`` 0, 1, ...). Fields: ``n_predict`` (-1 = until end of text; **0 still
  generates one token**, as the real server does), ``temperature`` (0.8), ``top_p`` (0.95), ``top_k``
  (40), ``min_p`` (0.05), ``seed`` (-1 = random; every prompt of a request gets the same stream),
  ``stop``, ``n_probs``, ``post_sampling_probs``, ``return_tokens``, ``cache_prompt`` (true). A result:
  ``index, content, tokens, id_slot, stop, model, tokens_predicted, tokens_evaluated,
  generation_settings, prompt, has_new_line, truncated, stop_type ("eos"|"limit"|"word"),
  stopping_word, tokens_cached, timings`` and, with ``n_probs``, ``completion_probabilities``.
* ``completion_probabilities``: one entry per run of tokens that completes text (a token holding part of
  a character has no entry of its own): the run's **last** token's ``id`` and ``logprob``, the whole
  run's text and ``bytes``, and that token's ``top_logprobs`` (raw, temperature 1): ``[{id, token, bytes,
  logprob}]``. With ``post_sampling_probs``: ``prob`` and ``top_probs`` (after temperature and top-p; a
  greedy request has one candidate of prob 1). When nothing is complete the key is absent. Top-list
  tokens holding part of a character read as U+FFFD. The end-of-text token has an entry (``token`` "",
  ``bytes`` []) when the text before it is whole, and is listed with empty bytes among the candidates.
* ``tokens_cached`` = prompt + generated - 1 (the last token is never evaluated); ``timings.cache_n`` /
  ``prompt_n``: prompt tokens read from the prefix cache / evaluated.
* ``POST /tokenize`` ``{content, add_special, with_pieces}`` -> ``{tokens: [id, ...]}`` or, with pieces,
  ``{tokens: [{id, piece}]}`` where ``piece`` is a string, or a list of byte values when the token is not
  valid UTF-8 alone. ``POST /detokenize`` ``{tokens}`` -> ``{content}``. ``GET /props``, ``GET /health``.
* ``stream: true`` (``stream_chunks``): SSE, one chunk per generated token ``{index, content, tokens, stop:
  false, id_slot: -1, tokens_predicted, tokens_evaluated}``, then the whole result with ``stop: true`` and
  an empty ``content``; no ``[DONE]``. Text that ends inside a character is held back (no chunk) until a
  token completes the character: that token's chunk carries the held text and lists only that token.
  Held text is left out if the generation ends first (where the plain answer shows U+FFFD).

Sampling follows llama-server's chain (``sampling_candidates``): top-k, top-p and min-p on the raw
probabilities, then temperature; ``post_sampling_probs`` reports the same candidates. Where the
simulator differs (its models, not the shapes): its tokenizer has no BOS token, so text prompts get none
(the real server adds ``<s>``); the random draws are its own (a seed reproduces the simulator's text,
not the real server's); ``stream`` serves one prompt without ``n_probs``. The served model is the request's ``model`` field (``?model=`` on GET)
when it names one, else the provider's first (the real server serves one model and ignores the field).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .corpus import EOS_TOKEN_ID, decode_text, encode_text, is_known_token, token_bytes
from .generation import Generation, Sampler, TokenRecord, stop_reason
from .jobs import Job, PromptWork
from .models import Mixture, NGramModel
from .params import ApiError, Sampling, read_bool, read_int, read_number
from .streams import Chunk

__all__ = [
    "TOTAL_SLOTS",
    "CompletionRequest",
    "completion_results",
    "detokenize",
    "health",
    "props",
    "read_completion",
    "tokenize",
]

TOTAL_SLOTS = 4
N_CTX = 8192
_DEFAULTS = {"temperature": 0.8, "top_p": 0.95, "min_p": 0.05}
_DEFAULT_TOP_K = 40
_RANDOM_SEED = 4294967295
_SAMPLERS = ["penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature"]


@dataclass(frozen=True)
class CompletionRequest:
    """A parsed ``/completion`` body."""

    prompts: list[list[int]]
    batch: bool  # a list of prompts: the answer is a JSON array
    sampling: Sampling
    n_predict: int
    top_k: int
    min_p: float
    n_probs: int
    post_sampling: bool
    return_tokens: bool
    cache_prompt: bool
    stop: tuple[str, ...]

    def work(self) -> list[PromptWork]:
        return [PromptWork(ids, cache_limit=None if self.cache_prompt else 0) for ids in self.prompts]

    def chain(self) -> dict[str, Any]:
        """The sampler chain's settings (``sampling_candidates``' keywords)."""
        return {"temperature": self.sampling.temperature, "top_k": self.top_k, "top_p": self.sampling.top_p,
                "min_p": self.min_p}

    def sampler(self) -> Sampler | None:
        """Draws tokens through llama-server's chain; ``None`` when nothing truncates (plain temperature
        sampling over the whole vocabulary, the model's own)."""
        if self.sampling.temperature <= 0.0 or (self.top_k <= 0 and self.sampling.top_p >= 1.0 and self.min_p <= 0.0):
            return None
        chain = self.chain()

        def draw(model: NGramModel, mix: Mixture, rng: np.random.Generator) -> int:
            ids, probs = sampling_candidates(*model.distribution_from(mix), **chain)
            return int(ids[min(int(np.searchsorted(np.cumsum(probs), rng.random(), "right")), len(ids) - 1)])

        return draw


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _ids(values: Sequence[Any]) -> list[int]:
    ids: list[int] = []
    for value in values:
        if isinstance(value, str):
            ids.extend(encode_text(value))
        elif _is_id(value) and is_known_token(value):
            ids.append(value)
        else:
            raise ApiError(400, f"invalid token in prompt: {value!r}", param="prompt")
    return ids


def _read_prompts(prompt: Any) -> tuple[list[list[int]], bool]:
    if isinstance(prompt, str):
        return [encode_text(prompt)], False
    if isinstance(prompt, list) and prompt:
        if any(_is_id(p) for p in prompt) and all(_is_id(p) or isinstance(p, str) for p in prompt):
            return [_ids(prompt)], False  # token ids, or ids mixed with strings: one prompt
        if all(isinstance(p, (str, list)) for p in prompt):
            return [_ids(p) if isinstance(p, list) else encode_text(p) for p in prompt], True
    raise ApiError(400, '"prompt" must be a string, a list of tokens, or a list of prompts', param="prompt")


def read_completion(body: Mapping[str, Any]) -> CompletionRequest:
    """The fields of a ``/completion`` body that the simulator serves; 400 on bad values."""
    prompts, batch = _read_prompts(body.get("prompt"))
    stream = read_bool(body, "stream", False)
    if stream and (batch or read_int(body, "n_probs", 0, minimum=0)):
        raise ApiError(400, "the simulator streams /completion for one prompt and without n_probs", param="stream")
    if not all(prompts):
        raise ApiError(400, "empty prompt", param="prompt")
    n_predict = read_int(body, "n_predict", None) if "n_predict" in body else read_int(body, "max_tokens", -1)
    n_predict = -1 if n_predict is None else n_predict
    longest = max(len(p) for p in prompts)
    limit = N_CTX - longest if n_predict < 0 else max(1, n_predict)  # n_predict 0 still samples one token
    seed = read_int(body, "seed", -1)
    stop = body.get("stop") or []
    if isinstance(stop, str) or not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError(400, '"stop" must be a list of strings', param="stop")
    temperature = read_number(body, "temperature", _DEFAULTS["temperature"], minimum=-math.inf, maximum=math.inf)
    top_p = read_number(body, "top_p", _DEFAULTS["top_p"], minimum=0.0, maximum=1.0)
    sampling = Sampling(
        max_tokens=max(1, limit),
        temperature=max(0.0, temperature),
        top_p=top_p if top_p > 0 else 1.0,
        seed=None if seed is None or seed < 0 or seed == _RANDOM_SEED else seed,
        stop=tuple(stop),
        n=1,
        stream=stream,
        include_usage=False,
    )
    return CompletionRequest(
        prompts=prompts,
        batch=batch,
        sampling=sampling,
        n_predict=n_predict,
        top_k=read_int(body, "top_k", _DEFAULT_TOP_K) or 0,
        min_p=read_number(body, "min_p", _DEFAULTS["min_p"], minimum=0.0, maximum=1.0),
        n_probs=read_int(body, "n_probs", 0, minimum=0) or 0,
        post_sampling=read_bool(body, "post_sampling_probs", False),
        return_tokens=read_bool(body, "return_tokens", False),
        cache_prompt=read_bool(body, "cache_prompt", True),
        stop=tuple(stop),
    )


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", errors="replace")


def _bytes_list(token_id: int) -> list[int]:
    return list(token_bytes(token_id) if token_id != EOS_TOKEN_ID else b"")


def _candidate(token_id: int, value: float, key: str) -> dict[str, Any]:
    return {"id": token_id, "token": _text(token_bytes(token_id)), "bytes": _bytes_list(token_id), key: value}


def sampling_candidates(
    ids: np.ndarray, probs: np.ndarray, *, temperature: float, top_k: int, top_p: float, min_p: float
) -> tuple[np.ndarray, np.ndarray]:
    """llama-server's sampler chain on a distribution (``ids``, raw ``probs``): top-k, top-p, min-p on the
    raw probabilities, then temperature; ``(ids, probs)`` of the candidates left, most likely first.

    Temperature 0 is greedy (one candidate). The model's uniform tail (tokens outside ``ids``) is left out
    as soon as anything truncates: it never reaches a top-k, top-p or min-p cut.
    """
    order = np.lexsort((ids, -probs))
    ids, probs = ids[order], probs[order]
    if temperature <= 0.0:
        return ids[:1], np.ones(1)
    if top_k > 0:
        ids, probs = ids[:top_k], probs[:top_k]
    if top_p < 1.0:
        cumulative = np.cumsum(probs) / probs.sum()
        keep = int(np.searchsorted(cumulative, top_p)) + 1
        ids, probs = ids[:keep], probs[:keep]
    if min_p > 0.0:
        keep = max(1, int(np.count_nonzero(probs >= min_p * probs[0])))
        ids, probs = ids[:keep], probs[:keep]
    weights = probs ** (1.0 / temperature)
    return ids, weights / weights.sum()


def _post_sampling_top(model: NGramModel, context: Sequence[int], request: CompletionRequest) -> list[tuple[int, float]]:
    """The ``n_probs`` most likely candidates after the sampler chain, with their probabilities."""
    ids, probs = model.next_distribution(context)
    ids, probs = sampling_candidates(ids, probs, **request.chain())
    return [(int(i), float(p)) for i, p in zip(ids[: request.n_probs].tolist(), probs[: request.n_probs].tolist())]


def completion_probabilities(
    model: NGramModel, prompt_ids: Sequence[int], gen: Generation, request: CompletionRequest
) -> list[dict[str, Any]]:
    """The ``completion_probabilities`` of one result: an entry each time the text generated so far ends
    on a whole character (as llama-server checks with ``validate_utf8`` before it sends text), for the run
    of tokens since the last entry."""
    out: list[dict[str, Any]] = []
    pending = b""
    context = list(prompt_ids)
    for record in gen.tokens:
        if record.token_id == EOS_TOKEN_ID:
            if not pending:  # the end of text has an entry of its own (no text, no bytes), as on the real server
                out.append(_entry(model, context, record, b"", request))
            break
        pending += token_bytes(record.token_id)
        if not ends_inside_a_character(pending):
            out.append(_entry(model, context, record, pending, request))
            pending = b""
        context.append(record.token_id)
    return out


def ends_inside_a_character(data: bytes) -> bool:
    """Whether ``data`` ends with the first bytes of a multi-byte UTF-8 character (bytes that are invalid
    in other ways do not hold text back)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue  # a continuation byte: look further back for its lead
        needed = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return needed > back
    return False


def _entry(
    model: NGramModel, context: Sequence[int], record: TokenRecord, run: bytes, request: CompletionRequest
) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": record.token_id, "token": _text(run), "bytes": list(run)}
    if request.post_sampling:
        top = _post_sampling_top(model, context, request)
        entry["prob"] = dict(top).get(record.token_id, 0.0)
        entry["top_probs"] = [_candidate(i, p, "prob") for i, p in top]
    else:
        entry["logprob"] = record.logprob
        entry["top_logprobs"] = [_candidate(i, lp, "logprob") for i, lp in (record.top or ())]
    return entry


def generation_settings(request: CompletionRequest | None, model: str) -> dict[str, Any]:
    """``generation_settings`` of a result, with the keys the real server reports; ``None``: ``/props``'
    ``default_generation_settings.params`` (the defaults, without the per-request fields)."""
    if request is None:
        settings = generation_settings(read_completion({"prompt": "x"}), model)
        for key in ("dry_sequence_breakers", "stop", "logit_bias", "grammar", "grammar_lazy", "grammar_triggers",
                    "preserved_tokens"):
            del settings[key]
        settings.update(max_tokens=-1, n_predict=-1, reasoning_format="none")
        return settings
    sampling = request.sampling
    return {
        "seed": sampling.seed if sampling.seed is not None else _RANDOM_SEED,
        "temperature": sampling.temperature, "dynatemp_range": 0.0, "dynatemp_exponent": 1.0,
        "top_k": request.top_k, "top_p": sampling.top_p, "min_p": request.min_p,
        "top_n_sigma": -1.0, "xtc_probability": 0.0, "xtc_threshold": 0.1, "typical_p": 1.0,
        "repeat_last_n": 64, "repeat_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2, "dry_penalty_last_n": 64,
        "dry_sequence_breakers": ["\n", ":", "\"", "*"],
        "mirostat": 0, "mirostat_tau": 5.0, "mirostat_eta": 0.1, "adaptive_target": -1.0, "adaptive_decay": 0.9,
        "stop": list(request.stop), "max_tokens": request.n_predict, "n_predict": request.n_predict,
        "n_keep": 0, "n_discard": 0, "ignore_eos": False, "stream": False, "logit_bias": [],
        "n_probs": request.n_probs, "min_keep": 0,
        "grammar": "", "grammar_lazy": False, "grammar_triggers": [], "preserved_tokens": [],
        "chat_format": "Content-only", "reasoning_format": "deepseek", "reasoning_in_content": False,
        "generation_prompt": "", "samplers": list(_SAMPLERS), "speculative.types": "none",
        "timings_per_token": False, "post_sampling_probs": request.post_sampling,
        "backend_sampling": False, "lora": [],
    }  # fmt: skip


def _timings(job: Job, gen: Generation) -> dict[str, Any]:
    prompt_n = len(job.prompt_ids) - job.cached_tokens
    predicted_n = len(gen.tokens)
    first = job.timing.first_token_s if job.timing else 0.0
    decode = sum(job.timing.gaps_s) if job.timing else 0.0
    prompt_ms, predicted_ms = first * 1000.0, decode * 1000.0
    return {
        "cache_n": job.cached_tokens,
        "prompt_n": prompt_n,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
        "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms > 0 else 0.0,
        "predicted_n": predicted_n,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / max(1, predicted_n - 1) if predicted_n > 1 else 0.0,
        "predicted_per_second": 1000.0 * max(0, predicted_n - 1) / predicted_ms if predicted_ms > 0 else 0.0,
    }


def _stop(gen: Generation, request: CompletionRequest) -> tuple[str, str]:
    if gen.tokens and gen.tokens[-1].token_id == EOS_TOKEN_ID:
        return "eos", ""
    word = stop_reason(gen, request.stop, eos=False)
    return ("word", str(word)) if word is not None else ("limit", "")


def completion_results(
    model: NGramModel, model_name: str, request: CompletionRequest, jobs: Sequence[Job]
) -> dict[str, Any] | list[dict[str, Any]]:
    """The ``/completion`` answer: one result, or a list of them for a list of prompts."""
    results = []
    for index, job in enumerate(jobs):
        gen = job.choices[0]
        stop_type, word = _stop(gen, request)
        result: dict[str, Any] = {
            "index": index,
            "content": gen.text,
            "tokens": gen.token_ids if request.return_tokens else [],
            "id_slot": index % TOTAL_SLOTS,
            "stop": True,
            "model": model_name,
            "tokens_predicted": len(gen.tokens),
            "tokens_evaluated": len(job.prompt_ids),
            "generation_settings": generation_settings(request, model_name),
            "prompt": decode_text(job.prompt_ids),
            "has_new_line": "\n" in gen.text,
            "truncated": False,
            "stop_type": stop_type,
            "stopping_word": word,
            "tokens_cached": len(job.prompt_ids) + len(gen.tokens) - 1,
            "timings": _timings(job, gen),
        }
        if request.n_probs > 0:
            probabilities = completion_probabilities(model, job.prompt_ids, gen, request)
            if probabilities:
                result["completion_probabilities"] = probabilities
        results.append(result)
    return results if request.batch else results[0]


def stream_chunks(model: NGramModel, model_name: str, request: CompletionRequest, job: Job) -> list[Chunk]:
    """A streamed ``/completion``: a chunk per generated token with the text it completes, then the whole
    result (``stop: true``, empty ``content``), as the real server streams it. Text that ends inside a
    character is held back (no chunk) until a later token completes the character; that token's chunk
    carries all of it, and lists only that token. If the generation ends first, it is left out."""
    gen = job.choices[0]
    shown = [r for r in gen.tokens if r.token_id != EOS_TOKEN_ID]
    pending, sent, held, chunks = b"", 0, 0, []
    for step, record in enumerate(shown):
        pending += token_bytes(record.token_id)
        held += 1
        if ends_inside_a_character(pending):
            continue
        text = _text(pending)[: max(0, len(gen.text) - sent)]  # a stop word ends the text early
        sent += len(text)
        partial = {
            "index": 0,
            "content": text,
            "tokens": [record.token_id] if request.return_tokens else [],
            "stop": False,
            "id_slot": -1,
            "tokens_predicted": step + 1,
            "tokens_evaluated": len(job.prompt_ids),
        }
        chunks.append(Chunk(step, partial, billed=held))
        pending, held = b"", 0
    final = completion_results(model, model_name, request, [job])
    assert isinstance(final, dict)
    final = {**final, "content": "", "tokens": []}
    chunks.append(Chunk(max(0, len(gen.tokens) - 1), final, billed=held + len(gen.tokens) - len(shown)))
    return chunks


def tokenize(body: Mapping[str, Any]) -> dict[str, Any]:
    """``/tokenize``: ``{tokens}``; ``with_pieces`` pairs each id with its text (or its bytes)."""
    content = body.get("content")
    if not isinstance(content, str):
        raise ApiError(400, '"content" must be a string', param="content")
    read_bool(body, "add_special", False)  # the simulated tokenizer has no BOS to add
    ids = encode_text(content)
    if not read_bool(body, "with_pieces", False):
        return {"tokens": ids}
    pieces = []
    for token in ids:
        raw = token_bytes(token)
        try:
            piece: Any = raw.decode("utf-8")
        except UnicodeDecodeError:
            piece = list(raw)
        pieces.append({"id": token, "piece": piece})
    return {"tokens": pieces}


def detokenize(body: Mapping[str, Any]) -> dict[str, Any]:
    """``/detokenize``: ``{content}`` (bytes that are not whole characters read as U+FFFD)."""
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(_is_id(t) and is_known_token(t) for t in tokens):
        raise ApiError(400, '"tokens" must be a list of token ids', param="tokens")
    return {"content": decode_text(tokens)}


def props(model_name: str) -> dict[str, Any]:
    """``/props``: the default generation settings (applied to requests that do not set them), slots,
    model and template facts, with the real server's keys."""
    return {
        "default_generation_settings": {"params": generation_settings(None, model_name), "n_ctx": N_CTX},
        "total_slots": TOTAL_SLOTS,
        "model_alias": model_name,
        "model_ftype": "simulated",
        "model_path": f"sim://{model_name}",
        "modalities": {"vision": False, "video": False, "audio": False},
        "media_marker": "<__media__>",
        "endpoint_slots": True,
        "endpoint_props": False,
        "endpoint_metrics": False,
        "ui": False,
        "ui_settings": {},
        "chat_template": "{# the simulator's template: <|role|> lines, see specapi.sim.template #}",
        "chat_template_caps": {
            "supports_object_arguments": False, "supports_parallel_tool_calls": False,
            "supports_preserve_reasoning": False, "supports_reasoning_effort": False,
            "supports_string_content": True, "supports_system_role": True, "supports_tool_calls": False,
            "supports_tools": False, "supports_typed_content": False,
        },  # fmt: skip
        "bos_token": "",
        "eos_token": "<|endoftext|>",
        "build_info": "specapi-sim",
        "is_sleeping": False,
        "cors_proxy_enabled": False,
    }


def health() -> dict[str, Any]:
    return {"status": "ok"}
