"""The processes a benchmark run measures: one tritonserver, the gateway as its own process, Infinity.

* Triton serves ``synthetic-llm`` and ``all-minilm-l6-v2`` from ``triton_models/`` plus
  ``synthetic-llm-slow`` (the synthetic model with ``delay_ms`` set) from a temporary second model
  repository, so the checked-in repository only holds the one synthetic model.
* The gateway runs as ``python openai_api_cli.py --config-file <bench config>`` in a subprocess, so
  its CPU time and memory are its own (uvicorn picks uvloop and httptools when installed).
* The bench-only gateway config is built here; the bundled ``openai_api/model_config.json`` is not touched.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from openai_api.embedded.launcher import EmbeddedTriton

REPO = Path(__file__).resolve().parents[1]
SYNTHETIC = "synthetic-llm"
SYNTHETIC_SLOW = "synthetic-llm-slow"
# The board's paced upstream (bench.board): the synthetic model with 20 ms between tokens.
SYNTHETIC_PACED = "synthetic-llm-paced"
PACED_DELAY_MS = 20
EMBEDDING = "all-minilm-l6-v2"
SMOLLM_TOKENIZER = REPO / "models" / "smollm2-135m-instruct"
MINILM_FOLDER = REPO / "models" / "all-minilm-l6-v2"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_venv(venv: Path, packages: list[str], executable: Path, log: Path) -> None:
    """A tool's own venv (git-ignored): created and ``packages`` installed unless ``executable`` is already
    there; RuntimeError with pip's tail (from ``log``) on failure."""
    if executable.is_file():
        return
    with open(log, "ab") as out:
        if not (venv / "bin" / "python").is_file():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, stdout=out, stderr=subprocess.STDOUT)
        proc = subprocess.run(
            [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", *packages],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    if proc.returncode != 0 or not executable.is_file():
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if not ln.startswith("WARNING: Location")]
        raise RuntimeError(
            f"pip install {' '.join(packages)} failed (exit {proc.returncode}): " + " | ".join(lines[-8:])
        )


def wait_http(url: str, timeout: float, proc: subprocess.Popen[bytes] | None = None, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"process exited with code {proc.returncode} before {url} answered:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-3000:] if log and log.exists() else ""
            raise RuntimeError(f"{url} not ready after {timeout:.0f} s:\n{tail}")
        time.sleep(0.2)


def slow_model_repository(delay_ms: int) -> Path:
    """A temporary repository holding ``synthetic-llm-slow`` (``delay_ms`` between tokens) and
    ``synthetic-llm-paced`` (``PACED_DELAY_MS``): the synthetic model, paced."""
    root = Path(tempfile.mkdtemp(prefix="bench-models-"))
    src = REPO / "triton_models" / SYNTHETIC
    for name, delay in ((SYNTHETIC_SLOW, delay_ms), (SYNTHETIC_PACED, PACED_DELAY_MS)):
        dst = root / name
        # The whole version folder: model.py imports the modules beside it (synthetic_engine.py).
        shutil.copytree(src / "1", dst / "1", ignore=shutil.ignore_patterns("__pycache__"))
        cfg = (src / "config.pbtxt").read_text()
        cfg = cfg.replace(f'name: "{SYNTHETIC}"', f'name: "{name}"')
        cfg = cfg.replace(
            '{ key: "delay_ms" value: { string_value: "0" } }',
            f'{{ key: "delay_ms" value: {{ string_value: "{delay}" }} }}',
        )
        if f'string_value: "{delay}"' not in cfg:
            raise RuntimeError(f"could not derive {name}: delay_ms parameter not found in config.pbtxt")
        (dst / "config.pbtxt").write_text(cfg)
    return root


def start_triton(slow_delay_ms: int, embeddings: bool) -> tuple[EmbeddedTriton, Path]:
    extra = slow_model_repository(slow_delay_ms)
    models = [SYNTHETIC, SYNTHETIC_SLOW, SYNTHETIC_PACED] + ([EMBEDDING] if embeddings else [])
    triton = EmbeddedTriton(models=models, extra_args=[f"--model-repository={extra}"])
    triton.start()
    return triton, extra


def gateway_config(grpc_url: str, http_url: str) -> dict[str, Any]:
    """The bench-only model config: the synthetic LLMs with SmolLM2's tokenizer and template."""
    template = str(REPO / "openai_api" / "chat_templates" / "smollm2.jinja")
    names = (SYNTHETIC, SYNTHETIC_SLOW, SYNTHETIC_PACED)
    llm = [
        {"name": name, "url": grpc_url, "path": str(SMOLLM_TOKENIZER), "triton_model": name, "chat_template": template}
        for name in names
    ]
    return {
        # Long-output runs ask for 8,192 tokens: the synthetic model has no position limit.
        "model_infos": [{"name": name, "end_id": -1, "max_len": 32768} for name in names],
        "llm": llm,
        "embedding": [{"name": EMBEDDING, "url": http_url, "path": str(MINILM_FOLDER), "max_tokens": 256}],
        "rerank": [],
    }


@functools.cache
def cli_help() -> str:
    """``python openai_api_cli.py --help``: which flags this version of the gateway has."""
    return subprocess.run(
        [sys.executable, str(REPO / "openai_api_cli.py"), "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout


def has_flag(flag: str) -> bool:
    """Whether ``--help`` lists ``flag`` itself (``--workers`` is not ``--cpu-workers``)."""
    return re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", cli_help()) is not None


def launch(cmd: list[str], log_path: Path, env: dict[str, str], cwd: Path | None = None) -> subprocess.Popen[bytes]:
    """`cmd` in a session of its own (so `stop_process` can end its whole group), output appended to `log_path`."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def stop_process(proc: subprocess.Popen[bytes] | None, group_signal: signal.Signals | None = signal.SIGTERM) -> None:
    """Stop a `launch`ed process: `group_signal` to its process group (None: SIGINT to the process alone, which
    uvicorn drains on), then SIGKILL to the group if it is still there after 15 s."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        if group_signal is None:
            proc.send_signal(signal.SIGINT)
        else:
            os.killpg(proc.pid, group_signal)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)


class Gateway:
    """``openai_api_cli.py`` in its own process, pointed at the bench Triton; ``extra_args`` are appended
    to its command line (``--workers 2``)."""

    def __init__(
        self, config: dict[str, Any], workdir: Path, extra_args: list[str] | None = None, name: str = "gateway"
    ) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.config_path = workdir / f"{name}-config.json"
        self.config_path.write_text(json.dumps(config, indent=2))
        self.log_path = workdir / f"{name}.log"
        self.extra_args = list(extra_args or [])
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @staticmethod
    def _limit_flags() -> list[str]:
        """Lift the gateway's admission limits (if this version has them) so 1,000 streams fit."""
        flags = []
        for flag in ("--max-in-flight", "--max-in-flight-per-model"):
            if has_flag(flag):
                flags += [flag, "100000"]
        return flags

    def processes(self) -> list[psutil.Process]:
        """The gateway's process and its children (``--workers N`` runs N processes)."""
        root = psutil.Process(self.pid)
        try:
            return [root, *root.children(recursive=True)]
        except psutil.Error:
            return [root]

    def start(self, prefix: list[str] | None = None) -> Gateway:
        cmd = [
            *(prefix or []),
            sys.executable,
            str(REPO / "openai_api_cli.py"),
            "--config-file",
            str(self.config_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--uvicorn-log-level",
            "warning",
            *self._limit_flags(),
            *self.extra_args,
        ]
        env = {**os.environ, "LOG_LEVEL": "WARNING"}
        self.proc = launch(cmd, self.log_path, env, cwd=REPO)
        wait_http(f"{self.url}/health", 60, self.proc, self.log_path)
        return self

    def stop(self) -> None:
        stop_process(self.proc, group_signal=None)
        self.proc = None

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""
