"""`--workers N`: N gateway processes serving one port, started, watched and stopped by the process the CLI
started (the supervisor), as gunicorn's arbiter or vLLM's `--api-server-count` run theirs.

* **A listening socket per worker, SO_REUSEPORT** (Linux), bound here and inherited by its worker
  (`pass_fds`): the kernel spreads new connections over the workers' sockets by a hash of the
  connection. Chosen over one socket shared by all: with a shared socket every worker wakes for a new
  connection and asyncio accepts up to 100 per wake-up, so the first worker awake takes a whole burst;
  measured here, 15 of the 16 keep-alive connections a pooled client opened at once went to one worker,
  which then carried all of that client's load. The costs: a busy worker still gets its share of new
  connections, and a worker that dies takes with it the connections queued on its socket but not yet
  accepted (they are reset; its restart gets a fresh socket, so nothing waits on a dead one). Before
  any worker starts, the port is bound once without SO_REUSEPORT, so a port held by anyone (another
  gateway with workers included) fails start-up as a single process's would. Where SO_REUSEPORT does not balance
  (macOS, the BSDs), all workers share one socket instead.
* **Each worker is a fresh interpreter** (`python -m openai_api.worker`; nothing forked from this process,
  whose threads include the embedded Triton's supervisor) in its own process group, so a terminal's
  Ctrl-C reaches the supervisor alone and each worker gets exactly one SIGTERM, from here: a second
  signal would end a worker's drain at once. It reads the settings and config resolved here.
* **The embedded Triton** (`--embedded-triton`) stays here: the CLI starts it once before the workers,
  they all use it, and it is stopped after they have all exited.
* **Metrics**: a fresh PROMETHEUS_MULTIPROC_DIR per run, set in the workers' environment (see
  `openai_api.observability`); a worker that ends is `process_ended` (its in-flight gauges leave the
  sums, its counts stay), and `PROCESSES_FILE` lists the live processes for the process metrics.
* **A worker that exits unasked** (a crash, an OOM kill, SIGKILL) is logged with its exit status and
  started again in its slot after `restart_delay` (1 s), doubling per crash up to `max_restart_delay`
  (30 s), back to 1 s once a worker has stayed up `stable_after` (60 s). A worker whose app cannot be
  built at start-up (`BOOT_FAILURE`: the config every worker shares is wrong, so restarting cannot help)
  stops the gateway with that status; later, the same failure is retried like a crash.
* **A worker that stops running without exiting** (its event loop blocked by a bug, a hung call, SIGSTOP)
  is found by its heartbeat: each worker's loop touches `RUN_DIR/alive-PID` once a second while it serves
  (`heartbeat_path`). One that has not for `--worker-timeout` seconds (30) is killed (SIGKILL) and then
  restarted as a crashed one is. A worker still booting (no file yet) is not judged; nor are workers
  while they drain (the drain has its own deadline).
* **SIGTERM / SIGINT**: every worker is sent SIGTERM and drains (new requests 503, requests in flight get
  --shutdown-grace); the supervisor waits for all of them, then returns 0. A second signal is passed on
  (each worker ends its drain at once); a third, or workers still running `KILL_AFTER_S` past the grace,
  get SIGKILL.
* **The prompt cache's segments** are shared through `RUN_DIR/prompt-segments` (named to the workers in their
  environment, see `openai_api.text.shared_segments`): a session's next turn may land on any worker.
* **SIGHUP** is passed to every worker: each reloads the model config (`openai_api.reload`; each also polls
  the file) and the keys file. A worker started later loads the config file as it is then.

What stays per worker (documented in docs/deployment/workers.md): admission limits, the connection cap, CPU threads,
replica health probes, and the Responses store (refused with workers > 1, see `settings`).
"""

from __future__ import annotations

import errno
import logging
import os
import pickle
import shutil
import signal
import site
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from openai_api.config import GatewayConfig
from openai_api.observability import MULTIPROC_ENV, process_ended, write_processes
from openai_api.settings import Settings
from openai_api.text.shared_segments import FOLDER_ENV as SEGMENTS_ENV

logger = logging.getLogger("openai_api")

