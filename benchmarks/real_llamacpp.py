"""Real compute: specapi's speculation over HTTP beside llama.cpp's own, on real llama-servers (issue 37).

The models are the compute-bound pair of `tests/real/make_models.py` (`make_compute_models`): a target
whose decode step is real matrix work (4 F32 blocks of width 1024, about 186 MB, far beyond the caches,
so a step is bound by memory, and a few tokens scored in one batch cost much less than as many steps)
and a draft of one small block, both carrying the tiny pair's bigram tables (greedy agreement about 77%
per token). Every server is llama.cpp's `llama-server` as `tests/real` builds it, one thread each
(`--threads-batch` gives the target's batches more), on 127.0.0.1; the target's and the in-engine ones
with `--kv-unified --cache-ram 0` (`--target-flags`; why: docs/performance.md). Side by side, on the same prompts
(three code, three prose, one of them CJK), greedy and at temperature 0.7 (llama-server's own sampler
chain, pinned: top_k 40, top_p 0.95, min_p 0.05):

1. the target alone (its own llama-server, through the openai SDK);
2. llama.cpp's in-engine speculation: one llama-server with `--model-draft --spec-type draft-simple`
   (`--model-draft` alone does not speculate in this build), the `--spec-draft-*` settings at their
   defaults (n-max 3, n-min 0, p-min 0), and tuned (`--tuned`, repeatable; default n-max 8 with
   p-min 0.3: long drafts cut where the draft is unsure);
3. specapi's default client (`AsyncSpeculativeOpenAI` with a target and a draft `Endpoint`, every
   option at its default) on two llama-servers (the target's of row 1, and the draft's);
   and the same client with a fixed draft length (`--diagnose K`, default 4): what its rounds cost when
   they happen;
4. `specapi serve` in front of the same two servers (its defaults), driven by the openai SDK;
5. Tightwad (PyPI `tightwad`, its proxy with both backends `llamacpp`) on the same two servers, when it
   is installed (`--no-tightwad` leaves it out). Not a dependency of specapi.

Requests go round-robin over the rows for each prompt (one at a time, never concurrently), so a machine
that slows down mid-run slows every row alike; each row first answers one warm-up request that is not
counted (a client's first request probes the target). Each row reports tokens per second (completion
tokens over wall time), the speedup over the target alone, the acceptance (accepted / drafted tokens:
specapi's statistics, llama-server's `timings.draft_n_accepted / draft_n`, Tightwad's status), whether
every greedy text equals the target alone's, the CPU seconds each process used during the row's timed
requests (`/proc/<pid>/stat`, with children; the client is this process), and from each llama-server's
`--metrics` the prompt tokens it evaluated and its `llama_decode` calls per output token (what a round
costs the target, whatever the machine's load). A request that fails is counted in its row.

Exactness at temperature 0.7 (the check of `tests/real/test_real_sampled_speculation.py`): the texts of
the first two tokens of `CHI_PROMPT`, sampled through each row with seeds 1000.., against the
distribution the target server itself reports (`/completion` with `post_sampling_probs` after the same
chain): chi-square over the texts expected at least 5 times, the rest pooled; p under 1e-3 fails. The
column says how many draft tokens those samples kept (a check of rows that drafted nothing only checks
the target). Longer T=0.7 texts are not compared with the target alone's: specapi draws each output
position with its own seed.

Before the rows, the cost of one decode step and of 5 tokens scored in one call on the target and on
the draft (llama-server's own `timings`, median of 3).

    python benchmarks/real_llamacpp.py                     # 6 prompts x 128 tokens, 200 samples a check
    python benchmarks/real_llamacpp.py --quick             # 2 prompts x 48 tokens, 60 samples
    python benchmarks/real_llamacpp.py --json out.json     # also every figure and text as JSON

Exit code 1 when a greedy text of the target, llama.cpp or specapi differs from the target alone's, one
of their requests fails or a distribution check of theirs fails (Tightwad's are its findings). The speed
bars of issue 37 are printed (PASS/FAIL) and do not set the exit code: timings on a shared machine are
noise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx2
import openai
from scipy.stats import chisquare

ROOT = pathlib.Path(__file__).resolve().parents[1]
REAL = ROOT / "tests" / "real"
if str(REAL) not in sys.path:
    sys.path.insert(0, str(REAL))

from make_models import make_compute_models  # noqa: E402

from specapi import AsyncSpeculativeOpenAI, Endpoint  # noqa: E402

CODE_PROMPTS = ["class Counter:\n    def increment(self", "def parse_config(text):\n    settings = {}", "numbers = [3, 1, 4"]
PROSE_PROMPTS = ["The model reads the prompt", "Speculative decoding keeps the output", "东京"]
WARMUP_PROMPT = "import"
#: llama-server's own sampler defaults (its /props), pinned so every row samples the same chain.
CHAIN = {"top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0}
TEMPERATURE = 0.7
CHI_PROMPT = "The model"
MIN_EXPECTED = 5.0
ALPHA = 1e-3
#: Slots of the target server: a greedy token-ids round sends K + 1 prompts at once (K up to 10).
TARGET_SLOTS = 12
DEFAULT_TUNED = ["--spec-draft-n-max 8 --spec-draft-p-min 0.3"]
#: The target's llama-server (and the in-engine ones, alike): one KV pool for every slot, and no prompt
#: cache in RAM. Without `--kv-unified` a batch over several slots is split into one forward pass per
#: slot length (a round's K + 1 prompts cost 73 ms instead of 31 ms); with it but with the RAM cache,
#: the server clears idle slots and a round re-evaluates whole prompts (docs/performance.md).
TARGET_FLAGS = "--kv-unified --cache-ram 0"
STARTUP_S = 120.0
REQUEST_TIMEOUT_S = 300.0


# -- processes --------------------------------------------------------------------------------------


def llama_server_binary() -> pathlib.Path:
    """Where tests/real/build_servers.sh puts llama-server (the same rule as tests/real/conftest.py)."""
    version = os.environ.get("SPECAPI_LLAMA_CPP_PYTHON_VERSION", "0.3.36")
    explicit = os.environ.get("SPECAPI_LLAMA_CACHE")
    if explicit:
        return pathlib.Path(explicit) / "bin" / "llama-server"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "specapi" / f"llama-cpp-python-{version}" / "bin" / "llama-server"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclasses.dataclass
class Process:
    """One server process on 127.0.0.1."""

    name: str
    port: int
    popen: subprocess.Popen[bytes]
    log: pathlib.Path

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, size: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-size:]
        except OSError:
            return ""


def _children(pid: int) -> list[int]:
    found = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as handle:
                found.extend(int(child) for child in handle.read().split())
    except OSError:
        pass
    return found


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its live descendants (Linux /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total, stack = 0.0, [pid]
    while stack:
        current = stack.pop()
        try:
            with open(f"/proc/{current}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime (fields 14 and 15)
        except (OSError, IndexError, ValueError):
            continue
        stack.extend(_children(current))
    return total


def server_counters(process: Process) -> dict[str, float]:
    """llama-server's counters (`--metrics`): prompt tokens evaluated, tokens generated, llama_decode
    calls; {} for a process without them."""
    try:
        response = httpx2.get(process.root + "/metrics", timeout=10.0)
    except httpx2.HTTPError:
        return {}
    if response.status_code != 200:
        return {}
    counters = {}
    for line in response.text.splitlines():
        for name in ("prompt_tokens_total", "tokens_predicted_total", "n_decode_total"):
            if line.startswith(f"llamacpp:{name} "):
                counters[name] = float(line.split()[1])
    return counters


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when this process dies, even without cleanup (Linux)."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def start_process(
    name: str, argv: list[str], logs: pathlib.Path, ready: str, *, env: dict[str, str] | None = None, port: int | None = None, startup_s: float = STARTUP_S
) -> Process:
    """Start `argv` ("{port}" replaced by a free port) and wait until GET `ready` answers 200 (at most `startup_s`)."""
    port = port or free_port()
    argv = [a.replace("{port}", str(port)) for a in argv]
    log = logs / f"{name.replace(' ', '-')}.log"
    with open(log, "wb") as out:
        popen = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=logs, preexec_fn=_die_with_parent)
    process = Process(name, port, popen, log)
    deadline, last = time.monotonic() + startup_s, "no answer"
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{name} exited with {popen.returncode} while starting:\n{process.log_tail()}")
        try:
            response = httpx2.get(process.root + ready, timeout=5.0)
            if response.status_code == 200:
                return process
            last = f"HTTP {response.status_code}"
        except httpx2.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.2)
    stop_process(process)
    raise RuntimeError(f"{name} did not answer {ready} within {startup_s:.0f} s ({last}):\n{process.log_tail()}")


def stop_process(process: Process) -> None:
    if process.popen.poll() is None:
        process.popen.send_signal(signal.SIGTERM)
        try:
            process.popen.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.popen.kill()
            process.popen.wait(timeout=15)


def llama_server_argv(binary: pathlib.Path, model: pathlib.Path, alias: str, *, slots: int, extra: list[str] = (), threads_batch: int = 1) -> list[str]:  # type: ignore[assignment]
    """One llama-server on one thread. `--threads-http`: a speculative client keeps more connections
    open than the default pool has threads (tests/real/README.md). `threads_batch`: threads for
    batches of several tokens (a verify call, a prompt); decode steps keep one. `--metrics`: the tokens it
    evaluated and its llama_decode calls, read around each request."""
    return [
        str(binary), "--model", str(model), "--alias", alias, "--host", "127.0.0.1", "--port", "{port}",
        "--ctx-size", str(1024 * slots), "--parallel", str(slots), "--threads", "1", "--threads-batch", str(threads_batch),
        "--threads-http", "32", "--no-webui", "--metrics", *extra,
    ]  # fmt: skip


def llama_cpp_python_argv(model: pathlib.Path, alias: str, *, threads_batch: int = 1) -> list[str]:
    """llama-cpp-python's OpenAI server (as tests/real/conftest.py starts it) on one thread; requests wait
    for each other (`--interrupt_requests False`) instead of ending the one streaming."""
    return [
        sys.executable, "-m", "llama_cpp.server", "--model", str(model), "--model_alias", alias,
        "--host", "127.0.0.1", "--port", "{port}", "--n_ctx", "4096", "--n_threads", "1",
        "--n_threads_batch", str(threads_batch), "--interrupt_requests", "False", "--verbose", "False",
    ]  # fmt: skip


# -- the cost of a step ------------------------------------------------------------------------------


async def step_costs(http: httpx2.AsyncClient, root: str, *, repeats: int = 3) -> dict[str, float]:
    """One decode step and one 5-token scoring call on a llama-server, from its own `timings` (ms,
    median of `repeats`): decode = predicted_per_token_ms of a 64-token greedy generation; verify5 =
    prompt_ms + predicted_ms of a call whose prompt adds 5 tokens to a cached context (prompt_n 5),
    generating one."""

    async def post(body: dict[str, Any]) -> dict[str, Any]:
        response = await http.post(root + "/completion", json={"temperature": 0, **body})
        response.raise_for_status()
        return response.json()

    first = await post({"prompt": CODE_PROMPTS[0], "n_predict": 64, "return_tokens": True})
    ids = (await http.post(root + "/tokenize", json={"content": CODE_PROMPTS[0], "add_special": True})).json()["tokens"]
    context, new = ids + first["tokens"][:32], first["tokens"][32:37]
    decode, verify = [], []
    for _ in range(repeats):
        decode.append((await post({"prompt": PROSE_PROMPTS[0], "n_predict": 64}))["timings"]["predicted_per_token_ms"])
        await post({"prompt": context, "n_predict": 1})
        timings = (await post({"prompt": context + new, "n_predict": 1}))["timings"]
        if timings["prompt_n"] == len(new):
            verify.append(timings["prompt_ms"] + timings["predicted_ms"])
    return {"decode_ms": statistics.median(decode), "verify5_ms": statistics.median(verify) if verify else float("nan")}


# -- the rows ----------------------------------------------------------------------------------------


@dataclasses.dataclass
class Sample:
    """One request's answer."""

    prompt: str
    text: str
    tokens: int
    wall_s: float
    drafted: int = 0
    accepted: int = 0
    exact: bool | None = None  # the route's own claim (specapi's `exact`), where it makes one
    note: str = ""  # specapi: the path, rounds and why it did not speculate, if it did not
    rounds: int = 0
    draft_call_s: float = 0.0  # specapi: the wall time of its draft calls and verify calls, summed
    verify_call_s: float = 0.0
    error: str | None = None  # the request failed (no text): the route's error


