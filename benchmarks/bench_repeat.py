"""How much do the bench's figures move from run to run? Repeats simulator scenarios and prints the spread.

Each repetition builds a fresh simulated pair with a different seed (so latency jitter differs) and runs
the scenario as ``specapi bench`` does (``specapi.bench.runner.run_scenario`` + ``summary.summarize``).
Printed per scenario: achieved and predicted speedup of every run, their min / mean / max, the worst
prediction gap, and whether every output was the target's own.

    python benchmarks/bench_repeat.py                                  # lan-code and lan-adaptive, 3 runs each
    python benchmarks/bench_repeat.py --scenario hosted-adaptive --repeat 5

Bounded: --timeout seconds overall (default 300). Exit code 1 if an output differed from the target's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import sys
import time

from specapi.bench.runner import run_scenario
from specapi.bench.scenarios import SCENARIOS, get_scenario
from specapi.bench.summary import summarize
from specapi.sim import simulated_endpoints


async def _main(args: argparse.Namespace) -> int:
    exact = True
    for name in args.scenario or ["lan-code", "lan-adaptive"]:
        base = get_scenario(name)
        rows = []
        for seed in range(args.repeat):
            scenario = dataclasses.replace(base, sim=dataclasses.replace(base.sim, seed=seed))
            target, draft = simulated_endpoints(profile=scenario.sim.profile, latency=scenario.sim.latency, seed=seed)
            started = time.perf_counter()
            summary = summarize(await run_scenario(scenario, target, draft))
            rows.append(summary)
            exact = exact and summary["exact_outputs"]
            print(
                f"{name} seed {seed}: speedup {summary['speedup']:.3f}x, predicted {summary['predicted_speedup']:.3f}x, "
                f"acceptance {summary['acceptance_rate'] if summary['acceptance_rate'] is not None else '-'}, "
                f"cost ratio {summary['cost_ratio'] if summary['cost_ratio'] is not None else 'free'}, "
                f"exact {summary['exact_outputs']} ({time.perf_counter() - started:.1f} s)",
                flush=True,
            )
        speedups = [r["speedup"] for r in rows]
        gaps = [r["prediction_gap"] for r in rows if r["prediction_gap"] is not None]
        aim = base.aim
        met = sum(1 for s in speedups if aim is not None and (s < aim if base.aim_below else s >= aim))
        print(
            f"{name}: speedup min {min(speedups):.3f}x, mean {statistics.fmean(speedups):.3f}x, max {max(speedups):.3f}x; "
            f"worst prediction gap {max(gaps, key=abs):+.1%}"
            + (f"; aim {'<' if base.aim_below else '>='}{aim}x met in {met}/{len(rows)} runs" if aim is not None else "")
        )
    return 0 if exact else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args()
    try:
        return asyncio.run(asyncio.wait_for(_main(args), timeout=args.timeout))
    except asyncio.TimeoutError:
        print(f"stopped: not finished within {args.timeout:.0f} s")
        return 1


if __name__ == "__main__":
    sys.exit(main())
