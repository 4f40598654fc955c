"""Capability probing: what an endpoint offers for verification, found with a few tiny requests.

`await probe_endpoint(role_client, meter)` returns `Capabilities`. Every probe request is metered like
any other call, so the request that triggered probing reports (and pays for) it. Results are cached per
(base_url, model) for the process. `specapi probe --base-url URL --model NAME` prints a report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field
from typing import Any, TypeVar

from ._calls import Meter, RoleClient, is_transient
from ._exceptions import EndpointError, MalformedResponseError
from ._wire import WireError, chat_tokens, completion_tokens, prompt_logprob_tokens
from .dialects import native_dialect, server_root
from .cli_options import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Option, UsageError, add_options, boolean, resolve
from .endpoint import Endpoint

__all__ = ["Capabilities", "probe_endpoint", "choose_verification", "add_arguments", "run"]

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
    """The JSON a GET answers, or None where the server does not answer it."""
    try:
        return await client.get(path, meter)
    except EndpointError:
        return None


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


@dataclass(frozen=True)
class Capabilities:
    """What one endpoint supports. `notes` explains each finding in words."""

    completions: bool = False
    completions_logprobs: int = 0  # largest top-k the completions endpoint returned (0 = none)
    max_logprobs: int | None = None  # the largest `logprobs` the echo request was accepted with
    echo_logprobs: bool = False
    prompt_logprobs: bool = False  # vLLM's prompt_logprobs on chat (with prompt_token_ids)
    chat: bool = False
    chat_logprobs: int = 0
    chat_prefill: bool = False  # continues a final assistant message
    prefill_style: str | None = None  # "continue_final_message" or "trailing"
    prefill_echoes_prefix: bool = False  # llama-server returns the prefix inside content
    predicted_outputs: bool = False
    logprobs_raw: bool | None = None  # True: logprobs ignore temperature; None: unknown
    offsets_from_prompt_start: bool | None = None  # text_offset's convention (reported, never relied on)
    server: str | None = None  # "llama-server", "llama-cpp-python", "vllm" or "sglang" when recognised
    #: The server takes token-id prompts (its native dialect tokenized a probe text): token-id verification.
    token_ids: bool = False
    #: Sampling settings the server applies to requests that do not set them (None: OpenAI's, 1.0 and 1.0).
    sampler_defaults: dict[str, float] | None = None
    #: The caller's last tokens the target must write in one call for the text to end as its own would.
    #: Servers that cut a character at the limit render it alike however the call began (0);
    #: llama-cpp-python finishes it past the limit, but only once its call has generated three bytes,
    #: and one of its one-token steps can run many tokens on.
    final_stretch: int = 0
    #: The limit the server gives a completions request that sets none (None: to the context's end).
    default_max_tokens: int | None = 16
    #: The server's context window in tokens (llama-server's slot `n_ctx`, vLLM's `max_model_len`), if known.
    context_window: int | None = None
    #: A completions stream ends with the usage though the request did not ask for it (`stream_options`):
    #: llama-server puts it on the chunk with the finish_reason (its chat streams do not).
    stream_usage_unasked: bool = False
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def choose_verification(caps: Capabilities, *, chat: bool) -> str:
    """The fastest exact path an endpoint allows, for completions or chat requests."""
    if chat:
        if caps.prompt_logprobs:
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
        if not defaults.done():
            defaults.cancel()
            await asyncio.gather(defaults, return_exceptions=True)


async def _probe_completions(client: RoleClient, meter: Meter) -> tuple[dict[str, Any], list[str]]:
    """What the completions endpoint offers: echo with logprobs (and how long its lists are), plain logprobs."""
    found: dict[str, Any] = {}
    notes: list[str] = []
    prompt = _PROBE_PROMPT

    # Completions with echo + logprobs: scores supplied tokens in one call. Ask for the longest lists
    # the endpoint is configured for; a server with a lower cap (OpenAI's base models: 5) refuses.
    # Raw or temperature-scaled logprobs: the same prompt scored at two temperatures, asked meanwhile
    # (read only where echo scores prompts; a server that refuses echo refuses these as cheaply).
    caps = sorted({client.endpoint.max_logprobs, 5}, reverse=True)
    response, hot, cold = await _all(
        _try(client, "/completions", {"prompt": prompt, "echo": True, "logprobs": caps[0], "max_tokens": 1, "temperature": 0}, meter),
        _try(client, "/completions", {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0.5, "seed": 0}, meter),
        _try(client, "/completions", {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 1.0, "seed": 0}, meter),
    )
    if response is not None:
        found["max_logprobs"] = caps[0]
    for k in caps[1:]:
        if response is not None:
            break
        body = {"prompt": prompt, "echo": True, "logprobs": k, "max_tokens": 1, "temperature": 0}
        response = await _try(client, "/completions", body, meter)
        if response is not None:
            found["max_logprobs"] = k
    if response is not None:
        found["completions"] = True
        tokens = _completion_tokens(response)
        scored = [t for t in tokens if t.top]
        found["echo_logprobs"] = len(tokens) >= 3 and len(scored) >= len(tokens) - 2
        found["completions_logprobs"] = max((len(t.top or {}) for t in tokens), default=0)
        found["offsets_from_prompt_start"] = _offsets_from_prompt_start(response, prompt, echo=True)
    notes.append("completions echo+logprobs: " + ("scores prompt tokens" if found.get("echo_logprobs") else "refused or no prompt logprobs"))

    if not found.get("completions"):
        response = await _try(client, "/completions", {"prompt": prompt, "logprobs": 5, "max_tokens": 1, "temperature": 0}, meter)
        if response is not None:
            found["completions"] = True
            found["completions_logprobs"] = max((len(t.top or {}) for t in _completion_tokens(response)), default=0)
            found["offsets_from_prompt_start"] = _offsets_from_prompt_start(response, prompt, echo=False)
    if found.get("offsets_from_prompt_start") is not None:
        convention = "from the prompt's start" if found["offsets_from_prompt_start"] else "from the generated text"
        notes.append(f"text_offset counts {convention} (specapi aligns on bytes and does not rely on it)")
    if found.get("completions") and not found.get("echo_logprobs"):
        notes.append(f"completions logprobs on generated tokens: top {found.get('completions_logprobs', 0)}")

    if found.get("echo_logprobs"):
        try:
            a = completion_tokens(hot["choices"][0]["logprobs"]) if hot else []
            b = completion_tokens(cold["choices"][0]["logprobs"]) if cold else []
            pairs = [(x.logprob, y.logprob) for x, y in zip(a[1:-1], b[1:-1]) if x.logprob is not None and y.logprob is not None]
            if pairs:
                found["logprobs_raw"] = all(math.isclose(x, y, abs_tol=1e-4) for x, y in pairs)
                notes.append("prompt logprobs are " + ("raw (temperature 1)" if found["logprobs_raw"] else "temperature-scaled"))
        except (KeyError, IndexError, TypeError, WireError):
            pass
    return found, notes


async def _probe_chat(client: RoleClient, meter: Meter) -> tuple[dict[str, Any], list[str]]:
    """What the chat endpoint offers: logprobs, continuing an assistant message, vLLM's prompt_logprobs, Predicted Outputs."""
    found: dict[str, Any] = {}
    notes: list[str] = []
    messages = [{"role": "user", "content": "a b c d e"}]
    prefix = "a b c"
    continued = messages + [{"role": "assistant", "content": prefix}]
    flags = {"continue_final_message": True, "add_generation_prompt": False}
    # All at once (what a server without chat refuses costs it nothing); each answer is read only where
    # the ones it depends on say it means something: the prefill pair where chat works, prompt_logprobs
    # where the flags continue an assistant message.
    response, with_flags, bare, continued_scored, predicted = await _all(
        _try(client, "/chat/completions", {"messages": messages, "max_tokens": 1, "logprobs": True, "top_logprobs": 20, "temperature": 0}, meter),
        _try(client, "/chat/completions", {"messages": continued, "max_tokens": 1, "temperature": 0, **flags}, meter),
        _try(client, "/chat/completions", {"messages": continued, "max_tokens": 1, "temperature": 0}, meter),
        _try(client, "/chat/completions", {"messages": continued, "max_tokens": 1, "temperature": 0, **flags, "prompt_logprobs": 1, "return_token_ids": True}, meter),
        _try(client, "/chat/completions", {"messages": messages, "max_tokens": 2, "temperature": 0, "prediction": {"type": "content", "content": "a b"}}, meter),
    )
    if response is not None:
        found["chat"] = True
        try:
            tokens = chat_tokens(response["choices"][0]["logprobs"]["content"])
            found["chat_logprobs"] = max((len(t.top or {}) for t in tokens), default=0)
        except (KeyError, IndexError, TypeError, WireError):
            found["chat_logprobs"] = 0
        notes.append(f"chat logprobs: top {found.get('chat_logprobs', 0)}")

        flagged_prompt = _prompt_tokens(with_flags)
        bare_prompt = _prompt_tokens(bare)
        if with_flags is not None and flagged_prompt is not None and bare_prompt is not None and flagged_prompt < bare_prompt:
            # The flags changed the prompt (no end of turn, no new assistant header): honoured (vLLM, SGLang).
            found.update(chat_prefill=True, prefill_style="continue_final_message", prefill_echoes_prefix=_content(with_flags).startswith(prefix))
        elif _content(bare).startswith(prefix) and len(_content(bare)) > len(prefix):
            # Flags refused or ignored, but the reply repeats the prefix and goes on: llama-server's way.
            found.update(chat_prefill=True, prefill_style="trailing", prefill_echoes_prefix=True)
        if found.get("prefill_style") == "continue_final_message":
            response = continued_scored
            if response is not None and response.get("prompt_logprobs") is not None:
                try:
                    token_ids = response.get("prompt_token_ids") or response["choices"][0].get("prompt_token_ids")
                    prompt_logprob_tokens(response["prompt_logprobs"], token_ids)
                    found["prompt_logprobs"] = True
                except (KeyError, IndexError, TypeError, WireError):
                    pass
        notes.append("chat prefill: " + (f"continues a final assistant message ({found.get('prefill_style')})" if found.get("chat_prefill") else "not supported"))
        notes.append("chat prompt_logprobs: " + ("yes" if found.get("prompt_logprobs") else "no"))

        if predicted is not None:
            details = (predicted.get("usage") or {}).get("completion_tokens_details") or {}
            found["predicted_outputs"] = "accepted_prediction_tokens" in details
        notes.append("Predicted Outputs: " + ("yes" if found.get("predicted_outputs") else "no"))
    return found, notes


