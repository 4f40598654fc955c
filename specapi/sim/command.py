"""`specapi simulate`: serve the simulated provider over HTTP.

    specapi simulate --port 8000 --profile vllm --latency lan

Point any OpenAI client at ``http://127.0.0.1:8000/v1`` with models ``sim-target`` and ``sim-draft``.
"""

from __future__ import annotations

import argparse

from .faults import Faults
from .latency import LATENCY_PROFILES
from .profiles import CAPABILITY_PROFILES
from .server import run_server

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--profile", choices=sorted(CAPABILITY_PROFILES), default="vllm",
                        help="which server to imitate (default: vllm)")
    parser.add_argument("--latency", choices=sorted(LATENCY_PROFILES), default="lan",
                        help="timing and prices (default: lan)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--error-rate", type=float, default=0.0, help="fraction of requests answered with 500")
    parser.add_argument("--rate-limit-rate", type=float, default=0.0, help="fraction answered with 429")
    parser.add_argument("--fail-first", type=int, default=0, help="answer the first N requests with 503")
    parser.add_argument("--log-level", default="info")


def run(args: argparse.Namespace) -> int:
    faults = Faults(
        error_rate=args.error_rate, rate_limit_rate=args.rate_limit_rate, fail_first=args.fail_first, seed=args.seed
    )
    print(f"specapi simulate: {args.profile} server, {args.latency} latency, on http://{args.host}:{args.port}/v1")
    run_server(
        host=args.host,
        port=args.port,
        capabilities=args.profile,
        latency=args.latency,
        seed=args.seed,
        faults=faults,
        log_level=args.log_level,
    )
    return 0