HANDOFF = "worker.pickle"  # in the run directory: (GatewayConfig, Settings), read by each worker
BOOT_FAILURE = 4  # a worker's exit status when the app cannot be built from the config
LISTEN_FAILURE = 3  # as uvicorn's own when the port cannot be bound
KILL_AFTER_S = 15.0  # past --shutdown-grace: a worker's cut, uvicorn's shutdown and the lifespan fit in it
_POLL_S = 0.1  # how often worker exits and signals are looked at
_BACKLOG = 2048  # uvicorn's default
# Linux balances connections over the sockets of a SO_REUSEPORT group; elsewhere the option does not
# balance, so there the workers share one set of sockets.
REUSE_PORT = sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")
# Where `openai_api` is imported from here: the workers must run this same code. From an installed copy
# (site-packages) they find it anyway; from a checkout or an editable install of another tree, they are
# pointed at this one (PYTHONPATH), and never at a copy in their cwd (python -P).
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
_INSTALLED = _PACKAGE_ROOT in {str(Path(p).resolve()) for p in (*site.getsitepackages(), site.getusersitepackages())}


def heartbeat_path(run_dir: str | Path, pid: int) -> Path:
    """The file worker `pid` touches once a second while its event loop runs (per pid, so a restarted
    worker never inherits its predecessor's last beat)."""
    return Path(run_dir) / f"alive-{pid}"


def bind_listeners(host: str, port: int, *, reuse_port: bool = False, listen: bool = True) -> list[socket.socket]:
    """Sockets for `host` and `port` as asyncio's `create_server` (a single process's uvicorn) binds them:
    one per address the host resolves to (`localhost`: 127.0.0.1 and ::1), SO_REUSEADDR, IPv6 only on an
    IPv6 socket, an IPv6 address the system does not have skipped; SO_REUSEPORT if asked; listening
    unless `listen` is false (a probe that the port is free)."""
    infos = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    sockets: list[socket.socket] = []
    seen: set[tuple[int, object]] = set()
    try:
        for family, kind, proto, _, address in infos:
            if (family, address) in seen:
                continue
            seen.add((family, address))
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:
                if family == socket.AF_INET6 and e.errno == errno.EADDRNOTAVAIL:
                    sockets.pop().close()  # as asyncio: no IPv6 on this host
                    continue
                raise OSError(e.errno, f"cannot listen on {address}: {e.strerror}") from None
            if listen:
                sock.listen(_BACKLOG)
        if not sockets:
            raise OSError(errno.EADDRNOTAVAIL, f"no address to listen on for {host!r}")
        return sockets
    except BaseException:
        for sock in sockets:
            sock.close()
        raise


