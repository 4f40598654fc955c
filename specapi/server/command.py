"""`specapi serve`: run the OpenAI-compatible speculative proxy with uvicorn.

Every option can also come from an environment variable (the option wins). Prefer the environment for
keys: command lines are visible to other users of the machine (`ps`).

    SPECAPI_TARGET_BASE_URL  SPECAPI_TARGET_MODEL  SPECAPI_TARGET_API_KEY
    SPECAPI_DRAFT_BASE_URL   SPECAPI_DRAFT_MODEL   SPECAPI_DRAFT_API_KEY
    SPECAPI_API_KEY (clients' key)  SPECAPI_HOST  SPECAPI_PORT  SPECAPI_NUM_SPECULATIVE_TOKENS
    SPECAPI_POLICY  SPECAPI_DRAFTER  SPECAPI_VERIFICATION  SPECAPI_PIPELINE
    SPECAPI_MAX_REQUEST_BYTES  SPECAPI_MAX_TOKENS_LIMIT  SPECAPI_UPSTREAM_TIMEOUT  SPECAPI_MAX_RETRIES
    SPECAPI_SHUTDOWN_TIMEOUT  SPECAPI_LOG_LEVEL  SPECAPI_SUFFIX_SCOPE  SPECAPI_SUFFIX_MAX_TOKENS
    SPECAPI_WORKERS  SPECAPI_READY_INTERVAL  SPECAPI_SHARE  SPECAPI_SHARE_MAX_ENTRIES

`--workers N` (N > 1) runs N processes on one port (uvicorn's workers: a supervisor that binds the socket and
spawns them). Each worker builds its own app from the same settings; Prometheus metrics go through
prometheus-client's multiprocess mode (a fresh temporary directory, or `PROMETHEUS_MULTIPROC_DIR` if set),
so `/metrics` on any worker adds up all of them. The workers tell each other what their suffix indexes
learn (`peers.py`: sockets in a fresh private directory, or `SPECAPI_PEERS_DIR` if set; separate `specapi
serve` processes given the same `SPECAPI_PEERS_DIR` share it too). With `--share redis://...` every process,
worker or replica, shares through Redis instead (`specapi.share`), and the workers' sockets are not used. SIGTERM to the supervisor reaches every
worker, and each drains its in-flight requests for up to `--shutdown-timeout` seconds.

The draft endpoint is optional with `--drafter lookup` (prompt lookup drafts from the request itself)
or `--verification none`.

Before it serves, it checks both endpoints: each must answer and serve its model (`specapi.surface.checks`). A
problem (a dead port, a refused key, a mistyped model) is printed naming the role, and the proxy does not
start, unless `--allow-degraded`: then it serves with what answers (without the draft, the target alone),
and `/ready` reports each role.

Exit codes: 0 after a clean shutdown, 1 if the server could not start (the port is bound first: a busy
one fails at once, before the client is built or the target probed; then an endpoint that fails the
start-up check), 2 for missing or invalid settings.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import uvicorn
from uvicorn.supervisors.multiprocess import Multiprocess
from starlette.applications import Starlette

from ..transport._exceptions import ConfigurationError
from ..core.cli_options import (
    ENDPOINTS,
    EXIT_FAILED,
    Option,
    UsageError,
    acceptance_options,
    acceptance_values,
    add_options,
    boolean,
    listening_socket,
    resolve,
    speculation_options,
)
from ..surface.checks import EndpointStatus
from ..transport.endpoint import Endpoint
from .app import build_client, create_app
from .config import DEFAULT_MAX_REQUEST_BYTES, DEFAULT_MAX_TOKENS_LIMIT, SUFFIX_SCOPES, ServerConfig
from .errors import redact
from .metrics import MULTIPROCESS_DIR_VARIABLE
from .peers import PEERS_DIR_VARIABLE

__all__ = ["add_arguments", "run", "serve", "serve_workers", "worker_app", "resolve_settings", "Settings", "SettingsError", "OPTIONS"]

#: Where the supervisor hands the command line's options to its workers (they resolve settings again).
_WORKER_OPTIONS_VARIABLE = "SPECAPI_SERVE_WORKER_OPTIONS"
#: The most worker processes `--workers` accepts.
MAX_WORKERS = 64


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


def _workers(text: str) -> int:
    value = int(text)
    if not 1 <= value <= MAX_WORKERS:
        raise ValueError(f"must be in 1..{MAX_WORKERS}")
    return value


def _required(option: Option) -> Option:
    return replace(option, required=True)


OPTIONS: tuple[Option, ...] = (
    _required(ENDPOINTS[0]),
    _required(replace(ENDPOINTS[1], help="the target model (the one clients get output from)")),
    ENDPOINTS[2],
    replace(ENDPOINTS[3], help="the draft's OpenAI-format base URL (required unless --drafter lookup or --verification none)", default_text=None),
    replace(ENDPOINTS[4], help="the draft model (required unless --drafter lookup or --verification none)"),
    ENDPOINTS[5],
    Option("--api-key", "SPECAPI_API_KEY", str, None, "the key clients must send (Authorization: Bearer KEY); none = open", secret=True),
    Option("--host", "SPECAPI_HOST", str, "127.0.0.1", "address to listen on"),
    Option("--port", "SPECAPI_PORT", _port, 8000, "port to listen on"),
    *speculation_options(),
    *acceptance_options(),
    Option("--allow-lossy-acceptance", "SPECAPI_ALLOW_LOSSY_ACCEPTANCE", boolean, False,
           "let --acceptance threshold|typical serve output that is not the target's (refused without it)"),
    Option("--expose-upstream-errors", "SPECAPI_EXPOSE_UPSTREAM_ERRORS", boolean, False,
           "send clients the upstream's address and raw message when it fails (by default they see the role "
           "only, and the details go to the log)"),
    Option(
        "--suffix-scope",
        "SPECAPI_SUFFIX_SCOPE",
        _suffix_scope,
        "model",
        "who shares the suffix index learnt from traffic: model (every client of the upstream model) or api-key "
        "(each client key its own: one tenant's text never shapes another's drafts, nor their timing)",
        choices=SUFFIX_SCOPES,
    ),
    Option("--suffix-max-tokens", "SPECAPI_SUFFIX_MAX_TOKENS", int, 32_768, "cap of each suffix index, in tokens (oldest out first)"),
    Option("--max-request-bytes", "SPECAPI_MAX_REQUEST_BYTES", int, DEFAULT_MAX_REQUEST_BYTES, "larger request bodies get HTTP 413"),
    Option("--max-tokens-limit", "SPECAPI_MAX_TOKENS_LIMIT", int, DEFAULT_MAX_TOKENS_LIMIT,
           "opt-in cost cap: larger max_tokens get HTTP 400, chat requests without one are bounded by it (default: none, as the target)"),
    Option("--upstream-timeout", "SPECAPI_UPSTREAM_TIMEOUT", _positive_float, 60.0, "seconds per upstream request"),
    Option("--max-retries", "SPECAPI_MAX_RETRIES", int, 3, "retries of transient upstream failures per request"),
    Option("--shutdown-timeout", "SPECAPI_SHUTDOWN_TIMEOUT", _positive_float, 30.0, "seconds to let in-flight requests finish on SIGTERM"),
    Option("--workers", "SPECAPI_WORKERS", _workers, 1, "processes serving the port (uvicorn workers; metrics add up across them)"),
    Option("--ready-interval", "SPECAPI_READY_INTERVAL", _positive_float, 5.0, "seconds between the checks of the target behind /ready"),
    Option("--share", "SPECAPI_SHARE", str, None,
           "a Redis URL (redis://host:6379/0) through which replicas share what they learn (needs redis-py: pip install 'specapi[share]')",
           secret=True),
    Option("--share-max-entries", "SPECAPI_SHARE_MAX_ENTRIES", int, 10_000, "cap of the shared Redis stream, in entries (about)"),
    Option("--allow-degraded", "SPECAPI_ALLOW_DEGRADED", boolean, False,
           "start even if an endpoint fails the start-up check (not reachable, key refused, model not served): "
           "serve with what answers (without the draft, the target alone); /ready reports each role"),
    Option("--log-level", "SPECAPI_LOG_LEVEL", str.lower, "info", "uvicorn log level", choices=("critical", "error", "warning", "info", "debug", "trace")),
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
    workers: int = 1
    allow_degraded: bool = False


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, OPTIONS)


def resolve_settings(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Options, else environment variables, else defaults; raises `SettingsError` naming every problem."""
    drafter = getattr(args, "drafter", None) or environ.get("SPECAPI_DRAFTER") or "auto"
    verification = getattr(args, "verification", None) or environ.get("SPECAPI_VERIFICATION") or "auto"
    needs_draft = drafter != "lookup" and verification != "none"  # prompt lookup drafts from the request itself
    options = [_required(o) if needs_draft and o.dest in ("draft_base_url", "draft_model") else o for o in OPTIONS]
    try:
        values = resolve(args, options, environ)
    except UsageError as exc:
        raise SettingsError(str(exc)) from exc
    try:
        common = {"timeout": values["upstream_timeout"], "max_retries": values["max_retries"]}
        draft = None
        if values["draft_model"]:
            draft = Endpoint(base_url=values["draft_base_url"], model=values["draft_model"], api_key=values["draft_api_key"], **common)
        config = ServerConfig(
            target=Endpoint(base_url=values["target_base_url"], model=values["target_model"], api_key=values["target_api_key"], **common),
            draft=draft,
            num_speculative_tokens=values["num_speculative_tokens"],
            api_key=values["api_key"],
            max_request_bytes=values["max_request_bytes"],
            max_tokens_limit=values["max_tokens_limit"],
            client_options={
                "policy": values["policy"], "drafter": values["drafter"], "verification": values["verification"], "pipeline": values["pipeline"],
                # Lossy acceptance only when asked for (ServerConfig refuses it without the flag).
                **(acceptance_values(values) if values["acceptance"] != "exact" else {}),
            },
            allow_lossy_acceptance=values["allow_lossy_acceptance"],
            suffix_scope=values["suffix_scope"],
            suffix_max_tokens=values["suffix_max_tokens"],
            readiness_interval=values["ready_interval"],
            share_url=values["share"] or None,
            share_max_entries=values["share_max_entries"],
            expose_upstream_errors=values["expose_upstream_errors"],
        )
    except ConfigurationError as exc:
        raise SettingsError(str(exc)) from exc
    return Settings(
        config=config, host=values["host"], port=values["port"], shutdown_timeout=values["shutdown_timeout"],
        log_level=values["log_level"], workers=values["workers"], allow_degraded=values["allow_degraded"],
    )


