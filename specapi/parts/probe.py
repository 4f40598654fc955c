"""Capability probing: what an endpoint offers for verification, found with a few tiny requests.

`await probe_endpoint(role_client, meter)` returns `Capabilities`. Every probe request is metered like
any other call, so the request that triggered probing reports (and pays for) it. Results are cached per
(base_url, model) for the process. `specapi probe --base-url URL --model NAME` prints a report.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import openai

from ..transport._calls import Meter, RoleClient, is_transient
from ..transport._exceptions import EndpointError, MalformedResponseError
from ..dialects import native_dialect, server_root
from ..dialects.base import UNREADABLE
from ..dialects.capabilities import Capabilities
from ..dialects.logprobs import chat_tokens, completion_tokens
from ..dialects.openai import CONTINUE_FINAL_MESSAGE, TRAILING, Prefill, chat_request, completion_request, fixed_sampling
from ..dialects.vllm import prompt_scores_finding, prompt_scores_note, prompt_scores_probe, scores_prompt
from ..core.cli_options import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Option, UsageError, add_options, boolean, resolve
from ..transport.endpoint import Endpoint

__all__ = ["Capabilities", "probe_endpoint", "choose_verification", "server_facts", "add_arguments", "run"]

# Plain lowercase letters and spaces: every tokenizer (and the tests' toy servers) accepts them.
_PROBE_PROMPT = "a b c d e f a b c d e f a b c"

#: llama-cpp-python's server applies these to requests that omit them (its request models' defaults,
#: version 0.3.36); it has no endpoint that reports them.
LLAMA_CPP_PYTHON_DEFAULTS = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05, "repeat_penalty": 1.1}
#: Every sampling setting llama-server reports that changes which token it picks (engine.py says which
#: values leave the pick alone: anything else keeps the target alone).
_DEFAULT_FIELDS = (
    "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
    "dry_multiplier", "xtc_probability", "typical_p", "top_n_sigma", "mirostat", "dynatemp_range",
)  # fmt: skip


@dataclass(frozen=True)
class _Limits:
    """How long a server lets a request run when the request sets no limit."""

    #: The limit of a completions request that sets none (None: to the end of the context window).
    default_max_tokens: int | None = 16  # OpenAI's and vLLM's
    context_window: int | None = None  # tokens, prompt and output together; None: not reported


async def _server_defaults(client: RoleClient) -> tuple[str | None, dict[str, float] | None, _Limits]:
    """Which server this is, if recognised, the sampling defaults it applies and its limits: llama-server
    answers `/props` (with its defaults, `n_predict` and the slot's `n_ctx`), vLLM `/version` (and lists
    each model's `max_model_len`), SGLang `/get_model_info`; llama-cpp-python names itself the owner "me"
    of its models (its defaults are known). GETs bill nothing and are not metered. All four are asked at
    once: on a server that answers none of them (404s), one after the other they were four round trips."""
    meter = Meter(client.endpoint)
    root = server_root(client)
    props, version, info, models = await asyncio.gather(
        _document(client, root + "/props", meter),
        _document(client, root + "/version", meter),
        _document(client, root + "/get_model_info", meter),
        _document(client, "/models", meter),
    )
    try:
        settings = props.get("default_generation_settings") or {}
        params = settings.get("params") or {}
        # As the server reports them: top_k stays an integer (a float is refused by stricter servers).
        defaults = {k: params[k] for k in _DEFAULT_FIELDS if isinstance(params.get(k), (int, float)) and not isinstance(params.get(k), bool)}
        if defaults:
            n_predict, n_ctx = params.get("n_predict"), settings.get("n_ctx")
            limits = _Limits(
                default_max_tokens=n_predict if _count(n_predict) else None,  # -1: to the context's end
                context_window=n_ctx if _count(n_ctx) else None,
            )
            return "llama-server", defaults, limits
    except (AttributeError, TypeError, ValueError):
        pass
    if isinstance(version, dict) and isinstance(version.get("version"), str):
        return "vllm", None, _Limits(context_window=_max_model_len(client, models))
    if isinstance(info, dict) and "model_path" in info:
        return "sglang", None, _Limits()
    try:
        owners = {m.get("owned_by") for m in models.get("data") or [] if isinstance(m, dict)}
        if owners == {"me"}:  # llama-cpp-python's server names itself so
            return "llama-cpp-python", dict(LLAMA_CPP_PYTHON_DEFAULTS), _Limits()
    except (AttributeError, TypeError, ValueError):
        pass
    return None, None, _Limits(context_window=_max_model_len(client, models))


async def _document(client: RoleClient, path: str, meter: Meter) -> Any:
    """The JSON a GET answers, or None where the server does not answer it. A transient failure (a 5xx,
    a 429, a timeout) is raised: it says nothing of the server, and the probe runs again."""
    try:
        return await client.get(path, meter)
    except EndpointError as exc:
        if _transient(exc):
            raise
        return None


def _transient(exc: EndpointError) -> bool:
    """An overloaded or hung server (429, 5xx, a timeout). An unreadable answer is the server's own (the
    SDK reports a body that is not JSON as a connection error), and a server that is down fails the
    probe's other calls anyway."""
    return isinstance(exc.__cause__, openai.APITimeoutError) or (exc.status_code is not None and (exc.status_code == 429 or exc.status_code >= 500))


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _max_model_len(client: RoleClient, models: Any) -> int | None:
    """The model's context window as vLLM lists it in `/models` (`max_model_len`); None when not listed."""
    try:
        for model in models.get("data") or []:
            if isinstance(model, dict) and model.get("id") == client.endpoint.model and _count(model.get("max_model_len")):
                return model["max_model_len"]
    except (AttributeError, TypeError, ValueError):
        pass
    return None


