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
  sends SIGTERM to Triton (graceful unload, models' ``finalize`` run), then SIGKILLs the whole group,
  so no ``triton_python_backend_stub`` outlives it.  An ``atexit`` hook stops leftovers.
* Triton's stdout/stderr go to ``log_path`` (a file in a private temp dir, kept after stop).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import json
import logging
import os
import queue
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
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL_REPOSITORY = REPO_ROOT / "triton_models"
_PR_SET_PDEATHSIG = 1
_LOADED_RE = re.compile(r"successfully loaded '([^']+)'")


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


def _free_port(taken: tuple[int | None, ...] = ()) -> int:
    """A port free now on 127.0.0.1 and not in ``taken`` (the kernel may hand the same one out twice)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port


def _load_prctl() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Resolved in the parent so the child only makes one plain libc call between fork and exec.
_PRCTL = _load_prctl()


def _set_pdeathsig() -> None:
    # Runs in the child between fork and exec: Triton gets SIGTERM when the spawning thread dies.
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


class _Spawner:
    """Long-lived thread that forks children on behalf of non-main threads.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so forking from a
    short-lived worker thread (e.g. ``asyncio.to_thread``) would kill Triton when that thread ends.
    """

    _lock = threading.Lock()
    _queue: queue.Queue[tuple[Callable[[], subprocess.Popen[bytes]], queue.Queue[Any]]] | None = None

    @classmethod
    def popen(cls, factory: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        if threading.current_thread() is threading.main_thread():
            return factory()
        with cls._lock:
            if cls._queue is None:
                cls._queue = queue.Queue()
                threading.Thread(target=cls._run, args=(cls._queue,), name="triton-spawner", daemon=True).start()
        reply: queue.Queue[Any] = queue.Queue()
        cls._queue.put((factory, reply))
        result = reply.get()
        if isinstance(result, BaseException):
            raise result
        return result  # type: ignore[no-any-return]

    @staticmethod
    def _run(jobs: queue.Queue[tuple[Callable[[], subprocess.Popen[bytes]], queue.Queue[Any]]]) -> None:
        while True:
            factory, reply = jobs.get()
            try:
                reply.put(factory())
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                reply.put(exc)


_live: weakref.WeakSet[EmbeddedTriton] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for server in list(_live):
        with contextlib.suppress(Exception):
            server.stop(timeout=5.0)


class EmbeddedTriton:
    """A tritonserver child process serving ``model_repository`` on 127.0.0.1."""

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
        extra_args: list[str] | None = None,
    ) -> None:
        self.model_repository = Path(model_repository or DEFAULT_MODEL_REPOSITORY).resolve()
        self.models = list(models) if models is not None else None
        self.grpc_port = grpc_port or _free_port((http_port, metrics_port))
        self.http_port = http_port or _free_port((self.grpc_port, metrics_port))
        self.metrics_port = metrics_port or _free_port((self.grpc_port, self.http_port))
        if models_dir is None:
            env_dir = os.environ.get("OPENAI_API_MODELS_DIR")
            models_dir = Path(env_dir) if env_dir else REPO_ROOT / "models"
        self.models_dir = Path(models_dir).resolve()
        self.log_verbose = log_verbose
        self.startup_timeout = startup_timeout
        self.extra_args = list(extra_args or [])
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._log_path: Path | None = None
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
        return self._proc.pid if self._proc is not None else None

    @property
    def log_path(self) -> Path | None:
        """File holding Triton's stdout+stderr (set once started; survives ``stop``)."""
        return self._log_path

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

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
        if self.models is None:
            cmd.append("--load-model=*")
        else:
            cmd += [f"--load-model={name}" for name in self.models]
        return cmd + self.extra_args

    def start(self) -> EmbeddedTriton:
        """Launch Triton and block until it and every requested model are ready."""
        if self.is_running():
            return self
        if not self.model_repository.is_dir():
            raise TritonLaunchError(f"model repository {self.model_repository} does not exist")
        root = _pytriton_root()
        self._workdir = Path(tempfile.mkdtemp(prefix="embedded-triton-"))
        backends = self._assemble_backends(root, self._workdir)
        self._log_path = self._workdir / "tritonserver.log"
        cmd = self._command(root, backends)
        env = self._env(root)
        logger.info(
            "starting tritonserver: grpc=%s http=%s models=%s log=%s",
            self.grpc_url,
            self.http_url,
            self.models or "*",
            self._log_path,
        )
        logger.debug("command: %s", " ".join(cmd))
        log_file = open(self._log_path, "wb")

        def factory() -> subprocess.Popen[bytes]:
            return subprocess.Popen(
                cmd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=str(self._workdir),
                # Only a pre-resolved libc prctl runs after fork, so threads holding locks don't matter.
                preexec_fn=_set_pdeathsig,
            )

        try:
            self._proc = _Spawner.popen(factory)
        finally:
            log_file.close()
        _live.add(self)
        t0 = time.monotonic()
        try:
            self._wait_ready(t0 + self.startup_timeout)
        except BaseException:
            self.stop()
            raise
        logger.info("tritonserver ready in %.1f s (pid %s)", time.monotonic() - t0, self.pid)
        return self

    def _http(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(f"http://{self.http_url}{path}", data=body, method=method)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=5) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def _wait_ready(self, deadline: float) -> None:
        announced: set[str] = set()
        log_offset = 0
        while True:
            log_offset = self._announce_from_log(log_offset, announced)
            if self._proc is None or self._proc.poll() is not None:
                code = self._proc.returncode if self._proc is not None else None
                raise TritonLaunchError(f"tritonserver exited with code {code}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise TritonLaunchError(
                    f"tritonserver not ready after {self.startup_timeout:.0f} s:\n{self.log_tail()}"
                )
            try:
                status, body = self._http("POST", "/v2/repository/index", b"{}")
            except (urllib.error.URLError, OSError):
                time.sleep(0.2)
                continue
            if status == 200 and self._check_index(json.loads(body or b"[]"), announced):
                ready, _ = self._http("GET", "/v2/health/ready")
                if ready == 200:
                    return
            time.sleep(0.2)

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
            elif state == "UNAVAILABLE":
                reason = (entry or {}).get("reason", "") or "unknown reason"
                raise TritonLaunchError(f"model {name} failed to load: {reason}")
            elif entry is None and self.models is not None:
                raise TritonLaunchError(f"model {name} not found in repository {self.model_repository}")
            else:
                all_ready = False
        return all_ready

    def log_tail(self, lines: int = 60) -> str:
        """Last ``lines`` lines of Triton's output."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_bytes()[-65536:].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM Triton, wait up to ``timeout`` s, then SIGKILL its whole process group. Idempotent."""
        with self._stop_lock:
            proc = self._proc
            if proc is None:
                return
            pgid = proc.pid  # start_new_session made Triton its group leader
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    logger.warning("tritonserver did not exit in %.0f s; killing it", timeout)
            # Stubs normally exit with Triton; kill whatever is left of the group.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            _live.discard(self)
            logger.info("tritonserver (pid %s) stopped", pgid)
            self._proc = None
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