#: A route answers (prompt, max_tokens, temperature, seed) with a Sample.
Complete = Callable[[str, int, float, int], Awaitable[Sample]]


@dataclasses.dataclass
class Route:
    """A way to get the target's text: one row of the table."""

    name: str
    complete: Complete
    processes: list[Process]
    close: Callable[[], Awaitable[None]] | None = None


def _sampling(temperature: float, seed: int) -> dict[str, Any]:
    extra = {k: v for k, v in CHAIN.items() if k != "top_p"}
    return {"temperature": temperature, "seed": seed, "top_p": CHAIN["top_p"], "extra_body": extra}


def sdk_route(
    name: str, base_url: str, model: str, processes: list[Process], *, stats: str | None = None, tokenize_url: str = "", sampling: Callable[[float, int], dict[str, Any]] | None = None
) -> Route:
    """Completions through the openai SDK. `stats`: where the answer says what was drafted and kept:
    "timings" (llama-server's in-engine speculation: draft_n, draft_n_accepted), "speculative"
    (specapi serve's extra field) or "tightwad" (none in the answer: its status's totals before and
    after, requests being one at a time; its tokens counted by `tokenize_url`, the target's /tokenize).
    `sampling`: the request's sampling fields from (temperature, seed) (default: llama-server's chain, pinned)."""
    fields = sampling or _sampling
    client = openai.AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=REQUEST_TIMEOUT_S)
    status_url = base_url.removesuffix("/v1") + "/v1/tightwad/status"

    async def tightwad_counts() -> tuple[int, int]:
        async with httpx2.AsyncClient(timeout=30.0) as http:
            counts = (await http.get(status_url)).json()["stats"]
        return int(counts["total_drafted"]), int(counts["total_accepted"])

    async def complete(prompt: str, max_tokens: int, temperature: float, seed: int) -> Sample:
        if stats == "tightwad":  # read before the clock starts: its status is not part of a request
            drafted_before, accepted_before = await tightwad_counts()
        started = time.perf_counter()
        response = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, **fields(temperature, seed))
        wall = time.perf_counter() - started
        extra = response.model_extra or {}
        sample = Sample(prompt, response.choices[0].text, response.usage.completion_tokens if response.usage else 0, wall)
        if stats == "timings":
            timings = extra.get("timings") or {}
            sample.drafted, sample.accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
        elif stats == "speculative":
            spec = extra.get("speculative") or {}
            sample.drafted, sample.accepted = int(spec.get("drafted_tokens", 0)), int(spec.get("accepted_tokens", 0))
            sample.exact = spec.get("exact")
            sample.note = _note(spec)
        elif stats == "tightwad":
            drafted, accepted = await tightwad_counts()
            sample.drafted, sample.accepted = drafted - drafted_before, accepted - accepted_before
            # Its usage counted fewer tokens than its text holds (68-83 for 128-token texts and more):
            # count them as the target's tokenizer does.
            async with httpx2.AsyncClient(timeout=30.0) as http:
                tokenized = await http.post(tokenize_url, json={"content": sample.text, "add_special": False})
            sample.tokens = len(tokenized.json()["tokens"])
            sample.note = f"usage said {response.usage.completion_tokens if response.usage else None} tokens"
        return sample

    return Route(name, complete, processes, client.close)