def choose_verification(caps: Capabilities, *, chat: bool) -> str:
    """The fastest exact path an endpoint allows, for completions or chat requests."""
    if chat:
        if caps.scores_chat_prompts:
            return "prompt-logprobs"
        if caps.chat_prefill and caps.chat:
            return "prefill-fanout"
        if caps.predicted_outputs:
            return "predicted-outputs"
        return "prefix-match"
    if caps.token_ids and not caps.echo_logprobs:
        # One request per round on the target's own ids (llama.cpp's multi-prompt /completion) instead
        # of one per draft position. Where echo scores a draft in one request too (vLLM, SGLang), echo
        # stays for short contexts, and the path resolver moves long ones to token ids (see paths.py).
        return "token-ids"
    if caps.echo_logprobs:
        return "echo"
    if caps.completions:
        return "prefill-fanout"
    return "none"


async def _try(client: RoleClient, path: str, body: dict[str, Any], meter: Meter) -> dict[str, Any] | None:
    """The response, or None when the endpoint refuses this request (a 4xx that retrying won't change).

    Transient failures (429, 5xx, timeouts) are retried and then raised: they say nothing about
    what the endpoint supports.
    """
    try:
        return await client.post(path, body, meter)
    except MalformedResponseError:
        return None
    except EndpointError as exc:
        if exc.__cause__ is not None and is_transient(exc.__cause__):
            raise
        if exc.status_code is None or exc.status_code >= 500:
            raise
        return None


T = TypeVar("T")


async def _all(*requests: Awaitable[T]) -> list[T]:
    """Independent probe requests at once (a cold start waits for the probe); all always finish, and
    the first failure is raised as if they had run one after the other."""
    results = await asyncio.gather(*requests, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)  # type: ignore[arg-type]


async def probe_endpoint(client: RoleClient, meter: Meter) -> Capabilities:
    # What kind of server this is (two GETs) does not depend on the rest: asked meanwhile.
    defaults = asyncio.ensure_future(_server_defaults(client))
    try:
        return await _probe(client, meter, defaults)
    finally:
        # Awaited whatever happened: its failure, when the probe failed first, is the probe's own.
        defaults.cancel()
        await asyncio.gather(defaults, return_exceptions=True)


Ask = Callable[[str, dict[str, Any]], Awaitable["dict[str, Any] | None"]]


@dataclass
class _Found:
    """What the probe found so far: `Capabilities` fields by name, and a note per finding."""

    values: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


async def _probe(client: RoleClient, meter: Meter, defaults_task: asyncio.Future[tuple[str | None, dict[str, float] | None, _Limits]]) -> Capabilities:
    async def ask(path: str, body: dict[str, Any]) -> dict[str, Any] | None:
        return await _try(client, path, body, meter)

    # The completions half and the chat half ask different endpoints and neither reads the other's
    # answers: asked at once, the first request of a cold client waits for the longer half (two or
    # three round trips), not for both one after the other (six).
    completions, chat = _Found(), _Found()
    await _all(_probe_completions(ask, completions, client.endpoint.max_logprobs), _probe_chat(ask, chat), _probe_streams(client, meter))
    found = _Found({**completions.values, **chat.values}, completions.notes + chat.notes)
    await _probe_server(client, meter, found, await defaults_task)
    return Capabilities(notes=tuple(found.notes), **found.values)


