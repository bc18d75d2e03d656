"""When a tritonserver start is done: it polls the start (Triton's log for models loaded, its repository index
for each requested model's state, its health and metrics ports) until every requested model is ready, and raises
`TritonLaunchError` with Triton's own reason for an early exit, a model that failed to load, a deadline passed or a
start that hung. A hung load (its log silent, its processes idle: `load_watch`) has its stubs killed and its models
loaded again once per start. Apart from the launcher, which decides what a failed start leads to (a stop, or the
next restart attempt); one watch per start, the first and each restart."""

from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from openai_api.embedded.command import TritonLaunchError, TritonSpec
from openai_api.embedded.load_watch import IDLE_SILENCE, IdleWatch, kill_stubs
from openai_api.embedded.processes import describe_exit, exit_code

logger = logging.getLogger("openai_api.embedded.launcher")  # the launcher's log, as before the split
_LOADED_RE = re.compile(r"successfully loaded '([^']+)'")


class Watched(TritonSpec, Protocol):
    """What a start's watch reads of the server it watches (`launcher.EmbeddedTriton`), each time it looks."""

    startup_timeout: float
    stall_timeout: float | None

    @property
    def http_url(self) -> str: ...

    @property
    def log_path(self) -> Path | None: ...

    def log_tail(self, lines: int = 60) -> str: ...