def _announce(settings: Settings, port: int) -> None:
    config = settings.config
    auth = "clients must send the proxy's key" if config.api_key else "no client authentication (set --api-key)"
    workers = f"; {settings.workers} workers" if settings.workers > 1 else ""
    print(
        f"specapi serve: target {redact(config.target.label)}, draft {redact(config.draft.label) if config.draft else '-'}; "
        f"http://{settings.host}:{port}/v1; {auth}{workers}",
        file=sys.stderr,
        flush=True,
    )


def serve(settings: Settings, app: Starlette, sock: socket.socket | None = None) -> int:
    """Run `app` until SIGINT/SIGTERM, then drain in-flight requests for up to `shutdown_timeout` seconds.
    `sock`: bound to the settings' address already (else bound here; 1 if it cannot be)."""
    if sock is None:
        sock = listening_socket("serve", settings.host, settings.port)
        if sock is None:
            return EXIT_FAILED
    server = uvicorn.Server(_uvicorn_config(app, settings))
    _announce(settings, sock.getsockname()[1])
    # uvicorn handles SIGTERM (graceful shutdown), then re-raises it to the handler it found: make that one
    # a no-op, so that a drained shutdown exits with 0 rather than being killed by the signal's default.
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _ignore_signal) if in_main_thread else None
    try:
        server.run(sockets=[sock])
    except SystemExit:  # uvicorn exits when it cannot start (its code, 3, is not ours)
        return EXIT_FAILED
    finally:
        sock.close()
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)
    return 0 if server.started else EXIT_FAILED