def _note(spec: dict[str, Any]) -> str:
    reasons = [spec.get(key) for key in ("fallback_reason", "load_reason", "exact_reason") if spec.get(key)]
    return f"{spec.get('verification')} rounds={spec.get('num_rounds')} {' '.join(reasons)}".strip()


def specapi_client_route(
    name: str, target: Endpoint, draft: Endpoint, processes: list[Process], *, sampling: Callable[[float, int], dict[str, Any]] | None = None, **options: Any
) -> Route:
    """specapi's client, every option at its default unless given (`sampling` as in `sdk_route`)."""
    fields = sampling or _sampling
    client = AsyncSpeculativeOpenAI(target=target, draft=draft, **options)

    async def complete(prompt: str, max_tokens: int, temperature: float, seed: int) -> Sample:
        started = time.perf_counter()
        response = await client.completions.create(prompt=prompt, max_tokens=max_tokens, **fields(temperature, seed))
        wall = time.perf_counter() - started
        stats = response.speculative
        sample = Sample(prompt, response.choices[0].text, stats.generated_tokens, wall, stats.drafted_tokens, stats.accepted_tokens, stats.exact)
        sample.note = _note(stats.to_dict())
        sample.rounds = stats.num_rounds
        sample.draft_call_s = sum(r.draft_latency_s for r in stats.rounds)
        sample.verify_call_s = sum(r.verify_latency_s for r in stats.rounds)
        return sample

    return Route(name, complete, processes, client.close)


