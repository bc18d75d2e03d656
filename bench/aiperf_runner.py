"""NVIDIA AIPerf (``aiperf`` on PyPI), an independent client on the OpenAI side, in its own venv.

``ensure_venv()`` creates ``bench/.venv-aiperf`` on first use (git-ignored) and installs
``aiperf==AIPERF_VERSION`` there: its dependencies pin older ``orjson``, ``psutil``,
``prometheus_client``, ``huggingface_hub``, ``rich`` and ``pyzmq`` than the gateway's venv holds,
so it never shares the gateway's environment. It pulls no torch.

AIPerf needs a Hugging Face tokenizer (to synthesise prompts of a given length and to count output
tokens client-side). It runs offline (``HF_HUB_OFFLINE=1``), and AIPerf 0.13.0 in offline mode only
looks tokenizers up in the Hugging Face cache (a local folder path is passed to
``snapshot_download(local_files_only=True)``, which rejects it as a repo id), so ``hf_cache()`` lays
out a throw-away cache in the run's work folder whose one snapshot links to the files of
``models/smollm2-135m-instruct``, under the name ``local/smollm2-135m-instruct``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from bench.stack import REPO, SMOLLM_TOKENIZER
from bench.stack import ensure_venv as ensure_venv_of

VENV = REPO / "bench" / ".venv-aiperf"
AIPERF_VERSION = "0.13.0"
PACKAGES = [f"aiperf=={AIPERF_VERSION}"]
TOKENIZER_NAME = "local/smollm2-135m-instruct"
_SNAPSHOT = "0" * 40
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "config.json",
    "generation_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def executable() -> Path:
    return VENV / "bin" / "aiperf"


def ensure_venv(log: Path) -> None:
    """Create the venv and install AIPerf if absent; raise RuntimeError with pip's tail on failure."""
    ensure_venv_of(VENV, PACKAGES, executable(), log)


def hf_cache(workdir: Path) -> Path:
    """A Hugging Face home whose hub cache holds the local SmolLM2 tokenizer as ``TOKENIZER_NAME``."""
    home = workdir / "hf-home"
    repo = home / "hub" / ("models--" + TOKENIZER_NAME.replace("/", "--"))
    snap = repo / "snapshots" / _SNAPSHOT
    snap.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(_SNAPSHOT)
    for name in _TOKENIZER_FILES:
        src = (SMOLLM_TOKENIZER / name).resolve()
        dst = snap / name
        if src.is_file() and not dst.exists():
            dst.symlink_to(src)
    if not (snap / "tokenizer.json").exists():
        raise RuntimeError(f"no tokenizer.json in {SMOLLM_TOKENIZER}")
    return home


def profile(
    url: str,
    *,
    model: str,
    endpoint_type: str,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    input_tokens: int,
    output_tokens: int | None,
    streaming: bool,
    workdir: Path,
    name: str,
    timeout_s: float = 300.0,
) -> dict[str, Any]:
    """One ``aiperf profile`` run; returns the metrics AIPerf exported (its ``profile_export_aiperf.json``)."""
    out_dir = workdir / f"aiperf-{name}"
    cmd = [
        str(executable()),
        "profile",
        "--model",
        model,
        "--url",
        url,
        "--endpoint-type",
        endpoint_type,
        *(["--streaming"] if streaming else []),
        "--concurrency",
        str(concurrency),
        "--benchmark-duration",
        f"{duration_s:g}",
        "--benchmark-grace-period",
        "30",
        "--warmup-duration",
        f"{warmup_s:g}",
        "--tokenizer",
        TOKENIZER_NAME,
        "--prompt-input-tokens-mean",
        str(input_tokens),
        "--prompt-input-tokens-stddev",
        "0",
        *(
            ["--prompt-output-tokens-mean", str(output_tokens), "--prompt-output-tokens-stddev", "0"]
            if output_tokens
            else []
        ),
        "--random-seed",
        "7",
        "--ui-type",
        "none",
        "--no-server-metrics",
        "--no-gpu-telemetry",
        "--output-artifact-dir",
        str(out_dir),
    ]
    env = {
        **os.environ,
        "HF_HOME": str(hf_cache(workdir)),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "DO_NOT_TRACK": "1",
    }
    env.pop("PYTHONPATH", None)
    log = workdir / f"aiperf-{name}.log"
    with open(log, "wb") as f:
        proc = subprocess.run(
            cmd, cwd=workdir, env=env, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s
        )
    export = out_dir / "profile_export_aiperf.json"
    if proc.returncode != 0 or not export.is_file():
        tail = log.read_text(errors="replace")[-1500:]
        raise RuntimeError(f"aiperf profile ({name}) exited {proc.returncode}: {tail}")
    data: dict[str, Any] = json.loads(export.read_text())
    data["command"] = " ".join(cmd[1:])
    return data


def metric(data: dict[str, Any], name: str, stat: str = "avg") -> float | None:
    m = data.get(name)
    if isinstance(m, dict) and isinstance(m.get(stat), int | float):
        return float(m[stat])
    return None