def _uvicorn_config(app: Any, settings: Settings, **extra: Any) -> uvicorn.Config:
    """uvicorn's settings for the proxy, in one process or as `--workers` (`extra`: the app factory's)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        lifespan="on",
        ws="none",
        timeout_graceful_shutdown=settings.shutdown_timeout,
        backlog=2048,
        **extra,
    )


def _ignore_signal(signum: int, frame: object) -> None:
    """Placeholder SIGTERM handler: uvicorn has already shut down gracefully when this runs."""


def proxy_app(settings: Settings) -> Starlette:
    """The app of a process that is the proxy (`specapi serve`, each of its workers): once started, it
    keeps what startup loaded out of the garbage collector's full passes (`ServerConfig.freeze_gc`),
    and shares what it learns with the processes of `SPECAPI_PEERS_DIR` when that is set (through Redis
    alone with `--share`: one mechanism, see docs/proxy.md)."""
    peers_dir = None if settings.config.share_url else os.environ.get(PEERS_DIR_VARIABLE) or None
    return create_app(replace(settings.config, freeze_gc=True, peers_dir=peers_dir))


def worker_app() -> Starlette:
    """The app of one `--workers` process: the supervisor's options, resolved again against the environment."""
    options = json.loads(os.environ[_WORKER_OPTIONS_VARIABLE])
    settings = resolve_settings(argparse.Namespace(**options), os.environ)
    return proxy_app(settings)