def describe_exit(code: int) -> str:
    """`Popen.returncode` in words: "exit code 1", "killed by SIGKILL"."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


@dataclass
class WorkerSlot:
    """One of the N places a worker runs in: its process now (None while it waits to start) and its
    restart back-off."""

    index: int
    delay: float
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    due: float | None = 0.0  # when to start it next (monotonic); None: not to be started again
    starts: int = 0
    pids: list[int] = field(default_factory=list)  # every pid it has had, oldest first
    killed_why: str | None = None  # why the supervisor killed the current process, if it did


class Supervisor:
    """Runs `settings.workers` workers of the gateway for `config` until a signal, then drains them all.
    `run()` returns the process exit status."""

    def __init__(self, config: GatewayConfig, settings: Settings, *, restart_delay: float = 1.0,
                 max_restart_delay: float = 30.0, stable_after: float = 60.0) -> None:
        self.config = config
        self.settings = settings
        self.restart_delay = restart_delay
        self.max_restart_delay = max_restart_delay
        self.stable_after = stable_after
        self.slots = [WorkerSlot(i, restart_delay) for i in range(settings.workers)]
        self.stopping = False
        self.exit_code = 0
        self.kill_at: float | None = None
        self._signals: list[int] = []  # appended by the handler, acted on by the loop
        self._acted = 0
        self._shared: list[socket.socket] = []  # every worker's listeners, where not REUSE_PORT
        self._port = settings.port  # the port bound (port 0: the one the system chose)
        self._run_dir: Path | None = None
        self._quota: Any = None  # the keys' counters server (quota.shared.QuotaServer), with a keys file

    @property
    def metrics_dir(self) -> Path:
        assert self._run_dir is not None, "only while running"
        return self._run_dir / "metrics"

    @property
    def segments_dir(self) -> Path:
        """The prompt cache's segments the workers share (`text.shared_segments`), removed with the run directory."""
        assert self._run_dir is not None, "only while running"
        return self._run_dir / "prompt-segments"

    def run(self) -> int:
        s = self.settings
        # First: a signal from here on stops the gateway in order (one that came before the loop stops it
        # before any worker starts).
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        # SIGHUP reloads the model config (openai_api/reload.py) and the keys file: passed on to every worker.
        previous[signal.SIGHUP] = signal.signal(signal.SIGHUP, self._on_signal)
        try:
            try:
                probe = bind_listeners(s.host, s.port, listen=not REUSE_PORT)
            except OSError as e:
                logger.error("%s", e)
                return LISTEN_FAILURE
            self._port = probe[0].getsockname()[1]
            if REUSE_PORT:
                for sock in probe:  # the port is free; each worker gets its own sockets on it (_start)
                    sock.close()
            else:
                self._shared = probe
            # Private (0700): it holds the pickled settings, API keys included.
            self._run_dir = Path(tempfile.mkdtemp(prefix="openai-api-workers-"))
            self.metrics_dir.mkdir()
            if s.prompt_cache_mb > 0:
                self.segments_dir.mkdir()
            if s.responses_store and s.responses_store_url is None:
                # The workers' one Responses store: an SQLite file here, alive while the gateway runs (a URL keeps
                # it across restarts, or shares it between hosts).
                s = self.settings = s.model_copy(update={"responses_store_url": f"sqlite://{self._run_dir}/responses"})
            with open(self._run_dir / HANDOFF, "wb") as f:
                pickle.dump((self.config, self.settings), f)
            if s.keys_file is not None and not s.redis_url:
                # The keys' counters for every worker, exact across them (see openai_api/quota/shared.py).
                from openai_api.quota.shared import QuotaServer

                self._quota = QuotaServer(self._run_dir / "quota.sock")
                self._quota.start()
            logger.info("gateway listening on http://%s:%d/v1 (%d workers, %d models, %s)", s.host, self._port,
                        s.workers, len(self.config.all_models()), s.auth_mode())
            return self._loop()
        finally:
            for slot in self.slots:  # only after an error here: never leave a worker behind
                if slot.proc is not None and slot.proc.poll() is None:
                    slot.proc.kill()
                    slot.proc.wait()
            for sock in self._shared:
                sock.close()
            if self._quota is not None:
                self._quota.stop()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if self._run_dir is not None:
                shutil.rmtree(self._run_dir, ignore_errors=True)
                logger.info("gateway stopped")

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signals.append(signum)  # nothing else in a handler: the loop acts within _POLL_S

    def _loop(self) -> int:
        while True:
            while self._acted < len(self._signals):
                self._acted += 1
                if self._signals[self._acted - 1] == signal.SIGHUP:
                    self._signals.pop(self._acted - 1)  # not a stop: SIGTERM counting ignores it
                    self._acted -= 1
                    logger.info("SIGHUP: the workers reload the model config%s",
                                " and the keys file" if self.settings.keys_file else "")
                    self._send(signal.SIGHUP)
                    continue
                self._signalled(self._signals[self._acted - 1], self._acted)
            now = time.monotonic()
            for slot in self.slots:
                if slot.proc is not None and (code := slot.proc.poll()) is not None:
                    self._ended(slot, code, now)
                elif slot.proc is not None and not self.stopping and slot.killed_why is None:
                    self._check_heartbeat(slot)
                if slot.proc is None and slot.due is not None and now >= slot.due and not self.stopping:
                    self._start(slot)
            if self.stopping:
                if all(slot.proc is None for slot in self.slots):
                    return self.exit_code
                if self.kill_at is not None and now >= self.kill_at:
                    logger.warning("workers still running %.0f s after the grace period: killed", KILL_AFTER_S)
                    self._send(signal.SIGKILL)
                    self.kill_at = None
            time.sleep(_POLL_S)

    def _check_heartbeat(self, slot: WorkerSlot) -> None:
        timeout = self.settings.worker_timeout_s
        if not timeout or slot.proc is None or self._run_dir is None:
            return
        try:
            silent = time.time() - heartbeat_path(self._run_dir, slot.proc.pid).stat().st_mtime
        except FileNotFoundError:
            return  # still booting: it beats once it serves
        if silent > timeout:
            slot.killed_why = f"its event loop has not run for {silent:.0f} s (--worker-timeout {timeout:g})"
            logger.error("worker %d (pid %d): %s; killing it", slot.index, slot.proc.pid, slot.killed_why)
            slot.proc.kill()  # the loop reaps it next and restarts it as a crashed worker

    def _signalled(self, signum: int, count: int) -> None:
        if count == 1:
            logger.info("signal %d: draining %d workers; requests in flight get up to %.0f s, new ones get 503",
                        signum, sum(slot.proc is not None for slot in self.slots), self.settings.shutdown_grace_s)
            self._stop()
        elif count == 2:
            logger.info("second signal: the workers end their drains now")
            self._send(signal.SIGTERM)
        else:
            logger.warning("third signal: killing the workers")
            self._send(signal.SIGKILL)

    def _stop(self) -> None:
        self.stopping = True
        self.kill_at = time.monotonic() + self.settings.shutdown_grace_s + KILL_AFTER_S
        for slot in self.slots:
            slot.due = None
        self._send(signal.SIGTERM)

    def _send(self, sig: signal.Signals) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.returncode is None:
                try:
                    slot.proc.send_signal(sig)
                except ProcessLookupError:
                    pass  # exited a moment ago; the loop reaps it

    def _command(self, index: int, sockets: list[socket.socket]) -> tuple[list[str], dict[str, str]]:
        fds = ",".join(str(sock.fileno()) for sock in sockets)
        env = dict(os.environ)
        env[MULTIPROC_ENV] = str(self.metrics_dir)  # a fresh directory, whatever the environment said
        if self._quota is not None:
            env["OPENAI_API_QUOTA_SOCKET"] = str(self._quota.path)
        env.pop(SEGMENTS_ENV, None)
        if self.settings.prompt_cache_mb > 0:
            env[SEGMENTS_ENV] = str(self.segments_dir)
        if not _INSTALLED:
            env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
        args = [str(self._run_dir), str(index), fds, str(os.getpid())]
        return [sys.executable, "-P", "-m", "openai_api.worker", *args], env

    def _start(self, slot: WorkerSlot) -> None:
        slot.started = time.monotonic()
        try:
            sockets = self._shared or bind_listeners(self.settings.host, self._port, reuse_port=True)
        except OSError as e:  # the port was taken between two workers' binds: try again later
            self._restart_later(slot, slot.started, f"worker {slot.index}: {e}")
            return
        try:
            cmd, env = self._command(slot.index, sockets)
            # A process group of its own: a terminal's Ctrl-C is not sent to it (see the module docstring).
            slot.proc = subprocess.Popen(cmd, env=env, pass_fds=[sock.fileno() for sock in sockets],
                                         stdin=subprocess.DEVNULL, process_group=0)
        finally:
            if sockets is not self._shared:
                # The worker holds the only copy now: when it ends, the socket closes (connections queued on
                # it but never accepted are reset) and leaves the SO_REUSEPORT group.
                for sock in sockets:
                    sock.close()
        slot.due = None
        slot.starts += 1
        slot.pids.append(slot.proc.pid)
        self._write_processes()
        if slot.starts == 1:
            logger.info("worker %d started (pid %d)", slot.index, slot.proc.pid)
        else:
            logger.info("worker %d restarted (pid %d, restart %d)", slot.index, slot.proc.pid, slot.starts - 1)

    def _ended(self, slot: WorkerSlot, code: int, now: float) -> None:
        assert slot.proc is not None
        pid = slot.proc.pid
        slot.proc = None
        why, slot.killed_why = slot.killed_why, None
        if self._run_dir is not None:
            heartbeat_path(self._run_dir, pid).unlink(missing_ok=True)
        process_ended(self.metrics_dir, pid)
        self._write_processes()
        if self.stopping:
            logger.info("worker %d (pid %d) stopped: %s", slot.index, pid, describe_exit(code))
            return
        if code == BOOT_FAILURE and slot.starts == 1:
            logger.error("worker %d (pid %d) could not build the app (its error is above): stopping the gateway",
                         slot.index, pid)
            self.exit_code = BOOT_FAILURE
            self._stop()
            return
        ended = f"killed after {now - slot.started:.1f} s: {why}" if why else \
            f"died after {now - slot.started:.1f} s: {describe_exit(code)}"
        self._restart_later(slot, now, f"worker {slot.index} (pid {pid}) {ended}")

    def _restart_later(self, slot: WorkerSlot, now: float, why: str) -> None:
        if now - slot.started >= self.stable_after:
            slot.delay = self.restart_delay
        delay = slot.delay
        slot.delay = min(delay * 2, self.max_restart_delay)
        slot.due = now + delay
        logger.error("%s; starting it again in %g s", why, delay)

    def _write_processes(self) -> None:
        live = {str(slot.index): slot.proc.pid for slot in self.slots if slot.proc is not None}
        write_processes(self.metrics_dir, {"supervisor": os.getpid(), **live})
