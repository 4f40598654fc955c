"""The `specapi` command: `bench | run | probe | serve | simulate`.

Each subcommand lives in its own module, which provides `add_arguments(parser)` and `run(args) -> int`;
this module only dispatches. `cli_logic(argv)` returns the exit code (testable in-process); `cli()` exits.

Every option has help text, a default and a `SPECAPI_*` environment variable (`specapi.core.cli_options`).
Results go to stdout, diagnostics (progress, notes, errors) to stderr. Exit codes, for every subcommand:

    0    success
    1    the work failed: an endpoint failed, a probe found nothing usable, a bench comparison found
         a difference or a failed request
    2    usage: missing or invalid options or input files
    130  interrupted (Ctrl-C)
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

__all__ = ["cli", "cli_logic", "build_parser"]

#: The extra that installs each optional third-party package a subcommand may import.
_EXTRA_OF = {
    "numpy": "bench", "matplotlib": "bench", "rich": "bench",
    "starlette": "serve", "uvicorn": "serve", "prometheus_client": "serve",
    "redis": "share",
}

_COMMANDS = {
    "bench": ("specapi.bench.command", "compare speculation with the target alone (default: on the embedded simulator)"),
    "run": ("specapi.run_command", "generate once with speculation and print the text and statistics"),
    "probe": ("specapi.parts.probe", "find out what an endpoint supports for verification"),
    "serve": ("specapi.server.command", "run an OpenAI-compatible speculative proxy"),
    "simulate": ("specapi.sim.command", "run the simulated OpenAI-format provider as an HTTP server"),
}


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(prog="specapi", description="Speculative decoding over OpenAI-format endpoints.")
    parser.add_argument("--version", action="version", version=f"specapi {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in _COMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            extra = missing_extra(exc)
            if extra is None:
                raise
            sub.set_defaults(_missing=extra)
            continue
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


def missing_extra(exc: ModuleNotFoundError) -> str | None:
    """The extra whose package `exc` says is not installed, or None when it is not one of ours."""
    return _EXTRA_OF.get((exc.name or "").split(".")[0])


def _needs(command: str, extra: str) -> str:
    return f"specapi {command} needs the '{extra}' extra: pip install 'specapi[{extra}]'"


def cli_logic(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "_missing", None):  # its options are unknown: the extra that declares them is missing
        print(_needs(args.command, args._missing), file=sys.stderr)
        return 2
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args._run(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ModuleNotFoundError as exc:  # an option that reaches an extra, as `run --simulate`
        extra = missing_extra(exc)
        if extra is None:
            raise
        print(_needs(args.command, extra), file=sys.stderr)
        return 2


def cli() -> None:
    sys.exit(cli_logic())
