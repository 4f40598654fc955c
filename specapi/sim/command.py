"""`specapi simulate`: serve the simulated provider over HTTP.

    specapi simulate --port 8001 --profile vllm --latency lan

Point any OpenAI client at ``http://127.0.0.1:8001/v1`` with models ``sim-target`` and ``sim-draft``
(the command prints its base URL, every model it serves, and the `specapi run` and `specapi serve` lines
that use them on stderr when it starts). Its default port is not `specapi serve`'s (8000), so that the
two run side by side with their defaults. Exit codes: 0 after Ctrl-C, 1 if it cannot listen (a busy
port fails at once, before the models are built), 2 for invalid options.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..core.cli_options import EXIT_FAILED, EXIT_OK, EXIT_USAGE, Option, UsageError, add_options, fraction, listening_socket, resolve
from .faults import Faults
from .latency import LATENCY_PROFILES
from .models import MODEL_SPECS
from .profiles import CAPABILITY_PROFILES
from .server import run_server

__all__ = ["add_arguments", "run", "OPTIONS", "DEFAULT_PORT"]

#: `specapi simulate`'s port: next to `specapi serve`'s 8000, so that the proxy runs in front of it as is.
DEFAULT_PORT = 8001
#: `specapi serve`'s default port (`server/command.py`; not imported: it would load the proxy's modules).
_SERVE_PORT = 8000


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


OPTIONS: tuple[Option, ...] = (
    Option("--host", "SPECAPI_SIM_HOST", str, "127.0.0.1", "address to listen on"),
    Option("--port", "SPECAPI_SIM_PORT", int, DEFAULT_PORT, "port to listen on (0: one the system picks, shown when it starts)"),
    Option("--profile", "SPECAPI_SIM_PROFILE", str, "vllm", "which server to imitate", choices=tuple(sorted(CAPABILITY_PROFILES))),
    Option("--latency", "SPECAPI_SIM_LATENCY", str, "lan", "timing and prices", choices=tuple(sorted(LATENCY_PROFILES))),
    Option("--seed", "SPECAPI_SIM_SEED", int, 0, "seed of sampling and faults"),
    Option("--error-rate", "SPECAPI_SIM_ERROR_RATE", fraction, 0.0, "fraction of requests answered with HTTP 500"),
    Option("--rate-limit-rate", "SPECAPI_SIM_RATE_LIMIT_RATE", fraction, 0.0, "fraction of requests answered with HTTP 429"),
    Option("--fail-first", "SPECAPI_SIM_FAIL_FIRST", _count, 0, "answer the first N requests with HTTP 503"),
    Option("--log-level", "SPECAPI_LOG_LEVEL", str.lower, "info", "uvicorn log level", choices=("critical", "error", "warning", "info", "debug")),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_options(parser, OPTIONS)


def run(args: argparse.Namespace) -> int:
    try:
        values = resolve(args, OPTIONS, os.environ)
    except UsageError as exc:
        print(f"specapi simulate: {exc}", file=sys.stderr)
        return EXIT_USAGE
    faults = Faults(
        error_rate=values["error_rate"], rate_limit_rate=values["rate_limit_rate"], fail_first=values["fail_first"], seed=values["seed"]
    )
    sock = listening_socket("simulate", values["host"], values["port"])  # a busy port fails before the models are built
    if sock is None:
        return EXIT_FAILED
    port = sock.getsockname()[1]
    print(banner(values["host"], port, profile=values["profile"], latency=values["latency"]), file=sys.stderr, flush=True)
    run_server(
        host=values["host"],
        port=port,
        sock=sock,
        capabilities=values["profile"],
        latency=values["latency"],
        seed=values["seed"],
        faults=faults,
        log_level=values["log_level"],
    )
    return EXIT_OK


def banner(host: str, port: int, *, profile: str, latency: str) -> str:
    """What `specapi simulate` prints when it starts: where it listens, its models, and the `specapi run`
    and `specapi serve` lines that use them (the proxy then on its own default port, or the next one)."""
    base_url = f"http://{host}:{port}/v1"
    endpoints = f"--target-base-url {base_url} --target-model sim-target --draft-base-url {base_url} --draft-model sim-draft"
    proxy_port = _SERVE_PORT if port != _SERVE_PORT else DEFAULT_PORT
    others = ", ".join(m for m in MODEL_SPECS if m not in ("sim-target", "sim-draft"))
    return (
        f"specapi simulate: a {profile}-like server with {latency} latency on {base_url}\n"
        f"  models: sim-target (the target), sim-draft (the draft); also {others}\n"
        f"  try: specapi run {endpoints} \"def fib(n):\"\n"
        f"  proxy: specapi serve {endpoints}{'' if proxy_port == _SERVE_PORT else f' --port {proxy_port}'}"
        f"  # then http://{host}:{proxy_port}/v1"
    )