# -- exactness at temperature > 0 ----------------------------------------------------------------------


async def two_token_distribution(http: httpx2.AsyncClient, root: str, prompt: str, samples: int) -> dict[str, float]:
    """P(text of the first two generated tokens) at TEMPERATURE after CHAIN, from the server's own
    `post_sampling_probs` (the whole support: top_k 40)."""

    async def top(ids: list[int]) -> list[dict[str, Any]]:
        body = {"prompt": ids, "n_predict": 1, "n_probs": 40, "post_sampling_probs": True, "temperature": TEMPERATURE, **CHAIN}
        for _ in range(40):  # no list when the sampled token is part of a character: ask again
            data = (await http.post(root + "/completion", json=body)).json()
            if data.get("completion_probabilities"):
                return data["completion_probabilities"][0]["top_probs"]
        raise RuntimeError(f"llama-server never reported probabilities after {ids}")

    ids = (await http.post(root + "/tokenize", json={"content": prompt, "add_special": True})).json()["tokens"]
    dist: Counter[str] = Counter()
    for first in await top(ids):
        if first["prob"] * samples < MIN_EXPECTED / 2:
            continue  # its pairs cannot reach an expected count of 5: pooled with the rest
        for second in await top(ids + [first["id"]]):
            dist[bytes(first["bytes"] + second["bytes"]).decode("utf-8", errors="replace")] += first["prob"] * second["prob"]
    return dict(dist)


def chi_square(texts: list[str], dist: dict[str, float]) -> float:
    """p-value of the texts against the distribution (categories expected >= MIN_EXPECTED times, the
    rest pooled into one)."""
    n = len(texts)
    keep = sorted((t for t, p in dist.items() if p * n >= MIN_EXPECTED), key=lambda t: -dist[t])
    counts = Counter(texts)
    observed = [counts.get(t, 0) for t in keep]
    expected = [dist[t] * n for t in keep]
    rest_observed, rest_expected = n - sum(observed), n - sum(expected)
    if rest_expected >= MIN_EXPECTED:
        observed.append(rest_observed)
        expected.append(rest_expected)
    else:
        expected = [e * n / sum(expected) for e in expected]
        if rest_observed:  # texts outside the support of the kept categories, with nothing expected
            return 0.0
    return float(chisquare(observed, expected).pvalue)


