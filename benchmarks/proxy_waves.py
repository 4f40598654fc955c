"""The proxy's cold waves, as issue 37 states its goal: one wave of 100 concurrent streams through a
fresh `specapi serve`, against the same wave sent to the target alone, five times with fresh processes,
with speculation off (`--verification none`: every stream relayed, `specapi/server/relay.py`) and with
the default settings, with one worker and with `--workers 2`. Each run also sends the wave through a
proxy that only forwards bytes (`byte_relay.py`): the floor any Python proxy on the same CPUs sets.

    python benchmarks/proxy_waves.py                        # everything: 4 settings x 5 waves (about 10 minutes)
    python benchmarks/proxy_waves.py --waves 3 --workers 1 --settings off

Each wave is `proxy_load.py --client raw --relay-baseline` (aiohttp reads the streams, so that the load
generator does not bound the target alone). Prints every wave's ratio (proxy / target alone, and the
byte relay's), the proxy's CPU seconds per wave, the machine's load average around it, and PASS when every wave of a setting reaches its goal:
0.97x with speculation off, 0.95x by default. Exit code 1 if any setting misses it, or a request failed
or differed from the target's output. Run it on a quiet machine: the simulator, the proxy and the load
generator share the CPUs, and anything else running moves the ratios.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import proxy_load  # noqa: E402

#: Each setting's environment for `specapi serve`, and its goal (proxy / target alone, every wave).
SETTINGS = {
    "off": ({"SPECAPI_VERIFICATION": "none"}, 0.97),
    "default": ({}, 0.95),
}


def _wave(setting: str, workers: int, args: argparse.Namespace) -> tuple[dict, bool]:
    environment, _ = SETTINGS[setting]
    saved = {name: os.environ.get(name) for name in ("SPECAPI_VERIFICATION",)}
    os.environ.pop("SPECAPI_VERIFICATION", None)
    os.environ.update(environment)
    try:
        options = proxy_load.build_parser().parse_args(
            ["--client", "raw", "--relay-baseline", "--concurrency", str(args.concurrency), "--workers", str(workers)]
        )
        load = os.getloadavg()[0]  # what else ran: the figures move with it
        summaries, failed = proxy_load._run(options)
        summaries[f"proxy@{args.concurrency}"]["load_average"] = round(max(load, os.getloadavg()[0]), 1)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    return summaries[f"proxy@{args.concurrency}"], failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waves", type=int, default=5, help="cold waves per setting, fresh processes each")
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--workers", type=int, action="append", choices=[1, 2, 3, 4], help="1 and 2 unless given (repeatable)")
    parser.add_argument("--settings", action="append", choices=sorted(SETTINGS), help="off and default unless given (repeatable)")
    args = parser.parse_args(argv)
    if not 1 <= args.waves <= 20:
        parser.error("--waves must be in 1..20")
    results: list[tuple[str, int, list[dict]]] = []
    failed = False
    for workers in args.workers or [1, 2]:
        for setting in args.settings or ["off", "default"]:
            waves = []
            for wave in range(args.waves):
                print(f"\n######## {setting}, {workers} worker(s), wave {wave + 1} of {args.waves}", flush=True)
                summary, wave_failed = _wave(setting, workers, args)
                waves.append(summary)
                failed = failed or wave_failed
            results.append((setting, workers, waves))
    print(f"\n== {args.concurrency} concurrent streams, one cold wave each: proxy / target alone (byte relay / target alone; "
          "proxy CPU s; the higher 1-minute load average, before and after the wave)")
    ok = not failed
    for setting, workers, waves in results:
        goal = SETTINGS[setting][1]
        ratios = [wave.get("throughput_vs_target_alone") for wave in waves]
        passed = all(r is not None and r >= goal for r in ratios)
        ok = ok and passed
        cells = ", ".join(
            f"{r:.3f}x ({wave.get('relay_vs_target_alone', float('nan')):.3f}x; {wave.get('cpu_s_proxy', '?')}; load {wave.get('load_average', '?')})"
            if r is not None else "?"
            for r, wave in zip(ratios, waves)
        )
        print(f"  {setting:<8} {workers} worker(s): {cells}  -> {'PASS' if passed else 'FAIL'} (every wave at least {goal}x)")
    if failed:
        print("  some request failed or differed from the target's output (see above)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
