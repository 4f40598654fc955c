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

from .scenarios import DEFAULT_SCENARIOS, SCENARIOS, Scenario, get_scenario, load_prompts, quick, with_requests

__all__ = ["add_arguments", "run", "build_scenarios"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sim = parser.add_argument_group("simulator (default)")
    sim.add_argument(
        "--scenario", action="append", choices=sorted(SCENARIOS), help=f"run this scenario (repeatable; default: {', '.join(DEFAULT_SCENARIOS)})"
    )
    sim.add_argument("--quick", action="store_true", help="no simulated latency, 2 short requests per scenario (for tests)")
    sim.add_argument("--list", action="store_true", help="list the scenarios and exit")

    real = parser.add_argument_group("real endpoints")
    real.add_argument("--target-base-url", default=os.environ.get("SPECAPI_TARGET_BASE_URL"))
    real.add_argument("--target-model", default=os.environ.get("SPECAPI_TARGET_MODEL"))
    real.add_argument("--target-api-key", default=os.environ.get("SPECAPI_TARGET_API_KEY"))
    real.add_argument("--draft-base-url", default=os.environ.get("SPECAPI_DRAFT_BASE_URL"))
    real.add_argument("--draft-model", default=os.environ.get("SPECAPI_DRAFT_MODEL"), help="omit for prompt lookup only")
    real.add_argument("--draft-api-key", default=os.environ.get("SPECAPI_DRAFT_API_KEY"))
    real.add_argument("--prompts", metavar="FILE.jsonl", help='one {"prompt": ...} or {"messages": [...]} per line')

    common = parser.add_argument_group("requests (override the scenarios' own settings)")
    common.add_argument("--max-tokens", type=int)
    common.add_argument("--temperature", type=float)
    common.add_argument("--num-speculative-tokens", type=int)
    common.add_argument("--policy", choices=["adaptive", "fixed"])
    common.add_argument("--drafter", choices=["auto", "model", "lookup", "suffix"], help="auto: suffix index, prompt lookup or the draft model, per round")
    common.add_argument("--requests", type=int, help="measured requests per scenario (prompts repeat as needed)")
    common.add_argument("--concurrency", type=int, help="requests in flight at once on each side")
    common.add_argument("--seed", type=int)

    out = parser.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the report as JSON")
    out.add_argument("--html", metavar="FILE", help="write a self-contained HTML report with plots")


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ValueError(f"--{name} must be >= 1, got {value}")


def _overridden(scenario: Scenario, args: argparse.Namespace) -> Scenario:
    client = dict(scenario.client)
    if args.num_speculative_tokens is not None:
        client["num_speculative_tokens"] = args.num_speculative_tokens
    if args.policy is not None:
        client["policy"] = args.policy
    if getattr(args, "drafter", None) is not None:
        client["drafter"] = args.drafter
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
        changed = replace(changed, aim=None)  # the aims hold for the scenarios as defined
    return changed


def build_scenarios(args: argparse.Namespace) -> list[Scenario]:
    """The scenarios to run, with the command line's overrides applied."""
    for name in ("max_tokens", "num_speculative_tokens", "requests", "concurrency"):
        _positive(name.replace("_", "-"), getattr(args, name))
    if args.temperature is not None and not 0.0 <= args.temperature <= 2.0:
        raise ValueError(f"--temperature must be in [0, 2], got {args.temperature}")
    if args.target_model:
        base = get_scenario((args.scenario or ["lan-code"])[0])
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
        )
        return [_overridden(scenario, args)]
    names = args.scenario or list(DEFAULT_SCENARIOS)
    scenarios = [get_scenario(name) for name in names]
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

            runs.append(await run_scenario(scenario, target, draft, progress=step))
    return runs


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .. import __version__
    from .report import print_report
    from .summary import report as build_report

    console = Console()
    if not console.is_terminal:
        console = Console(width=150)  # a pipe or a file: keep the table whole rather than 80 columns wide
    if args.list:
        for name, scenario in SCENARIOS.items():
            console.print(f"[bold]{name}[/bold]{' (default)' if name in DEFAULT_SCENARIOS else ''}: {scenario.description}")
        return 0
    try:
        scenarios = build_scenarios(args)
    except (ValueError, KeyError, OSError) as exc:
        print(f"specapi bench: {exc}", file=sys.stderr)
        return 2
    mode = "endpoints" if args.target_model else ("simulator, quick" if args.quick else "simulator")
    runs = asyncio.run(_run_all(args, scenarios, console))
    data = build_report(runs, mode=mode, version=__version__)
    print_report(data, console)
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
        console.print(f"JSON report: {args.json}")
    if args.html:
        from .html import write_html

        write_html(data, args.html)
        console.print(f"HTML report: {args.html}")
    # A run fails on errors and on outputs that differ while claiming to be exact; outputs the engine
    # itself marked approximate are reported, not failed.
    failed = any(any(m.get("claimed_exact", True) for m in s["mismatches"]) or s["errors"] for s in data["scenarios"])
    return 1 if failed else 0
