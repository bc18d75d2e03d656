"""py-spy on the gateway process: record while a load runs, then reduce the stacks to the top costs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]+)(?::\d+)?\)$")


def py_spy() -> str | None:
    local = Path(sys.executable).parent / "py-spy"
    return str(local) if local.is_file() else shutil.which("py-spy")


def start(
    pid: int, out: Path, duration_s: int, fmt: str = "raw", rate: int = 250, gil: bool = False
) -> subprocess.Popen[bytes]:
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not installed (pip install py-spy)")
    # --nonblocking: sample without pausing the gateway, so profiling barely changes what it measures.
    cmd = [
        exe,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(duration_s),
        "--rate",
        str(rate),
        "--format",
        fmt,
        "--nonblocking",
        *(["--gil"] if gil else []),
        "-o",
        str(out),
    ]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _short(frame: str) -> str:
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    file = m.group("file")
    for anchor in ("openai_api/", "site-packages/", "lib/python3"):
        i = file.find(anchor)
        if i >= 0:
            file = file[i + (len(anchor) if anchor != "openai_api/" else 0) :]
            break
    return f"{m.group('func')} ({file})"


def summarize(raw: Path, top: int = 15) -> dict[str, Any]:
    """Self time per function, and inclusive time of the gateway's own functions, as % of samples."""
    self_t: Counter[str] = Counter()
    incl: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        n = int(count_s)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ") and not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        self_t[_short(frames[-1])] += n
        for f in {_short(f) for f in frames if "openai_api/" in f}:
            incl[f] += n

    def table(c: Counter[str]) -> list[dict[str, Any]]:
        return [{"function": k, "pct": round(100.0 * v / total, 1)} for k, v in c.most_common(top)] if total else []

    return {"samples": total, "self": table(self_t), "gateway_inclusive": table(incl)}
