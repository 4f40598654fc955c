"""An independent, stdlib-only OpenAI-format HTTP server over two toy language models.

Used by the acceptance tests to check that specapi's output is exactly the target's.
Nothing here imports specapi.

Models
------
Vocabulary (token id: text), one token per character, plus an end-of-text token::

    0:"a" 1:"b" 2:"c" 3:"d" 4:"e" 5:"f" 6:" " 7:"\\n" 8:":" 9:"U" 10:"A"   11: EOT ("<|endoftext|>")

Tokenizing text = one token per character; the literal string ``"<|endoftext|>"`` in a prompt is
read as the EOT token (as HF tokenizers parse special tokens).  Any other character is refused
with HTTP 400.

* ``TARGET``: the next-token distribution is a fixed function of the last two token ids of the
  context and a 4-bit rolling hash of the whole context (a seeded table; contexts shorter than 2
  are padded), with varied entropy: some contexts peaked, some flat.  The hash makes the output
  depend on the whole context (a client that drops or duplicates a token anywhere gets different
  distributions), and stops the fixed chat suffix "\nA:" from making every chat prompt alike.
* ``DRAFT``: ``0.6 * target + 0.4 * other`` where ``other`` is an independent seeded table: it
  agrees with the target's argmax most of the time, but at temperature 1 its sequence
  distribution is clearly different.

When a model emits EOT, generation stops with ``finish_reason="stop"``; EOT is not part of the
text but (like vLLM's EOS) it appears as the last entry of the logprobs ``tokens`` with the token
string ``"<|endoftext|>"`` and is counted in ``usage.completion_tokens``.  EOT also appears in
every top-logprobs list, so a request with ``logprobs >= 12`` sees the whole distribution.

Exact distributions::

    TARGET.next_probs("ab")            -> {"a": ..., ..., "<|endoftext|>": ...}   (sums to 1)
    TARGET.sequence_probs("ab", 3)      -> {continuation_text: probability}
        every possible generated text of at most 3 tokens at temperature 1 (a text shorter
        than 3 ended with EOT); sums to 1.
    TARGET.greedy("ab", 20, stop=None)  -> (text, finish_reason)   what the server returns at T=0

Server
------
``with ToyServer() as srv: srv.base_url  # "http://127.0.0.1:PORT/v1"``.  Both models are served
by one server, selected by the request's ``model`` ("target" / "draft").

* ``POST /v1/completions``: ``prompt`` (str, a list of one str, or a list of token ids),
  ``max_tokens`` (default 16; >= 0 with echo, else >= 1), ``temperature`` (default 1; 0 = argmax,
  ties to the lowest id), ``top_p``, ``top_k`` (vLLM's order: temperature, top_k, top_p), ``seed`` (reproducible sampling; absent = fresh
  randomness), ``stop`` (str or list; matched in the generated text only, not included in the
  output, finish_reason "stop"), ``n`` (each choice drawn apart, the prompt billed once), ``logprobs`` (int k in 0..max_logprobs (20),
  -1 = all: top-k plus the chosen token; raw = temperature-1 values, clamped at -9999),
  ``echo`` (prompt first; with logprobs the prompt tokens and their logprobs come first, position
  0 ``null``), vLLM's ``prompt_logprobs`` (int; ``choices[0].prompt_logprobs``),
  ``return_token_ids`` (``choices[0].prompt_token_ids`` / ``token_ids``),
  ``return_tokens_as_token_ids`` (tokens as ``"token_id:N"``), ``stream`` (+ ``stream_options``).
  ``text_offset`` counts characters: with echo from the start of the prompt, without echo from
  the start of the generated text (vLLM).
* ``POST /v1/chat/completions``: ``messages`` rendered with the template below, ``max_tokens`` /
  ``max_completion_tokens``, ``temperature``, ``top_p``, ``seed``, ``stop``, ``logprobs`` (bool) +
  ``top_logprobs`` (int), ``add_generation_prompt`` (default true), ``continue_final_message``
  (vLLM), ``prompt_logprobs`` (int; top-level ``prompt_logprobs``: ``[None, {"<id>": {"logprob",
  "rank", "decoded_token"}}, ...]``), ``return_token_ids`` (top-level ``prompt_token_ids``,
  ``choices[0].token_ids``), ``stream``.  Only the continuation is returned as content.
* ``GET /v1/models``, ``GET /v1/models/{id}``, ``GET /health``.
* Errors: ``{"error": {"message", "type", "param", "code"}}`` with 400 / 401 / 404 (and injected ones).

Chat template: each message becomes ``ROLE + ":" + content + "\\n"`` where ROLE is ``"A"`` for
assistant messages and ``"U"`` for all others (user, system, developer, tool).  Then, with
``add_generation_prompt`` (default), ``"A:"`` is appended.  With ``continue_final_message: true``
(and ``add_generation_prompt: false``) the final message must be an assistant message and it is
rendered without its closing ``"\\n"``::

    [{"role": "user", "content": "ab"}]                          -> "U:ab\\nA:"
    [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}]
        with continue_final_message                               -> "U:ab\\nA:cd"

Accounting and fault injection: ``srv.stats[model]`` (requests, prompt_tokens,
completion_tokens, cached_tokens, failed) counts the usage the server returned;
``srv.log`` records every request (path, model, body, status); ``srv.fail_next(...)`` and
``srv.omit_logprobs_next(...)`` make the next matching responses fail or lack logprobs;
``srv.set_delay(...)`` adds latency.  With ``cache_block=B`` the server reports
``usage.prompt_tokens_details.cached_tokens`` (longest prefix shared with an earlier prompt of
the same model, in whole blocks of B tokens).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import http.server
import json
import math
import random
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "CHARS",
    "DRAFT",
    "EOT",
    "EOT_TEXT",
    "MODELS",
    "TARGET",
    "TOKENS",
    "VOCAB_SIZE",
    "ModelStats",
    "ToyError",
    "ToyModel",
    "ToyServer",
    "context_key",
    "detokenize",
    "render_chat",
    "tokenize",
]

# ----------------------------------------------------------------------------- vocabulary

CHARS = ("a", "b", "c", "d", "e", "f", " ", "\n", ":", "U", "A")
EOT_TEXT = "<|endoftext|>"
TOKENS = CHARS + (EOT_TEXT,)
EOT = len(CHARS)  # 11
VOCAB_SIZE = len(TOKENS)  # 12
_PAD = VOCAB_SIZE  # context padding id (contexts shorter than 2 tokens)
_CHAR_ID = {c: i for i, c in enumerate(CHARS)}
_TOKEN_ID = {t: i for i, t in enumerate(TOKENS)}
LOGPROB_FLOOR = -9999.0


class ToyError(Exception):
    """An error that the server turns into an OpenAI-shaped error response."""

    def __init__(self, status: int, message: str, *, type: str | None = None, code: str | None = None,
                 param: str | None = None, headers: Mapping[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
                             429: "rate_limit_error"}.get(status, "server_error")
        self.code = code if code is not None else status
        self.param = param
        self.headers = dict(headers or {})


def tokenize(text: str) -> list[int]:
    """One token per character; the literal ``"<|endoftext|>"`` is the EOT token."""
    ids: list[int] = []
    i = 0
    while i < len(text):
        if text.startswith(EOT_TEXT, i):
            ids.append(EOT)
            i += len(EOT_TEXT)
            continue
        c = text[i]
        if c not in _CHAR_ID:
            raise ToyError(400, f"character {c!r} at position {i} is not in the toy vocabulary {''.join(CHARS)!r}",
                           code="invalid_token", param="prompt")
        ids.append(_CHAR_ID[c])
        i += 1
    return ids


def detokenize(ids: Iterable[int], *, skip_eot: bool = True) -> str:
    return "".join(TOKENS[i] for i in ids if not (skip_eot and i == EOT))


def _as_ids(context: str | Sequence[int]) -> list[int]:
    return tokenize(context) if isinstance(context, str) else list(context)


# ----------------------------------------------------------------------------- models


def _softmax(logits: Sequence[float]) -> tuple[float, ...]:
    m = max(logits)
    e = [math.exp(x - m) for x in logits]
    s = sum(e)
    return tuple(x / s for x in e)


HASH_BUCKETS = 16


def context_key(ids: Sequence[int]) -> tuple[int, int, int]:
    """(second-to-last id, last id, rolling hash of all ids); _PAD where the context is shorter than 2.

    The hash h = fold(h -> (3*h + id + 1) mod 16) changes whenever any single token changes.
    """
    h = 0
    for t in ids:
        h = (3 * h + t + 1) % HASH_BUCKETS
    a = ids[-2] if len(ids) >= 2 else _PAD
    b = ids[-1] if len(ids) >= 1 else _PAD
    return a, b, h


def _random_table(seed: int) -> dict[tuple[int, int, int], tuple[float, ...]]:
    """Seeded next-token tables keyed by context_key."""
    rng = random.Random(seed)
    table = {}
    for a in range(VOCAB_SIZE + 1):
        for b in range(VOCAB_SIZE + 1):
            for h in range(HASH_BUCKETS):
                scale = rng.choice((0.3, 1.0, 2.0, 3.5))  # flat ... peaked
                logits = [rng.gauss(0.0, 1.0) * scale for _ in range(VOCAB_SIZE)]
                logits[EOT] -= 1.0  # end-of-text somewhat rarer than the rest
                table[(a, b, h)] = _softmax(logits)
    return table


def transform(probs: Sequence[float], temperature: float = 1.0, top_p: float | None = None, top_k: int | None = None) -> list[float]:
    """The sampling distribution the server uses for raw probabilities ``probs``.

    temperature 0 = point mass on the argmax (ties to the lowest id); otherwise p^(1/T)
    renormalised, then top_k (the k most likely tokens, ties to the lowest id) renormalised, then
    nucleus (top_p) filtering: the smallest set of most likely tokens (ties to the lowest id) whose
    mass reaches top_p, renormalised (vLLM's order).
    """
    n = len(probs)
    if temperature == 0:
        best = max(range(n), key=lambda i: (probs[i], -i))
        return [1.0 if i == best else 0.0 for i in range(n)]
    if temperature != 1:
        logs = [math.log(p) / temperature if p > 0 else -math.inf for p in probs]
        m = max(logs)
        w = [math.exp(x - m) for x in logs]
        s = sum(w)
        dist = [x / s for x in w]
    else:
        dist = list(probs)
    if top_k is not None and 0 < top_k < n:
        kept = set(sorted(range(n), key=lambda i: (-dist[i], i))[:top_k])
        s = sum(dist[i] for i in kept)
        dist = [dist[i] / s if i in kept else 0.0 for i in range(n)]
    if top_p is not None and top_p < 1:
        order = sorted(range(n), key=lambda i: (-dist[i], i))
        keep, mass = [], 0.0
        for i in order:
            keep.append(i)
            mass += dist[i]
            if mass >= top_p:
                break
        s = sum(dist[i] for i in keep)
        kept = set(keep)
        dist = [dist[i] / s if i in kept else 0.0 for i in range(n)]
    return dist


class ToyModel:
    """A model whose next-token distribution is ``table[context_key(context ids)]``."""

    def __init__(self, name: str, table: Mapping[tuple[int, int, int], Sequence[float]]):
        self.name = name
        self._table = {k: tuple(v) for k, v in table.items()}

    # -- raw distributions
    def probs_ids(self, ids: Sequence[int]) -> tuple[float, ...]:
        return self._table[context_key(ids)]

    def next_probs(self, context: str | Sequence[int]) -> dict[str, float]:
        """Exact next-token distribution (temperature 1), keyed by token text (EOT as "<|endoftext|>")."""
        p = self.probs_ids(_as_ids(context))
        return {TOKENS[i]: p[i] for i in range(VOCAB_SIZE)}

    def next_logprobs(self, context: str | Sequence[int]) -> dict[str, float]:
        return {t: math.log(p) for t, p in self.next_probs(context).items()}

    def argmax(self, context: str | Sequence[int]) -> str:
        p = self.probs_ids(_as_ids(context))
        return TOKENS[max(range(VOCAB_SIZE), key=lambda i: (p[i], -i))]

    # -- sequences
    def sequence_probs(self, context: str | Sequence[int], n: int, *, temperature: float = 1.0,
                       top_p: float | None = None, top_k: int | None = None) -> dict[str, float]:
        """Exact probability of every generated text of at most n tokens (shorter = ended by EOT)."""
        out: dict[str, float] = {}

        def rec(ids: list[int], text: str, prob: float, left: int) -> None:
            if left == 0:
                out[text] = out.get(text, 0.0) + prob
                return
            dist = transform(self.probs_ids(ids), temperature, top_p, top_k)
            for i, q in enumerate(dist):
                if q <= 0:
                    continue
                if i == EOT:
                    out[text] = out.get(text, 0.0) + prob * q
                else:
                    rec(ids + [i], text + TOKENS[i], prob * q, left - 1)

        rec(_as_ids(context), "", 1.0, n)
        return out

    def greedy(self, context: str | Sequence[int], max_tokens: int,
               stop: str | Sequence[str] | None = None) -> tuple[str, str]:
        """The server's temperature-0 output: (text, finish_reason)."""
        g = generate(self, _as_ids(context), max_tokens, temperature=0.0, stop=stop)
        return g.text, g.finish_reason

    def __repr__(self) -> str:
        return f"ToyModel({self.name!r})"


_TARGET_TABLE = _random_table(20240601)
_OTHER_TABLE = _random_table(777)
TARGET = ToyModel("target", _TARGET_TABLE)
DRAFT = ToyModel("draft", {k: tuple(0.6 * t + 0.4 * o for t, o in zip(_TARGET_TABLE[k], _OTHER_TABLE[k]))
                           for k in _TARGET_TABLE})
MODELS = {"target": TARGET, "draft": DRAFT}


# ----------------------------------------------------------------------------- generation


@dataclasses.dataclass
class Generation:
    ids: list[int]  # generated token ids, including a final EOT and any stop-string tokens
    text: str  # returned text (no EOT, truncated before the stop string)
    finish_reason: str  # "stop" | "length"


def _normalise_stop(stop: Any) -> list[str]:
    if stop is None:
        return []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ToyError(400, "'stop' must be a string or a list of strings", param="stop")
    return [s for s in stop if s]


def generate(model: ToyModel, prompt_ids: Sequence[int], max_tokens: int, *, temperature: float = 1.0,
             top_p: float | None = None, stop: Any = None, rng: random.Random | None = None,
             top_k: int | None = None) -> Generation:
    stops = _normalise_stop(stop)
    ctx = list(prompt_ids)
    out: list[int] = []
    text = ""
    for _ in range(max_tokens):
        dist = transform(model.probs_ids(ctx), temperature, top_p, top_k)
        if temperature == 0:
            tok = dist.index(1.0)
        else:
            u = (rng or random.Random()).random()
            acc, tok = 0.0, None
            for i, q in enumerate(dist):
                acc += q
                if u < acc:
                    tok = i
                    break
            if tok is None:  # rounding: last token with mass
                tok = max(i for i, q in enumerate(dist) if q > 0)
        out.append(tok)
        ctx.append(tok)
        if tok == EOT:
            return Generation(out, text, "stop")
        text += TOKENS[tok]
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return Generation(out, text[: min(hits)], "stop")
    return Generation(out, text, "length")


def _rank_order(probs: Sequence[float]) -> list[int]:
    return sorted(range(len(probs)), key=lambda i: (-probs[i], i))


def _lp(p: float) -> float:
    return max(LOGPROB_FLOOR, math.log(p)) if p > 0 else LOGPROB_FLOOR


# ----------------------------------------------------------------------------- server


@dataclasses.dataclass
class ModelStats:
    requests: int = 0  # successful responses (each returned a usage)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    failed: int = 0  # error responses (not billed)

    def minus(self, other: "ModelStats") -> "ModelStats":
        return ModelStats(*(getattr(self, f.name) - getattr(other, f.name) for f in dataclasses.fields(self)))


@dataclasses.dataclass
class RequestRecord:
    method: str
    path: str
    model: str | None
    body: Any
    status: int = 0
    time: float = 0.0


@dataclasses.dataclass
class _Fault:
    kind: str  # "status" | "omit_logprobs"
    remaining: int
    model: str | None
    endpoint: str | None  # "completions" | "chat" | None
    status: int = 500
    retry_after: float | None = None
    message: str | None = None


def _int_param(body: Mapping[str, Any], name: str, default: Any, *, lo: int | None = None,
               hi: int | None = None) -> Any:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ToyError(400, f"'{name}' must be an integer, got {v!r}", param=name)
    if lo is not None and v < lo:
        raise ToyError(400, f"'{name}' must be >= {lo}, got {v}", param=name)
    if hi is not None and v > hi:
        raise ToyError(400, f"'{name}' must be <= {hi}, got {v}", param=name)
    return v


def _float_param(body: Mapping[str, Any], name: str, default: float, lo: float, hi: float) -> float:
    v = body.get(name, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ToyError(400, f"'{name}' must be a number, got {v!r}", param=name)
    if not lo <= v <= hi:
        raise ToyError(400, f"'{name}' must be in [{lo}, {hi}], got {v}", param=name)
    return float(v)


class _QuietServer(http.server.ThreadingHTTPServer):
    """Clients that hang up mid-request (a cancelled speculative call) are normal here: no traceback."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)


class ToyServer:
    """OpenAI-format server over loopback HTTP serving ``models`` (default: target and draft)."""

    def __init__(self, models: Mapping[str, ToyModel] | None = None, *, host: str = "127.0.0.1", port: int = 0,
                 max_logprobs: int = 20, max_model_len: int = 4096, cache_block: int | None = None,
                 api_key: str | None = None):
        self.models = dict(models or MODELS)
        self.host, self.port = host, port
        self.max_logprobs = max_logprobs
        self.max_model_len = max_model_len
        self.cache_block = cache_block
        self.api_key = api_key
        self.stats: dict[str, ModelStats] = {m: ModelStats() for m in self.models}
        self.log: list[RequestRecord] = []
        self._faults: list[_Fault] = []
        self._delays: dict[str, tuple[float, float]] = {}
        self._seen_prompts: dict[str, list[tuple[int, ...]]] = {m: [] for m in self.models}
        self._lock = threading.Lock()
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle
    def start(self) -> "ToyServer":
        server = self

        class Handler(_Handler):
            toy = server

        httpd = _QuietServer((self.host, self.port), Handler, bind_and_activate=False)
        httpd.daemon_threads = True
        httpd.request_queue_size = 1024
        httpd.allow_reuse_address = True
        httpd.server_bind()
        httpd.server_activate()
        self._httpd = httpd
        self.port = httpd.server_address[1]
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"toyserver:{self.port}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "ToyServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    # -- accounting
    def snapshot(self) -> dict[str, ModelStats]:
        with self._lock:
            return {m: dataclasses.replace(s) for m, s in self.stats.items()}

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = {m: ModelStats() for m in self.models}
            self.log.clear()

    def requests_for(self, model: str, path_suffix: str | None = None) -> list[Any]:
        with self._lock:
            return [r.body for r in self.log
                    if r.model == model and (path_suffix is None or r.path.endswith(path_suffix))]

    # -- fault injection and latency
    def fail_next(self, n: int = 1, status: int = 500, *, model: str | None = None, endpoint: str | None = None,
                  retry_after: float | None = None, message: str | None = None) -> None:
        """The next n requests (for ``model`` / ``endpoint`` "completions" or "chat", if given) fail."""
        with self._lock:
            self._faults.append(_Fault("status", n, model, endpoint, status, retry_after, message))

    def omit_logprobs_next(self, n: int = 1, *, model: str | None = None, endpoint: str | None = None) -> None:
        """The next n matching responses succeed but carry ``logprobs: null`` (and no prompt_logprobs)."""
        with self._lock:
            self._faults.append(_Fault("omit_logprobs", n, model, endpoint))

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def set_delay(self, model: str, per_request: float = 0.0, per_token: float = 0.0) -> None:
        """Sleep per_request + per_token * completion_tokens seconds before answering (per token when streaming)."""
        with self._lock:
            self._delays[model] = (per_request, per_token)

    @contextlib.contextmanager
    def delays_suspended(self) -> Iterator[None]:
        """Within the block, answer without the configured delays (e.g. for reference calls)."""
        with self._lock:
            saved, self._delays = self._delays, {}
        try:
            yield
        finally:
            with self._lock:
                self._delays = saved

    def _take_fault(self, model: str | None, endpoint: str) -> _Fault | None:
        with self._lock:
            for f in self._faults:
                if f.remaining > 0 and (f.model is None or f.model == model) and \
                        (f.endpoint is None or f.endpoint == endpoint):
                    f.remaining -= 1
                    fault = copy.copy(f)
                    self._faults = [g for g in self._faults if g.remaining > 0]
                    return fault
        return None

    def _bill(self, model: str, prompt_ids: Sequence[int], completion_tokens: int) -> dict[str, Any]:
        with self._lock:
            cached = 0
            if self.cache_block:
                p = tuple(prompt_ids)
                best = 0
                for prev in self._seen_prompts[model]:
                    n = 0
                    for x, y in zip(prev, p):
                        if x != y:
                            break
                        n += 1
                    best = max(best, n)
                best = min(best, max(0, len(p) - 1))
                cached = best // self.cache_block * self.cache_block
                self._seen_prompts[model].append(p)
                del self._seen_prompts[model][:-512]
            s = self.stats[model]
            s.requests += 1
            s.prompt_tokens += len(prompt_ids)
            s.completion_tokens += completion_tokens
            s.cached_tokens += cached
        usage: dict[str, Any] = {"prompt_tokens": len(prompt_ids), "completion_tokens": completion_tokens,
                                 "total_tokens": len(prompt_ids) + completion_tokens}
        if self.cache_block:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return usage

    # -- request handling (returns (status, payload, headers) or a stream of chunks)
    def handle(self, method: str, path: str, body: Any, headers: Mapping[str, str]) -> "_Reply":
        record = RequestRecord(method, path, body.get("model") if isinstance(body, dict) else None, body,
                               time=time.time())
        with self._lock:
            self.log.append(record)
        try:
            reply = self._route(method, path, body, headers)
        except ToyError as e:
            reply = _Reply(e.status, {"error": {"message": e.message, "type": e.type, "param": e.param,
                                                "code": e.code}}, e.headers)
            if record.model in self.stats:
                with self._lock:
                    self.stats[record.model].failed += 1
        record.status = reply.status
        return reply

    def _route(self, method: str, path: str, body: Any, headers: Mapping[str, str]) -> "_Reply":
        path = path.split("?", 1)[0].rstrip("/")
        if path == "/health":
            return _Reply(200, {"status": "ok"})
        if self.api_key is not None:
            auth = headers.get("authorization", "")
            if auth != f"Bearer {self.api_key}":
                raise ToyError(401, "invalid api key", code="invalid_api_key")
        if method == "GET" and path == "/v1/models":
            return _Reply(200, {"object": "list", "data": [self._model_card(m) for m in self.models]})
        if method == "GET" and path.startswith("/v1/models/"):
            name = path[len("/v1/models/"):]
            if name not in self.models:
                raise ToyError(404, f"The model `{name}` does not exist.", code="model_not_found")
            return _Reply(200, self._model_card(name))
        if path in ("/v1/completions", "/v1/chat/completions"):
            if method != "POST":
                raise ToyError(405, f"method {method} not allowed")
            if not isinstance(body, dict):
                raise ToyError(400, "request body must be a JSON object")
            endpoint = "chat" if path.endswith("chat/completions") else "completions"
            model_name = body.get("model")
            if not isinstance(model_name, str):
                raise ToyError(400, "'model' is required", param="model")
            if model_name not in self.models:
                raise ToyError(404, f"The model `{model_name}` does not exist.", code="model_not_found",
                               param="model")
            fault = self._take_fault(model_name, endpoint)
            if fault is not None and fault.kind == "status":
                hdrs = {}
                if fault.retry_after is not None:
                    hdrs["Retry-After"] = f"{fault.retry_after:g}"
                raise ToyError(fault.status, fault.message or f"injected failure ({fault.status})", headers=hdrs)
            omit = fault is not None and fault.kind == "omit_logprobs"
            one = self._chat if endpoint == "chat" else self._completions
            n = _int_param(body, "n", 1, lo=1, hi=128)
            if n == 1:
                return one(model_name, body, omit)
            return self._choices(one, model_name, body, omit, n)
        raise ToyError(404, f"no route for {method} {path}", code="not_found")

    def _model_card(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": "toyserver",
                "max_model_len": self.max_model_len}

    # -- common parameter handling
    def _sampling(self, body: Mapping[str, Any]) -> tuple[float, float | None, random.Random, list[str], int | None]:
        temperature = _float_param(body, "temperature", 1.0, 0.0, 2.0)
        top_k = _int_param(body, "top_k", -1, lo=-1)
        top_p = _float_param(body, "top_p", 1.0, 1e-9, 1.0)
        seed = body.get("seed")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ToyError(400, "'seed' must be an integer", param="seed")
        rng = random.Random(seed) if seed is not None else random.Random()
        if _int_param(body, "best_of", 1, lo=1) != 1:
            raise ToyError(400, "the toy server supports only best_of=1", param="best_of")
        for name in ("presence_penalty", "frequency_penalty"):
            if body.get(name) not in (None, 0, 0.0):
                raise ToyError(400, f"'{name}' is not supported by the toy server", param=name)
        if body.get("repetition_penalty") not in (None, 1, 1.0):
            raise ToyError(400, "'repetition_penalty' is not supported by the toy server", param="repetition_penalty")
        if body.get("logit_bias"):
            raise ToyError(400, "'logit_bias' is not supported by the toy server", param="logit_bias")
        stops = _normalise_stop(body.get("stop"))
        return temperature, (top_p if top_p < 1 else None), rng, stops, (top_k if top_k > 0 else None)

    def _logprobs_k(self, body: Mapping[str, Any], name: str) -> int | None:
        k = body.get(name)
        if k is None:
            return None
        if isinstance(k, bool) or not isinstance(k, int):
            raise ToyError(400, f"'{name}' must be an integer", param=name)
        if k == -1:
            return VOCAB_SIZE
        if k < 0 or k > self.max_logprobs:
            raise ToyError(400, f"'{name}' must be in [0, {self.max_logprobs}] or -1, got {k}", param=name)
        return min(k, VOCAB_SIZE)

    def _delay(self, model: str) -> tuple[float, float]:
        with self._lock:
            return self._delays.get(model, (0.0, 0.0))

    def _prompt_logprobs_vllm(self, model: ToyModel, ids: Sequence[int], k: int) -> list[Any]:
        out: list[Any] = [None]
        for pos in range(1, len(ids)):
            probs = model.probs_ids(ids[:pos])
            order = _rank_order(probs)
            chosen = set(order[:k]) | {ids[pos]}
            rank = {t: r + 1 for r, t in enumerate(order)}
            out.append({str(t): {"logprob": _lp(probs[t]), "rank": rank[t], "decoded_token": TOKENS[t]}
                        for t in sorted(chosen, key=lambda t: rank[t])})
        return out

    # -- n > 1
    def _choices(self, one: Callable[[str, Mapping[str, Any], bool], "_Reply"], name: str, body: Mapping[str, Any],
                 omit: bool, n: int) -> "_Reply":
        """`n` choices as OpenAI and vLLM answer them: each drawn on its own (a seeded request's choice i with
        the seed plus i), indexed 0..n-1, one request billed with the prompt once."""
        seed = body.get("seed")
        streamed = bool(body.get("stream"))
        with self._lock:
            before = self.stats[name].prompt_tokens
        replies = [one(name, {**body, "n": 1, "stream_options": {"include_usage": True} if streamed else None,
                              "seed": seed + i if isinstance(seed, int) and not isinstance(seed, bool) else seed}, omit)
                   for i in range(n)]
        with self._lock:  # the n calls above billed the prompt n times and counted n requests
            s = self.stats[name]
            prompt_tokens = (s.prompt_tokens - before) // n
            s.prompt_tokens -= prompt_tokens * (n - 1)
            s.requests -= n - 1

        def usage_of(completion_tokens: int, first: Mapping[str, Any]) -> dict[str, Any]:
            return {**first, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}

        if not streamed:
            usages = [r.payload["usage"] for r in replies]
            choices = [{**r.payload["choices"][0], "index": i} for i, r in enumerate(replies)]
            usage = usage_of(sum(u["completion_tokens"] for u in usages), usages[0])
            return _Reply(200, {**replies[0].payload, "choices": choices, "usage": usage})
        wants_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        def chunks() -> Iterable[tuple[float, dict[str, Any]]]:
            usages: list[Mapping[str, Any]] = []
            for i, reply in enumerate(replies):
                for delay, chunk in reply.stream or ():
                    if not chunk["choices"] and "usage" in chunk:
                        usages.append(chunk["usage"])
                        continue
                    yield delay, {**chunk, "choices": [{**c, "index": i} for c in chunk["choices"]]}
            if wants_usage:
                usage = usage_of(sum(u["completion_tokens"] for u in usages), usages[0])
                yield 0.0, {"id": f"cmpl-{uuid.uuid4().hex}", "object": "chat.completion.chunk" if "messages" in body
                            else "text_completion", "created": int(time.time()), "model": name, "choices": [], "usage": usage}
        return _Reply(200, None, stream=chunks())

    # -- /v1/completions
    def _completions(self, name: str, body: Mapping[str, Any], omit_logprobs: bool) -> "_Reply":
        model = self.models[name]
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = tokenize(prompt)
        elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if any(not 0 <= t < VOCAB_SIZE for t in prompt):
                raise ToyError(400, "token id out of range", param="prompt")
            prompt_ids = list(prompt)
        else:
            raise ToyError(400, "'prompt' must be a string, a list of one string, or a list of token ids",
                           param="prompt")
        echo = bool(body.get("echo", False))
        max_tokens = _int_param(body, "max_tokens", 16, lo=0 if echo else 1)
        if not prompt_ids and not echo:
            raise ToyError(400, "the prompt is empty", param="prompt")
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise ToyError(400, f"This model's maximum context length is {self.max_model_len} tokens; "
                                f"requested {len(prompt_ids) + max_tokens}.", param="max_tokens")
        temperature, top_p, rng, stops, top_k = self._sampling(body)
        k = self._logprobs_k(body, "logprobs")
        pk = self._logprobs_k(body, "prompt_logprobs")
        as_ids = bool(body.get("return_tokens_as_token_ids", False))
        gen = generate(model, prompt_ids, max_tokens, temperature=temperature, top_p=top_p, stop=stops, rng=rng, top_k=top_k)
        usage = self._bill(name, prompt_ids, len(gen.ids))

        prompt_text = detokenize(prompt_ids, skip_eot=False)
        tok_str = (lambda t: f"token_id:{t}") if as_ids else (lambda t: TOKENS[t])

        # logprob entries: (token id, logprob or None, top dict or None, text offset)
        entries: list[tuple[str, float | None, dict[str, float] | None, int]] = []
        if k is not None:
            off = 0
            n_echo = len(prompt_ids) if echo else 0
            all_ids = list(prompt_ids) + gen.ids
            for pos in range(len(prompt_ids) - n_echo, len(all_ids)):
                t = all_ids[pos]
                if pos == 0:  # the first prompt token has no logprob
                    entries.append((tok_str(t), None, None, off))
                else:
                    probs = model.probs_ids(all_ids[:pos])
                    order = _rank_order(probs)
                    top_ids = order[:k]
                    if t not in top_ids:
                        top_ids.append(t)
                    entries.append((tok_str(t), _lp(probs[t]), {tok_str(i): _lp(probs[i]) for i in top_ids}, off))
                # EOT is text only inside the prompt (generated EOT ends the text)
                off += len(TOKENS[t]) if (t != EOT or pos < len(prompt_ids)) else 0
        text = (prompt_text if echo else "") + gen.text
        logprobs_obj = None
        if k is not None and not omit_logprobs:
            logprobs_obj = {"tokens": [e[0] for e in entries], "token_logprobs": [e[1] for e in entries],
                            "top_logprobs": [e[2] for e in entries], "text_offset": [e[3] for e in entries]}
        choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": logprobs_obj,
                                  "finish_reason": gen.finish_reason, "stop_reason": None}
        if pk is not None and not omit_logprobs:
            choice["prompt_logprobs"] = self._prompt_logprobs_vllm(model, prompt_ids, pk)
        if body.get("return_token_ids"):
            choice["prompt_token_ids"] = list(prompt_ids)
            choice["token_ids"] = list(gen.ids)
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        per_req, per_tok = self._delay(name)
        if not body.get("stream"):
            time.sleep(per_req + per_tok * len(gen.ids))
            return _Reply(200, {"id": rid, "object": "text_completion", "created": created, "model": name,
                                "choices": [choice], "usage": usage, "system_fingerprint": None})

        # streaming: one chunk per generated token (prompt first with echo), then finish, then usage
        def chunks() -> Iterable[tuple[float, dict[str, Any]]]:
            def chunk(text_piece: str, lp: dict[str, Any] | None, finish: str | None) -> dict[str, Any]:
                return {"id": rid, "object": "text_completion", "created": created, "model": name,
                        "choices": [{"index": 0, "text": text_piece, "logprobs": lp, "finish_reason": finish,
                                     "stop_reason": None}]}
            n_prompt = len(prompt_ids) if echo else 0
            if echo:
                lp = None
                if logprobs_obj is not None:
                    lp = {key: val[:n_prompt] for key, val in logprobs_obj.items()}
                yield per_req, chunk(prompt_text, lp, None)
            emitted = 0
            for j, t in enumerate(gen.ids):
                piece = "" if t == EOT else TOKENS[t]
                piece = piece[: max(0, len(gen.text) - emitted)]
                emitted += len(piece)
                lp = None
                if logprobs_obj is not None:
                    lp = {key: val[n_prompt + j: n_prompt + j + 1] for key, val in logprobs_obj.items()}
                last = j == len(gen.ids) - 1
                yield (per_tok if (j or echo) else per_req + per_tok), \
                    chunk(piece, lp, gen.finish_reason if last else None)
            if not gen.ids:
                yield 0.0, chunk("", None, gen.finish_reason)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield 0.0, {"id": rid, "object": "text_completion", "created": created, "model": name,
                            "choices": [], "usage": usage}
        return _Reply(200, None, stream=chunks())

    # -- /v1/chat/completions
    def _chat(self, name: str, body: Mapping[str, Any], omit_logprobs: bool) -> "_Reply":
        model = self.models[name]
        messages = body.get("messages")
        prompt_text = render_chat(messages, add_generation_prompt=body.get("add_generation_prompt", True),
                                  continue_final_message=body.get("continue_final_message", False))
        prompt_ids = tokenize(prompt_text)
        default_max = self.max_model_len - len(prompt_ids)
        max_tokens = body.get("max_completion_tokens")
        if max_tokens is None:
            max_tokens = _int_param(body, "max_tokens", default_max, lo=1)
        else:
            max_tokens = _int_param(body, "max_completion_tokens", default_max, lo=1)
        if len(prompt_ids) + max_tokens > self.max_model_len:
            raise ToyError(400, f"This model's maximum context length is {self.max_model_len} tokens; "
                                f"requested {len(prompt_ids) + max_tokens}.", param="max_tokens")
        temperature, top_p, rng, stops, top_k = self._sampling(body)
        want_lp = bool(body.get("logprobs", False))
        top_k = _int_param(body, "top_logprobs", 0, lo=0, hi=self.max_logprobs)
        if body.get("top_logprobs") is not None and not want_lp:
            raise ToyError(400, "'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
        top_k = min(top_k, VOCAB_SIZE)
        pk = self._logprobs_k(body, "prompt_logprobs")
        gen = generate(model, prompt_ids, max_tokens, temperature=temperature, top_p=top_p, stop=stops, rng=rng, top_k=top_k)
        usage = self._bill(name, prompt_ids, len(gen.ids))

        content_lp: list[dict[str, Any]] = []
        if want_lp:
            ctx = list(prompt_ids)
            for t in gen.ids:
                probs = model.probs_ids(ctx)
                order = _rank_order(probs)
                content_lp.append({
                    "token": TOKENS[t], "logprob": _lp(probs[t]), "bytes": list(TOKENS[t].encode()),
                    "top_logprobs": [{"token": TOKENS[i], "logprob": _lp(probs[i]), "bytes": list(TOKENS[i].encode())}
                                     for i in order[:top_k]]})
                ctx.append(t)
        logprobs_obj = {"content": content_lp} if want_lp and not omit_logprobs else None
        choice: dict[str, Any] = {"index": 0,
                                  "message": {"role": "assistant", "content": gen.text, "tool_calls": []},
                                  "logprobs": logprobs_obj, "finish_reason": gen.finish_reason, "stop_reason": None}
        if body.get("return_token_ids"):
            choice["token_ids"] = list(gen.ids)
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        payload: dict[str, Any] = {"id": rid, "object": "chat.completion", "created": created, "model": name,
                                   "choices": [choice], "usage": usage, "system_fingerprint": None}
        if pk is not None:
            payload["prompt_logprobs"] = None if omit_logprobs else self._prompt_logprobs_vllm(model, prompt_ids, pk)
        if body.get("return_token_ids"):
            payload["prompt_token_ids"] = list(prompt_ids)
        per_req, per_tok = self._delay(name)
        if not body.get("stream"):
            time.sleep(per_req + per_tok * len(gen.ids))
            return _Reply(200, payload)

        def chunks() -> Iterable[tuple[float, dict[str, Any]]]:
            def chunk(delta: dict[str, Any], lp: Any, finish: str | None) -> dict[str, Any]:
                return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name,
                        "choices": [{"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}]}
            yield per_req, chunk({"role": "assistant", "content": ""}, None, None)
            emitted = 0
            for j, t in enumerate(gen.ids):
                piece = "" if t == EOT else TOKENS[t]
                piece = piece[: max(0, len(gen.text) - emitted)]
                emitted += len(piece)
                lp = {"content": [content_lp[j]]} if logprobs_obj is not None else None
                last = j == len(gen.ids) - 1
                yield per_tok, chunk({"content": piece}, lp, gen.finish_reason if last else None)
            if (body.get("stream_options") or {}).get("include_usage"):
                yield 0.0, {"id": rid, "object": "chat.completion.chunk", "created": created, "model": name,
                            "choices": [], "usage": usage}
        return _Reply(200, None, stream=chunks())


def render_chat(messages: Any, *, add_generation_prompt: bool = True, continue_final_message: bool = False) -> str:
    """The toy chat template (see the module docstring)."""
    if not isinstance(messages, list) or not messages:
        raise ToyError(400, "'messages' must be a non-empty list", param="messages")
    if continue_final_message and add_generation_prompt:
        raise ToyError(400, "continue_final_message and add_generation_prompt cannot both be true",
                       param="continue_final_message")
    parts = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m:
            raise ToyError(400, f"messages[{i}] must be an object with a role", param="messages")
        content = m.get("content") or ""
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
        if not isinstance(content, str):
            raise ToyError(400, f"messages[{i}].content must be a string", param="messages")
        role = "A" if m["role"] == "assistant" else "U"
        last = i == len(messages) - 1
        if last and continue_final_message:
            if m["role"] != "assistant":
                raise ToyError(400, "continue_final_message needs a final assistant message", param="messages")
            parts.append(f"{role}:{content}")
        else:
            parts.append(f"{role}:{content}\n")
    if add_generation_prompt:
        parts.append("A:")
    return "".join(parts)


@dataclasses.dataclass
class _Reply:
    status: int
    payload: Any
    headers: dict[str, str] = dataclasses.field(default_factory=dict)
    stream: Iterable[tuple[float, dict[str, Any]]] | None = None


class _Handler(http.server.BaseHTTPRequestHandler):
    toy: ToyServer
    protocol_version = "HTTP/1.1"
    server_version = "toyserver/1"
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # silence
        pass

    def _serve(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                self._send(_Reply(400, {"error": {"message": "invalid JSON body", "type": "BadRequestError",
                                                  "param": None, "code": 400}}))
                return
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            reply = self.toy.handle(method, self.path, body, headers)
        except Exception as e:  # a bug in the toy server: report it as a 500 rather than hang
            reply = _Reply(500, {"error": {"message": f"toyserver bug: {e!r}", "type": "server_error",
                                           "param": None, "code": 500}})
        self._send(reply)

    def _send(self, reply: _Reply) -> None:
        try:
            if reply.stream is None:
                data = json.dumps(reply.payload).encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)
            else:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.send_header("Connection", "close")
                self.end_headers()
                self.close_connection = True
                for delay, obj in reply.stream:
                    if delay:
                        time.sleep(delay)
                    self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")
