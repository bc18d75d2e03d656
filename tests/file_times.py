"""Where the test command's minutes go, per test file and per pytest process (hooks imported by tests/conftest.py).

pytest's `--durations` names slow tests; with pytest-xdist taking whole files (`--dist loadfile`), what bounds the
wall time is each process's schedule of files and the tail at the end, when one process has finished and the
other still runs its last files (a core left idle). At the end of every run this prints each process's busy
time, when it ran its last test, its longest files, and the idle tail; the whole record (per file: process,
start and end offsets from the first test, summed setup + call + teardown) is kept in pytest's cache,
`.pytest_cache/v/file_times/last`, for `python scripts/test_times.py` to print in full."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import pytest


@dataclass
class _File:
    worker: str
    start: float
    end: float
    seconds: float = 0.0
    tests: int = 0


_FILES: dict[str, _File] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # In an xdist run the controller sees every worker's reports (`report.node`); a worker records nothing (its
    # summary is not shown).
    if _is_xdist_worker():
        return
    node = getattr(report, "node", None)
    worker = node.gateway.id if node is not None else "main"
    path = report.nodeid.split("::", 1)[0]
    entry = _FILES.get(path)
    if entry is None:
        entry = _FILES[path] = _File(worker, report.start, report.stop)
    entry.start, entry.end = min(entry.start, report.start), max(entry.end, report.stop)
    entry.seconds += report.duration
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        entry.tests += 1


def _is_xdist_worker() -> bool:
    return "PYTEST_XDIST_WORKER" in os.environ


def record() -> dict[str, Any]:
    """The run's per-file record: {"files": {path: {worker, start, end, seconds, tests}}}, offsets in seconds
    from the first test's start."""
    if not _FILES:
        return {"files": {}}
    t0 = min(f.start for f in _FILES.values())
    return {"files": {path: {"worker": f.worker, "start": round(f.start - t0, 2), "end": round(f.end - t0, 2),
                             "seconds": round(f.seconds, 2), "tests": f.tests}
                      for path, f in sorted(_FILES.items(), key=lambda kv: kv[1].start)}}


def summary(data: dict[str, Any], top: int = 8) -> list[str]:
    """Lines saying, per process, its busy time, when its last test ended and its longest files; then the tail."""
    files: dict[str, dict[str, Any]] = data["files"]
    workers = sorted({f["worker"] for f in files.values()})
    lines = []
    ends = {}
    for w in workers:
        mine = {p: f for p, f in files.items() if f["worker"] == w}
        ends[w] = max(f["end"] for f in mine.values())
        busy = sum(f["seconds"] for f in mine.values())
        longest = sorted(mine.items(), key=lambda kv: -kv[1]["seconds"])[:top]
        lines.append(f"{w}: {len(mine)} files, tests' own time {busy:.0f} s, last test ended at {ends[w]:.0f} s; "
                     f"longest: " + ", ".join(f"{p.rsplit('/', 1)[-1]} {f['seconds']:.0f} s" for p, f in longest))
    if len(workers) > 1:
        last = max(ends, key=lambda w: ends[w])
        tail = sorted(files.items(), key=lambda kv: kv[1]["start"])
        after = [(p, f) for p, f in tail if f["worker"] == last and f["end"] > min(ends.values())]
        lines.append(f"tail: {last} ran {max(ends.values()) - min(ends.values()):.0f} s after the other process's "
                     "last test, in " + ", ".join(f"{p.rsplit('/', 1)[-1]} ({f['start']:.0f}-{f['end']:.0f} s)"
                                                   for p, f in after))
    return lines


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if _is_xdist_worker() or not _FILES:
        return
    data = record()
    cache = getattr(config, "cache", None)  # none under -p no:cacheprovider
    if cache is not None:
        cache.set("file_times/last", data)
    terminalreporter.section("time per file and process (file_times/last in .pytest_cache)")
    for line in summary(data):
        terminalreporter.write_line(line)
