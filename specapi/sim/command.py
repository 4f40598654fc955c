"""`specapi simulate`: serve the simulated provider over HTTP.

    specapi simulate --port 8000 --profile vllm --latency lan

Point any OpenAI client at ``http://127.0.0.1:8000/v1`` with models ``sim-target`` and ``sim-draft``
(the command prints its base URL and every model it serves on stderr when it starts). Exit codes: 0
after Ctrl-C, 2 for invalid options.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..cli_options import EXIT_OK, EXIT_USAGE, Option, UsageError, add_options, fraction, resolve
from .faults import Faults
from .latency import LATENCY_PROFILES
from .models import MODEL_SPECS
from .profiles import CAPABILITY_PROFILES
from .server import run_server

__all__ = ["add_arguments", "run", "OPTIONS"]


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise ValueError("must be >= 0")
    return value


OPTIONS: tuple[Option, ...] = (
    Option("--host", "SPECAPI_SIM_HOST", str, "127.0.0.1", "address to listen on"),
    Option("--port", "SPECAPI_SIM_PORT", int, 8000, "port to listen on"),
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
    base_url = f"http://{values['host']}:{values['port']}/v1"
    print(
        f"specapi simulate: a {values['profile']}-like server with {values['latency']} latency on {base_url}\n"
        f"  models: sim-target (the target), sim-draft (the draft); also {', '.join(m for m in MODEL_SPECS if m not in ('sim-target', 'sim-draft'))}\n"
        f"  try: specapi run --target-base-url {base_url} --target-model sim-target "
        f"--draft-base-url {base_url} --draft-model sim-draft \"def fib(n):\"",
        file=sys.stderr,
        flush=True,
    )
    run_server(
        host=values["host"],
        port=values["port"],
        capabilities=values["profile"],
        latency=values["latency"],
        seed=values["seed"],
        faults=faults,
        log_level=values["log_level"],
    )
    return EXIT_OK