async def distribution_check(route: Route, dist: dict[str, float], samples: int, concurrency: int = 4) -> dict[str, Any]:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(seed: int) -> Sample | None:
        async with semaphore:
            try:
                return await route.complete(CHI_PROMPT, 2, TEMPERATURE, seed)
            except Exception:  # a peer's failed request: counted, and the check fails
                return None

    results = await asyncio.gather(*(one(1000 + seed) for seed in range(samples)))
    answered = [r for r in results if r is not None]
    failed = samples - len(answered)
    if failed:
        return {"samples": samples, "p": None, "passed": False, "failed": failed, "accepted": 0, "drafted": 0}
    p = chi_square([r.text for r in answered], dist)
    return {"samples": samples, "p": p, "passed": p > ALPHA, "failed": 0, "accepted": sum(r.accepted for r in answered), "drafted": sum(r.drafted for r in answered)}


# -- one run ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class RowResult:
    name: str
    temperature: float
    samples: list[Sample]
    cpu_s: dict[str, float]
    #: The warm-up request's error, if it failed (the row's requests are sent all the same).
    error: str | None = None
    #: Per llama-server of the row: its counters' growth during the row's requests (server_counters).
    counters: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    @property
    def answered(self) -> list[Sample]:
        return [s for s in self.samples if s.error is None]

    @property
    def failed(self) -> list[Sample]:
        return [s for s in self.samples if s.error is not None]

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.answered)

    @property
    def wall_s(self) -> float:
        """The answered requests' wall time (tokens per second counts only what was answered)."""
        return sum(s.wall_s for s in self.answered)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s else 0.0

    @property
    def acceptance(self) -> float | None:
        drafted = sum(s.drafted for s in self.samples)
        return sum(s.accepted for s in self.samples) / drafted if drafted else None

    @property
    def rounds(self) -> int:
        return sum(s.rounds for s in self.samples)

    def per_round_ms(self) -> tuple[float, float] | None:
        """specapi's mean draft-call and verify-call wall time per round (ms)."""
        if not self.rounds:
            return None
        return 1000 * sum(s.draft_call_s for s in self.samples) / self.rounds, 1000 * sum(s.verify_call_s for s in self.samples) / self.rounds


async def measure(routes: list[Route], prompts: list[str], max_tokens: int, temperature: float, *, repeats: int = 1) -> list[RowResult]:
    """Every route answers every prompt (round-robin over the routes, one request at a time), after
    one warm-up request each; with the CPU seconds of each route's processes during its requests."""
    results = [RowResult(route.name, temperature, [], {}) for route in routes]
    for route, result in zip(routes, results):
        try:
            await route.complete(WARMUP_PROMPT, 16, temperature, 7)
        except Exception as exc:  # a peer that fails is reported, not fatal to the other rows
            result.error = f"{type(exc).__name__}: {exc}"
    servers = {route.name: [p for p in route.processes if "llama-server" in p.name] for route in routes}
    for repeat in range(repeats):
        for i, prompt in enumerate(prompts):
            for route, result in zip(routes, results):
                counted = {p.name: server_counters(p) for p in servers[route.name]}
                before = {p.name: cpu_seconds(p.popen.pid) for p in route.processes}
                client_before = time.process_time()
                started = time.perf_counter()
                try:
                    result.samples.append(await route.complete(prompt, max_tokens, temperature, 100 * repeat + i))
                except Exception as exc:  # a peer that fails a request is reported, not fatal
                    result.samples.append(Sample(prompt, "", 0, time.perf_counter() - started, error=f"{type(exc).__name__}: {exc}"))
                result.cpu_s["client (this process)"] = result.cpu_s.get("client (this process)", 0.0) + time.process_time() - client_before
                for p in route.processes:
                    result.cpu_s[p.name] = result.cpu_s.get(p.name, 0.0) + cpu_seconds(p.popen.pid) - before[p.name]
                for p in servers[route.name]:
                    growth = result.counters.setdefault(p.name, {})
                    for name, value in server_counters(p).items():
                        growth[name] = growth.get(name, 0.0) + value - counted[p.name].get(name, 0.0)
    return results


def tightwad_installed() -> bool:
    try:
        import tightwad.proxy  # noqa: F401
    except Exception:
        return False
    return True


