"""Options the `specapi` subcommands share, each with help text, a default and a `SPECAPI_*` variable.

An `Option` is resolved from the command line, else its environment variable, else its default
(`resolve(args, options, environ)`), and its help says all three. `bench`, `run` and `serve` take the
same endpoint options (`ENDPOINTS`) and speculation options (`speculation_options()`):

    --target-base-url URL    SPECAPI_TARGET_BASE_URL     --draft-base-url URL    SPECAPI_DRAFT_BASE_URL
    --target-model NAME      SPECAPI_TARGET_MODEL        --draft-model NAME      SPECAPI_DRAFT_MODEL
    --target-api-key KEY     SPECAPI_TARGET_API_KEY      --draft-api-key KEY     SPECAPI_DRAFT_API_KEY
    --num-speculative-tokens SPECAPI_NUM_SPECULATIVE_TOKENS   --policy adaptive|fixed      SPECAPI_POLICY
    --drafter auto|model|lookup  SPECAPI_DRAFTER     --verification auto|PATH|none  SPECAPI_VERIFICATION
    --pipeline/--no-pipeline     SPECAPI_PIPELINE (1/0, true/false)
    --allow-hosted           SPECAPI_ALLOW_HOSTED: a model without a base URL goes to OpenAI's API (refused without it)

Every subcommand prints its results on stdout and its diagnostics (progress, notes, errors) on stderr.
Exit codes: 0 success; 1 the work failed (an endpoint failed, or a comparison found a difference);
2 a usage error (bad or missing options); 130 interrupted.
"""

from __future__ import annotations

import argparse
import socket
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Option",
    "fraction",
    "UsageError",
    "ENDPOINTS",
    "OPENAI_API_URL",
    "refuse_hosted",
    "speculation_options",
    "acceptance_options",
    "acceptance_values",
    "ACCEPTANCE_CHOICES",
    "add_options",
    "resolve",
    "boolean",
    "positive_int",
    "EXIT_OK",
    "EXIT_FAILED",
    "EXIT_USAGE",
    "listening_socket",
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

#: `specapi.parts.paths.VERIFICATIONS`, spelled out: `paths` imports `probe`, which imports this module.
VERIFICATION_CHOICES = ("auto", "token-ids", "echo", "prompt-logprobs", "prefill-fanout", "predicted-outputs", "prefix-match", "none")


#: `specapi.core.lossy.ACCEPTANCE_MODES`, spelled out as above.
ACCEPTANCE_CHOICES = ("exact", "threshold", "typical")


class UsageError(Exception):
    """Missing or invalid options (exit code 2)."""


