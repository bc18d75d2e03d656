"""Infinity (infinity-emb), the embeddings baseline, in its own virtual environment.

``ensure_venv()`` creates ``bench/.venv-infinity`` on first use (git-ignored): ``torch==2.13.0``
pinned in the same ``pip install`` as ``infinity-emb[server,torch]`` (any other torch spec, or the
``[all]`` extra, whose torchvision drags in a CUDA torch, pulls gigabytes). Infinity brings its own
transformers, which is why it does not share the gateway's environment. ``InfinityServer`` starts it
offline on the same MiniLM folder the Triton model serves.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bench.stack import MINILM_FOLDER, REPO, free_port, launch, stop_process, wait_http
from bench.stack import ensure_venv as ensure_venv_of

VENV = REPO / "bench" / ".venv-infinity"
INFINITY_VERSION = "0.0.78"
PACKAGES = ["torch==2.13.0", f"infinity-emb[server,torch]=={INFINITY_VERSION}"]
SERVED_NAME = "all-minilm-l6-v2"


def executable() -> Path:
    return VENV / "bin" / "infinity_emb"


def ensure_venv(log: Path) -> None:
    """Create the venv and install Infinity if absent; raise RuntimeError with pip's tail on failure."""
    ensure_venv_of(VENV, PACKAGES, executable(), log)


class InfinityServer:
    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.log_path = workdir / "infinity.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 240.0) -> InfinityServer:
        cmd = [
            str(executable()),
            "v2",
            "--model-id",
            str(MINILM_FOLDER),
            "--served-model-name",
            SERVED_NAME,
            "--engine",
            "torch",
            "--device",
            "cpu",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--no-model-warmup",
            "--log-level",
            "warning",
        ]
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
            "DO_NOT_TRACK": "1",
        }
        env.pop("PYTHONPATH", None)
        self.proc = launch(cmd, self.log_path, env)
        wait_http(f"{self.url}/health", timeout, self.proc, self.log_path)
        return self

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