@contextlib.contextmanager
def servers(args: argparse.Namespace, logs: pathlib.Path) -> Iterator[dict[str, Process]]:
    """The llama-servers (target, draft, in-engine default and tuned), the proxy and Tightwad."""
    binary = llama_server_binary()
    if not os.access(binary, os.X_OK):
        raise SystemExit(f"llama-server not found at {binary}: run `bash tests/real/build_servers.sh` first")
    target_model, draft_model = make_compute_models(args.models)
    in_engine = ["--model-draft", str(draft_model), "--spec-type", "draft-simple", "--spec-draft-threads", "1", "--spec-draft-threads-batch", "1"]
    started: dict[str, Process] = {}
    try:
        target_flags = args.target_flags.split()
        started["target"] = start_process("target llama-server", llama_server_argv(binary, target_model, "compute-target", slots=args.target_slots, extra=target_flags, threads_batch=args.threads_batch), logs, "/health")
        if args.target_server == "llama-cpp-python":
            # The target llama-server stays, for the target alone on llama-server, the step costs and the
            # distribution check (the same model and sampler chain); specapi's rows go to llama-cpp-python's.
            started["native target"] = started["target"]
            started["target"] = start_process("target llama-cpp-python", llama_cpp_python_argv(target_model, "compute-target", threads_batch=args.threads_batch), logs, "/v1/models")
        started["draft"] = start_process("draft llama-server", llama_server_argv(binary, draft_model, "compute-draft", slots=TARGET_SLOTS), logs, "/health")
        started["in-engine"] = start_process("in-engine llama-server (defaults)", llama_server_argv(binary, target_model, "compute-target", slots=4, extra=in_engine + target_flags, threads_batch=args.threads_batch), logs, "/health")
        for flags in args.tuned:
            started[f"in-engine {flags}"] = start_process(f"in-engine llama-server ({flags})", llama_server_argv(binary, target_model, "compute-target", slots=4, extra=in_engine + target_flags + flags.split(), threads_batch=args.threads_batch), logs, "/health")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        serve = [
            sys.executable, "-c", "from specapi.cli import cli; cli()", "serve",
            "--target-base-url", started["target"].root + "/v1", "--target-model", "compute-target",
            "--draft-base-url", started["draft"].root + "/v1", "--draft-model", "compute-draft",
            "--host", "127.0.0.1", "--port", "{port}", "--log-level", "warning", *args.proxy_flags,
        ]  # fmt: skip
        started["proxy"] = start_process(f"specapi serve ({' '.join(args.proxy_flags) or 'defaults'})", serve, logs, "/health", env=env)
        if args.tightwad and tightwad_installed():
            port = free_port()
            tw_env = {
                **os.environ, "HOME": str(logs),  # its pid file and logs go under ~/.tightwad
                "TIGHTWAD_DRAFT_URL": started["draft"].root, "TIGHTWAD_TARGET_URL": started["target"].root,
                "TIGHTWAD_DRAFT_MODEL": "compute-draft", "TIGHTWAD_TARGET_MODEL": "compute-target",
                "TIGHTWAD_DRAFT_BACKEND": "llamacpp", "TIGHTWAD_TARGET_BACKEND": "llamacpp",
                "TIGHTWAD_HOST": "127.0.0.1", "TIGHTWAD_PORT": str(port),
            }  # fmt: skip
            code = (
                "import uvicorn; from tightwad.config import load_proxy_from_env; from tightwad.proxy import create_app; "
                f"uvicorn.run(create_app(load_proxy_from_env()), host='127.0.0.1', port={port}, log_level='warning')"
            )
            started["tightwad"] = start_process("tightwad proxy", [sys.executable, "-c", code], logs, "/v1/models", env=tw_env, port=port)
        yield started
    finally:
        for process in reversed(list(started.values())):
            stop_process(process)


def build_routes(started: dict[str, Process], diagnose: list[int] = ()) -> list[Route]:  # type: ignore[assignment]
    """The table's rows; `diagnose`: draft lengths of extra rows with specapi's client at a fixed K
    (what a round costs when the adaptive policy would not speculate)."""
    target, draft = started["target"], started["draft"]
    routes = [sdk_route("target alone", target.root + "/v1", "compute-target", [target])]
    if "native target" in started:
        routes.append(sdk_route("target alone on llama-server", started["native target"].root + "/v1", "compute-target", [started["native target"]]))
    routes.append(sdk_route("llama.cpp in-engine, defaults", started["in-engine"].root + "/v1", "compute-target", [started["in-engine"]], stats="timings"))
    for key, process in started.items():
        if key.startswith("in-engine "):
            short = key.removeprefix("in-engine ").replace("--spec-draft-", "")
            routes.append(sdk_route(f"llama.cpp in-engine, tuned: {short}", process.root + "/v1", "compute-target", [process], stats="timings"))
    routes.append(
        specapi_client_route(
            "specapi client (defaults)",
            Endpoint(base_url=target.root + "/v1", model="compute-target", name="target llama-server"),
            Endpoint(base_url=draft.root + "/v1", model="compute-draft", name="draft llama-server"),
            [target, draft],
        )
    )
    for k in diagnose:
        routes.append(
            specapi_client_route(
                f"specapi client, fixed K={k}",
                Endpoint(base_url=target.root + "/v1", model="compute-target", name="target llama-server"),
                Endpoint(base_url=draft.root + "/v1", model="compute-draft", name="draft llama-server"),
                [target, draft],
                policy="fixed",
                num_speculative_tokens=k,
            )
        )
    routes.append(sdk_route(started["proxy"].name, started["proxy"].root + "/v1", "compute-target", [target, draft, started["proxy"]], stats="speculative"))
    if "tightwad" in started:
        routes.append(sdk_route("tightwad proxy", started["tightwad"].root + "/v1", "compute-target", [target, draft, started["tightwad"]], stats="tightwad", tokenize_url=target.root + "/tokenize"))
    return routes


def _fmt_cpu(cpu: dict[str, float]) -> str:
    return ", ".join(f"{name} {seconds:.2f}" for name, seconds in cpu.items())


