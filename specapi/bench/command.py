"""`specapi bench`: does a draft/target pair pay off, in time and money, against the target alone?

With no endpoint options it runs the built-in scenarios on the embedded simulator (``--scenario NAME``
to choose, ``--quick`` for a fast check without simulated latency). With ``--target-model`` it runs one
scenario against real endpoints, on prompts from ``--prompts FILE.jsonl`` (or the built-in code
prompts). Either way it prints a table and an explanation per scenario, and writes ``--json`` and
``--html`` reports. The exit code is 1 when an output differed from the target alone's at temperature 0
or a request failed, else 0 (sampled outputs the engine marks approximate are reported, not failed).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..cli_options import ENDPOINTS, EXIT_FAILED, EXIT_OK, EXIT_USAGE, Option, UsageError, add_options, boolean, positive_int, refuse_hosted, resolve, speculation_options
from .scenarios import DEFAULT_SCENARIOS, SCENARIO_GROUPS, SCENARIOS, Scenario, get_scenarios, load_prompts, quick, with_requests

__all__ = ["add_arguments", "run", "build_scenarios"]


def _temperature(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 2.0:
        raise ValueError("must be in [0, 2]")
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
    Option("--concurrency", "SPECAPI_CONCURRENCY", positive_int, None, "requests in flight at once on each side", default_text=_SCENARIO_DEFAULT),
    Option("--seed", "SPECAPI_SEED", int, None, "seed for sampling and the simulator", default_text=_SCENARIO_DEFAULT),
)
OUTPUT: tuple[Option, ...] = (
    Option("--json", "SPECAPI_BENCH_JSON", str, None, "write the full report as JSON to this file", default_text="none"),
    Option("--html", "SPECAPI_BENCH_HTML", str, None, "write a self-contained HTML report with charts to this file", default_text="none"),
)
SPECULATION = speculation_options(default_text=_SCENARIO_DEFAULT)
OPTIONS: tuple[Option, ...] = (*SIMULATOR, *ENDPOINTS, *SPECULATION, *REQUESTS, *OUTPUT)


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
    add_options(parser.add_argument_group("output (the table goes to stdout, progress to stderr)"), OUTPUT)


def _resolved(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with every option resolved from the command line, the environment or its default."""
    if getattr(args, "_resolved", False):
        return args
    values = resolve(args, OPTIONS, os.environ)
    refuse_hosted(values, os.environ)
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
    for name in ("max_tokens", "temperature", "seed", "concurrency"):
        if getattr(after, name) != getattr(before, name):
            out.append((name, getattr(after, name)))
    if len(after.requests) != len(before.requests):
        out.append(("requests", len(after.requests)))
    return out


def build_scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios to run, with the command line's overrides applied."""
    args = _resolved(args)
    for name in ("max_tokens", "num_speculative_tokens", "requests", "concurrency"):
        _positive(name.replace("_", "-"), getattr(args, name))
    if args.temperature is not None and not 0.0 <= args.temperature <= 2.0:
        raise ValueError(f"--temperature must be in [0, 2], got {args.temperature}")
    if args.target_model:
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


def _endpoints(args: argparse.Namespace, scenario: Scenario):  # type: ignore[no-untyped-def]
    from ..endpoint import Endpoint

    if scenario.sim is None:
        target = Endpoint(base_url=args.target_base_url, model=args.target_model, api_key=args.target_api_key)
        draft = Endpoint(base_url=args.draft_base_url, model=args.draft_model, api_key=args.draft_api_key) if args.draft_model else None
        return target, draft
    from ..sim import simulated_endpoints

    return simulated_endpoints(profile=scenario.sim.profile, latency=scenario.sim.latency, seed=scenario.sim.seed)


async def _run_all(args: argparse.Namespace, scenarios: list[Scenario], console: Any) -> list[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from .runner import run_scenario, steps

    runs = []
    total = sum(steps(s) for s in scenarios)
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("starting", total=total)
        for scenario in scenarios:
            target, draft = _endpoints(args, scenario)
            progress.update(task, description=f"{scenario.name}")

            def step(label: str, name: str = scenario.name) -> None:
                progress.update(task, advance=1, description=f"{name}: {label}")

            run = await run_scenario(scenario, target, draft, progress=step)
            if scenario.seed_blog:
                progress.update(task, description=f"{scenario.name}: the blog experiment and the lossy sweep")
                run.extras = await _seed_blog(args, scenario)
            runs.append(run)
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
    """Exit codes: 0 every comparison held; 1 an output differed while claiming to be exact, or a request
    failed; 2 bad options or prompts."""
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
    runs = asyncio.run(_run_all(args, scenarios, err))
    data = build_report(runs, mode=mode, version=__version__)
    print_report(data, out)
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
    return EXIT_FAILED if failed else EXIT_OK
