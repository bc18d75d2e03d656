"""CPU-heavy request work (rendering chat templates, tokenizing big inputs) off the event loop.

`CPUWorkers` is a fixed set of threads: the event loop hands a job over and keeps serving every other
request's tokens while it runs, and the number of jobs running at once is bounded by the thread count
(the rest wait their turn in order; the in-flight limits bound how many can wait).

A job may carry a time budget. Python cannot kill a thread, but it can raise an exception in one at its
next bytecode boundary (`PyThreadState_SetAsyncExc`): when the budget passes, or when the request that
waits for the job is cancelled (client gone), the worker running it gets `JobInterrupted` raised inside
the job. Template rendering is pure Python bytecode, so a runaway template (nested loops) stops within
milliseconds. A job stuck inside one long C call is interrupted when that call returns. The interrupt is
only ever aimed at the job it was meant for: the worker and the interrupter agree under a lock on which
job is running, and the worker clears any interrupt that arrives too late before it takes the next job.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import functools
import itertools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

T = TypeVar("T")

# PyThreadState_SetAsyncExc(thread id, exception type), and the same call with NULL, which clears a
# pending one (a py_object None would be Py_None, not NULL): two prototypes of the one C function.
_SET_ASYNC_EXC = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.py_object)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))
_CLEAR_ASYNC_EXC = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p)(
    ("PyThreadState_SetAsyncExc", ctypes.pythonapi))
_names = itertools.count()


@functools.cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")  # runs ldconfig: once per process
    if not name:
        return None
    try:
        return ctypes.CDLL(name)
    except OSError:
        return None


def _glibc(symbol: str) -> Callable[..., int] | None:
    fn: Callable[..., int] | None = getattr(_libc(), symbol, None)  # None: not glibc (musl, macOS)
    return fn


def _find_malloc_trim() -> Callable[[int], int] | None:
    return _glibc("malloc_trim")


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
BIG_ALLOCATION = 1 << 20


def map_big_allocations() -> bool:
    """glibc: give every allocation of `BIG_ALLOCATION` (1 MiB) or more a mapping of its own, returned to the
    system when freed. By default glibc raises that threshold (up to 32 MiB) each time such a block is freed,
    so after the first big request, multi-megabyte bodies, their decoded text and parsed JSON come from the
    heap instead and stay in the process's RSS as free fragments (on the event loop's thread too, which no
    `malloc_trim` here reaches). A fixed threshold keeps them out: only big requests pay a mmap and a munmap.
    False where malloc is not glibc's."""
    mallopt = _glibc("mallopt")
    return bool(mallopt is not None and mallopt(_M_MMAP_THRESHOLD, BIG_ALLOCATION))