def serve_workers(settings: Settings, args: argparse.Namespace, sock: socket.socket | None = None) -> int:
    """Run `settings.workers` processes on one port until SIGINT/SIGTERM; each drains like `serve` does.
    `sock`: bound to the settings' address already (else bound here; 1 if it cannot be)."""
    if sock is None:
        sock = listening_socket("serve", settings.host, settings.port)
        if sock is None:
            return EXIT_FAILED
    created = []
    if not os.environ.get(MULTIPROCESS_DIR_VARIABLE):
        created.append((MULTIPROCESS_DIR_VARIABLE, tempfile.mkdtemp(prefix="specapi-metrics-")))
    if not os.environ.get(PEERS_DIR_VARIABLE):
        created.append((PEERS_DIR_VARIABLE, tempfile.mkdtemp(prefix="specapi-peers-")))  # mode 0700
    for variable, directory in created:
        os.environ[variable] = directory  # read by each worker (prometheus-client: when it imports it)
    os.environ[_WORKER_OPTIONS_VARIABLE] = json.dumps({o.dest: getattr(args, o.dest, None) for o in OPTIONS})
    config = _uvicorn_config(f"{__name__}:worker_app", settings, factory=True, workers=settings.workers)
    _announce(settings, sock.getsockname()[1])
    try:
        # The supervisor turns SIGINT/SIGTERM into a SIGTERM to every worker, then waits for all of them.
        Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()
        os.environ.pop(_WORKER_OPTIONS_VARIABLE, None)
        for variable, directory in created:
            os.environ.pop(variable, None)
            shutil.rmtree(directory, ignore_errors=True)
    return 0


def run(args: argparse.Namespace) -> int:
    try:
        settings = resolve_settings(args, os.environ)
    except SettingsError as exc:
        print(f"specapi serve: {exc}", file=sys.stderr)
        return 2
    sock = listening_socket("serve", settings.host, settings.port)  # a busy port fails before any start-up work
    if sock is None:
        return EXIT_FAILED
    try:
        if settings.workers > 1:
            build_client(settings.config)  # refuses unknown policy, drafter or verification; the workers build the apps
        else:
            app = proxy_app(settings)  # builds the client, with the same checks
    except ConfigurationError as exc:
        sock.close()
        print(f"specapi serve: {exc}", file=sys.stderr)
        return 2
    if not _endpoints_answer(settings):
        sock.close()
        return EXIT_FAILED
    if settings.workers > 1:
        return serve_workers(settings, args, sock)
    return serve(settings, app, sock)


def _endpoints_answer(settings: Settings) -> bool:
    """The start-up check: each problem printed; False if there is one and `--allow-degraded` is not set."""
    problems = [status.problem for status in asyncio.run(_check(settings.config)) if status.problem is not None]
    for problem in problems:
        print(f"specapi serve: {redact(problem, settings.config.secrets)}", file=sys.stderr)
    if not problems:
        return True
    if settings.allow_degraded:
        print("specapi serve: starting anyway (--allow-degraded): serving with what answers; /ready reports each role", file=sys.stderr)
        return True
    print("specapi serve: not started: correct the settings above, or start with --allow-degraded to serve with what answers", file=sys.stderr)
    return False


async def _check(config: ServerConfig) -> tuple[EndpointStatus, ...]:
    client = build_client(config)
    try:
        return await client.check_endpoints()
    finally:
        await client.close()