class StartWatch:
    """One start of `server`'s tritonserver (the first or a restart), watched until it serves (`wait_ready`).
    `stopping` set (by the launcher's stop) ends the wait; `on_poll` runs on every poll (the launcher records the
    stubs' shared memory there)."""

    def __init__(self, server: Watched, stopping: threading.Event,
                 on_poll: Callable[[subprocess.Popen[bytes]], None]) -> None:
        self.server = server
        self._stopping = stopping
        self._on_poll = on_poll
        self._reviving: set[str] = set()  # models whose hung load `_revive` ended, loading again

    def _http(self, method: str, path: str, body: bytes | None = None, timeout: float = 5) -> tuple[int, bytes]:
        req = urllib.request.Request(f"http://{self.server.http_url}{path}", data=body, method=method)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def _index(self) -> list[dict[str, Any]] | None:
        """Triton's repository index, or None while it does not answer (not serving yet, or an error status)."""
        try:
            status, body = self._http("POST", "/v2/repository/index", b"{}")
        except (urllib.error.URLError, OSError):
            return None
        return json.loads(body or b"[]") if status == 200 else None

    def wait_ready(self, proc: subprocess.Popen[bytes], deadline: float, log_offset: int = 0) -> None:
        announced: set[str] = set()
        started = progressed = time.monotonic()
        watch = IdleWatch(proc.pid)
        revived = False
        self._reviving = set()
        while True:
            before = log_offset
            log_offset = self._announce_from_log(log_offset, announced)
            now = time.monotonic()
            if log_offset != before:
                progressed = now
                watch.progressed()
            elif self.server.stall_timeout is not None and now - progressed > self.server.stall_timeout:
                raise TritonLaunchError(
                    f"tritonserver not ready after {now - started:.0f} s: its log made no progress for "
                    f"{self.server.stall_timeout:.0f} s (a model's load hung):\n{self.server.log_tail()}")
            elif (self.server.stall_timeout is not None
                  and now - progressed > min(IDLE_SILENCE, self.server.stall_timeout)):
                idle = watch.idle(now)
                if idle is not None and not revived and self._revive(proc, announced, idle):
                    # Once per start: the hung loads' stubs are killed (Triton's load thread waiting for them
                    # returns, their models UNAVAILABLE) and those models loaded again, seconds instead of a
                    # restart of every model.
                    revived = True
                    progressed = time.monotonic()
                    watch.progressed()
                elif idle is not None:
                    raise TritonLaunchError(
                        f"tritonserver not ready after {now - started:.0f} s: its log silent for "
                        f"{now - progressed:.0f} s and its processes idle ({idle}): a model's load hung:\n"
                        f"{self.server.log_tail()}")
            self._on_poll(proc)
            if self._stopping.is_set():
                raise TritonLaunchError("stopped while starting")
            code = exit_code(proc)
            if code is not None:
                raise TritonLaunchError(f"tritonserver {describe_exit(code)}:\n{self.server.log_tail()}")
            if time.monotonic() > deadline:
                raise TritonLaunchError(
                    f"tritonserver not ready after {self.server.startup_timeout:.0f} s:\n{self.server.log_tail()}"
                )
            index = self._index()
            if index is not None and self._check_index(index, announced):
                ready, _ = self._http("GET", "/v2/health/ready")
                if ready == 200 and self._metrics_listening():
                    return
            time.sleep(0.2)

    def _metrics_listening(self) -> bool:
        """Triton opens its metrics port just after its HTTP port: a caller told "ready" scrapes it at once."""
        try:
            with socket.create_connection(("127.0.0.1", self.server.metrics_port), timeout=1):
                return True
        except OSError:
            return False

    def _announce_from_log(self, offset: int, announced: set[str]) -> int:
        # Triton loads all start-up models before opening HTTP; the log is the only live progress.
        if self.server.log_path is None:
            return offset
        try:
            with open(self.server.log_path, "rb") as fh:
                fh.seek(offset)
                chunk = fh.read()
        except OSError:
            return offset
        end = chunk.rfind(b"\n")
        if end < 0:
            return offset
        for line in chunk[: end + 1].decode("utf-8", "replace").splitlines():
            match = _LOADED_RE.search(line)
            if match and match.group(1) not in announced:
                announced.add(match.group(1))
                logger.info("model %s ready", match.group(1))
        return offset + end + 1

    def _check_index(self, index: list[dict[str, Any]], announced: set[str]) -> bool:
        """True when every expected model is READY; raises for an UNAVAILABLE one."""
        states = {entry.get("name", ""): entry for entry in index}
        expected = self.server.models if self.server.models is not None else list(states)
        all_ready = True
        for name in expected:
            entry = states.get(name)
            state = (entry or {}).get("state", "")
            if state == "READY":
                if name not in announced:
                    announced.add(name)
                    logger.info("model %s ready", name)
            elif state == "UNAVAILABLE" and name in self._reviving:
                all_ready = False  # its hung load was ended by `_revive`; loading again
            elif state == "UNAVAILABLE":
                reason = (entry or {}).get("reason", "") or "unknown reason"
                raise TritonLaunchError(f"model {name} failed to load: {reason}")
            elif entry is None and self.server.models is not None:
                raise TritonLaunchError(f"model {name} not found in repository {self.server.model_repository}")
            else:
                all_ready = False
        return all_ready

    def _revive(self, proc: subprocess.Popen[bytes], announced: set[str], idle: str) -> bool:
        """End the hung loads of a start - the requested models its log has not shown loaded: their stubs are
        killed - and have Triton load those models again once it serves (at start-up its HTTP server opens only
        after the start-up loads end). False when there is nothing to revive (every model loaded, or no list of
        requested models to compare with)."""
        waiting = set(self.server.models or ()) - announced
        if not waiting:
            return False
        killed = kill_stubs(proc.pid, waiting)
        logger.warning("tritonserver start hung (log silent, processes idle: %s) loading %s; killed stubs %s and "
                       "loading those models again", idle, sorted(waiting), killed)
        self._reviving = set(waiting)
        for name in sorted(waiting):
            threading.Thread(target=self._load_again, args=(name,), name=f"triton-reload-{name}",
                             daemon=True).start()
        return True

    def _load_again(self, name: str) -> None:
        """Once Triton serves and ``name`` is no longer LOADING (its killed load ended), load it again."""
        deadline = time.monotonic() + self.server.startup_timeout
        try:
            while time.monotonic() < deadline and not self._stopping.is_set():
                if any(e.get("name") == name and e.get("state") != "LOADING" for e in self._index() or []):
                    break
                time.sleep(0.2)
            status, body = self._http("POST", f"/v2/repository/models/{name}/load", b"{}",
                                      timeout=self.server.startup_timeout)
            if status != 200:
                logger.warning("loading %s again failed: HTTP %d %s", name, status,
                               body[:500].decode("utf-8", "replace"))
        except (urllib.error.URLError, OSError) as exc:
            logger.warning("loading %s again failed: %s", name, exc)
        finally:
            self._reviving.discard(name)