def report(rows: list[RowResult], checks: dict[str, dict[str, Any]], costs: dict[str, dict[str, float]], args: argparse.Namespace) -> tuple[dict[str, Any], bool]:
    """Print the table; return the JSON document and whether exactness held everywhere."""
    ok = True
    print()
    for name, cost in costs.items():
        print(f"{name}: one decode step {cost['decode_ms']:.2f} ms, 5 tokens scored in one call {cost['verify5_ms']:.2f} ms ({cost['verify5_ms'] / cost['decode_ms']:.2f} steps)")
    if "target" in costs and "draft" in costs:
        print(f"target step / draft step: {costs['target']['decode_ms'] / costs['draft']['decode_ms']:.1f}x")
    doc: dict[str, Any] = {"costs_ms": costs, "prompts": args.prompt_list, "max_tokens": args.max_tokens, "rows": []}
    for temperature in sorted({r.temperature for r in rows}):
        group = [r for r in rows if r.temperature == temperature]
        base = group[0]
        print(f"\n{'greedy' if temperature == 0 else f'T={temperature}'}: {len(base.samples)} requests a row, {args.max_tokens} tokens max")
        print(f"{'row':44} {'tok/s':>7} {'speedup':>8} {'accept':>7}  exact")
        for row in group:
            if not row.answered:
                print(f"{row.name:44} failed every request: {row.samples[0].error if row.samples else row.error}")
                doc["rows"].append({"name": row.name, "temperature": temperature, "error": row.samples[0].error if row.samples else row.error})
                ok &= row.name.startswith("tightwad")
                continue
            speedup = row.tokens_per_s / base.tokens_per_s if base.tokens_per_s else 0.0
            if temperature == 0:
                equal = sum(s.text == b.text for s, b in zip(row.samples, base.samples))
                exact = f"{equal}/{len(row.samples)} texts equal"
                longer = sum(s.text != b.text and s.text.startswith(b.text) for s, b in zip(row.samples, base.samples))
                if longer:
                    exact += f" ({longer} start with it and run on past max_tokens)"
                ok &= equal == len(row.samples) or row.name.startswith("tightwad")  # a peer's inexactness is its finding
            else:
                check = checks.get(row.name)
                if check is None:
                    exact = "-"
                elif check["p"] is None:
                    exact = f"check failed: {check['failed']} of {check['samples']} requests failed"
                else:
                    kept = f" kept {check['accepted']}/{check['drafted']}" if check["drafted"] else " no drafts"
                    exact = f"chi2 p={check['p']:.3g} {'ok' if check['passed'] else 'FAIL'}{kept}"
                # A peer's failed check is its own finding; specapi's and llama.cpp's set the exit code.
                ok &= check is None or check["passed"] or row.name.startswith("tightwad")
            acceptance = "-" if row.acceptance is None else f"{row.acceptance:.1%}"
            print(f"{row.name:44} {row.tokens_per_s:7.1f} {speedup:7.2f}x {acceptance:>7}  {exact}")
            print(f"    CPU seconds: {_fmt_cpu(row.cpu_s)}")
            if row.failed:
                errors = Counter(s.error for s in row.failed)
                print(f"    {len(row.failed)} of {len(row.samples)} requests failed: " + "; ".join(f"{e} ({n}x)" for e, n in errors.items()))
                ok &= row.name.startswith("tightwad")
            timing = row.per_round_ms()
            if timing:
                print(f"    {row.rounds} rounds; per round: draft call {timing[0]:.1f} ms, verify call {timing[1]:.1f} ms")
            for server, growth in row.counters.items():
                if growth and row.tokens:
                    print(f"    {server}: {growth.get('prompt_tokens_total', 0) / row.tokens:.2f} prompt tokens evaluated and "
                          f"{growth.get('n_decode_total', 0) / row.tokens:.2f} llama_decode calls per output token")
            if args.verbose:
                for s in row.samples:
                    print(f"    {s.prompt[:24]!r:28} {s.tokens:4d} tokens {s.wall_s * 1000:8.1f} ms  accepted {s.accepted}/{s.drafted}  {s.note}")
            doc["rows"].append({
                "name": row.name, "temperature": temperature, "tokens": row.tokens, "wall_s": round(row.wall_s, 4),
                "tokens_per_s": round(row.tokens_per_s, 2), "speedup": round(speedup, 3), "acceptance": row.acceptance,
                "failed_requests": len(row.failed), "warmup_error": row.error,
                "exact": exact, "distribution_check": checks.get(row.name) if temperature else None,
                "cpu_s": {k: round(v, 3) for k, v in row.cpu_s.items()}, "rounds": row.rounds, "server_counters": row.counters,
                "per_round_ms": dict(zip(("draft_call", "verify_call"), row.per_round_ms() or ())),
                "samples": [dataclasses.asdict(s) for s in row.samples],
            })  # fmt: skip
        if temperature == 0:
            doc["bars"] = bars([r for r in group if r.answered])
    return doc, ok


