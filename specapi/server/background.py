"""Run an ASGI app with uvicorn in a background thread, on a loopback port: for tests, benchmarks, notebooks.

    with BackgroundServer(create_app(config)) as server:
        openai.OpenAI(base_url=server.url + "/v1", api_key=...)

Leaving the block shuts the server down like a SIGTERM does (graceful, draining in-flight requests for
up to `shutdown_timeout` seconds).
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn

__all__ = ["BackgroundServer"]


class BackgroundServer:
    """uvicorn serving `app` on `host` (port chosen by the OS unless given) in a daemon thread."""

    def __init__(
        self, app: Any, *, host: str = "127.0.0.1", port: int = 0, shutdown_timeout: float = 10.0, log_level: str = "warning"
    ) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        config = uvicorn.Config(
            app,
            log_level=log_level,
            access_log=False,
            lifespan="on",
            ws="none",
            timeout_graceful_shutdown=shutdown_timeout,
            backlog=2048,
        )
        self.server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 10.0) -> BackgroundServer:
        self._thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self._socket]}, name=f"uvicorn:{self.port}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on {self.url}")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Ask for a graceful shutdown and wait for it (in-flight requests finish first)."""
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._socket.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