async def _probe_streams(client: RoleClient, meter: Meter) -> None:
    """One token streamed from each endpoint: what the server's chunks carry beyond specapi's own fields
    (`answer_keys`), so that the streams specapi assembles carry them too. Refusals say nothing here."""

    async def stream(path: str, body: dict[str, Any]) -> None:
        body = {**body, "stream_options": {"include_usage": True}}  # billed like every other call
        try:
            async with contextlib.aclosing(client.stream(path, body, meter)) as chunks:
                async for _ in chunks:
                    pass
        except EndpointError as exc:
            if exc.__cause__ is not None and is_transient(exc.__cause__) or exc.status_code is None or exc.status_code >= 500:
                raise
        except ValueError:  # an unreadable chunk: the calls that matter find it out and say so
            pass

    await _all(
        stream(*completion_request(_PROBE_PROMPT, 1, fixed_sampling(0))),
        stream(*chat_request([{"role": "user", "content": "a b c d e"}], 1, fixed_sampling(0))),
    )


async def _probe_completions(ask: Ask, found: _Found, max_logprobs: int) -> None:
    """Completions with echo + logprobs: scores supplied tokens in one call. Ask for the longest lists
    the endpoint is configured for; a server with a lower cap (OpenAI's base models: 5) refuses.
    Raw or temperature-scaled logprobs: the same prompt scored at two temperatures, asked meanwhile
    (read only where echo scores prompts; a server that refuses echo refuses these as cheaply)."""
    prompt, values = _PROBE_PROMPT, found.values
    caps = sorted({max_logprobs, 5}, reverse=True)
    response, hot, cold = await _all(
        ask(*completion_request(prompt, 1, fixed_sampling(0), top_k=caps[0], echo=True)),
        ask(*completion_request(prompt, 1, fixed_sampling(0.5, seed=0), top_k=1, echo=True)),
        ask(*completion_request(prompt, 1, fixed_sampling(1.0, seed=0), top_k=1, echo=True)),
    )
    if response is not None:
        values["max_logprobs"] = caps[0]
    for k in caps[1:]:
        if response is not None:
            break
        response = await ask(*completion_request(prompt, 1, fixed_sampling(0), top_k=k, echo=True))
        if response is not None:
            values["max_logprobs"] = k
    if response is not None:
        values["completions"] = True
        tokens = _completion_tokens(response)
        scored = [t for t in tokens if t.top]
        values["echo_logprobs"] = len(tokens) >= 3 and len(scored) >= len(tokens) - 2
        values["completions_logprobs"] = max((len(t.top or {}) for t in tokens), default=0)
        values["offsets_from_prompt_start"] = _offsets_from_prompt_start(response, prompt, echo=True)
    found.notes.append("completions echo+logprobs: " + ("scores prompt tokens" if values.get("echo_logprobs") else "refused or no prompt logprobs"))

    if not values.get("completions"):
        response = await ask(*completion_request(prompt, 1, fixed_sampling(0), top_k=5))
        if response is not None:
            values["completions"] = True
            values["completions_logprobs"] = max((len(t.top or {}) for t in _completion_tokens(response)), default=0)
            values["offsets_from_prompt_start"] = _offsets_from_prompt_start(response, prompt, echo=False)
    if values.get("offsets_from_prompt_start") is not None:
        convention = "from the prompt's start" if values["offsets_from_prompt_start"] else "from the generated text"
        found.notes.append(f"text_offset counts {convention} (specapi aligns on bytes and does not rely on it)")
    if values.get("completions") and not values.get("echo_logprobs"):
        found.notes.append(f"completions logprobs on generated tokens: top {values.get('completions_logprobs', 0)}")
    if values.get("echo_logprobs"):
        _read_temperature(found, hot, cold)


