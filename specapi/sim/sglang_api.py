"""SGLang's native API, as the simulator serves it (``capabilities="sglang"``).

Shapes from SGLang's source (``python/sglang/srt/managers/io_struct.py`` ``GenerateReqInput``,
``tokenizer_manager.py`` where ``meta_info`` is built, ``sampling/sampling_params.py``,
``entrypoints/http_server.py``); fixtures in ``tests/fixtures/sglang/``:

* ``POST /generate``: ``text`` (a string or a list) or ``input_ids`` (a list of ids or a list of such
  lists); a list gives a JSON array, one result per prompt, in order. ``sampling_params``:
  ``max_new_tokens`` (128), ``temperature`` (1.0; 0 = greedy), ``top_p``, ``top_k``, ``min_p``,
  ``sampling_seed``, ``stop`` (string or list). ``return_logprob``, ``top_logprobs_num``,
  ``logprob_start_len`` (-1 = only the last prompt token), ``return_text_in_logprobs``.
* A result: ``{"text", "output_ids", "meta_info"}``; ``meta_info``: ``id``, ``finish_reason``
  (``{"type": "length", "length": n}`` or ``{"type": "stop", "matched": <token id or stop string>}``),
  ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, ``e2e_latency``, and with
  ``return_logprob``: ``input_token_logprobs`` / ``output_token_logprobs`` as ``[logprob, token_id,
  text or null]`` triples (JSON arrays), and with ``top_logprobs_num`` > 0 ``input_top_logprobs`` /
  ``output_top_logprobs``: per position a list of such triples, or null.
* Input logprobs cover the prompt from ``logprob_start_len`` on; the token **at** that position has a
  null logprob (and a null top list). With ``return_logprob`` the radix cache serves at most
  ``logprob_start_len`` tokens: 0 bypasses it (``cached_tokens`` 0 every time); near the prompt's end it
  keeps the cache.
* ``GET /get_model_info`` (and ``/model_info``, its newer name): ``model_path``, ``tokenizer_path``,
  ``is_generation``, ``preferred_sampling_params``, ``weight_version``, ...

Not simulated: ``stream``, per-prompt ``sampling_params`` lists, ``n`` > 1, ``token_ids_logprob``,
``top_k`` and ``min_p`` in sampling. The served model is the request's ``model`` field when it names one
(SGLang serves one model), else the provider's first.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .corpus import encode_text, is_known_token, token_str
from .generation import Generation, TokenRecord, stop_reason
from .jobs import Job, PromptWork
from .params import ApiError, Sampling, read_bool, read_int, read_number

__all__ = ["GenerateRequest", "generate_results", "model_info", "read_generate"]

_DEFAULT_MAX_NEW_TOKENS = 128


@dataclass(frozen=True)
class GenerateRequest:
    """A parsed ``/generate`` body."""

    prompts: list[list[int]]
    batch: bool
    sampling: Sampling
    return_logprob: bool
    top_logprobs_num: int
    logprob_start_lens: list[int]  # resolved per prompt
    return_text: bool

    def work(self) -> list[PromptWork]:
        if not self.return_logprob:
            return [PromptWork(ids) for ids in self.prompts]
        return [
            PromptWork(ids, prompt_k=self.top_logprobs_num, score_start=start + 1, cache_limit=start)
            for ids, start in zip(self.prompts, self.logprob_start_lens)
        ]


def _is_ids(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def _check_ids(ids: list[int]) -> list[int]:
    if not all(is_known_token(t) for t in ids):
        raise ApiError(400, "input_ids holds a token id outside the vocabulary", param="input_ids")
    return list(ids)


def _read_prompts(body: Mapping[str, Any]) -> tuple[list[list[int]], bool]:
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise ApiError(400, "Either text or input_ids should be provided.", param="text")
    if text is not None:
        if isinstance(text, str):
            return [encode_text(text)], False
        if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
            return [encode_text(t) for t in text], True
        raise ApiError(400, "text must be a string or a list of strings", param="text")
    if isinstance(input_ids, list) and _is_ids(input_ids):
        return [_check_ids(input_ids)], False
    if isinstance(input_ids, list) and input_ids and all(_is_ids(p) for p in input_ids):
        return [_check_ids(p) for p in input_ids], True
    raise ApiError(400, "input_ids must be a list of token ids or a list of such lists", param="input_ids")


def read_generate(body: Mapping[str, Any]) -> GenerateRequest:
    """The fields of a ``/generate`` body that the simulator serves; 400 on bad values."""
    if read_bool(body, "stream", False):
        raise ApiError(400, "the simulator does not stream /generate", param="stream")
    prompts, batch = _read_prompts(body)
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise ApiError(400, "sampling_params must be an object (one for every prompt)", param="sampling_params")
    if (read_int(params, "n", 1) or 1) != 1:
        raise ApiError(400, "the simulator serves n = 1 on /generate", param="n")
    max_new = read_int(params, "max_new_tokens", _DEFAULT_MAX_NEW_TOKENS, minimum=0)
    stop = params.get("stop")
    stops = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if not all(isinstance(s, str) for s in stops):
        raise ApiError(400, "stop must be a string or a list of strings", param="stop")
    temperature = read_number(params, "temperature", 1.0, minimum=0.0, maximum=math.inf)
    sampling = Sampling(
        max_tokens=max_new,
        temperature=temperature,
        top_p=read_number(params, "top_p", 1.0, minimum=1e-9, maximum=1.0),
        seed=read_int(params, "sampling_seed", None),
        stop=stops,
        n=1,
        stream=False,
        include_usage=False,
    )
    read_int(params, "top_k", -1)
    read_number(params, "min_p", 0.0, minimum=0.0, maximum=1.0)
    return_logprob = read_bool(body, "return_logprob", False)
    start = read_int(body, "logprob_start_len", -1)
    starts = []
    for ids in prompts:
        resolved = len(ids) - 1 if start is None or start < 0 else start
        if resolved >= len(ids):
            raise ApiError(400, f"logprob_start_len ({resolved}) is not below the input length ({len(ids)})",
                           param="logprob_start_len")
        starts.append(resolved)
    return GenerateRequest(
        prompts=prompts,
        batch=batch,
        sampling=sampling,
        return_logprob=return_logprob,
        top_logprobs_num=read_int(body, "top_logprobs_num", 0, minimum=0) or 0,
        logprob_start_lens=starts,
        return_text=read_bool(body, "return_text_in_logprobs", False),
    )


def _triple(token_id: int, logprob: float | None, with_text: bool) -> list[Any]:
    return [logprob, token_id, token_str(token_id) if with_text else None]


def _logprobs(records: Sequence[TokenRecord], with_text: bool) -> list[list[Any]]:
    return [_triple(r.token_id, r.logprob, with_text) for r in records]


def _tops(records: Sequence[TokenRecord], with_text: bool) -> list[list[list[Any]] | None]:
    return [
        [_triple(i, lp, with_text) for i, lp in r.top] if r.top and r.logprob is not None else None for r in records
    ]


def _finish_reason(gen: Generation, sampling: Sampling) -> dict[str, Any]:
    matched = stop_reason(gen, sampling.stop, eos=True)
    if matched is None:
        return {"type": "length", "length": len(gen.tokens)}
    return {"type": "stop", "matched": matched}


def generate_results(request: GenerateRequest, jobs: Sequence[Job], ids: Sequence[str]) -> Any:
    """The ``/generate`` answer: one result, or a list for a list of prompts (``ids``: one per prompt)."""
    results = []
    for job, rid in zip(jobs, ids):
        gen = job.choices[0]
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": _finish_reason(gen, request.sampling),
            "prompt_tokens": len(job.prompt_ids),
            "weight_version": "default",
        }
        if request.return_logprob:
            records = job.prompt_records or []
            meta["input_token_logprobs"] = _logprobs(records, request.return_text)
            meta["output_token_logprobs"] = _logprobs(gen.tokens, request.return_text)
            if request.top_logprobs_num > 0:
                meta["input_top_logprobs"] = _tops(records, request.return_text)
                meta["output_top_logprobs"] = _tops(gen.tokens, request.return_text)
        meta["completion_tokens"] = len(gen.tokens)
        meta["cached_tokens"] = job.cached_tokens
        meta["e2e_latency"] = job.timing.total_s if job.timing else 0.0
        results.append({"text": gen.text, "output_ids": gen.token_ids, "meta_info": meta})
    return results if request.batch else results[0]


def model_info(model_name: str) -> dict[str, Any]:
    """``/get_model_info`` (and ``/model_info``)."""
    return {
        "model_path": model_name,
        "tokenizer_path": model_name,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": "sim-ngram",
        "architectures": ["SimNGramForCausalLM"],
    }