async def _probe(client: RoleClient, meter: Meter, defaults_task: asyncio.Future[tuple[str | None, dict[str, float] | None, _Limits]]) -> Capabilities:
    # The completions half and the chat half ask different endpoints and neither reads the other's
    # answers: asked at once, the first request of a cold client waits for the longer half (two or
    # three round trips), not for both one after the other (six).
    (found, notes), (chat_found, chat_notes) = await _all(_probe_completions(client, meter), _probe_chat(client, meter))
    found.update(chat_found)
    notes.extend(chat_notes)
    prompt = _PROBE_PROMPT

    server, defaults, limits = await defaults_task
    found.update(default_max_tokens=limits.default_max_tokens, context_window=limits.context_window)
    if server is not None:
        found.update(
            server=server, sampler_defaults=defaults, final_stretch=16 if server == "llama-cpp-python" else 0,
            stream_usage_unasked=server == "llama-server",
        )
        if defaults:
            notes.append(f"{server}: applies {defaults} to requests that do not set them")
        dialect = native_dialect(server)
        if dialect is not None and found.get("completions"):
            try:
                ids = await dialect.tokenize(client, prompt, meter, special=False)
                found["token_ids"] = bool(ids)
            except EndpointError:
                found["token_ids"] = False
            notes.append(f"dialect: {dialect.name}; token-id prompts: " + ("yes" if found.get("token_ids") else "no (tokenize refused)"))
        else:
            notes.append(f"dialect: {server} (OpenAI formats only)")
    else:
        notes.append("dialect: OpenAI formats only (no native API recognised)")
    return Capabilities(notes=tuple(notes), **found)


