"""The image's command line starts the gateway: ENTRYPOINT + CMD from docker/Dockerfile, run here
through the venv's `openai-api` console script (what the image's PATH resolves), with only host,
port and config file swapped for local ones, against a Triton that is not running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.deploy.helpers import (
    COMPOSE_MODEL_CONFIG,
    GATEWAY_DOCKERFILE,
    REPO,
    Dockerfile,
    localize_model_config,
    replace_option,
)
from tests.helpers import free_port, requires_models

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _console_script() -> Path:
    script = Path(sys.executable).parent / "openai-api"
    if not script.is_file():
        pytest.skip(f"no openai-api console script next to {sys.executable} (pip install -e .)")
    return script


@requires_models("smollm2-135m-instruct", "all-minilm-l6-v2")
@pytest.mark.parametrize("workers", [None, "2"], ids=["image-env", "workers-2"])
def test_image_command_line_starts_and_stops_cleanly(tmp_path: Path, workers: str | None) -> None:
    """With the image's environment (OPENAI_API_WORKERS=1), and with OPENAI_API_WORKERS=2 as the Kubernetes
    manifest sets it."""
    dockerfile = Dockerfile.parse(GATEWAY_DOCKERFILE)
    argv = dockerfile.entrypoint() + dockerfile.cmd()
    assert argv[0] == "openai-api"

    # The compose config (the shape the image is run with), pointed at this checkout's prepared
    # tokenizer folders and at a port where nothing listens.
    config = localize_model_config(json.loads(COMPOSE_MODEL_CONFIG.read_text(encoding="utf-8")),
                                   REPO / "models", triton_url="127.0.0.1:1")
    config_file = tmp_path / "model_config.json"
    config_file.write_text(json.dumps(config), encoding="utf-8")
    port = free_port()
    argv = replace_option(argv, "--host", "127.0.0.1")
    argv = replace_option(argv, "--port", str(port))
    argv = replace_option(argv, "--config-file", str(config_file))
    argv[0] = str(_console_script())

    log_path = tmp_path / "gateway.log"
    with open(log_path, "wb") as log:
        # cwd is an empty folder, as in the image (WORKDIR /tmp): nothing may rely on the repo's cwd.
        env = {**os.environ, **{k: v for k, v in dockerfile.env().items() if k.startswith("OPENAI_API_")}}
        if workers is not None:
            env["OPENAI_API_WORKERS"] = workers
        proc = subprocess.Popen(argv, cwd=tmp_path, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"gateway exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                status = _get(f"{base}/health")
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"gateway not serving after {START_TIMEOUT_S} s:\n{log_path.read_text()}")
                time.sleep(0.2)
        assert status == 200, "liveness must not depend on Triton"
        assert _get(f"{base}/health/ready") == 503, "Triton is down: not ready"

        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"gateway still running {STOP_TIMEOUT_S} s after SIGTERM:\n{log_path.read_text()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    log_text = log_path.read_text(encoding="utf-8", errors="replace")
    assert log_text.count("Application shutdown complete") == int(workers or 1), log_text
    assert "Traceback" not in log_text, log_text
    # 0, not "killed by SIGTERM" (plain uvicorn >= 0.29 re-raises the signal after its shutdown).
    assert code == 0, f"exit code {code}:\n{log_text}"
