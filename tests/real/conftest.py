"""Real llama.cpp servers on 127.0.0.1 for the tests in tests/real/.

Session fixtures:
- `real_build`: makes sure both servers are built and installed. If llama.cpp's `llama-server` binary
  or llama-cpp-python's server module is missing, it runs `build_servers.sh` (a few minutes, once;
  cached outside the clone). A failed build is a test error, never a skip.
- `tiny_models`: the target and draft GGUF models written by `make_models.py` (cached by its hash).
- `lcp` and `ls`: a `ServerPair` (target and draft processes, and their `Endpoint`s) for
  llama-cpp-python's server and for llama.cpp's `llama-server`. Each model runs in its own process on
  a free port, one thread each; the processes are stopped at the end of the session.

The oracle of every test is the same server answering the same request directly (real_helpers.py).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
import httpx2
import pytest


HERE = pathlib.Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from make_models import make_models, model_dir  # noqa: E402
from real_helpers import Server, ServerPair  # noqa: E402
import vllm_setup  # noqa: E402

VERSION = os.environ.get("SPECAPI_LLAMA_CPP_PYTHON_VERSION", "0.3.36")
#: Each server gets this long to load and answer its first request.
STARTUP_S = 120.0
#: Slots of llama-server: specapi's fan-out sends K+1 one-token requests at once.
PARALLEL = 4


def cache_dir() -> pathlib.Path:
    """The build cache, as build_servers.sh computes it."""
    explicit = os.environ.get("SPECAPI_LLAMA_CACHE")
    if explicit:
        return pathlib.Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "specapi" / f"llama-cpp-python-{VERSION}"


def llama_server_binary() -> pathlib.Path:
    return cache_dir() / "bin" / "llama-server"


def _python_server_importable() -> bool:
    """llama-cpp-python's server and its extras import (checked in a child: it loads the library)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import llama_cpp, llama_cpp.server.app, sse_starlette, starlette_context, pydantic_settings"],
        capture_output=True,
        timeout=120,
    )
    return probe.returncode == 0


def _missing() -> list[str]:
    missing = []
    if not os.access(llama_server_binary(), os.X_OK):
        missing.append(f"llama-server ({llama_server_binary()})")
    if not _python_server_importable():
        missing.append("llama-cpp-python's server (llama_cpp.server)")
    return missing


@pytest.fixture(scope="session")
def real_build(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """The llama-server binary; builds both servers first if anything is missing."""
    missing = _missing()
    if missing:
        log = tmp_path_factory.mktemp("build") / "build.log"
        env = dict(os.environ)
        # The script runs `python -m pip`: make `python` this interpreter (the venv under test).
        env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get("PATH", "")])
        started = time.monotonic()
        with open(log, "wb") as out:
            result = subprocess.run(["bash", str(HERE / "build_servers.sh")], stdout=out, stderr=subprocess.STDOUT, env=env, timeout=3600)
        tail = log.read_text(errors="replace")[-4000:]
        if result.returncode != 0:
            pytest.fail(f"build_servers.sh failed (exit {result.returncode}) building {', '.join(missing)}:\n{tail}", pytrace=False)
        still = _missing()
        if still:
            pytest.fail(f"build_servers.sh ran ({time.monotonic() - started:.0f} s) but {', '.join(still)} is still missing:\n{tail}", pytrace=False)
    return llama_server_binary()


@pytest.fixture(scope="session")
def tiny_models() -> tuple[pathlib.Path, pathlib.Path]:
    return make_models(model_dir())


#: The module whose tests take the session's vLLM pair over (they run last; see the ordering hook below).
FAULTS_MODULE = "test_real_vllm_faults.py"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_ready(server: Server, path: str, startup_s: float = STARTUP_S) -> None:
    deadline = time.monotonic() + startup_s
    last = "no answer"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            pytest.fail(f"{server.family} ({server.role}) exited with {server.process.returncode} while starting:\n{server.log_tail()}", pytrace=False)
        try:
            response = httpx2.get(server.root + path, timeout=5.0)
            if response.status_code == 200:
                return
            last = f"HTTP {response.status_code}: {response.text[:200]}"
        except httpx2.HTTPError as exc:
            last = repr(exc)
        time.sleep(0.25)
    pytest.fail(f"{server.family} ({server.role}) did not answer {path} within {startup_s:.0f} s ({last}):\n{server.log_tail()}", pytrace=False)


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the test process dies, even without teardown (Linux)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop(server: Server) -> None:
    if server.process.poll() is None:
        server.process.send_signal(signal.SIGTERM)
        try:
            server.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(timeout=15)


@contextlib.contextmanager
def _servers(
    specs: list[tuple[str, str, str, list[str], str]],
    logs: pathlib.Path,
    *,
    env: dict[str, str] | None = None,
    startup_s: float = STARTUP_S,
    own_group: bool = False,
) -> Iterator[list[Server]]:
    """Start (family, role, model, argv, ready path) processes together, wait for all, stop all.
    `own_group`: each in its own process group (a server with child processes that a test signals whole)."""
    started: list[Server] = []
    try:
        for family, role, model, argv, _ in specs:
            port = free_port()
            argv = [a.replace("{port}", str(port)) for a in argv]
            log = logs / f"{family}-{role}.log"
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=logs, env=env, preexec_fn=_die_with_parent, start_new_session=own_group
                )
            started.append(Server(family, role, model, port, process, log))
        for server, (*_, ready) in zip(started, specs):
            _wait_ready(server, ready, startup_s)
        yield started
    finally:
        for server in started:
            _stop(server)