def _completion_tokens(response: dict[str, Any]) -> list:
    try:
        return completion_tokens(response["choices"][0].get("logprobs"))
    except (KeyError, IndexError, TypeError, WireError):
        return []


def _offsets_from_prompt_start(response: dict[str, Any], prompt: str, *, echo: bool) -> bool | None:
    """Where the server counts `text_offset` from, seen at the first generated token; None when it
    gives none (SGLang's -1, llama.cpp's chat-shaped logprobs)."""
    try:
        offsets = response["choices"][0]["logprobs"]["text_offset"]
        first_generated = offsets[-1] if echo else offsets[0]
    except (KeyError, IndexError, TypeError):
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
    except (KeyError, IndexError, TypeError):
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
    if exc.status_code in (401, 403):
        return " (the key was refused: check --api-key or SPECAPI_PROBE_API_KEY)"
    if exc.status_code == 404:
        return " (check --model, and that --base-url ends where /completions is served, usually /v1)"
    return ""


async def _why_unusable(client: RoleClient, meter: Meter) -> str:
    """The endpoint answered no probe: its answer to the plainest request says why."""
    try:
        await client.post("/chat/completions", {"messages": [{"role": "user", "content": "a"}], "max_tokens": 1}, meter, retries=0)
    except EndpointError as exc:
        return f"{exc}{_hint(exc)}"
    return "it refused every probe request"  # pragma: no cover - a chat call that works means chat was found


def run(args: argparse.Namespace) -> int:
    """Exit codes: 0 the endpoint can serve generation; 1 it cannot (refused, not found, unreachable);
    2 missing or invalid options. The report goes to stdout, the probing cost to stderr."""
    import os
    import sys

    from rich.console import Console
    from rich.table import Table

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
        print(f"specapi probe: {exc}{_hint(exc)}", file=sys.stderr)
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
    table = Table(title=f"{endpoint.label}")
    table.add_column("capability")
    table.add_column("value")
    table.add_row("dialect", caps.server or "OpenAI formats")
    table.add_row("verification for completions", paths["completions"])
    table.add_row("verification for chat", paths["chat"])
    for key, value in caps.to_dict().items():
        if key != "notes":
            table.add_row(key, str(value))
    console = Console()
    console.print(table)
    for note in caps.notes:
        console.print(f"- {note}")
    print(cost, file=sys.stderr)
    return EXIT_OK
