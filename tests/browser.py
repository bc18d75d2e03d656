"""A real headless browser for the e2e tests: Debian's `chromium`, driven over the DevTools protocol (a WebSocket,
with the `websockets` package uvicorn already brings). No browser is downloaded; without `chromium` the tests
that need it skip (scripts/setup_tests.sh installs it). Every request a page makes is recorded
(`Network.requestWillBeSent`), so a test can tell that a page loaded nothing from outside the gateway."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from websockets.sync.client import ClientConnection, connect

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run",
         "--disable-extensions", "--disable-sync", "--disable-default-apps", "--disable-component-update",
         "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0")


class Page:
    """One tab (a target attached in flat mode): `send` a command, read `events`, `evaluate` JavaScript."""

    def __init__(self, ws: ClientConnection, session: str, browser: Browser) -> None:
        self.ws, self.session, self.browser = ws, session, browser
        self.requested: list[str] = []

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        return self.browser.call(method, params, self.session)

    def evaluate(self, expression: str) -> Any:
        """The value of `expression` in the page; None while the page is between two documents (a reload)."""
        result = self.browser.call("Runtime.evaluate", {"expression": expression, "returnByValue": True},
                                   self.session, check=False)
        return result.get("result", {}).get("value")

    def close(self) -> None:
        target = self.browser.call("Target.getTargetInfo", {}, self.session).get("targetInfo", {}).get("targetId")
        if target:
            self.browser.call("Target.closeTarget", {"targetId": target})

    def wait_for(self, expression: str, timeout_s: float = 60.0) -> Any:
        """Evaluate `expression` until it is truthy (returned), or fail after `timeout_s` (a hang guard)."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            assert time.monotonic() < deadline, f"never true: {expression}"
            time.sleep(0.1)


class Browser:
    """`chromium` with a fresh profile in `folder`, its DevTools endpoint on a loopback port of its choosing."""

    def __init__(self, folder: Path) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        if binary is None:
            pytest.skip("chromium is not installed (scripts/setup_tests.sh installs Debian's package)")
        profile = folder / "profile"
        profile.mkdir(parents=True, exist_ok=True)
        self.log = folder / "chromium.log"
        self.proc = subprocess.Popen([binary, *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=self.log.open("wb"))
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port, path = port_file.read_text().splitlines()[:2]
        self.ws = connect(f"ws://127.0.0.1:{port}{path}", max_size=None, open_timeout=30)
        self._next = 0
        self.pages: dict[str, Page] = {}
        self.events: list[dict[str, Any]] = []  # received while waiting for a reply, for `wait_event`

    def _receive(self, timeout_s: float) -> dict[str, Any]:
        message: dict[str, Any] = json.loads(self.ws.recv(timeout=timeout_s))
        if message.get("method") == "Network.requestWillBeSent" and message.get("sessionId") in self.pages:
            self.pages[message["sessionId"]].requested.append(message["params"]["request"]["url"])
        return message

    def wait_event(self, session: str, methods: set[str], timeout_s: float = 60.0) -> dict[str, Any]:
        """The next event of `session` among `methods` (one already received first)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for i, event in enumerate(self.events):
                if event.get("sessionId") == session and event.get("method") in methods:
                    return self.events.pop(i)
            left = deadline - time.monotonic()
            assert left > 0, f"no {methods} within {timeout_s} s"
            self.events.append(self._receive(left))
            del self.events[:-1000]  # the ones nobody waits for

    def post(self, method: str, params: dict[str, Any], session: str | None = None) -> int:
        """Send a command without waiting for its answer (one that answers only after events the caller must
        handle first, as a navigation whose requests are paused); returns its id."""
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params}
        if session is not None:
            message["sessionId"] = session
        self.ws.send(json.dumps(message))
        return self._next

    def call(self, method: str, params: dict[str, Any], session: str | None = None,
             check: bool = True) -> dict[str, Any]:
        ident = self.post(method, params, session)
        while True:
            reply = self._receive(60)
            if "id" not in reply:
                self.events.append(reply)
                del self.events[:-1000]
            elif reply.get("id") == ident:
                assert not check or "error" not in reply, (method, reply.get("error"))
                result: dict[str, Any] = reply.get("result", {})
                return result

    def new_page(self, headers: dict[str, str] | None = None) -> Page:
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = self.pages[session] = Page(self.ws, session, self)
        page.send("Network.enable")
        if headers:
            page.send("Network.setExtraHTTPHeaders", headers=headers)
        page.send("Page.enable")
        return page

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