@pytest.fixture(scope="session")
def lcp(real_build: pathlib.Path, tiny_models: tuple[pathlib.Path, pathlib.Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPair]:
    """llama-cpp-python's OpenAI-compatible server (`python -m llama_cpp.server`), one per model.

    Options beyond host and port: the model's alias (the name requests send), one thread, and
    `--interrupt_requests False`: by default a request that arrives while another one streams makes
    the server end the streaming one early (with a normal-looking end of stream).
    """
    logs = tmp_path_factory.mktemp("llama-cpp-python")
    specs = []
    for role, path in zip(("target", "draft"), tiny_models):
        model = f"tiny-{role}"
        argv = [
            sys.executable, "-m", "llama_cpp.server",
            "--model", str(path), "--model_alias", model,
            "--host", "127.0.0.1", "--port", "{port}",
            "--n_ctx", "2048", "--n_threads", "1", "--n_threads_batch", "1",
            "--interrupt_requests", "False", "--verbose", "False",
        ]  # fmt: skip
        specs.append(("llama-cpp-python", role, model, argv, "/v1/models"))
    with _servers(specs, logs) as (target, draft):
        yield ServerPair(target, draft)


@pytest.fixture(scope="session")
def ls(real_build: pathlib.Path, tiny_models: tuple[pathlib.Path, pathlib.Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPair]:
    """llama.cpp's `llama-server`, one per model: PARALLEL slots (concurrent fan-out requests run
    together), a small context per slot, one thread, no web UI.

    `--threads-http`: the default pool (max(parallel + 2, cores - 1) threads) is smaller than the
    connections a speculative client keeps open; a keep-alive connection holds its thread while idle,
    so further requests waited about 5 s (the keep-alive timeout) before being read.
    """
    logs = tmp_path_factory.mktemp("llama-server")
    specs = []
    for role, path in zip(("target", "draft"), tiny_models):
        model = f"tiny-{role}"
        argv = [
            str(real_build), "--model", str(path), "--alias", model,
            "--host", "127.0.0.1", "--port", "{port}",
            "--ctx-size", str(1024 * PARALLEL), "--parallel", str(PARALLEL),
            "--threads", "1", "--threads-batch", "1", "--threads-http", str(4 * PARALLEL), "--no-webui",
        ]  # fmt: skip
        specs.append(("llama-server", role, model, argv, "/health"))
    with _servers(specs, logs) as (target, draft):
        yield ServerPair(target, draft)


@pytest.fixture(scope="session")
def ls_penalised(real_build: pathlib.Path, tiny_models: tuple[pathlib.Path, pathlib.Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A target `llama-server` started with a default penalty (`--frequency-penalty 0.3`): requests that do
    not set one get it (test_conformance_real.py)."""
    logs = tmp_path_factory.mktemp("llama-server-penalised")
    argv = [
        str(real_build), "--model", str(tiny_models[0]), "--alias", "tiny-target",
        "--host", "127.0.0.1", "--port", "{port}", "--ctx-size", "1024", "--parallel", "1",
        "--threads", "1", "--threads-batch", "1", "--no-webui", "--frequency-penalty", "0.3",
    ]  # fmt: skip
    with _servers([("llama-server", "target", "tiny-target", argv, "/health")], logs) as (target,):
        yield target


# -- vLLM ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def vllm_python() -> pathlib.Path:
    """The vLLM venv's python (install_vllm.sh installs it when missing; cached outside the clone)."""
    try:
        return vllm_setup.vllm_python()
    except vllm_setup.SetupError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def vllm_models(vllm_python: pathlib.Path) -> dict[str, pathlib.Path]:
    """The tiny HF-format models by name (`target`, `draft`, `target_compute`), from make_vllm_models.py."""
    try:
        return vllm_setup.vllm_models(vllm_python)
    except vllm_setup.SetupError as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def vllm(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerPair]:
    """Real vLLM OpenAI servers (`vllm serve`), one per model: the trained target and its draft.

    Started together once per session (each compiles its graph for about a minute) and stopped at the end.
    Servers already running (`SPECAPI_VLLM_PORTS`, see `vllm_setup.running_servers`) are used as they are:
    then nothing is installed or made.
    """
    logs = tmp_path_factory.mktemp("vllm")
    running = vllm_setup.running_servers(logs)
    if running is not None:
        yield running
        return
    vllm_python = request.getfixturevalue("vllm_python")
    vllm_models = request.getfixturevalue("vllm_models")
    specs = []
    for role in ("target", "draft"):
        model = f"tiny-{role}"
        argv = vllm_setup.serve_argv(vllm_python, vllm_models[role], model)
        specs.append(("vllm", role, model, argv, "/v1/models"))
    with _servers(specs, logs, env=vllm_setup.serve_env(), startup_s=vllm_setup.STARTUP_S, own_group=True) as (target, draft):
        yield ServerPair(target, draft)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests of the real vLLM run last, together: its servers start on the first of them and hold
    about 3 GB of memory each until the session ends, so every other test runs before they start. The fault tests come after every other: they take the session's pair over
    (stopping, killing and restarting it), which saves a start of their own."""

    def order(item: pytest.Item) -> tuple[bool, bool]:
        faults = item.path.name == FAULTS_MODULE
        return faults or "vllm" in getattr(item, "fixturenames", ()), faults

    items.sort(key=order)
    from vllm_known_differences import KNOWN_DIFFERENCES

    for item in items:
        reason = KNOWN_DIFFERENCES.get(item.nodeid.split("tests/real/", 1)[-1])
        if reason is not None:
            item.add_marker(pytest.mark.xfail(reason=f"known difference on real vLLM: {reason}", strict=False))
