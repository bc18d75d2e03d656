"""Print the last test run's time per file and pytest process, in the order each process ran them.

pytest records it at the end of every run (tests/file_times.py) in `.pytest_cache/v/file_times/last`:
`python scripts/test_times.py [PATH]`. Columns: process, start and end (seconds from the run's first test),
the file's summed setup + call + teardown time, its tests, the file."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.file_times import summary


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else Path(__file__).resolve().parent.parent / ".pytest_cache/v/file_times/last"
    data = json.loads(path.read_text(encoding="utf-8"))
    for name, f in sorted(data["files"].items(), key=lambda kv: (kv[1]["worker"], kv[1]["start"])):
        sys.stdout.write(f"{f['worker']:>5} {f['start']:7.1f} {f['end']:7.1f} {f['seconds']:7.1f} s "
                         f"{f['tests']:4d}  {name}\n")
    for line in summary(data):
        sys.stdout.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
