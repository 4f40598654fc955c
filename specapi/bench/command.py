"""`specapi bench`: does a draft/target pair pay off, in time and money, against the target alone?

With no endpoint options it runs the built-in scenarios on the embedded simulator (``--scenario NAME``
to choose, ``--quick`` for a fast check without simulated latency). With ``--target-model`` it runs one
scenario against real endpoints, on prompts from ``--prompts FILE.jsonl`` (or the built-in code
prompts). Either way it prints a table and an explanation per scenario (``--table``: the tables only),
and writes ``--json`` and ``--html`` reports. ``--repeat N`` runs each scenario N times and gives each
figure as its median and spread; ``--request-rate`` and ``--concurrency`` set the load, ``--via serve``
measures `specapi serve` instead of the client, ``--fresh-prompts`` keeps repeated prompts from being
drafted from what the client learnt of them, ``--draft-lengths 2,4,6`` sweeps the draft length (each
scenario at each fixed length and with the default policy, in one table). Progress goes to stderr: a bar on a terminal, one line per
step otherwise.

The exit code is 1 when an output differed from the target alone's at temperature 0 or a request
failed, or (with ``--check``) when a scenario missed the speedup it is expected to reach; else 0
(sampled outputs the engine marks approximate are reported, not failed). 2: bad options.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..core.cli_options import ENDPOINTS, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Option, UsageError, add_options, boolean, positive_int, refuse_hosted, resolve, speculation_options
from .scenarios import DEFAULT_SCENARIOS, SCENARIO_GROUPS, SCENARIOS, Scenario, get_scenarios, load_prompts, quick, with_requests
from .sweep import expand, parse_lengths

__all__ = ["add_arguments", "run", "build_scenarios"]


def _temperature(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 2.0:
        raise ValueError("must be in [0, 2]")
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise ValueError("must be > 0 (requests per second)")
    return value


_SCENARIO_DEFAULT = "the scenario's"
SIMULATOR: tuple[Option, ...] = (
    Option("--quick", "SPECAPI_BENCH_QUICK", boolean, False, "no simulated latency, 2 short requests per scenario (for tests)"),
)
REQUESTS: tuple[Option, ...] = (
    Option("--prompts", "SPECAPI_PROMPTS", str, None, 'a JSONL file: one {"prompt": ...} or {"messages": [...]} per line',
           default_text="the scenario's prompts"),
    Option("--max-tokens", "SPECAPI_MAX_TOKENS", positive_int, None, "tokens per request at most", default_text=_SCENARIO_DEFAULT),
    Option("--temperature", "SPECAPI_TEMPERATURE", _temperature, None, "sampling temperature (0 = greedy)", default_text=_SCENARIO_DEFAULT),
    Option("--requests", "SPECAPI_REQUESTS", positive_int, None, "measured requests per scenario (prompts repeat as needed)",
           default_text=_SCENARIO_DEFAULT),
    Option("--concurrency", "SPECAPI_CONCURRENCY", positive_int, None,
           "requests in flight at once on each side (with --request-rate: at most this many)", default_text=_SCENARIO_DEFAULT),
    Option("--request-rate", "SPECAPI_REQUEST_RATE", _rate, None,
           "requests per second, arriving as a Poisson process (drawn from --seed, the same on both sides)",
           default_text="none: --concurrency at a time"),
    Option("--fresh-prompts", "SPECAPI_FRESH_PROMPTS", boolean, False,
           "every measured request starts with an empty suffix index, so a prompt sent before (a warm-up, a "
           "repeat) runs as a new one would; without it the report counts such repeats"),
    Option("--seed", "SPECAPI_SEED", int, None, "seed for sampling and the simulator", default_text=_SCENARIO_DEFAULT),
)
RUNS: tuple[Option, ...] = (
    Option("--repeat", "SPECAPI_BENCH_REPEAT", positive_int, 1,
           "run each scenario N times: each figure as the median and the lowest-highest run; a win only when every run beat the target alone"),
    Option("--via", "SPECAPI_BENCH_VIA", str, "client", "measure the client in this process, or the proxy (specapi serve's app on a loopback port)",
           choices=("client", "serve")),
    Option("--check", "SPECAPI_BENCH_CHECK", boolean, False, "exit 1 when a scenario misses the speedup it is expected to reach"),
    Option("--draft-lengths", "SPECAPI_BENCH_DRAFT_LENGTHS", parse_lengths, None,
           "a sweep, e.g. 2,4,6: each scenario at each fixed draft length and with the default policy, each against "
           "the target alone, in one table (not with --policy or --num-speculative-tokens)", default_text="none"),
)
OUTPUT: tuple[Option, ...] = (
    Option("--table", "SPECAPI_BENCH_TABLE", boolean, False, "print the tables only (no explanation per scenario)"),
    Option("--json", "SPECAPI_BENCH_JSON", str, None, "write the full report as JSON to this file", default_text="none"),
    Option("--html", "SPECAPI_BENCH_HTML", str, None, "write a self-contained HTML report with charts to this file", default_text="none"),
)
SPECULATION = speculation_options(default_text=_SCENARIO_DEFAULT)
OPTIONS: tuple[Option, ...] = (*SIMULATOR, *ENDPOINTS, *SPECULATION, *REQUESTS, *RUNS, *OUTPUT)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sim = parser.add_argument_group("simulator (the default, when no --target-model is given)")
    sim.add_argument(
        "--scenario", action="append", choices=sorted([*SCENARIOS, *SCENARIO_GROUPS]), metavar="NAME",
        help=f"run this scenario or group (repeatable; one of {', '.join(sorted([*SCENARIOS, *SCENARIO_GROUPS]))}; default: {', '.join(DEFAULT_SCENARIOS)})",
    )
    add_options(sim, SIMULATOR)
    sim.add_argument("--list", action="store_true", help="list the scenarios and exit")
    add_options(parser.add_argument_group("real endpoints (with --target-model, one scenario on your endpoints)"), ENDPOINTS)
    add_options(parser.add_argument_group("speculation (overrides the scenarios' own settings)"), SPECULATION)
    add_options(parser.add_argument_group("requests (override the scenarios' own settings)"), REQUESTS)
    add_options(parser.add_argument_group("runs"), RUNS)
    add_options(parser.add_argument_group("output (the table goes to stdout, progress to stderr)"), OUTPUT)


def _resolved(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with every option resolved from the command line, the environment or its default."""
    if getattr(args, "_resolved", False):
        return args
    values = resolve(args, OPTIONS, os.environ)
    return argparse.Namespace(**{**vars(args), **values, "_resolved": True})


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"--{name} must be >= 1, got {value}")