def _read_temperature(found: _Found, hot: dict[str, Any] | None, cold: dict[str, Any] | None) -> None:
    """Raw logprobs score the prompt alike at both temperatures; scaled ones do not."""
    try:
        a = completion_tokens(hot["choices"][0]["logprobs"]) if hot else []
        b = completion_tokens(cold["choices"][0]["logprobs"]) if cold else []
    except UNREADABLE:
        return
    pairs = [(x.logprob, y.logprob) for x, y in zip(a[1:-1], b[1:-1]) if x.logprob is not None and y.logprob is not None]
    if pairs:
        found.values["logprobs_raw"] = all(math.isclose(x, y, abs_tol=1e-4) for x, y in pairs)
        found.notes.append("prompt logprobs are " + ("raw (temperature 1)" if found.values["logprobs_raw"] else "temperature-scaled"))


async def _probe_chat(ask: Ask, found: _Found) -> None:
    """Chat: logprobs, continuing a final assistant message, vLLM's prompt scores, Predicted Outputs.
    All asked at once (what a server without chat refuses costs it nothing); each answer is read only
    where the ones it depends on say it means something: the prefill pair where chat works, the prompt
    scores where the flags continue an assistant message."""
    messages = [{"role": "user", "content": "a b c d e"}]
    continued = messages + [{"role": "assistant", "content": _PREFILL_PREFIX}]
    response, with_flags, bare, continued_scored, predicted = await _all(
        ask(*chat_request(messages, 1, fixed_sampling(0), top_k=20)),
        ask(*chat_request(continued, 1, fixed_sampling(0), prefill=Prefill())),
        ask(*chat_request(continued, 1, fixed_sampling(0))),
        ask(*prompt_scores_probe(continued)),
        ask(*chat_request(messages, 2, fixed_sampling(0), prediction="a b")),
    )
    if response is None:
        return
    found.values["chat"] = True
    try:
        tokens = chat_tokens(response["choices"][0]["logprobs"]["content"])
        found.values["chat_logprobs"] = max((len(t.top or {}) for t in tokens), default=0)
    except UNREADABLE:
        found.values["chat_logprobs"] = 0
    found.notes.append(f"chat logprobs: top {found.values.get('chat_logprobs', 0)}")

    _read_prefill(found, with_flags, bare)
    scored = found.values.get("prefill_style") == CONTINUE_FINAL_MESSAGE and scores_prompt(continued_scored)
    found.values.update(prompt_scores_finding(scored))
    chat_prefill = f"continues a final assistant message ({found.values.get('prefill_style')})" if found.values.get("chat_prefill") else "not supported"
    found.notes.append("chat prefill: " + chat_prefill)
    found.notes.append(prompt_scores_note(scored))

    if predicted is not None:
        details = (predicted.get("usage") or {}).get("completion_tokens_details") or {}
        found.values["predicted_outputs"] = "accepted_prediction_tokens" in details
    found.notes.append("Predicted Outputs: " + ("yes" if found.values.get("predicted_outputs") else "no"))


#: The assistant text the prefill probe asks the endpoint to continue.
_PREFILL_PREFIX = "a b c"


def _read_prefill(found: _Found, with_flags: dict[str, Any] | None, bare: dict[str, Any] | None) -> None:
    """How the endpoint continues a final assistant message: with vLLM/SGLang's flags, or by itself."""
    flagged_prompt = _prompt_tokens(with_flags)
    bare_prompt = _prompt_tokens(bare)
    if with_flags is not None and flagged_prompt is not None and bare_prompt is not None and flagged_prompt < bare_prompt:
        # The flags changed the prompt (no end of turn, no new assistant header): honoured (vLLM, SGLang).
        found.values.update(chat_prefill=True, prefill_style=CONTINUE_FINAL_MESSAGE, prefill_echoes_prefix=_content(with_flags).startswith(_PREFILL_PREFIX))
    elif _content(bare).startswith(_PREFILL_PREFIX) and len(_content(bare)) > len(_PREFILL_PREFIX):
        # Flags refused or ignored, but the reply repeats the prefix and goes on: llama-server's way.
        found.values.update(chat_prefill=True, prefill_style=TRAILING, prefill_echoes_prefix=True)


