"""Start and stop a real `mlflow server` on 127.0.0.1 for tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MlflowServer:
    """One `mlflow server` process over a sqlite store (its own, or `store_uri`); `stop()` kills it hard,
    `start()` brings it back."""

    def __init__(self, folder: Path, port: int | None = None, store_uri: str | None = None) -> None:
        self.folder = folder
        self.port = port or free_port()
        self._store_uri = store_uri
        self.process: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def store_uri(self) -> str:
        return self._store_uri or f"sqlite:///{self.folder / 'server.db'}"

    def start(self, timeout_s: float = 90.0) -> None:
        with open(self.folder / "server.log", "ab") as log:  # the server process keeps its own copy
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "mlflow", "server",
                    "--backend-store-uri", self.store_uri,
                    "--artifacts-destination", str(self.folder / "artifacts"),
                    "--host", "127.0.0.1",
                    "--port", str(self.port),
                    "--workers", "1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.folder / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as response:
                    if response.status == 200:
                        return
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"mlflow server did not answer on {self.uri} within {timeout_s} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        self.process = None