def listening_socket(command: str, host: str, port: int) -> socket.socket | None:
    """A socket bound to `host:port` for a server to listen on (port 0: one the system picks), or `None`
    after saying on stderr why not (a busy port, an address not of this machine). The serving commands
    bind first, so that such a failure comes at once, before any start-up work (models built, endpoints
    probed), with exit code 1."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError as exc:
        print(f"specapi {command}: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port at once
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = " (another server is using it: pick another with --port)" if port else ""
        print(f"specapi {command}: cannot listen on {host}:{port}: {exc.strerror or exc}{hint}", file=sys.stderr)
        return None
    sock.set_inheritable(True)  # `--workers` hands it to the worker processes
    return sock


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("must be true or false (1/0)")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError("must be >= 1")
    return value


@dataclass(frozen=True)
class Option:
    """One command-line option: `--flag`, its `SPECAPI_*` variable, how to read it, its default, its help."""

    flag: str
    env: str
    kind: Callable[[str], Any]
    default: Any
    help: str
    required: bool = False
    secret: bool = False
    choices: tuple[str, ...] | None = None
    #: Shown instead of the default (e.g. "the scenario's"), when None means "decided elsewhere".
    default_text: str | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")

    @property
    def is_flag(self) -> bool:
        return self.kind is boolean

    def describe(self) -> str:
        parts = [self.help]
        if self.choices and len(self.choices) > 3:  # up to 3 show in the metavar
            parts.append("one of " + ", ".join(self.choices))
        if not self.secret:
            shown = self.default_text if self.default_text is not None else self.default
            if shown is not None:
                parts.append(f"default: {shown}")
        parts.append(f"env {self.env}")
        return "; ".join(parts)


def _metavar(option: Option) -> str:
    if option.secret:
        return "KEY"
    if option.dest.endswith("base_url"):
        return "URL"
    if option.dest.endswith("model"):
        return "NAME"
    if option.choices:
        return "{" + ",".join(option.choices) + "}" if len(option.choices) <= 3 else option.dest.rsplit("_", 1)[-1].upper()
    return option.dest.rsplit("_", 1)[-1].upper()


def add_options(parser: argparse.ArgumentParser | argparse._ArgumentGroup, options: Iterable[Option]) -> None:
    """Add the options (all defaulting to None, so `resolve` can tell given from not given)."""
    for option in options:
        if option.is_flag:
            parser.add_argument(option.flag, dest=option.dest, default=None, action=argparse.BooleanOptionalAction, help=option.describe())
        else:
            parser.add_argument(option.flag, dest=option.dest, default=None, metavar=_metavar(option), help=option.describe())


def resolve(args: argparse.Namespace, options: Iterable[Option], environ: Mapping[str, str]) -> dict[str, Any]:
    """Each option's value: the command line's, else its variable's, else its default.

    Raises `UsageError` naming every missing or invalid value (and where it came from).
    """
    values: dict[str, Any] = {}
    missing: list[str] = []
    problems: list[str] = []
    for option in options:
        given = getattr(args, option.dest, None)
        source = option.flag
        if given is None or given == "":
            given, source = environ.get(option.env) or None, option.env
        if given is None:
            if option.required:
                missing.append(f"{option.flag} (or {option.env})")
            values[option.dest] = option.default
            continue
        if isinstance(given, bool) or not isinstance(given, str):
            values[option.dest] = given  # argparse already read it (a --flag/--no-flag)
            continue
        try:
            value = option.kind(given)
            if option.choices and value not in option.choices:
                raise ValueError("must be one of " + ", ".join(option.choices))
            values[option.dest] = value
        except ValueError as exc:
            shown = "***" if option.secret else repr(given)
            problems.append(f"{source}={shown} is invalid ({exc})")
    if missing:
        problems.insert(0, "missing required settings: " + ", ".join(missing))
    if problems:
        raise UsageError("; ".join(problems))
    return values


def _endpoint_options(role: str, *, model_help: str) -> tuple[Option, ...]:
    upper = role.upper()
    return (
        Option(f"--{role}-base-url", f"SPECAPI_{upper}_BASE_URL", str, None, f"the {role}'s OpenAI-format base URL (e.g. http://gpu:8000/v1)",
               default_text="OPENAI_BASE_URL, else OpenAI's API"),
        Option(f"--{role}-model", f"SPECAPI_{upper}_MODEL", str, None, model_help),
        Option(f"--{role}-api-key", f"SPECAPI_{upper}_API_KEY", str, None, f"the {role}'s API key (prefer the variable: command lines are visible in ps)",
               secret=True),
    )


#: Where the openai SDK sends requests when neither a base URL nor OPENAI_BASE_URL is given.
OPENAI_API_URL = "https://api.openai.com/v1"

ENDPOINTS: tuple[Option, ...] = (
    *_endpoint_options("target", model_help="the target model: the one whose output you get"),
    *_endpoint_options("draft", model_help="the draft model (cheap, proposes tokens); omit for prompt lookup only"),
    Option("--allow-hosted", "SPECAPI_ALLOW_HOSTED", boolean, False,
           f"let a model given without a base URL (and without OPENAI_BASE_URL) go to OpenAI's hosted API ({OPENAI_API_URL}), "
           "billed to OPENAI_API_KEY (refused without it)"),
)


def refuse_hosted(values: Mapping[str, Any], environ: Mapping[str, str], *, what: str = "") -> None:
    """Raise `UsageError` if a model resolved from `ENDPOINTS` has no base URL, so that its requests would
    go to OpenAI's API by default, and `--allow-hosted` was not given. A base URL given through
    OPENAI_BASE_URL counts as given. `what`: what else would leave the machine (e.g. a prompts file)."""
    if values.get("allow_hosted") or environ.get("OPENAI_BASE_URL"):
        return
    for role in ("target", "draft"):
        if values.get(f"{role}_model") and not values.get(f"{role}_base_url"):
            raise UsageError(
                f"--{role}-model {values[f'{role}_model']} without --{role}-base-url (or SPECAPI_{role.upper()}_BASE_URL): "
                f"the {role}'s requests{what} would go to OpenAI's API ({OPENAI_API_URL}) and be billed to OPENAI_API_KEY; "
                f"give the server's URL, e.g. --{role}-base-url http://localhost:8000/v1, or --allow-hosted to measure OpenAI itself"
            )


def speculation_options(*, default_text: str | None = None, **defaults: Any) -> tuple[Option, ...]:
    """`--num-speculative-tokens`, `--policy`, `--drafter`, `--verification`, `--pipeline/--no-pipeline`.

    `defaults` overrides the client's defaults (e.g. `policy="fixed"`); with `default_text`, every
    default is None and described by that text (bench: "the scenario's").
    """
    base = {"num_speculative_tokens": 4, "policy": "adaptive", "drafter": "auto", "verification": "auto", "pipeline": True, **defaults}
    if default_text is not None:
        base = {name: None for name in base}

    def option(flag: str, kind: Callable[[str], Any], help: str, choices: tuple[str, ...] | None = None) -> Option:
        dest = flag.lstrip("-").replace("-", "_")
        return Option(flag, "SPECAPI_" + dest.upper(), kind, base[dest], help, choices=choices, default_text=default_text)

    return (
        option("--num-speculative-tokens", positive_int, "draft tokens per round (the starting length when adaptive)"),
        option("--policy", str, "draft length: adaptive (stops speculating when the target alone is faster) or fixed", ("adaptive", "fixed")),
        option("--drafter", str, "who proposes: auto (per round: the suffix index, prompt lookup or the draft model), model, "
               "lookup (no draft model) or suffix (past requests' text, no draft model)", ("auto", "model", "lookup", "suffix")),
        option("--verification", str, "how the target checks drafts (see docs/verification.md); none = the target alone", VERIFICATION_CHOICES),
        option("--pipeline", boolean, "draft the next round while the current one is verified"),
    )


def fraction(text: str) -> float:
    """An option value in [0, 1]."""
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise ValueError("must be a number in [0, 1]")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0.0:
        raise ValueError("must be a number >= 0")
    return value


def acceptance_options() -> tuple[Option, ...]:
    """`--acceptance`, `--acceptance-threshold`, `--typical-epsilon`, `--typical-delta` (see `specapi.core.lossy`)."""
    return (
        Option("--acceptance", "SPECAPI_ACCEPTANCE", str, "exact", "how drafts are kept: exact (the target's output), or the lossy "
               "threshold (p_target/p_draft >= --acceptance-threshold) or typical (Medusa's) rules; lossy output says exact=false",
               choices=ACCEPTANCE_CHOICES),
        Option("--acceptance-threshold", "SPECAPI_ACCEPTANCE_THRESHOLD", _non_negative, 0.7, "the threshold rule's ratio"),
        Option("--typical-epsilon", "SPECAPI_TYPICAL_EPSILON", fraction, 0.09, "the typical rule's hard floor epsilon"),
        Option("--typical-delta", "SPECAPI_TYPICAL_DELTA", fraction, 0.3, "the typical rule's entropy factor delta"),
    )


def acceptance_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The client's keyword arguments from resolved `acceptance_options()`."""
    return {name: values[name] for name in ("acceptance", "acceptance_threshold", "typical_epsilon", "typical_delta")}