def _overridden(scenario: Scenario, args: argparse.Namespace) -> Scenario:
    client = dict(scenario.client)
    if args.num_speculative_tokens is not None:
        client["num_speculative_tokens"] = args.num_speculative_tokens
    for name in ("policy", "drafter", "verification", "pipeline"):
        if getattr(args, name) is not None:
            client[name] = getattr(args, name)
    changes: dict[str, Any] = {"client": client}
    if args.max_tokens is not None:
        changes["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        changes["temperature"] = args.temperature
    if args.seed is not None:
        changes["seed"] = args.seed
    if args.concurrency is not None:
        changes["concurrency"] = args.concurrency
    if args.request_rate is not None:
        changes["request_rate"] = args.request_rate
    if args.fresh_prompts:
        changes["fresh_prompts"] = True
    if args.via != scenario.via:
        changes["via"] = args.via
    if args.requests is not None:
        changes["requests"] = with_requests(scenario.requests, args.requests)
    changed = replace(scenario, **changes)
    if changed != scenario:
        # The aims hold for the scenarios as defined, and the description says what the command changed
        # (a description that says "greedy" over a run at temperature 0.7 would misread the figures).
        said = [f"{name.replace('_', '-')} {value}" for name, value in _changed_settings(scenario, changed)]
        note = f" (run with --{', --'.join(said)})" if said else ""
        changed = replace(changed, aim=None, description=scenario.description + note)
    return changed


def _changed_settings(before: Scenario, after: Scenario) -> list[tuple[str, Any]]:
    """The settings a command line changed, in a fixed order: (name, new value)."""
    out = [(name, after.client.get(name)) for name in sorted(after.client) if after.client.get(name) != before.client.get(name)]
    for name in ("max_tokens", "temperature", "seed", "concurrency", "request_rate", "fresh_prompts", "via"):
        if getattr(after, name) != getattr(before, name):
            out.append((name, getattr(after, name)))
    if len(after.requests) != len(before.requests):
        out.append(("requests", len(after.requests)))
    return out


def build_scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios to run, with the command line's overrides applied (and with ``--draft-lengths``,
    each scenario's variants of the sweep in its place)."""
    args = _resolved(args)
    if args.draft_lengths and (args.policy is not None or args.num_speculative_tokens is not None):
        raise ValueError("--draft-lengths sets the policy and the draft length of each run: leave out --policy and --num-speculative-tokens")
    scenarios = _built(args)
    if args.draft_lengths:
        scenarios = [variant for scenario in scenarios for variant in expand(scenario, args.draft_lengths)]
    return scenarios


def _built(args: argparse.Namespace) -> list[Scenario]:
    for name in ("max_tokens", "num_speculative_tokens", "requests", "concurrency"):
        _positive(name.replace("_", "-"), getattr(args, name))
    if args.temperature is not None and not 0.0 <= args.temperature <= 2.0:
        raise ValueError(f"--temperature must be in [0, 2], got {args.temperature}")
    if args.target_model:
        refuse_hosted(vars(args), os.environ, what=f" (the prompts of {args.prompts})" if args.prompts else "")
        base = get_scenarios((args.scenario or ["lan-code"])[0])[0]
        requests = load_prompts(args.prompts) if args.prompts else base.requests
        scenario = Scenario(
            name=args.scenario[0] if args.scenario else "endpoints",
            description=f"{args.target_model} verified, " + (f"{args.draft_model} drafting" if args.draft_model else "prompt lookup drafting"),
            requests=requests,
            sim=None,
            client={
                "policy": "fixed",
                "num_speculative_tokens": 4,
                "drafter": "model" if args.draft_model else "lookup",
                "pipeline": True,
            },
            use_draft=bool(args.draft_model),
            max_tokens=64,
            seed_blog=base.seed_blog,
        )
        return [_overridden(scenario, args)]
    names = args.scenario or list(DEFAULT_SCENARIOS)
    scenarios = [scenario for name in names for scenario in get_scenarios(name)]
    if args.prompts:
        prompts = load_prompts(args.prompts)
        scenarios = [replace(s, requests=prompts, aim=None) for s in scenarios]
    if args.quick:
        scenarios = [quick(s) for s in scenarios]
    return [_overridden(s, args) for s in scenarios]


def _endpoints(args: argparse.Namespace, scenario: Scenario, repetition: int = 0):  # type: ignore[no-untyped-def]
    from ..transport.endpoint import Endpoint

    if scenario.sim is None:
        target = Endpoint(base_url=args.target_base_url, model=args.target_model, api_key=args.target_api_key)
        draft = Endpoint(base_url=args.draft_base_url, model=args.draft_model, api_key=args.draft_api_key) if args.draft_model else None
        return target, draft
    from ..sim import simulated_endpoints

    # Each repetition its own simulated pair, with its own latency draws.
    return simulated_endpoints(profile=scenario.sim.profile, latency=scenario.sim.latency, seed=scenario.sim.seed + repetition)


class _Lines:
    """Progress as one line per step on stderr (a pipe or a file): never silent for long."""

    def __init__(self, total: int, clock: Any = time.monotonic) -> None:
        self.total, self.done, self.clock, self.started = total, 0, clock, clock()

    def step(self, text: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total} {self.clock() - self.started:.0f} s] {text}", file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        print(f"[{self.done}/{self.total} {self.clock() - self.started:.0f} s] {text}", file=sys.stderr, flush=True)


