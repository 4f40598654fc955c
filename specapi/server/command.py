"""`specapi serve`: run the OpenAI-compatible speculative proxy with uvicorn.

Every option can also come from an environment variable (the option wins). Prefer the environment for
keys: command lines are visible to other users of the machine (`ps`).

    SPECAPI_TARGET_BASE_URL  SPECAPI_TARGET_MODEL  SPECAPI_TARGET_API_KEY
    SPECAPI_DRAFT_BASE_URL   SPECAPI_DRAFT_MODEL   SPECAPI_DRAFT_API_KEY
    SPECAPI_API_KEY (clients' key)  SPECAPI_HOST  SPECAPI_PORT  SPECAPI_NUM_SPECULATIVE_TOKENS
    SPECAPI_POLICY  SPECAPI_DRAFTER  SPECAPI_VERIFICATION
    SPECAPI_MAX_REQUEST_BYTES  SPECAPI_MAX_TOKENS_LIMIT  SPECAPI_UPSTREAM_TIMEOUT  SPECAPI_MAX_RETRIES
    SPECAPI_SHUTDOWN_TIMEOUT  SPECAPI_LOG_LEVEL  SPECAPI_SUFFIX_SCOPE  SPECAPI_SUFFIX_MAX_TOKENS

Exit codes: 0 after a clean shutdown, 1 if the server could not start, 2 for missing or invalid settings.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import uvicorn
from starlette.applications import Starlette

from .._exceptions import ConfigurationError
from ..endpoint import Endpoint
from .app import create_app
from .config import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TOKENS_LIMIT, SUFFIX_SCOPES, ServerConfig
from .errors import redact

__all__ = ["add_arguments", "run", "serve", "resolve_settings", "Settings", "SettingsError", "OPTIONS"]


@dataclass(frozen=True)
class _Option:
    flag: str
    env: str
    kind: Callable[[str], Any]
    default: Any
    help: str
    required: bool = False
    secret: bool = False

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _suffix_scope(text: str) -> str:
    if text not in SUFFIX_SCOPES:
        raise ValueError(f"must be one of {', '.join(SUFFIX_SCOPES)}")
    return text


def _positive_float(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise ValueError("must be in 0..65535")
    return value


OPTIONS: tuple[_Option, ...] = (
    _Option("--target-base-url", "SPECAPI_TARGET_BASE_URL", str, None, "the target's OpenAI-format base URL (e.g. http://gpu:8000/v1)", True),
    _Option("--target-model", "SPECAPI_TARGET_MODEL", str, None, "the target model (the one clients get output from)", True),
    _Option("--target-api-key", "SPECAPI_TARGET_API_KEY", str, None, "the target's API key (prefer the environment variable)", secret=True),
    _Option("--draft-base-url", "SPECAPI_DRAFT_BASE_URL", str, None, "the draft's OpenAI-format base URL", True),
    _Option("--draft-model", "SPECAPI_DRAFT_MODEL", str, None, "the draft model (cheap, proposes tokens)", True),
    _Option("--draft-api-key", "SPECAPI_DRAFT_API_KEY", str, None, "the draft's API key (prefer the environment variable)", secret=True),
    _Option("--api-key", "SPECAPI_API_KEY", str, None, "the key clients must send (Authorization: Bearer KEY); none = open", secret=True),
    _Option("--host", "SPECAPI_HOST", str, "127.0.0.1", "address to listen on"),
    _Option("--port", "SPECAPI_PORT", _port, 8000, "port to listen on"),
    _Option("--num-speculative-tokens", "SPECAPI_NUM_SPECULATIVE_TOKENS", int, 4, "draft tokens per round (the start, when adaptive)"),
    _Option("--policy", "SPECAPI_POLICY", str, "adaptive", "draft length: adaptive (stops speculating when the target alone is faster) or fixed"),
    _Option("--drafter", "SPECAPI_DRAFTER", str, "auto", "auto, model, lookup or suffix"),
    _Option(
        "--suffix-scope",
        "SPECAPI_SUFFIX_SCOPE",
        _suffix_scope,
        "model",
        "who shares the suffix index learnt from traffic: model (every client of the upstream model) or api-key "
        "(each client key its own: one tenant's text never shapes another's drafts, nor their timing)",
    ),
    _Option("--suffix-max-tokens", "SPECAPI_SUFFIX_MAX_TOKENS", int, 32_768, "cap of each suffix index, in tokens (oldest out first)"),
    _Option("--verification", "SPECAPI_VERIFICATION", str, "auto", "auto, echo, prompt-logprobs, prefill-fanout, ..., or none"),
    _Option("--max-request-bytes", "SPECAPI_MAX_REQUEST_BYTES", int, DEFAULT_MAX_REQUEST_BYTES, "larger request bodies get HTTP 413"),
    _Option("--max-tokens-limit", "SPECAPI_MAX_TOKENS_LIMIT", int, DEFAULT_MAX_TOKENS_LIMIT, "larger max_tokens get HTTP 400"),
    _Option("--upstream-timeout", "SPECAPI_UPSTREAM_TIMEOUT", _positive_float, 60.0, "seconds per upstream request"),
    _Option("--max-retries", "SPECAPI_MAX_RETRIES", int, 3, "retries of transient upstream failures per request"),
    _Option("--shutdown-timeout", "SPECAPI_SHUTDOWN_TIMEOUT", _positive_float, 30.0, "seconds to let in-flight requests finish on SIGTERM"),
    _Option("--log-level", "SPECAPI_LOG_LEVEL", str.lower, "info", "uvicorn log level (debug, info, warning, error)"),
)


class SettingsError(Exception):
    """Missing or invalid settings (exit code 2)."""


@dataclass(frozen=True)
class Settings:
    """Everything `specapi serve` needs: the app's configuration and where and how to listen."""

    config: ServerConfig
    host: str
    port: int
    shutdown_timeout: float
    log_level: str


