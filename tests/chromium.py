"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe).

No driver package and no network port: the browser reads commands on fd 3 and
writes replies and events on fd 4, each a JSON message ended by NUL. Used by
tests/test_report_browser.py and by `python3 tests/chromium.py` to retake the
README's screenshots.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    env = os.environ.get("PORTER_CHROMIUM")
    if env:
        return env if shutil.which(env) else None
    return next((p for p in map(shutil.which, CANDIDATES) if p), None)


def _high(fd: int) -> int:
    """The same pipe end at a number >= 10, so dup2 onto 3 and 4 in the child cannot clobber it."""
    new = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return new


class Browser:
    def __init__(self, exe: str | None = None, width: int = 1400, height: int = 1000, timeout: float = 60):
        exe = exe or find_chromium()
        if exe is None:
            raise RuntimeError("no Chromium found")
        self.width, self.height, self.timeout = width, height, timeout
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        to_child_r, from_child_w = _high(to_child_r), _high(from_child_w)

        def wire():  # runs in the child between fork and exec
            os.dup2(to_child_r, 3, inheritable=True)
            os.dup2(from_child_w, 4, inheritable=True)

        self._profile = tempfile.TemporaryDirectory(prefix="porter-chromium-")
        self.proc = subprocess.Popen(
            [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={self._profile.name}", "about:blank"],
            preexec_fn=wire, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child_r)
        os.close(from_child_w)
        self._w = os.fdopen(to_child_w, "wb", buffering=0)
        self._r = os.fdopen(from_child_r, "rb", buffering=0)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def _read_message(self) -> dict:
        while b"\0" not in self._buf:
            chunk = self._r.read(65536)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def call(self, method: str, session: bool = False, **params) -> dict:
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if session:
            msg["sessionId"] = self.session
        self._w.write(json.dumps(msg).encode() + b"\0")
        while True:
            reply = self._read_message()
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def open(self, url: str) -> None:
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._read_message())

    def eval(self, expression: str):
        res = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"script failed: {res['exceptionDetails'].get('text')}")
        return res["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", session=True, format="png")["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except Exception:  # noqa: BLE001  already gone
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._w.close()
        self._r.close()
        self._profile.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# What the reviewer must actually see: element boxes inside the viewport, not merely present in the DOM.
VISIBLE_JS = """
(sel) => { const el = document.querySelector(sel); if (!el) return null;
  const r = el.getBoundingClientRect(), s = getComputedStyle(el);
  return {top: r.top, left: r.left, right: r.right, bottom: r.bottom, width: r.width, height: r.height,
          shown: r.width > 0 && r.height > 0 && s.display !== 'none' && s.visibility !== 'hidden'
                 && r.top < innerHeight && r.bottom > 0 && r.left < innerWidth,
          color: s.color, text: el.innerText.slice(0, 200)}; }
"""


def box(browser: Browser, selector: str) -> dict | None:
    return browser.eval(f"({VISIBLE_JS})({json.dumps(selector)})")


if __name__ == "__main__":  # retake the README's screenshots: SITE DOCS UNIT [NAME], NAME as in report-NAME-overview.png
    import sys

    site, docs, unit = Path(sys.argv[1]).resolve(), Path(sys.argv[2]), sys.argv[3]
    stem = f"report-{sys.argv[4]}-" if len(sys.argv) > 4 else "report-"
    shots = (docs / f"{stem}overview.png", docs / f"{stem}unit.png")
    with Browser(height=900) as b:
        b.open((site / "index.html").as_uri())
        b.screenshot(shots[0])
        b.open((site / "units" / f"{unit}.html").as_uri())
        b.screenshot(shots[1])
    print(f"wrote {shots[0]} and {shots[1]}")
