"""Run the real ``tritonserver`` binary shipped in the ``nvidia-pytriton`` wheel as a child process.

Contract:

* ``EmbeddedTriton(...).start()`` launches Triton 2.51 on 127.0.0.1 with the given (or free) gRPC,
  HTTP and metrics ports, a model repository (default ``<repo>/triton_models``) and
  ``--model-control-mode=explicit``: every model named in ``models`` (or ``*`` = all) is loaded at
  start-up.  It returns once ``/v2/health/ready`` is 200 and ``POST /v2/repository/index`` shows every
  expected model ``READY``; a model in state ``UNAVAILABLE`` or an early exit raises
  ``TritonLaunchError`` carrying Triton's own reason text (after stopping the process).
* The child gets ``OPENAI_API_MODELS_DIR`` (prepared weights) and a ``PYTHONPATH`` with the repo root
  and this interpreter's site-packages, so Python-backend stubs import torch/transformers from the
  active virtual environment.  ``LD_LIBRARY_PATH`` lists this interpreter's libpython dir before
  the wheel's bundled libs, otherwise the stub binds the system libpython.
* Triton runs in its own session (process group) with ``PR_SET_PDEATHSIG=SIGTERM``; ``stop()``
  sends SIGTERM to a ready Triton (graceful unload, models' ``finalize`` run), then SIGKILLs the
  whole group (at once for a Triton still loading), so no ``triton_python_backend_stub`` outlives
  it.  An ``atexit`` hook stops leftovers.
* Triton's stdout/stderr go to ``log_path`` (a file in a private temp dir, kept after stop); a
  restart appends to the same file after a ``==== restart N, attempt M ====`` marker line.

Supervision (``supervise=True``; the gateway's ``--embedded-triton`` turns it on):

* Once ``start()`` has succeeded, a ``triton-supervisor`` thread checks the child every
  ``_POLL_S`` (0.5 s) without reaping it.  Any exit that ``stop()`` did not ask for (a crash, a
  signal, even exit code 0) is logged at ERROR with the exit code or signal name and the last lines
  of Triton's log.  Before the leader is reaped (so its pid, the group id, cannot be reused) the
  whole process group is SIGKILLed and the supervisor waits until no live member is left: orphaned
  Python-backend stubs are killed, stubs that were re-parented to this process (the gateway as
  PID 1 in a container) are reaped, and the stubs' ``/dev/shm/triton_python_backend_shm_region_*``
  files, which only Triton itself would have unlinked, are removed.
* Triton is then restarted on the same ports, with the same models, after a delay: ``restart_delay``
  (1 s) doubling per attempt up to ``max_restart_delay`` (30 s).  A restart that does not become
  ready (early exit, a port still in use, a model that fails to load, ``startup_timeout``) is
  killed the same way and retried with the next delay; the supervisor never raises.  The delay goes
  back to ``restart_delay`` when a crash comes after Triton has stayed up ``stable_after`` (60 s).
  Every attempt and its outcome is logged; ``restarts`` counts the successful ones.
* A failure of the *first* ``start()`` is not retried: it raises ``TritonLaunchError``.
* ``stop()`` turns supervision off before anything else, so a deliberate stop is never restarted.
  It works at any moment, including during a back-off delay or a restart in progress; when it
  returns, no process of any Triton this object started is alive and the supervisor has ended.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from types import TracebackType
from typing import Any

from openai_api.embedded.load_watch import IDLE_SILENCE, IdleWatch, kill_stubs
from openai_api.embedded.processes import (
    Spawner,
    describe_exit,
    exit_code,
    free_port,
    kill_group,
    shm_regions,
    with_pdeathsig,
)

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_REPOSITORY = REPO_ROOT / "triton_models"
_LOADED_RE = re.compile(r"successfully loaded '([^']+)'")
_POLL_S = 0.5  # how often the supervisor checks the child
_CRASH_TAIL_LINES = 20


class TritonLaunchError(RuntimeError):
    """Triton failed to start or a model failed to load; the message carries Triton's reason."""


