"""A tritonserver child process as the launcher holds it: its settings (model repository, models, ports, log
verbosity, deadlines, supervision's delays), its state, and what is done to one spawned process - spawning it into
its log (a restart appends after a marker line), waiting until it serves (`readiness.StartWatch`), reading its log,
recording its Python-backend stubs' shared memory, and discarding its whole process group. Apart from
`launcher.EmbeddedTriton`, built on it, which decides when each happens: the first start, the supervisor's
restarts, the stop."""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
from pathlib import Path

from openai_api.embedded.command import DEFAULT_MODEL_REPOSITORY, REPO_ROOT
from openai_api.embedded.processes import Spawner, exit_code, free_port, kill_group, shm_regions, with_pdeathsig
from openai_api.embedded.readiness import StartWatch


class TritonChild:
    """The settings, state and child-process operations of `launcher.EmbeddedTriton` (its base class; see there)."""

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

    def _wait_ready(self, proc: subprocess.Popen[bytes], deadline: float, log_offset: int = 0) -> None:
        """Block until this start of ``proc`` serves every requested model (``readiness.StartWatch``), or raise
        ``TritonLaunchError`` with Triton's reason."""
        StartWatch(self, self._stopping, self._track_shm).wait_ready(proc, deadline, log_offset)

    def log_tail(self, lines: int = 60) -> str:
        """Last ``lines`` lines of Triton's output."""
        if self._log_path is None or not self._log_path.exists():
            return ""
        text = self._log_path.read_bytes()[-65536:].decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

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
