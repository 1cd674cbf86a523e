"""A headless Chromium driven over the DevTools protocol on a pipe: open a page, wait until the DOM says it is ready.

Stdlib only (no websocket client, no Selenium or Playwright, whose browsers come from outside the package registries):
Chromium's ``--remote-debugging-pipe`` reads protocol messages on its fd 3 and writes on its fd 4, each a JSON
object ended by a NUL byte. Debian's ``chromium`` package (``apt-get install chromium``).

    with Browser() as browser:
        seconds = browser.time_until(url, "document.querySelectorAll('[role=row]').length > 10", timeout_s=60)
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any


def chromium_path() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    raise FileNotFoundError("no chromium on PATH: apt-get install chromium")


class Browser:
    """One headless Chromium process and one page of it, driven by DevTools protocol commands."""

    def __init__(self, width: int = 1600, height: int = 1000) -> None:
        self.profile = tempfile.mkdtemp(prefix="browser-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # the child's fd 3 reads our commands and its fd 4 writes the replies; move both out of the way of 3 and 4 first
        high = [dup_above(fd, 10) for fd in (to_chrome_r, from_chrome_w)]

        def wire() -> None:
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        command = [chromium_path(), "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu"]
        command += ["--no-first-run", f"--user-data-dir={self.profile}", f"--window-size={width},{height}", "about:blank"]
        self.process = subprocess.Popen(
            command, preexec_fn=wire, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )  # close_fds=False: the child keeps its inheritable fds, 3 and 4 alone (Python's own fds are close-on-exec)
        for fd in (to_chrome_r, from_chrome_w, *high):
            os.close(fd)
        self._buffer = b""
        self._next_id = 0
        target = self.command("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.command("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]

    def command(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> dict[str, Any]:
        """Send one command and return its result (events that arrive before it are dropped)."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(line)

    def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page."""
        result = self.command("Runtime.evaluate", {"expression": expression, "returnByValue": True}, self.session)
        return result.get("result", {}).get("value")

    def navigate(self, url: str) -> None:
        self.command("Page.navigate", {"url": url}, self.session)

    def time_until(self, url: str, ready: str, timeout_s: float, every_s: float = 0.1) -> float:
        """Seconds from navigating to ``url`` until the JavaScript expression ``ready`` is true in the page."""
        from tests.conftest import wait_for

        started = time.monotonic()
        self.navigate(url)
        wait_for(lambda: bool(self.evaluate(f"Boolean({ready})")), timeout_s, f"{ready} at {url}", every_s=every_s)
        return time.monotonic() - started

    def screenshot(self, path: str) -> None:
        import base64

        data = self.command("Page.captureScreenshot", {"format": "png"}, self.session)["data"]
        with open(path, "wb") as f:
            f.write(base64.b64decode(data))

    def close(self) -> None:
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dup_above(fd: int, lowest: int) -> int:
    """A close-on-exec duplicate of ``fd`` numbered ``lowest`` or above (moving it onto 3 or 4 clobbers no other)."""
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, lowest)