async def _probe_server(
    client: RoleClient, meter: Meter, found: _Found, defaults: tuple[str | None, dict[str, float] | None, _Limits]
) -> None:
    """What the server found by its GETs applies unasked, and whether its native dialect takes token ids."""
    server = defaults[0]
    values, notes = found.values, found.notes
    _server_findings(found, defaults)
    if server is None:
        return
    dialect = native_dialect(server)
    if dialect is not None and values.get("completions"):
        try:
            ids = await dialect.tokenize(client, _PROBE_PROMPT, meter, special=False)
            values["token_ids"] = bool(ids)
        except EndpointError as exc:
            if _transient(exc):
                raise
            values["token_ids"] = False
        notes.append(f"dialect: {dialect.name}; token-id prompts: " + ("yes" if values.get("token_ids") else "no (tokenize refused)"))
    else:
        notes.append(f"dialect: {server} (OpenAI formats only)")


def _server_findings(found: _Found, defaults: tuple[str | None, dict[str, float] | None, _Limits]) -> None:
    """What the server's GETs (`_server_defaults`) say: which server, what it applies unasked, its limits."""
    server, sampler_defaults, limits = defaults
    found.values.update(default_max_tokens=limits.default_max_tokens, context_window=limits.context_window)
    if server is None:
        found.notes.append("dialect: OpenAI formats only (no native API recognised)")
        return
    found.values.update(
        server=server, sampler_defaults=sampler_defaults, final_stretch=16 if server == "llama-cpp-python" else 0,
        stream_usage_unasked=server == "llama-server", penalties_over_prompt=server == "llama-server",
        chat_hides_partial_runs=server == "llama-server",
    )
    if sampler_defaults:
        found.notes.append(f"{server}: applies {sampler_defaults} to requests that do not set them")


async def server_facts(client: RoleClient) -> Capabilities:
    """What a path forced by the caller needs to know of the target without probing it: which server it
    is, the sampling defaults it applies unasked, its default limit and its context window. From the
    probe's GETs alone (unbilled, one round trip); every verification capability keeps its unknown value."""
    found = _Found()
    _server_findings(found, await _server_defaults(client))
    return Capabilities(notes=tuple(found.notes), **found.values)


_FACTS: dict[tuple[str, str], Capabilities] = {}


async def cached_server_facts(client: RoleClient) -> Capabilities:
    key = (client.endpoint.label, client.endpoint.model)
    if key in _CACHE:
        return _CACHE[key]
    if key not in _FACTS:
        _FACTS[key] = await server_facts(client.apart())
    return _FACTS[key]


def _completion_tokens(response: dict[str, Any]) -> list:
    try:
        return completion_tokens(response["choices"][0].get("logprobs"))
    except UNREADABLE:
        return []


def _offsets_from_prompt_start(response: dict[str, Any], prompt: str, *, echo: bool) -> bool | None:
    """Where the server counts `text_offset` from, seen at the first generated token; None when it
    gives none (SGLang's -1, llama.cpp's chat-shaped logprobs)."""
    try:
        offsets = response["choices"][0]["logprobs"]["text_offset"]
        first_generated = offsets[-1] if echo else offsets[0]
    except UNREADABLE:
        return None
    if not isinstance(first_generated, int) or first_generated < 0:
        return None
    return first_generated == len(prompt)


def _prompt_tokens(response: dict[str, Any] | None) -> int | None:
    value = ((response or {}).get("usage") or {}).get("prompt_tokens")
    return value if isinstance(value, int) else None


def _content(response: dict[str, Any] | None) -> str:
    try:
        return (response or {})["choices"][0]["message"]["content"] or ""
    except UNREADABLE:
        return ""


_CACHE: dict[tuple[str, str], Capabilities] = {}


async def cached_probe(client: RoleClient, meter: Meter) -> Capabilities:
    key = (client.endpoint.label, client.endpoint.model)
    if key not in _CACHE:
        _CACHE[key] = await probe_endpoint(client.apart(), meter)
    return _CACHE[key]


# -- CLI: specapi probe -------------------------------------------------------------------------