# glibc's malloc_trim(0): hand free heap pages back to the system. A job here handled a big input (a
# multi-megabyte text tokenized in windows, a big template), leaving its arena full of free fragments
# that glibc keeps: without a trim, each hostile 2 MB request raised RSS by ~4 MiB for good (measured:
# 20 such requests, +62 MiB; with the trim RSS keeps falling back to ~+12 MiB). ctypes releases the GIL
# around the call, so the event loop does not wait for it.
_MALLOC_TRIM = _find_malloc_trim()
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _rss_bytes() -> int | None:
    """This process's resident set (`/proc/self/statm`, ~10 us), or None where there is no procfs."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None


class TrimPacer:
    """When a finished job should `malloc_trim`: once the process's RSS has grown `slack` bytes past what
    it was after the last trim. Trimming after every job (as before) cost an agent turn at ~117k tokens
    ~2 ms of system CPU: the trim handed back the ~4 MiB the request had used and the next request faulted
    all of it in again (~1,100 page faults a request, measured; 0.3 with this pacing). Paced by growth, a
    hostile stream of multi-megabyte requests still trims every few requests, so RSS stays within `slack`
    of its trimmed level; a steady agent session trims every few dozen turns. Shared by every worker thread
    of the process (a trim covers all of glibc's arenas); races only cost an extra trim."""

    def __init__(self, slack: int = 16 << 20, rss: Callable[[], int | None] = _rss_bytes,
                 trim: Callable[[int], int] | None = _MALLOC_TRIM) -> None:
        self.slack = slack
        self._rss = rss
        self._trim = trim
        self._base: int | None = None
        self.trims = 0

    def after_job(self) -> None:
        if self._trim is None:
            return
        now = self._rss()
        if now is not None and self._base is not None and now - self._base < self.slack:
            return
        self._trim(0)
        self.trims += 1
        self._base = self._rss()


_TRIM = TrimPacer()


class JobInterrupted(Exception):
    """Raised inside a job whose time budget passed or whose caller went away."""


class JobTimeoutError(TimeoutError):
    """What the caller of `CPUWorkers.run` gets for a job that ran past its budget."""


class _Job(Generic[T]):
    __slots__ = ("args", "budget_s", "fn", "future", "interrupted", "started", "timed_out")

    def __init__(self, fn: Callable[..., T], args: tuple[Any, ...], budget_s: float | None) -> None:
        self.fn = fn
        self.args = args
        self.budget_s = budget_s
        self.future: Future[T] = Future()
        self.started = 0.0
        self.interrupted = False
        self.timed_out = False


class _Worker(threading.Thread):
    def __init__(self, jobs: queue.SimpleQueue[_Job[Any] | None], name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.jobs = jobs
        self.lock = threading.Lock()
        self.current: _Job[Any] | None = None

    def interrupt(self, job: _Job[Any], timed_out: bool = False) -> None:
        """Raise `JobInterrupted` in this thread if, and only if, it is running `job` now."""
        with self.lock:
            if self.current is job and not job.interrupted and self.ident is not None:
                job.interrupted = True
                job.timed_out = timed_out
                _SET_ASYNC_EXC(self.ident, JobInterrupted)

    def _finish(self) -> None:
        with self.lock:
            self.current = None
            if self.ident is not None:
                _CLEAR_ASYNC_EXC(self.ident, None)  # an interrupt that came too late must not hit the next job

    def run(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if not job.future.set_running_or_notify_cancel():
                continue  # the caller left before the job started
            try:
                with self.lock:
                    job.started = time.monotonic()
                    self.current = job
                try:
                    result = job.fn(*job.args)
                finally:
                    self._finish()
                job.future.set_result(result)
            except JobInterrupted:
                self._finish()
                job.future.set_exception(
                    JobTimeoutError(f"the job took longer than {job.budget_s:g} s") if job.timed_out
                    else JobInterrupted("the caller went away"))
            except BaseException as e:  # noqa: BLE001 - handed to the caller, the worker goes on
                self._finish()
                job.future.set_exception(e)
            del job  # before the trim: the job's arguments are what the trim should give back
            _TRIM.after_job()


class CPUWorkers:
    """A bounded pool of threads for CPU-heavy request work; see the module docstring.

    One watchdog thread looks at the running jobs every `WATCH_INTERVAL_S` and interrupts those past
    their budget, so a budget is kept to within that interval, counted from when a worker started the
    job (time spent waiting for a free worker is not the job's fault)."""

    WATCH_INTERVAL_S = 0.05

    def __init__(self, threads: int = 2, name: str = "cpu-worker") -> None:
        self.threads = max(1, threads)
        self._jobs: queue.SimpleQueue[_Job[Any] | None] = queue.SimpleQueue()
        self._workers = [_Worker(self._jobs, f"{name}-{next(_names)}") for _ in range(self.threads)]
        self._closed = threading.Event()
        for w in self._workers:
            w.start()
        threading.Thread(target=self._watch, name=f"{name}-watchdog", daemon=True).start()

    async def run(self, fn: Callable[..., T], *args: Any, budget_s: float | None = None) -> T:
        """`fn(*args)` on a worker thread. Past `budget_s` seconds of running the job is interrupted and
        `JobTimeoutError` raised here; cancelling the caller interrupts the job too. Any exception `fn`
        raises is raised here."""
        job: _Job[T] | None = _Job(fn, args, budget_s)
        assert job is not None
        self._jobs.put(job)
        try:
            return await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.future.cancel()  # not started yet: it never will be
            for w in self._workers:
                w.interrupt(job)
            raise
        finally:
            # An exception raised here carries a traceback holding this frame, whose `job` holds the future
            # holding that exception: a cycle that keeps the request's whole input (multi-megabyte texts,
            # the request objects) alive until a full garbage collection, which a busy server runs rarely.
            # Measured in scripts/soak.py: ~80 MiB of refused 2 MB requests held this way after a short run.
            job = None

    def _watch(self) -> None:
        while not self._closed.wait(self.WATCH_INTERVAL_S):
            now = time.monotonic()
            for w in self._workers:
                job = w.current
                if job is not None and job.budget_s is not None and now - job.started > job.budget_s:
                    w.interrupt(job, timed_out=True)

    def close(self) -> None:
        self._closed.set()
        for _ in self._workers:
            self._jobs.put(None)