class _Bar:
    """Progress as a rich bar (a terminal)."""

    def __init__(self, progress: Any, total: int) -> None:
        self.progress, self.task = progress, progress.add_task("starting", total=total)

    def step(self, text: str) -> None:
        self.progress.update(self.task, advance=1, description=text)

    def note(self, text: str) -> None:
        self.progress.update(self.task, description=text)


async def _run_all(args: argparse.Namespace, scenarios: list[Scenario], console: Any) -> list[list[Any]]:
    """Each scenario `--repeat` times: a list of runs per scenario."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .runner import steps

    repeat = args.repeat
    total = repeat * sum(steps(s) for s in scenarios)
    if not console.is_terminal:
        return await _run_each(args, scenarios, _Lines(total))
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        return await _run_each(args, scenarios, _Bar(progress, total))


async def _run_each(args: argparse.Namespace, scenarios: list[Scenario], shown: Any) -> list[list[Any]]:
    from .runner import run_scenario

    runs = []
    for scenario in scenarios:
        mine = []
        for repetition in range(args.repeat):
            target, draft = _endpoints(args, scenario, repetition)
            name = scenario.name + (f" (run {repetition + 1} of {args.repeat})" if args.repeat > 1 else "")
            shown.note(f"{name}: starting")
            run = await run_scenario(scenario, target, draft, progress=lambda label, n=name: shown.step(f"{n}: {label}"), order=repetition)
            if scenario.seed_blog and repetition == 0:
                shown.note(f"{name}: the blog experiment and the lossy sweep")
                run.extras = await _seed_blog(args, scenario)
            mine.append(run)
        runs.append(mine)
    return runs


async def _seed_blog(args: argparse.Namespace, scenario: Scenario) -> dict[str, Any]:
    """The blog experiment and the lossy acceptance sweep (`bench/blog.py`), on fresh endpoints: on the
    simulator, the sweep runs on the LAN vLLM-like pair, where the target shows its probabilities."""
    from .blog import SHORT_SWEEP, SIM_PRICE_MODELS, SWEEP_PROMPTS, lossy_sweep, seed_blog

    target, draft = _endpoints(args, scenario)
    if draft is None:
        return {"seed_blog_skipped": "the blog experiment needs a draft model (--draft-model)"}
    if scenario.sim is None:
        return {"seed_blog": await seed_blog(target, draft), "sweep": await lossy_sweep(*_endpoints(args, scenario))}
    from ..sim import simulated_endpoints

    instant = scenario.sim.latency == "instant"  # --quick
    check = simulated_endpoints(profile=scenario.sim.profile, latency="instant", seed=scenario.sim.seed)
    result = await seed_blog(target, draft, price_models=SIM_PRICE_MODELS, greedy_check=check)
    pair = simulated_endpoints(profile="vllm", latency="instant" if instant else "lan", seed=scenario.sim.seed)
    quick_sweep = {"settings": SHORT_SWEEP, "prompts": SWEEP_PROMPTS[:2], "max_tokens": 12} if instant else {}
    return {"seed_blog": result, "sweep": await lossy_sweep(*pair, **quick_sweep)}


def run(args: argparse.Namespace) -> int:
    """Exit codes: 0 every comparison held; 1 an output differed while claiming to be exact, a request
    failed, or (``--check``) a scenario missed its expected speedup; 2 bad options or prompts."""
    from rich.console import Console

    from .. import __version__
    from .report import print_report
    from .summary import report as build_report

    out = Console()
    if not out.is_terminal:
        out = Console(width=80)  # a pipe or a file: the same 80 columns every time
    err = Console(stderr=True)
    if args.list:
        for name, scenario in SCENARIOS.items():
            out.print(f"[bold]{name}[/bold]{' (default)' if name in DEFAULT_SCENARIOS else ''}: {scenario.description}")
        return EXIT_OK
    try:
        args = _resolved(args)
        scenarios = build_scenarios(args)
    except (UsageError, ValueError, KeyError, OSError) as exc:
        print(f"specapi bench: {exc}", file=sys.stderr)
        return EXIT_USAGE
    mode = "endpoints" if args.target_model else ("simulator, quick" if args.quick else "simulator")
    if args.via == "serve":
        mode += ", through specapi serve"
    if args.draft_lengths:
        mode += ", draft lengths " + ", ".join(map(str, args.draft_lengths))
    if args.request_rate is not None:
        mode += f", {args.request_rate:g} requests/s (Poisson)"
    elif args.concurrency is not None and args.concurrency > 1:
        mode += f", {args.concurrency} at a time"
    runs = asyncio.run(_run_all(args, scenarios, err))
    data = build_report(runs, mode=mode, version=__version__)
    print_report(data, out, table_only=args.table)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        err.print(f"JSON report: {args.json}")
    if args.html:
        from .html import write_html

        write_html(data, args.html)
        err.print(f"HTML report: {args.html}")
    # A run fails on errors and on outputs that differ while claiming to be exact; outputs the engine
    # itself marked approximate are reported, not failed.
    failed = any(any(m.get("claimed_exact", True) for m in s["mismatches"]) or s["errors"] for s in data["scenarios"])
    missed = [s for s in data["scenarios"] if (s.get("aim") or {}).get("met") is False]
    if args.check and missed:
        names = ", ".join(s["name"] for s in missed)
        print(f"specapi bench --check: {len(missed)} scenario(s) missed the speedup they are expected to reach: {names}", file=sys.stderr)
    return EXIT_FAILED if failed or (args.check and missed) else EXIT_OK
