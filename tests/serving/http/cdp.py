"""A minimal Chrome DevTools Protocol client over --remote-debugging-pipe (no websocket
library needed): headless Chromium reads commands on fd 3 and answers on fd 4, each message
JSON ended by a NUL byte."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time


# the names `make browser` (run by make test) looks for before it installs Debian's chromium
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")
NO_CHROMIUM = (f"no Chromium on PATH ({', '.join(CHROMIUM_NAMES)}): `make test` installs Debian's "
               "chromium when run as root with apt-get; else apt-get install chromium")


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        if shutil.which(name):
            return shutil.which(name)
    return None


def _above_4(fd: int) -> int:
    """`fd` moved to the lowest free descriptor above 4 (close-on-exec, as os.pipe made it)."""
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 5)
    os.close(fd)
    return moved


class Browser:
    def __init__(self, width: int = 1000, height: int = 680):
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # the child's ends, moved above fd 4 first: a dup2 onto the descriptor an end already
        # sits on does nothing (it stays close-on-exec, and Chromium finds fd 3 closed), and
        # one end on 4 would be overwritten by the first dup2 before the second reads it
        to_chrome_r, from_chrome_w = _above_4(to_chrome_r), _above_4(from_chrome_w)

        def fds():  # the child's fd 3 / fd 4 are the pipe ends the protocol expects
            os.dup2(to_chrome_r, 3)  # dup2's copy is inheritable: it survives the exec
            os.dup2(from_chrome_w, 4)

        # a fresh profile per browser: the page's localStorage history never leaks between tests
        self.profile = tempfile.mkdtemp(prefix="graft-chromium-")
        # --no-sandbox: test machines run as root, where Chromium's sandbox refuses to start
        self.proc = subprocess.Popen(
            [find_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             f"--user-data-dir={self.profile}",
             "--disable-dev-shm-usage", "--remote-debugging-pipe", f"--window-size={width},{height}",
             "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id, self._buffer, self.session = 0, b"", None
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call("Emulation.setDeviceMetricsOverride", width=width, height=height,
                  deviceScaleFactor=1, mobile=False)

    def call(self, method: str, **params):
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        while True:  # events in between are not needed here
            reply = self._read()
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _read(self) -> dict:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)

    def goto(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True,
                           returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout_s: float = 60.0):
        """Poll `expression` until it is truthy; its value."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.js(expression)
            if value:
                return value
            time.sleep(0.1)
        raise TimeoutError(f"{expression!r} stayed falsy for {timeout_s} s")

    def set_files(self, selector: str, paths: list[str]) -> None:
        """Choose files in an <input type=file>, as a user picking them would."""
        root = self.call("DOM.getDocument")["root"]["nodeId"]
        node = self.call("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        self.call("DOM.setFileInputFiles", nodeId=node, files=[str(p) for p in paths])

    def box(self, selector: str) -> dict | None:
        """The element's box in CSS pixels and whether it shows (None: no such element)."""
        return self.js(f"""(() => {{ const e = document.querySelector({selector!r});
          if (!e) return null; const r = e.getBoundingClientRect();
          return {{x: r.x, y: r.y, width: r.width, height: r.height, right: r.right,
                   bottom: r.bottom, shown: !!e.offsetParent || r.width > 0}}; }})()""")

    def click(self, selector: str) -> None:
        self.js(f"document.querySelector({selector!r}).click(); true")

    def screenshot(self, path) -> None:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        with open(path, "wb") as fh:
            fh.write(base64.b64decode(data))

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except RuntimeError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self._to_chrome)
        os.close(self._from_chrome)
        shutil.rmtree(self.profile, ignore_errors=True)
