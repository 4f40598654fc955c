"""Test helpers (not a test module): a real `redis-server` on a free loopback port, and `specapi serve`
processes started in parallel, each its own replica."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

import httpx2
import pytest

READY_TIMEOUT_S = 30.0
#: After SIGTERM, how long a process that failed to start gets before SIGKILL (`specapi serve` may wait out
#: its shutdown timeout and more on SIGTERM; one that never started has nothing to finish).
ABANDON_WAIT_S = 2.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def redis_installed() -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed (Debian: apt-get install -y redis-server; .ci/run installs it)")


class RedisServer:
    """`redis-server` on 127.0.0.1, without persistence: `kill()` loses everything, as an outage would."""

    def __init__(self) -> None:
        redis_installed()
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--protected-mode", "yes",
             # Small stream nodes: `MAXLEN ~` trims whole nodes, so the cap then holds within 5 entries.
             "--stream-node-max-entries", "5"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            assert self.process.poll() is None, "redis-server exited"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            assert time.monotonic() < deadline, "redis-server did not start"
            time.sleep(0.02)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)
        self.process = None

    def command(self, *args: str) -> bytes:
        """One command's raw reply (RESP), through a socket: no client library of the code under test."""
        line = f"*{len(args)}\r\n" + "".join(f"${len(a.encode())}\r\n{a}\r\n" for a in args)
        with socket.create_connection(("127.0.0.1", self.port), timeout=2) as sock:
            sock.sendall(line.encode())
            return sock.recv(65536)

    def integer(self, *args: str) -> int:
        reply = self.command(*args)
        assert reply.startswith(b":"), reply
        return int(reply[1:].split(b"\r\n")[0])


class Replicas:
    """`specapi serve` processes (started together, waited for together) in front of `target_url`."""

    def __init__(
        self, target_url: str, count: int, *, share: str | None, extra: Sequence[str] = (), ports: Sequence[int] | None = None
    ) -> None:
        self.target_url = target_url
        self.ports = list(ports) if ports is not None else [free_port() for _ in range(count)]
        env = {**os.environ, "SPECAPI_LOG_LEVEL": "warning"}
        for name in ("SPECAPI_PEERS_DIR", "PROMETHEUS_MULTIPROC_DIR"):
            env.pop(name, None)
        command = [
            sys.executable, "-c", "from specapi.cli import cli; cli()", "serve",
            "--target-base-url", target_url, "--target-model", "sim-target",
            "--draft-base-url", target_url, "--draft-model", "sim-draft", "--shutdown-timeout", "2", "--ready-interval", "0.5",
            *(["--share", share] if share else []), *extra,
        ]
        self.processes = [
            subprocess.Popen([*command, "--port", str(port)], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            for port in self.ports
        ]

    def url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.ports[index]}"

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> Replicas:
        """Each process answering 200 on /ready within `timeout_s`; else every one is stopped (none is left
        running) and the first failure raised, with the stderr of a process that exited."""
        try:
            self._wait_ready(time.monotonic() + timeout_s)
        except BaseException:
            self.abandon()
            raise
        return self

    def _wait_ready(self, deadline: float) -> None:
        for index, process in enumerate(self.processes):
            while True:
                assert process.poll() is None, process.communicate()[1]
                try:
                    if httpx2.get(self.url(index) + "/ready", timeout=2).status_code == 200:
                        break
                except httpx2.TransportError:
                    pass
                assert time.monotonic() < deadline, "specapi serve did not become ready"
                time.sleep(0.05)

    def abandon(self) -> None:
        """SIGTERM to each process still running, SIGKILL to any alive `ABANDON_WAIT_S` later; then reap them all."""
        running = [p for p in self.processes if p.poll() is None]
        for process in running:
            process.terminate()
        deadline = time.monotonic() + ABANDON_WAIT_S
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
        for process in self.processes:
            if process.stderr is not None and not process.stderr.closed:
                process.communicate()  # reaps it and closes its stderr pipe
            else:
                process.wait()

    def stop(self) -> list[str]:
        """SIGTERM to each, then their stderr."""
        for process in self.processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        errors = []
        for process in self.processes:
            try:
                errors.append(process.communicate(timeout=20)[1])
            except subprocess.TimeoutExpired:
                process.kill()
                errors.append(process.communicate()[1])
        return errors

    def __enter__(self) -> Replicas:
        return self.wait_ready()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def metric(text: str, name: str) -> float:
    """The value of one sample (`name` with its labels, as exported) in a Prometheus page; 0 if absent."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0
