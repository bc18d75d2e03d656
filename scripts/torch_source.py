"""Where scripts/setup.sh installs torch from, and why: the one choice the first run's size depends on.

The reference models run on CPU, and on Linux x86_64 the default package index's torch is the CUDA
build, which brings about 2.7 GB of `nvidia-*` libraries (a 6 GB venv with Python 3.12). So with
`TORCH_VARIANT=cpu` (the default) torch comes from PyTorch's own CPU wheel index (about 190 MB) when that
index answers; when it does not (offline, a proxy, a mirror-only network), from the default index, whose
local CPU wheel or CUDA build pip then picks as configured. `TORCH_VARIANT=default` skips the probe.
`TORCH_CPU_INDEX` names another CPU index (a mirror).

    python scripts/torch_source.py "torch==2.13.0"

prints the pip arguments for that spec on stdout (one line, empty for the default index) and, on
stderr, one line saying what will be downloaded and why. Exit status 2 for an unknown variant.
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
VARIANTS = ("cpu", "default")
CUDA_NOTE = "on Linux x86_64 that is the CUDA build, with about 2.7 GB of nvidia-* libraries"


@dataclass(frozen=True)
class Choice:
    """pip arguments that select the index (empty: the default one) and the line that tells the operator."""

    pip_args: list[str]
    message: str


def reachable(index: str, timeout_s: float = 5.0) -> bool:
    """Whether the index answers for torch within `timeout_s` (any HTTP answer below 400)."""
    try:
        with urllib.request.urlopen(f"{index.rstrip('/')}/torch/", timeout=timeout_s) as r:
            return int(r.status) < 400
    except (urllib.error.URLError, OSError, ValueError):
        return False


def choose(variant: str, spec: str, cpu_index: str = CPU_INDEX,
           probe: Callable[[str], bool] = reachable) -> Choice:
    """Where `spec` comes from for `variant` (`cpu` or `default`); ValueError for anything else."""
    if variant not in VARIANTS:
        raise ValueError(f"TORCH_VARIANT must be one of {', '.join(VARIANTS)}, not {variant!r}")
    if variant == "default":
        return Choice([], f"torch: {spec} from the default package index (TORCH_VARIANT=default; {CUDA_NOTE})")
    if probe(cpu_index):
        return Choice(["--index-url", cpu_index],
                      f"torch: {spec}, the CPU-only build, from PyTorch's CPU index {cpu_index} (about 190 MB): "
                      f"the reference models run on CPU, and the default index's build is larger ({CUDA_NOTE}); "
                      "TORCH_VARIANT=default uses it")
    return Choice([], f"torch: PyTorch's CPU index {cpu_index} is not reachable from here, so {spec} comes from "
                      "the default package index: a local CPU wheel where pip is configured with one, else "
                      f"{CUDA_NOTE}")


def main(argv: list[str]) -> int:
    spec = argv[1] if len(argv) > 1 else "torch"
    try:
        choice = choose(os.environ.get("TORCH_VARIANT", "cpu") or "cpu", spec,
                        os.environ.get("TORCH_CPU_INDEX") or CPU_INDEX)
    except ValueError as e:
        print(f"setup: {e}", file=sys.stderr)
        return 2
    print(f"setup: {choice.message}", file=sys.stderr)
    print(" ".join(choice.pip_args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