def bars(group: list[RowResult]) -> dict[str, Any]:
    """Issue 37's greedy bars, from this run's ratios."""
    by = {r.name: r.tokens_per_s for r in group}
    base = by["target alone"]
    engine = max((v for k, v in by.items() if k.startswith("llama.cpp in-engine")), default=0.0)
    client, proxy = by.get("specapi client (defaults)", 0.0), by.get("specapi serve (defaults)", 0.0)
    result = {
        "client_over_target": client / base,
        "client_over_in_engine_speedup": (client / base) / (engine / base) if engine else None,
        "proxy_over_client": proxy / client if client else None,
    }
    print(f"\nbars (greedy): client {result['client_over_target']:.2f}x the target alone (>= 1.5: {'PASS' if result['client_over_target'] >= 1.5 else 'FAIL'}); "
          f"{result['client_over_in_engine_speedup']:.2f} of the best in-engine speedup (>= 0.9: {'PASS' if result['client_over_in_engine_speedup'] >= 0.9 else 'FAIL'}); "
          f"proxy {result['proxy_over_client']:.2f} of the client (>= 0.9: {'PASS' if result['proxy_over_client'] >= 0.9 else 'FAIL'})")  # fmt: skip
    return result


async def run(args: argparse.Namespace) -> int:
    logs = pathlib.Path(tempfile.mkdtemp(prefix="specapi-real-llamacpp-"))
    with servers(args, logs) as started:
        routes = build_routes(started, args.diagnose)
        try:
            async with httpx2.AsyncClient(timeout=REQUEST_TIMEOUT_S) as http:
                native = started.get("native target", started["target"])
                costs = {"target": await step_costs(http, native.root), "draft": await step_costs(http, started["draft"].root)}
                rows = await measure(routes, args.prompt_list, args.max_tokens, 0.0, repeats=args.repeats)
                checks: dict[str, dict[str, Any]] = {}
                if not args.greedy_only:
                    rows += await measure(routes, args.prompt_list, args.max_tokens, TEMPERATURE, repeats=args.repeats)
                    dist = await two_token_distribution(http, native.root, CHI_PROMPT, args.samples)
                    for route in routes:
                        checks[route.name] = await distribution_check(route, dist, args.samples)
        finally:
            for route in routes:
                if route.close is not None:
                    await route.close()
        doc, ok = report(rows, checks, costs, args)
    doc["logs"] = str(logs)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(doc, indent=2, ensure_ascii=False))
        print(f"\nJSON written to {args.json}")
    return 0 if ok else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, with the defaults `--quick` changes filled in."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 prompts (one code, one prose), 48 tokens, 60 samples per distribution check")
    parser.add_argument("--max-tokens", type=int, help="tokens per request (default 128; --quick 48)")
    parser.add_argument("--repeats", type=int, default=1, help="passes over the prompts (default 1; T=0.7 draws new seeds each pass)")
    parser.add_argument("--samples", type=int, help="samples per distribution check at T=0.7 (default 200; --quick 60)")
    parser.add_argument("--tuned", action="append", help=f"extra llama-server flags of a tuned in-engine row (repeatable; default {DEFAULT_TUNED!r}; 'none' leaves it out)")
    parser.add_argument("--threads-batch", type=int, default=1, help="threads of the target's batches (verify calls, prompts) on the target and in-engine servers; decode steps keep one (default 1)")
    parser.add_argument("--target-flags", default=TARGET_FLAGS, help=f"llama-server flags of the target and in-engine servers (default {TARGET_FLAGS!r})")
    parser.add_argument("--target-server", choices=("llama-server", "llama-cpp-python"), default="llama-server", help="the target server of specapi's rows and of the target alone (default llama-server; llama-cpp-python: its OpenAI server, checked by echo + logprobs, with llama-server's target alone beside it)")
    parser.add_argument("--target-slots", type=int, default=TARGET_SLOTS, help=f"--parallel of the target's llama-server (default {TARGET_SLOTS})")
    parser.add_argument("--diagnose", type=int, action="append", metavar="K", help="a row of specapi's client with a fixed draft length K (repeatable; default 4; 0 leaves it out): what its rounds cost, and a distribution check of rounds that happen")
    parser.add_argument("--proxy-flag", dest="proxy_flags", action="append", default=[], metavar="FLAG", help="a word added to `specapi serve`'s command line (repeatable)")
    parser.add_argument("--greedy-only", action="store_true", help="leave out temperature 0.7")
    parser.add_argument("--no-tightwad", dest="tightwad", action="store_false", help="leave out Tightwad")
    parser.add_argument("--models", help="where the compute models are written (default: the cache of tests/real/make_models.py)")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--verbose", action="store_true", help="print every request")
    args = parser.parse_args(argv)
    args.tuned = [t for t in (args.tuned or DEFAULT_TUNED) if t != "none"]
    args.diagnose = [k for k in (args.diagnose or [4]) if k > 0]
    args.prompt_list = [CODE_PROMPTS[0], PROSE_PROMPTS[0]] if args.quick else CODE_PROMPTS + PROSE_PROMPTS
    args.max_tokens = args.max_tokens or (48 if args.quick else 128)
    args.samples = args.samples or (60 if args.quick else 200)
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(run(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
