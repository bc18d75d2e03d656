"""The child processes behind `embedded.launcher`: ports, the death signal a tritonserver is started with, the
long-lived thread that forks it, and its process group (members, the Python backend's shared memory, killing the
whole group). Linux-first; where prctl is missing the command runs as it is."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger("openai_api.embedded.launcher")  # the launcher's log, as before the split

PR_SET_PDEATHSIG = 1
SHM_PREFIX = "/dev/shm/triton_python_backend_shm_region_"


def free_port(taken: tuple[int | None, ...] = ()) -> int:
    """A port free now on 127.0.0.1 and not in ``taken`` (the kernel may hand the same one out twice)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in taken:
            return port


def load_prctl() -> Any:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


# Whether this libc has prctl (Linux): then Triton gets PR_SET_PDEATHSIG, through `PDEATHSIG_EXEC`.
PRCTL = load_prctl()

# Run as `python -I -S -c PDEATHSIG_EXEC <parent pid> <command...>`: asks for SIGTERM when the thread that
# started it dies, leaves at once if that parent is already gone, then execs the command (the same pid, looked
# up on PATH when not a path; the death signal survives exec). Setting it in a `preexec_fn` instead runs
# Python between fork and exec in a copy of a process full of threads (gRPC, torch, tokenizers): a child
# crashed there with a segfault in a long test session. Here it runs in a fresh interpreter.
PDEATHSIG_EXEC = (
    "import ctypes, os, signal, sys\n"
    f"ctypes.CDLL('libc.so.6', use_errno=True).prctl({PR_SET_PDEATHSIG}, int(signal.SIGTERM))\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(1)\n"
    "os.execvp(sys.argv[2], sys.argv[2:])\n")


def with_pdeathsig(cmd: list[str]) -> list[str]:
    """`cmd`, started so that it gets SIGTERM when the spawning thread dies (where prctl exists)."""
    if PRCTL is None or not sys.executable:
        return cmd
    return [sys.executable, "-I", "-S", "-c", PDEATHSIG_EXEC, str(os.getpid()), *cmd]


class Spawner:
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
        proc: subprocess.Popen[bytes] = result
        return proc

    @staticmethod
    def _run(jobs: queue.Queue[tuple[Callable[[], subprocess.Popen[bytes]], queue.Queue[Any]]]) -> None:
        while True:
            factory, reply = jobs.get()
            try:
                reply.put(factory())
            except BaseException as exc:  # noqa: BLE001 - handed back to the caller
                reply.put(exc)


def exit_code(proc: subprocess.Popen[bytes]) -> int | None:
    """``proc``'s exit status (negative: killed by that signal), or None while it runs.

    Unlike ``Popen.poll`` this leaves an exited child a zombie, so its pid (the id of its process
    group) stays taken until the group is cleaned up and ``proc.wait()`` reaps it.
    """
    if proc.returncode is not None:
        return proc.returncode
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:  # someone else reaped it
        return proc.poll()
    if info is None or info.si_pid == 0:
        return None
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def group_stats(pgid: int) -> list[tuple[int, list[str]]]:
    """(pid, the fields after the command name in /proc/PID/stat) of every process in group ``pgid``, zombies
    included: [0] its state, [1] its parent, [2] its group, [11] and [12] its user and system CPU ticks."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
        if int(fields[2]) == pgid:
            found.append((int(entry.name), fields))
    return found


def group_members(pgid: int) -> list[tuple[int, int, str]]:
    """(pid, ppid, state) of every process in process group ``pgid``, zombies included."""
    return [(pid, int(fields[1]), fields[0]) for pid, fields in group_stats(pgid)]


def shm_regions(pids: list[int]) -> set[str]:
    """The Python backend's shared-memory files mapped by ``pids`` (Triton unlinks them on a clean exit)."""
    regions = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            path = line.rsplit(None, 1)[-1]
            if path.startswith(SHM_PREFIX):
                regions.add(path)
    return regions


def kill_group(pgid: int, regions: set[str], wait_s: float = 10.0) -> list[int]:
    """SIGKILL process group ``pgid`` and wait until it has no live member; returns the pids that were alive.

    Members that became this process's children (orphans re-parented to a PID 1 or subreaper gateway)
    are reaped here.  Then the Python backend's shared-memory files are unlinked: ``regions`` (seen
    mapped by the group earlier) and those its members map now.  Triton unlinks them on a clean exit
    only; after a crash, or its own exit on a start-up error, they would stay in /dev/shm.
    """
    alive = [pid for pid, _, state in group_members(pgid) if state != "Z"]
    regions = regions | shm_regions(alive)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    me = os.getpid()
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for pid, ppid, state in group_members(pgid):
            if state == "Z" and ppid == me and pid != pgid:  # the leader is reaped by its Popen
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            elif state != "Z":
                left.append(pid)
        if not left:
            break
        if time.monotonic() > deadline:
            logger.error("process group %d still has live members %s after SIGKILL", pgid, left)
            break
        time.sleep(0.05)
    for path in regions:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return alive
