"""Headless Chromium (Debian's ``chromium``) driven over the DevTools protocol, to look at
Prefect's web UI as an operator does: open a page, click a tab, read the text shown.

``--dump-dom`` is not enough: the flow-run page's tabs appear only once the run is loaded,
so its ``?tab=`` is dropped and a tab must be clicked like a person would.
"""

import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Self

from websockets.sync.client import ClientConnection, connect


class Browser:
    """One headless Chromium with one page; use as a context manager."""

    def __init__(self, start_timeout: float = 60) -> None:
        executable = shutil.which("chromium")
        if executable is None:
            raise RuntimeError("no chromium on PATH: apt-get install -y chromium")
        # A helper process that outlives the browser may still write the profile as it goes.
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-", ignore_cleanup_errors=True)
        # --no-sandbox: Chromium's sandbox refuses to run as root, as CI does.
        self._process = subprocess.Popen(
            [
                executable,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--window-size=1600,1200",
                "--remote-debugging-port=0",
                f"--user-data-dir={self._profile.name}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its renderer and helper processes go with it on close
        )
        port = self._debugging_port(Path(self._profile.name), start_timeout)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as reply:
            page = next(t for t in json.load(reply) if t["type"] == "page")
        self._socket: ClientConnection = connect(page["webSocketDebuggerUrl"], max_size=None)
        self._ids = itertools.count(1)

    def _debugging_port(self, profile: Path, timeout: float) -> int:
        """The port Chromium chose, from the file it writes once it listens."""
        deadline = time.monotonic() + timeout
        port_file = profile / "DevToolsActivePort"
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"chromium exited with {self._process.returncode}")
            if port_file.exists() and (lines := port_file.read_text().splitlines()):
                return int(lines[0])
            time.sleep(0.1)
        raise TimeoutError(f"chromium did not open its DevTools port within {timeout:.0f} s")

    def command(self, method: str, **params: Any) -> dict[str, Any]:
        """One DevTools command; events that arrive meanwhile are dropped."""
        message_id = next(self._ids)
        self._socket.send(json.dumps({"id": message_id, "method": method, "params": params}))
        while True:
            reply = json.loads(self._socket.recv(timeout=60))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]

    def evaluate(self, expression: str) -> Any:
        result = self.command("Runtime.evaluate", expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, url: str) -> None:
        self.command("Page.navigate", url=url)

    def text(self) -> str:
        """What the page shows, as a person reads it."""
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def wait_for_text(self, *wanted: str, timeout: float = 60) -> str:
        """The page's text once it shows every string of ``wanted``."""
        deadline = time.monotonic() + timeout
        while not all(w in (shown := self.text()) for w in wanted):
            if time.monotonic() > deadline:
                missing = [w for w in wanted if w not in shown]
                raise AssertionError(f"the page never showed {missing}; it shows:\n{shown}")
            time.sleep(0.25)
        return shown

    def click(self, selector: str, text: str = "") -> None:
        """Click the first element matching the CSS ``selector`` that shows ``text``."""
        found = self.evaluate(
            f"(() => {{ const e = [...document.querySelectorAll({json.dumps(selector)})]"
            f".find(e => e.innerText.includes({json.dumps(text)}));"
            " if (!e) return false; e.click(); return true; })()"
        )
        if not found:
            raise AssertionError(f"no {selector!r} showing {text!r} on the page:\n{self.text()}")

    def table_rows(self) -> list[list[str]]:
        """The cells of every table row the page shows, header rows included."""
        return self.evaluate(
            "[...document.querySelectorAll('tr')].map(r => [...r.querySelectorAll('th, td')]"
            ".map(c => c.innerText.trim()))"
        )

    def close(self) -> None:
        """End the browser and every process of its session, then remove its profile."""
        self._socket.close()
        self._signal_session(signal.SIGTERM)
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        deadline = time.monotonic() + 10
        while self._signal_session(signal.SIGKILL) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._profile.cleanup()

    def _signal_session(self, signum: int) -> bool:
        """Send ``signum`` to the browser's process group; False once none is left."""
        try:
            os.killpg(self._process.pid, signum)
        except ProcessLookupError:
            return False
        return True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
