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

This module decides when: the first start, the supervisor's restarts, the stop, and ``main`` (the foreground
command). What the child runs is ``command``; the child's settings and what is done to one spawned process,
``child.TritonChild`` (``EmbeddedTriton``'s base class); when a start is done, ``readiness``; process groups and
the death signal, ``processes``; a hung load told from a slow one, ``load_watch``.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path
from types import TracebackType

from openai_api.embedded.child import TritonChild
from openai_api.embedded.command import TritonLaunchError, assemble_backends, child_env, command_line, pytriton_root
from openai_api.embedded.processes import describe_exit, exit_code

# TritonLaunchError is part of the launcher's contract (module docstring): imported from here, as before the split.
__all__ = ["EmbeddedTriton", "TritonLaunchError", "main"]

logger = logging.getLogger(__name__)

_POLL_S = 0.5  # how often the supervisor checks the child
_CRASH_TAIL_LINES = 20


_live: weakref.WeakSet[EmbeddedTriton] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.stop(timeout=5.0)


class EmbeddedTriton(TritonChild):
    """A tritonserver child process serving ``model_repository`` on 127.0.0.1.

    With ``supervise=True`` a crashed Triton is cleaned up and restarted on the same ports (see the
    module docstring): ``restart_delay`` is the first back-off delay in seconds, doubled per attempt
    up to ``max_restart_delay``, and reset once Triton has stayed up ``stable_after`` seconds.
    ``state`` is ``"stopped"``, ``"starting"``, ``"ready"`` or ``"restarting"`` (down, in back-off or
    loading again).
    """

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> EmbeddedTriton:
        """Launch Triton and block until it and every requested model are ready; then supervise it if asked.

        A no-op while Triton runs, or while the supervisor is bringing it back (``state == "restarting"``).
        """
        if self.is_running() or (self._monitor is not None and self._monitor.is_alive()):
            return self
        if not self.model_repository.is_dir():
            raise TritonLaunchError(f"model repository {self.model_repository} does not exist")
        root = pytriton_root()
        self._stopping.clear()
        self._restarts = 0
        self._workdir = Path(tempfile.mkdtemp(prefix="embedded-triton-"))
        backends = assemble_backends(root, self._workdir)
        self._log_path = self._workdir / "tritonserver.log"
        self._cmd = command_line(self, root, backends)
        self._child_env = child_env(root, self.models_dir)
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
