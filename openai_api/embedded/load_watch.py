"""Telling a hung model load from a slow one while tritonserver starts, and ending the hung ones.

A Python-backend stub starved of CPU can miss Triton's 1 s initialization window; Triton's load thread then
waits for that stub forever, the stub waits for its next message, and the start hangs with its log silent
(seen in the e2e tier under load, several times a day). A slow load is silent too (a model importing torch and
reading weights logs once at the end), but it burns CPU; a hung one burns none. `IdleWatch` reads the kernel's
CPU accounting of Triton's process group (the launcher starts it as a group leader; its stubs share the group)
to tell the two apart, and `kill_stubs` ends a hung load: Triton's load thread gets its stub's exit, marks the
model UNAVAILABLE, and the launcher asks for it again.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from openai_api.embedded.processes import group_stats

# A start is judged hung once its log has been silent IDLE_SILENCE s and its process group used under IDLE_CPU s
# of CPU over the last IDLE_WINDOW s (Triton answers the launcher's readiness polls meanwhile: ~1 ms a second).
IDLE_SILENCE, IDLE_WINDOW, IDLE_CPU = 20.0, 8.0, 0.05
_CLK_TCK = os.sysconf("SC_CLK_TCK")


def group_cpu_seconds(pgid: int) -> float:
    """User + system CPU seconds used so far by the live processes of group ``pgid``."""
    return sum(int(f[11]) + int(f[12]) for _, f in group_stats(pgid)) / _CLK_TCK  # utime, stime: proc(5) 14, 15


class IdleWatch:
    """CPU samples of a process group, at most one a second, while the start's log is silent."""

    def __init__(self, pgid: int) -> None:
        self.pgid = pgid
        self.marks: list[tuple[float, float]] = []  # (monotonic time, the group's CPU seconds)

    def progressed(self) -> None:
        """The log grew: the samples so far say nothing about a hang."""
        self.marks.clear()

    def idle(self, now: float) -> str | None:
        """How idle the group has been over the last IDLE_WINDOW s when under IDLE_CPU (a hang), else None."""
        if not self.marks or now - self.marks[-1][0] >= 1.0:
            self.marks.append((now, group_cpu_seconds(self.pgid)))
        while len(self.marks) > 1 and now - self.marks[1][0] >= IDLE_WINDOW:
            self.marks.pop(0)  # keep the newest sample at least IDLE_WINDOW old as the first
        (then, cpu_then), (_, cpu_now) = self.marks[0], self.marks[-1]
        if now - then >= IDLE_WINDOW and cpu_now - cpu_then < IDLE_CPU:
            return f"{cpu_now - cpu_then:.2f} s of CPU in {now - then:.0f} s"
        return None


def kill_stubs(pgid: int, models: set[str]) -> list[int]:
    """SIGKILL the Python-backend stubs of ``models`` in group ``pgid``; returns their pids. A stub's command
    line ends with its instance name (``<model>_<n>_<m>``, or the model's own name for config auto-completion)
    and its kind."""
    killed = []
    for pid, _ in group_stats(pgid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [w.decode("utf-8", "replace") for w in argv if w]
        if len(words) < 3 or not words[0].endswith("triton_python_backend_stub"):
            continue
        instance = words[-2]
        if any(instance == m or instance.startswith(m + "_") for m in models):
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except ProcessLookupError:
                pass
    return killed
