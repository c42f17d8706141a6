"""A real `mlflow server` on 127.0.0.1 and a proxy in front of it that delays every request.

The proxy makes a slow tracking server out of a fast one: each request waits `delay_s` before it is
forwarded, so every MLflow call the profiler's sink makes costs at least that much. Both run in processes
of their own; as a script this file is the proxy.
"""

from __future__ import annotations

import argparse
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class MlflowServer:
    """`python -m mlflow server` over a sqlite store in `folder`, in its own process group."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self._launched = 0.0

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def launch(self) -> MlflowServer:
        """Start the server process and return at once (see `wait_ready`)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._launched = time.monotonic()
        with (self.folder / "server.log").open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "mlflow", "server",
                    "--backend-store-uri", f"sqlite:///{self.folder / 'server.db'}",
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
        return self

    def wait_ready(self, timeout_s: float = 180.0) -> float:
        """Wait for /health; return the seconds since `launch`."""
        if self.process is None:
            self.launch()
        assert self.process is not None
        while time.monotonic() - self._launched < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"mlflow server exited: {(self.folder / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.uri}/health", timeout=1) as response:
                    if response.status == 200:
                        return time.monotonic() - self._launched
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"mlflow server did not answer on {self.uri} within {timeout_s:g} s")

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
            if self.process.stdout is not None:
                self.process.stdout.close()
        self.process = None


class DelayingProxy:
    """An HTTP proxy on 127.0.0.1 that waits `delay_s` before forwarding each request to `target_port`.

    It runs in a process of its own (this file as a script), so that its threads never compete with the
    measured training for the interpreter lock. `GET /__proxy__/requests` answers the number of requests
    forwarded so far, at once.
    """

    def __init__(self, target_port: int, delay_s: float = 0.1) -> None:
        self.target_port = target_port
        self.delay_s = delay_s
        self.port = 0
        self.process: subprocess.Popen[str] | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> DelayingProxy:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--target-port", str(self.target_port), "--delay-s", str(self.delay_s)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # "port <n>" once it listens
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"the delaying proxy did not start (it said {line!r})")
        self.port = int(line.split()[1])
        return self

    @property
    def requests(self) -> int | None:
        try:
            with urllib.request.urlopen(f"{self.uri}{STATS_PATH}", timeout=5) as response:
                return int(response.read())
        except OSError:
            return None

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(10)
            if self.process.stdout is not None:
                self.process.stdout.close()
        self.process = None


STATS_PATH = "/__proxy__/requests"


def serve(target_port: int, delay_s: float) -> None:
    """Forward every request to 127.0.0.1:`target_port` after `delay_s`; print the port once listening."""
    forwarded = 0
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _forward(self) -> None:
            nonlocal forwarded
            if self.path == STATS_PATH:
                self._reply(200, [], str(forwarded).encode())
                return
            body = self._read_body()
            with lock:
                forwarded += 1
            time.sleep(delay_s)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            if body or self.command in ("POST", "PUT", "PATCH"):
                headers["Content-Length"] = str(len(body))
            connection = http.client.HTTPConnection("127.0.0.1", target_port, timeout=120)
            try:
                connection.request(self.command, self.path, body=body or None, headers=headers)
                response = connection.getresponse()
                self._reply(response.status, response.getheaders(), response.read(), response.reason)
            finally:
                connection.close()

        def _reply(self, status: int, headers: list[tuple[str, str]], payload: bytes, reason: str = "") -> None:
            self.send_response(status, reason or None)
            for key, value in headers:
                if key.lower() not in HOP_BY_HOP and key.lower() != "content-length":
                    self.send_header(key, value)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(payload)

        def _read_body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                chunks = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
                self.rfile.readline()
                return b"".join(chunks)
            length = int(self.headers.get("Content-Length") or 0)
            return self.rfile.read(length) if length else b""

        do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _forward  # noqa: N815

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(f"port {server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Delay every HTTP request to a local server.")
    parser.add_argument("--target-port", type=int, required=True)
    parser.add_argument("--delay-s", type=float, default=0.1)
    options = parser.parse_args()
    serve(options.target_port, options.delay_s)