def _metavar(option: _Option) -> str:
    if option.secret:
        return "KEY"
    if option.dest.endswith("base_url"):
        return "URL"
    if option.dest.endswith("model"):
        return "NAME"
    return option.dest.rsplit("_", 1)[-1].upper()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for option in OPTIONS:
        default = "" if option.default is None else f" (default: {option.default})"
        parser.add_argument(
            option.flag,
            dest=option.dest,
            default=None,
            metavar=_metavar(option),
            help=f"{option.help}; env {option.env}{'' if option.secret else default}",
        )


def resolve_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Options, else environment variables, else defaults; raises `SettingsError` naming every problem."""
    values: dict[str, Any] = {}
    missing: list[str] = []
    problems: list[str] = []
    for option in OPTIONS:
        given = getattr(args, option.dest, None)
        source = option.flag
        if given is None or given == "":
            given, source = environ.get(option.env) or None, option.env
        if given is None:
            if option.required:
                missing.append(f"{option.flag} (or {option.env})")
            values[option.dest] = option.default
            continue
        try:
            values[option.dest] = option.kind(given)
        except ValueError as exc:
            shown = "***" if option.secret else repr(given)
            problems.append(f"{source}={shown} is invalid ({exc})")
    if missing:
        problems.insert(0, "missing required settings: " + ", ".join(missing))
    if problems:
        raise SettingsError("; ".join(problems))
    try:
        common = {"timeout": values["upstream_timeout"], "max_retries": values["max_retries"]}
        config = ServerConfig(
            target=Endpoint(base_url=values["target_base_url"], model=values["target_model"], api_key=values["target_api_key"], **common),
            draft=Endpoint(base_url=values["draft_base_url"], model=values["draft_model"], api_key=values["draft_api_key"], **common),
            num_speculative_tokens=values["num_speculative_tokens"],
            api_key=values["api_key"],
            max_request_bytes=values["max_request_bytes"],
            max_tokens_limit=values["max_tokens_limit"],
            client_options={"policy": values["policy"], "drafter": values["drafter"], "verification": values["verification"]},
            suffix_scope=values["suffix_scope"],
            suffix_max_tokens=values["suffix_max_tokens"],
        )
    except ConfigurationError as exc:
        raise SettingsError(str(exc)) from exc
    return Settings(config=config, host=values["host"], port=values["port"], shutdown_timeout=values["shutdown_timeout"], log_level=values["log_level"])


def serve(settings: Settings, app: Starlette) -> int:
    """Run `app` until SIGINT/SIGTERM, then drain in-flight requests for up to `shutdown_timeout` seconds."""
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.host,
            port=settings.port,
            log_level=settings.log_level,
            lifespan="on",
            ws="none",
            timeout_graceful_shutdown=settings.shutdown_timeout,
            backlog=2048,
        )
    )
    config = settings.config
    auth = "clients must send the proxy's key" if config.api_key else "no client authentication (set --api-key)"
    print(
        f"specapi serve: target {redact(config.target.label)}, draft {redact(config.draft.label) if config.draft else '-'}; "
        f"http://{settings.host}:{settings.port}/v1; {auth}",
        file=sys.stderr,
        flush=True,
    )
    # uvicorn handles SIGTERM (graceful shutdown), then re-raises it to the handler it found: make that one
    # a no-op, so that a drained shutdown exits with 0 rather than being killed by the signal's default.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _ignore_signal) if in_main_thread else None
    try:
        server.run()
    except SystemExit as exc:  # uvicorn exits when it cannot bind
        return int(exc.code or 1)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    return 0 if server.started else 1


def _ignore_signal(signum: int, frame: object) -> None:
    """Placeholder SIGTERM handler: uvicorn has already shut down gracefully when this runs."""


def run(args: argparse.Namespace) -> int:
    try:
        settings = resolve_settings(args, os.environ)
        app = create_app(settings.config)  # builds the client: refuses unknown policy, drafter or verification
    except (SettingsError, ConfigurationError) as exc:
        print(f"specapi serve: {exc}", file=sys.stderr)
        return 2
    return serve(settings, app)