def _pytriton_root() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("pytriton")
    if spec is None or spec.origin is None:
        raise TritonLaunchError("nvidia-pytriton is not installed")
    root = Path(spec.origin).parent / "tritonserver"
    if not (root / "bin" / "tritonserver").is_file():
        raise TritonLaunchError(f"no tritonserver binary under {root}")
    return root


_live: weakref.WeakSet[EmbeddedTriton] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.stop(timeout=5.0)


class EmbeddedTriton:
    """A tritonserver child process serving ``model_repository`` on 127.0.0.1.

    With ``supervise=True`` a crashed Triton is cleaned up and restarted on the same ports (see the
    module docstring): ``restart_delay`` is the first back-off delay in seconds, doubled per attempt
    up to ``max_restart_delay``, and reset once Triton has stayed up ``stable_after`` seconds.
    ``state`` is ``"stopped"``, ``"starting"``, ``"ready"`` or ``"restarting"`` (down, in back-off or
    loading again).
    """

    def __init__(
        self,
        model_repository: Path | None = None,
        *,
        models: list[str] | None = None,
        grpc_port: int | None = None,
        http_port: int | None = None,
        metrics_port: int | None = None,
        models_dir: Path | None = None,
        log_verbose: int = 0,
        startup_timeout: float = 300.0,
        stall_timeout: float | None = None,
        extra_args: list[str] | None = None,
        supervise: bool = False,
        restart_delay: float = 1.0,
        max_restart_delay: float = 30.0,
        stable_after: float = 60.0,
        auto_complete: bool | None = None,
    ) -> None:
        self.model_repository = Path(model_repository or DEFAULT_MODEL_REPOSITORY).resolve()
        # Triton's config auto-completion runs every Python model's model.py in a stub process of its own before
        # the instance's stub (~2 s of CPU each: their imports), to ask for a config it already has. This
        # repository's models carry complete configs (tests/unit/test_launcher_command.py), so it is off for
        # them (None); a repository of the user's keeps it, as Triton does.
        self.auto_complete = (self.model_repository != DEFAULT_MODEL_REPOSITORY.resolve()
                              if auto_complete is None else auto_complete)
        self.models = list(models) if models is not None else None
        self.grpc_port = grpc_port or free_port((http_port, metrics_port))
        self.http_port = http_port or free_port((self.grpc_port, metrics_port))
        self.metrics_port = metrics_port or free_port((self.grpc_port, self.http_port))
        if models_dir is None:
            env_dir = os.environ.get("OPENAI_API_MODELS_DIR")
            models_dir = Path(env_dir) if env_dir else REPO_ROOT / "models"
        self.models_dir = Path(models_dir).resolve()
        self.log_verbose = log_verbose
        self.startup_timeout = startup_timeout
        # A start whose log stops growing for this long is given up before `startup_timeout` (None: never). A
        # Python-backend stub starved of CPU can miss Triton's 1 s initialization window, and Triton then waits
        # for it forever: idle, its log silent (seen in the e2e tier under load: 8 minutes lost per hang). With
        # it set, a start whose log has been silent for IDLE_SILENCE s and whose processes are idle
        # (`load_watch.IdleWatch`) has its hung loads ended and loaded again, once; idle again, it is given up.
        self.stall_timeout = stall_timeout
        self.extra_args = list(extra_args or [])
        self.supervise = supervise
        self.restart_delay = restart_delay
        self.max_restart_delay = max(max_restart_delay, restart_delay)
        self.stable_after = stable_after
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._log_path: Path | None = None
        self._cmd: list[str] = []
        self._child_env: dict[str, str] = {}
        self._state = "stopped"
        self._ready_at = 0.0
        self._restarts = 0
        self._monitor: threading.Thread | None = None
        self._shm: dict[int, set[str]] = {}  # Triton pid -> Python-backend shm files it was seen to map
        # Set first thing by stop(): the supervisor neither restarts nor spawns once it is set.
        self._stopping = threading.Event()
        # Guards spawning and swapping _proc, so stop() sees every child the supervisor starts.
        self._proc_lock = threading.Lock()
        self._reviving: set[str] = set()  # models whose hung load `_revive` ended, loading again
        self._stop_lock = threading.Lock()

    # ------------------------------------------------------------------ properties
    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def log_path(self) -> Path | None:
        """File holding Triton's stdout+stderr (set once started; survives ``stop``)."""
        return self._log_path

    @property
    def state(self) -> str:
        return self._state

    @property
    def restarts(self) -> int:
        """How many times the supervisor brought Triton back (successful restarts only)."""
        return self._restarts

    def is_running(self) -> bool:
        proc = self._proc
        return proc is not None and exit_code(proc) is None

    # ------------------------------------------------------------------ lifecycle
    def _assemble_backends(self, root: Path, workdir: Path) -> Path:
        # The wheel's backends/python lacks the stub; build a private backends dir with the stub for
        # this interpreter's version next to libtriton_python.so (where the backend looks for it).
        version = f"{sys.version_info.major}.{sys.version_info.minor}"
        stub = root / "python_backend_stubs" / version / "triton_python_backend_stub"
        if not stub.is_file():
            raise TritonLaunchError(f"no Python backend stub for Python {version} in {stub.parent.parent}")
        backends = workdir / "backends"
        py = backends / "python"
        py.mkdir(parents=True)
        for src in (root / "backends" / "python").iterdir():
            if src.is_file():
                shutil.copy2(src, py / src.name)
        shutil.copy2(stub, py / stub.name)
        return backends

    def _env(self, root: Path) -> dict[str, str]:
        env = dict(os.environ)
        libdir = sysconfig.get_config_var("LIBDIR") or ""
        wheel_libs = root.parent.parent / "nvidia_pytriton.libs"
        ld = [p for p in (libdir, str(wheel_libs), env.get("LD_LIBRARY_PATH", "")) if p]
        env["LD_LIBRARY_PATH"] = ":".join(ld)
        paths = [str(REPO_ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = ":".join(dict.fromkeys(paths))
        # The stub's embedded interpreter ignores PYTHONPATH for its prefix: it takes sys.prefix from the
        # first `python3` on PATH. Without this, a gateway started as `.venv/bin/python ...` from a shell
        # with no activated environment gives the models the system interpreter (no torch).
        bindir = str(Path(sys.executable).parent)
        rest = [p for p in env.get("PATH", "").split(os.pathsep) if p and p != bindir]
        env["PATH"] = os.pathsep.join([bindir, *rest])
        if sys.prefix != sys.base_prefix:
            env["VIRTUAL_ENV"] = sys.prefix
        env["OPENAI_API_MODELS_DIR"] = str(self.models_dir)
        return env

    def _command(self, root: Path, backends: Path) -> list[str]:
        cmd = [
            str(root / "bin" / "tritonserver"),
            f"--model-repository={self.model_repository}",
            f"--backend-directory={backends}",
            "--model-control-mode=explicit",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}",
            "--metrics-address=127.0.0.1",
            f"--metrics-port={self.metrics_port}",
            "--allow-gpu-metrics=false",
            # CPU-only models; skips the pinned-pool warning on machines without a CUDA driver.
            "--pinned-memory-pool-byte-size=0",
            # Keep serving when a model fails so the repository index can tell us why.
            "--exit-on-error=false",
            "--exit-timeout-secs=5",
            f"--log-verbose={self.log_verbose}",
        ]
        if not self.auto_complete:
            cmd.append("--disable-auto-complete-config")
        if self.models is None:
            cmd.append("--load-model=*")
        else:
            cmd += [f"--load-model={name}" for name in self.models]
        return cmd + self.extra_args

    def start(self) -> EmbeddedTriton:
        """Launch Triton and block until it and every requested model are ready; then supervise it if asked.

        A no-op while Triton runs, or while the supervisor is bringing it back (``state == "restarting"``).
        """
        if self.is_running() or (self._monitor is not None and self._monitor.is_alive()):
            return self
        if not self.model_repository.is_dir():
            raise TritonLaunchError(f"model repository {self.model_repository} does not exist")
        root = _pytriton_root()
        self._stopping.clear()
        self._restarts = 0
        self._workdir = Path(tempfile.mkdtemp(prefix="embedded-triton-"))
        backends = self._assemble_backends(root, self._workdir)
        self._log_path = self._workdir / "tritonserver.log"
        self._cmd = self._command(root, backends)
        self._child_env = self._env(root)
        logger.info(
            "starting tritonserver: grpc=%s http=%s models=%s log=%s",
            self.grpc_url,
            self.http_url,
            self.models or "*",
            self._log_path,
        )
        logger.debug("command: %s", " ".join(self._cmd))
        self._state = "starting"
        t0 = time.monotonic()
        proc = self._spawn()
        _live.add(self)
        try:
            if proc is None:
                raise TritonLaunchError("stopped while starting")
            self._wait_ready(proc, t0 + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        self._ready_at = time.monotonic()
        self._state = "ready"
        logger.info("tritonserver ready in %.1f s (pid %s)", self._ready_at - t0, proc.pid)
        if self.supervise:
            self._monitor = threading.Thread(target=self._supervise, args=(proc,), name="triton-supervisor",
                                             daemon=True)
            self._monitor.start()
        return self

    def _spawn(self, marker: str | None = None) -> subprocess.Popen[bytes] | None:
        """Start the tritonserver process (with a ``marker``: appending to the log); None once stop() began."""
        assert self._log_path is not None and self._workdir is not None
        cmd, env, workdir = self._cmd, self._child_env, str(self._workdir)
        with self._proc_lock:
            if self._stopping.is_set():
                return None
            log_file = open(self._log_path, "ab" if marker else "wb")
            if marker:
                log_file.write(f"\n==== {marker} ====\n".encode())
                log_file.flush()

            def factory() -> subprocess.Popen[bytes]:
                return subprocess.Popen(
                    with_pdeathsig(cmd),
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    cwd=workdir,
                )

            try:
                # From a non-main thread (the supervisor) this forks on the long-lived spawner thread.
                self._proc = Spawner.popen(factory)
            finally:
                log_file.close()
            return self._proc

    def _http(self, method: str, path: str, body: bytes | None = None, timeout: float = 5) -> tuple[int, bytes]:
        req = urllib.request.Request(f"http://{self.http_url}{path}", data=body, method=method)
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

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float, log_offset: int = 0) -> None:
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
            elif self.stall_timeout is not None and now - progressed > self.stall_timeout:
                raise TritonLaunchError(
                    f"tritonserver not ready after {now - started:.0f} s: its log made no progress for "
                    f"{self.stall_timeout:.0f} s (a model's load hung):\n{self.log_tail()}")
            elif self.stall_timeout is not None and now - progressed > min(IDLE_SILENCE, self.stall_timeout):
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
                        f"{self.log_tail()}")
            self._track_shm(proc)
            if self._stopping.is_set():
                raise TritonLaunchError("stopped while starting")
            code = exit_code(proc)
            if code is not None:
                raise TritonLaunchError(f"tritonserver {describe_exit(code)}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TritonLaunchError(
                    f"tritonserver not ready after {self.startup_timeout:.0f} s:\n{self.log_tail()}"
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
            with socket.create_connection(("127.0.0.1", self.metrics_port), timeout=1):
                return True
        except OSError:
            return False

    def _announce_from_log(self, offset: int, announced: set[str]) -> int:
        # Triton loads all start-up models before opening HTTP; the log is the only live progress.
        if self._log_path is None:
            return offset
        try:
            with open(self._log_path, "rb") as fh:
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
        expected = self.models if self.models is not None else list(states)
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
            elif entry is None and self.models is not None:
                raise TritonLaunchError(f"model {name} not found in repository {self.model_repository}")
            else:
                all_ready = False
        return all_ready

    def _revive(self, proc: subprocess.Popen[bytes], announced: set[str], idle: str) -> bool:
        """End the hung loads of a start - the requested models its log has not shown loaded: their stubs are
        killed - and have Triton load those models again once it serves (at start-up its HTTP server opens only
        after the start-up loads end). False when there is nothing to revive (every model loaded, or no list of
        requested models to compare with)."""
        waiting = set(self.models or ()) - announced
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
        deadline = time.monotonic() + self.startup_timeout
        try:
            while time.monotonic() < deadline and not self._stopping.is_set():
                if any(e.get("name") == name and e.get("state") != "LOADING" for e in self._index() or []):
                    break
                time.sleep(0.2)
            status, body = self._http("POST", f"/v2/repository/models/{name}/load", b"{}",
                                      timeout=self.startup_timeout)
            if status != 200:
                logger.warning("loading %s again failed: HTTP %d %s", name, status,
                               body[:500].decode("utf-8", "replace"))
        except (urllib.error.URLError, OSError) as exc:
            logger.warning("loading %s again failed: %s", name, exc)
        finally:
            self._reviving.discard(name)

    def log_tail(self, lines: int = 60) -> str:
        """Last ``lines`` lines of Triton's output."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_bytes()[-65536:].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    # ------------------------------------------------------------------ supervision
    def _supervise(self, proc: subprocess.Popen[bytes]) -> None:
        """Supervisor thread: watch ``proc``; on an unexpected exit clean up and restart (module docstring)."""
        try:
            delay = self.restart_delay
            while not self._stopping.wait(_POLL_S):
                code = exit_code(proc)
                if code is None:
                    self._track_shm(proc)  # a stub Triton restarts gets a new region
                    continue
                if self._stopping.is_set():
                    return  # stop() is ending it
                self._state = "restarting"
                up_s = time.monotonic() - self._ready_at
                tail = self.log_tail(_CRASH_TAIL_LINES)
                stray = [p for p in self._discard(proc) if p != proc.pid]
                logger.error(
                    "tritonserver (pid %d) %s after %.0f s up; killed %d leftover process(es) of its group %s; "
                    "last lines of its log (%s):\n%s",
                    proc.pid, describe_exit(code), up_s, len(stray), stray, self._log_path, tail,
                )
                if up_s >= self.stable_after:
                    delay = self.restart_delay
                restarted = self._restart(delay)
                if restarted is None:
                    return
                proc, delay = restarted
        except Exception:
            logger.exception("tritonserver supervisor failed: Triton is no longer restarted")

    def _restart(self, delay: float) -> tuple[subprocess.Popen[bytes], float] | None:
        """Relaunch until one comes up ready: (the new process, the delay for the next crash); None if stopped."""
        attempt = 0
        while True:
            attempt += 1
            logger.warning("restarting tritonserver in %.1f s (attempt %d)", delay, attempt)
            if self._stopping.wait(delay):
                return None
            t0 = time.monotonic()
            log_offset = self._log_path.stat().st_size if self._log_path and self._log_path.exists() else 0
            self._state = "restarting"
            try:
                proc = self._spawn(f"restart {self._restarts + 1}, attempt {attempt}")
                if proc is None:
                    return None
                logger.info("restart attempt %d: tritonserver pid %d loading %s", attempt, proc.pid,
                            self.models or "*")
                self._wait_ready(proc, t0 + self.startup_timeout, log_offset)
            except Exception as exc:  # noqa: BLE001 - every failure is retried
                if self._stopping.is_set():
                    return None
                lines = str(exc).splitlines()
                reason = "\n".join(lines[:1] + lines[1:][-_CRASH_TAIL_LINES:])
                if self._proc is not None:
                    self._discard(self._proc)
                delay = min(delay * 2, self.max_restart_delay)
                logger.error("restart attempt %d failed after %.1f s: %s", attempt, time.monotonic() - t0, reason)
                continue
            if self._stopping.is_set():
                return None  # stop() owns the new process
            self._ready_at = time.monotonic()
            self._restarts += 1
            self._state = "ready"
            logger.warning(
                "tritonserver restarted (attempt %d): pid %d ready in %.1f s on gRPC %s, HTTP %s, metrics %s",
                attempt, proc.pid, self._ready_at - t0, self.grpc_url, self.http_url, self.metrics_url,
            )
            return proc, min(delay * 2, self.max_restart_delay)

    def _track_shm(self, proc: subprocess.Popen[bytes]) -> None:
        # Triton maps every stub's region; read while it runs, so they can be removed after a crash.
        self._shm.setdefault(proc.pid, set()).update(shm_regions([proc.pid]))

    def _discard(self, proc: subprocess.Popen[bytes]) -> list[int]:
        """Kill ``proc``'s whole group, reap ``proc`` and forget it; returns the pids that were alive."""
        # Before reaping: the zombie leader keeps the group id taken.
        alive = kill_group(proc.pid, self._shm.pop(proc.pid, set()))
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        with self._proc_lock:
            if self._proc is proc:
                self._proc = None
        return alive

    # ------------------------------------------------------------------ stop
    def stop(self, timeout: float = 15.0) -> None:
        """Stop Triton for good; idempotent, and safe at any moment (also during a restart or back-off).

        Supervision is turned off first, so this exit is never restarted.  A ready Triton gets SIGTERM
        and up to ``timeout`` s to unload its models; one still loading is not waited for.  Then the
        whole process group is SIGKILLed and drained, the supervisor thread is joined, and no process
        this object started is left alive.
        """
        self._stopping.set()
        with self._stop_lock:
            with self._proc_lock:  # waits out a spawn in flight; none can begin after this
                proc = self._proc
                graceful = self._state == "ready"
            if proc is not None:
                pgid = proc.pid  # start_new_session made Triton its group leader
                if graceful and exit_code(proc) is None:
                    with contextlib.suppress(ProcessLookupError):
                        proc.send_signal(signal.SIGTERM)
                    deadline = time.monotonic() + timeout
                    # Wait without reaping: the zombie leader keeps the group id taken for killpg.
                    while exit_code(proc) is None and time.monotonic() < deadline:
                        time.sleep(0.05)
                    if exit_code(proc) is None:
                        logger.warning("tritonserver did not exit in %.0f s; killing it", timeout)
                # Stubs normally exit with Triton; kill whatever is left of the group.
                self._discard(proc)
                logger.info("tritonserver (pid %s) stopped", pgid)
            monitor, self._monitor = self._monitor, None
            if monitor is not None and monitor is not threading.current_thread():
                monitor.join(timeout=timeout + 30)
                if monitor.is_alive():
                    logger.error("tritonserver supervisor did not end")
            # Nothing can be spawned any more; discard whatever child is still recorded (belt and braces).
            with self._proc_lock:
                proc, self._proc = self._proc, None
            if proc is not None:
                self._discard(proc)
            self._state = "stopped"
            _live.discard(self)
            if self._workdir is not None:
                # Keep the log for post-mortems; the backend copies are just bulk.
                shutil.rmtree(self._workdir / "backends", ignore_errors=True)

    def __enter__(self) -> EmbeddedTriton:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def _raise_interrupt(signum: int, frame: object) -> None:
    # Treat SIGTERM like Ctrl-C so the finally block stops Triton.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the embedded tritonserver in the foreground.")
    parser.add_argument("--model-repository", type=Path, default=None)
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--grpc-port", type=int, default=None)
    parser.add_argument("--http-port", type=int, default=None)
    parser.add_argument("--metrics-port", type=int, default=None)
    parser.add_argument("--models", default=None, help="comma-separated subset to load (default all)")
    parser.add_argument("--log-verbose", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = EmbeddedTriton(
        args.model_repository,
        models=[m for m in args.models.split(",") if m] if args.models else None,
        grpc_port=args.grpc_port,
        http_port=args.http_port,
        metrics_port=args.metrics_port,
        models_dir=args.models_dir,
        log_verbose=args.log_verbose,
    )
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        server.start()
        print(
            f"grpc {server.grpc_url}\nhttp {server.http_url}\nmetrics {server.metrics_url}\n"
            f"log {server.log_path}\npid {server.pid}",
            flush=True,
        )
        while server.is_running():
            time.sleep(0.5)
        print(f"tritonserver exited:\n{server.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except TritonLaunchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        server.stop()


if __name__ == "__main__":
    raise SystemExit(main())