PROBE_OPTIONS = (
    Option("--base-url", "SPECAPI_PROBE_BASE_URL", str, None, "the endpoint's base URL, e.g. http://localhost:8000/v1", required=True),
    Option("--model", "SPECAPI_PROBE_MODEL", str, None, "the model to probe", required=True),
    Option("--api-key", "SPECAPI_PROBE_API_KEY", str, None, "the endpoint's key (default: OPENAI_API_KEY)", secret=True),
    Option("--json", "SPECAPI_PROBE_JSON", boolean, False, "print JSON instead of a table"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, PROBE_OPTIONS)


def _hint(exc: EndpointError) -> str:
    cause = exc.__cause__
    if isinstance(cause, openai.APITimeoutError):
        return " (no answer in time: is the server overloaded, or --base-url the address of another service?)"
    if isinstance(cause, openai.APIConnectionError):
        return ": is the server running, and is --base-url right (scheme, host, port, and the /v1 path)?"
    if exc.status_code in (401, 403):
        return " (the key was refused: check --api-key or SPECAPI_PROBE_API_KEY)"
    if exc.status_code == 404:
        return " (check --model, and that --base-url ends where /completions is served, usually /v1)"
    return ""


def _connection_failure(exc: EndpointError) -> str:
    """What the transport saw (connection refused, a name that does not resolve, ...), else the SDK's class."""
    root: BaseException | None = exc.__cause__
    while root is not None and root.__cause__ is not None:
        root = root.__cause__
    text = str(root) if root is not None and not isinstance(root, openai.APIError) else ""
    return text or type(exc.__cause__).__name__


async def _why_unusable(client: RoleClient, meter: Meter) -> str:
    """The endpoint answered no probe: its answer to the plainest request says why."""
    try:
        path, body = chat_request([{"role": "user", "content": "a"}], 1)
        await client.post(path, body, meter, retries=0)
    except EndpointError as exc:
        return f"{exc}{_hint(exc)}"
    return "it refused every probe request"  # pragma: no cover - a chat call that works means chat was found


def run(args: argparse.Namespace) -> int:
    """Exit codes: 0 the endpoint can serve generation; 1 it cannot (refused, not found, unreachable);
    2 missing or invalid options. The report goes to stdout, the probing cost to stderr."""
    import os
    import sys

    try:
        values = resolve(args, PROBE_OPTIONS, os.environ)
        endpoint = Endpoint(base_url=values["base_url"], model=values["model"], api_key=values["api_key"])
    except (UsageError, ValueError) as exc:
        print(f"specapi probe: {exc}", file=sys.stderr)
        return EXIT_USAGE
    client = RoleClient("target", endpoint)
    meter = Meter(endpoint)

    async def probe_and_close() -> tuple[Capabilities, str | None]:
        try:
            caps = await probe_endpoint(client, meter)
            problem = None if caps.completions or caps.chat else await _why_unusable(client, meter)
            return caps, problem
        finally:
            await client.aclose()

    try:
        caps, problem = asyncio.run(probe_and_close())
    except EndpointError as exc:
        unreachable = isinstance(exc.__cause__, openai.APIConnectionError) and not isinstance(exc.__cause__, openai.APITimeoutError)
        shown = f"{endpoint.base_url} is not reachable ({_connection_failure(exc)})" if unreachable else str(exc)
        print(f"specapi probe: {shown}{_hint(exc)}", file=sys.stderr)
        return EXIT_FAILED
    if problem is not None:
        print(f"specapi probe: {endpoint.label} serves neither completions nor chat: {problem}", file=sys.stderr)
        return EXIT_FAILED
    usage = meter.snapshot()
    paths = {"completions": choose_verification(caps, chat=False), "chat": choose_verification(caps, chat=True)}
    cost = f"probing cost {usage.requests} requests, {usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens"
    if values["json"]:
        payload = {
            "endpoint": endpoint.label,
            "verification": paths,
            "capabilities": caps.to_dict(),
            "requests": usage.requests,
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
        }
        print(json.dumps(payload, indent=2))
        print(cost, file=sys.stderr)
        return EXIT_OK
    rows = [
        ("dialect", caps.server or "OpenAI formats"),
        ("verification for completions", paths["completions"]),
        ("verification for chat", paths["chat"]),
    ]
    rows += [(key, str(value)) for key, value in caps.to_dict().items() if key != "notes"]
    print(_table(endpoint.label, rows))
    for note in caps.notes:
        print(f"- {note}")
    print(cost, file=sys.stderr)
    return EXIT_OK


def _table(title: str, rows: list[tuple[str, str]]) -> str:
    """Two aligned columns under a title, in plain text (the client installs no terminal library)."""
    width = max(len("capability"), *(len(key) for key, _ in rows))
    lines = [title, f"{'capability':<{width}}  value", f"{'-' * width}  -----"]
    lines += [f"{key:<{width}}  {value}" for key, value in rows]
    return "\n".join(lines)
