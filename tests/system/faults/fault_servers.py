"""Misbehaving HTTP endpoints on 127.0.0.1: a server that answers every request with an error, and a proxy
that sleeps before forwarding each request to a real `mlflow server`."""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit


class _Endpoint:
    """A threaded HTTP server in the background of the test process; use it as a context manager."""

    def __init__(self, handler: type[_Handler]) -> None:
        for verb in ("GET", "POST", "PATCH", "PUT", "DELETE"):
            setattr(handler, f"do_{verb}", handler.answer)
        self.requests = 0
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._server.endpoint = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, name="test-http-endpoint", daemon=True)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def count(self) -> None:
        with self._lock:
            self.requests += 1

    def __enter__(self) -> _Endpoint:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        """Keep the test output clean."""

    def read_body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def answer(self) -> None:
        raise NotImplementedError

    def reply(self, status: int, body: bytes, headers: Sequence[tuple[str, str]] = ()) -> None:
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class ErrorServer(_Endpoint):
    """Answers every request with `status` and an HTML body, as a broken proxy or overloaded server does."""

    def __init__(self, status: int = 500) -> None:
        class Handler(_Handler):
            def answer(self) -> None:
                self.read_body()
                self.server.endpoint.count()  # type: ignore[attr-defined]
                self.reply(status, f"<html><body>{status} from a broken server</body></html>".encode())

        super().__init__(Handler)


class SlowProxy(_Endpoint):
    """Forwards every request to `upstream` after sleeping `delay_s`: a tracking server that takes seconds."""

    def __init__(self, upstream: str, delay_s: float) -> None:
        target = urlsplit(upstream)

        class Handler(_Handler):
            def answer(self) -> None:
                body = self.read_body()
                self.server.endpoint.count()  # type: ignore[attr-defined]
                time.sleep(delay_s)
                connection = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                connection.request(self.command, self.path, body=body or None, headers=headers)
                response = connection.getresponse()
                payload = response.read()
                connection.close()
                passed = [(k, v) for k, v in response.getheaders() if k.lower() in ("content-type",)]
                self.reply(response.status, payload, passed)

        super().__init__(Handler)
