"""Headless Chromium driven over the DevTools protocol on a pipe: wait for a React page to render, click, and
take screenshots, with no websocket library and no fixed sleeps."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
REPLY_TIMEOUT_S = 60.0


class Browser:
    """One headless Chromium with one page; `close()` ends it."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000) -> None:
        to_browser_read, self._to_browser = os.pipe()
        self._from_browser, from_browser_write = os.pipe()
        # --remote-debugging-pipe talks on the browser's fds 3 (commands in) and 4 (replies out).
        launch = 'exec "$0" "$@" 3<&' + str(to_browser_read) + " 4>&" + str(from_browser_write)
        self.process = subprocess.Popen(
            ["bash", "-c", launch, str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
             f"--user-data-dir={profile}", f"--window-size={width},{height}", "--remote-debugging-pipe",
             "about:blank"],
            pass_fds=(to_browser_read, from_browser_write),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        os.close(to_browser_read)
        os.close(from_browser_write)
        self._buffer = b""
        self._next_id = 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self._session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.page("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1, mobile=False)

    def call(self, method: str, session: str | None = None, **params: Any) -> dict[str, Any]:
        """Send one command and return its result (events that arrive meanwhile are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def page(self, method: str, **params: Any) -> dict[str, Any]:
        return self.call(method, self._session, **params)

    def open(self, url: str) -> None:
        self.page("Page.navigate", url=url)

    def evaluate(self, expression: str) -> Any:
        result = self.page("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def text(self) -> str:
        return str(self.evaluate("document.body ? document.body.innerText : ''") or "")

    def wait_for_text(self, *needles: str, timeout_s: float = 30.0) -> str:
        """The page's visible text once it holds every needle; AssertionError with what it holds otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            if all(needle in text for needle in needles) or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        missing = [needle for needle in needles if needle not in text]
        assert not missing, f"not on the page after {timeout_s} s: {missing}; it shows: {text[:3000]}"
        return text

    def count(self, selector: str) -> int:
        return int(self.evaluate(f"document.querySelectorAll({json.dumps(selector)}).length") or 0)

    def wait_for_count(self, selector: str, at_least: int, timeout_s: float = 30.0) -> int:
        """How many elements match `selector` once there are `at_least` (charts draw after their titles)."""
        deadline = time.monotonic() + timeout_s
        while (found := self.count(selector)) < at_least and time.monotonic() < deadline:
            time.sleep(0.25)
        assert found >= at_least, f"{found} elements {selector} after {timeout_s} s, expected {at_least}"
        return found

    def click(self, selector: str, text: str | None = None) -> bool:
        """Click the first element matching `selector` (and holding `text`); False when there is none."""
        script = (
            f"(() => {{ const found = [...document.querySelectorAll({json.dumps(selector)})]"
            f".find(e => {json.dumps(text)} === null || e.innerText.includes({json.dumps(text)}));"
            " if (!found) return false; found.click(); return true; })()"
        )
        return bool(self.evaluate(script))

    def screenshot(self, path: Path, height: int | None = None) -> Path:
        """A PNG of the viewport, or of its top `height` pixels."""
        params: dict[str, Any] = {"format": "png"}
        if height is not None:
            width = int(self.evaluate("window.innerWidth"))
            params["clip"] = {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}
        path.write_bytes(base64.b64decode(self.page("Page.captureScreenshot", **params)["data"]))
        return path

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):  # it may exit before it answers
            self.call("Browser.close")
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, 9)
            self.process.wait()
        os.close(self._to_browser)
        os.close(self._from_browser)

    def _read_message(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            if not select.select([self._from_browser], [], [], REPLY_TIMEOUT_S)[0]:
                raise RuntimeError(f"Chromium sent nothing for {REPLY_TIMEOUT_S} s")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError(f"Chromium closed the DevTools pipe (exit code {self.process.poll()})")
            self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)
