"""LiteLLM's Python proxy, the gateway peer the board compares us with (issue #27), in its own venv.

``ensure_venv()`` creates ``bench/.venv-litellm`` on first use (git-ignored) with
``litellm[proxy]==LITELLM_VERSION``. 1.108.0 is the newest release whose ``proxy`` extra resolves from
PyPI here: from 1.108.x the extra pins ``litellm-proxy-extras`` post-releases, and 1.110.x a
``litellm-proxy`` package, that the index does not carry. The proxy has its own FastAPI, uvicorn and
pydantic pins, which is why it does not share the gateway's environment.

``LiteLLMProxy`` starts ``litellm --config`` with one model, ``paced``, routed to an OpenAI-compatible
upstream (``bench.paced_upstream``) through LiteLLM's ``openai/`` provider: no master key (as the
bench's gateway has no API keys), no database, no callbacks, the model cost map read from the package (no network).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from bench.stack import REPO, free_port, launch, stop_process, wait_http
from bench.stack import ensure_venv as ensure_venv_of

VENV = REPO / "bench" / ".venv-litellm"
LITELLM_VERSION = "1.108.0"
PACKAGES = [f"litellm[proxy]=={LITELLM_VERSION}"]
SERVED_NAME = "paced"


def executable() -> Path:
    return VENV / "bin" / "litellm"


def ensure_venv(log: Path) -> None:
    """Create the venv and install the proxy if absent; RuntimeError with pip's tail on failure."""
    ensure_venv_of(VENV, PACKAGES, executable(), log)


def installed_version() -> str:
    """The litellm version the venv holds (its dist-info), '' if none."""
    for dist in sorted(VENV.glob("lib/python*/site-packages/litellm-*.dist-info")):
        return dist.name.removeprefix("litellm-").removesuffix(".dist-info")
    return ""


def config_yaml(upstream_url: str) -> str:
    """One model routed to ``upstream_url`` (an OpenAI-compatible base URL ending in /v1)."""
    return (
        "model_list:\n"
        f"  - model_name: {SERVED_NAME}\n"
        "    litellm_params:\n"
        f"      model: openai/{SERVED_NAME}\n"
        f"      api_base: {upstream_url}\n"
        "      api_key: none\n"
        "litellm_settings:\n"
        "  drop_params: true\n"
        "  telemetry: false\n"
    )


class LiteLLMProxy:
    def __init__(self, workdir: Path, upstream_url: str) -> None:
        self.port = free_port()
        self.config_path = workdir / "litellm-config.yaml"
        self.config_path.write_text(config_yaml(upstream_url))
        self.log_path = workdir / "litellm.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self, timeout: float = 180.0, prefix: list[str] | None = None) -> LiteLLMProxy:
        cmd = [
            *(prefix or []),
            str(executable()),
            "--config",
            str(self.config_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--num_workers",
            "1",
        ]
        env = {
            **os.environ,
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no fetch of the cost map from GitHub
            "LITELLM_TELEMETRY": "False",
            "LITELLM_LOG": "ERROR",
            "DISABLE_SCHEMA_UPDATE": "True",
            "HF_HUB_OFFLINE": "1",
            # No key on either side: the bench's gateway runs without API keys too. From 1.108 the proxy
            # refuses to start without a master key unless told this is deliberate.
            "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        }
        env.pop("PYTHONPATH", None)
        self.proc = launch(cmd, self.log_path, env)
        wait_http(f"{self.url}/health/liveliness", timeout, self.proc, self.log_path)
        return self

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
