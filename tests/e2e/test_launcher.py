"""``EmbeddedTriton`` lifecycle: start, stop without orphans, and failures that name Triton's reason."""

from __future__ import annotations

import os
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from openai_api.embedded.launcher import EmbeddedTriton, TritonLaunchError

CONFIG = """
backend: "python"
max_batch_size: 0
input [{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }]
output [{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }]
"""

GOOD_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())])
            for r in requests
        ]
"""

BROKEN_MODEL = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("deliberately broken model: kaboom-4711")

    def execute(self, requests):
        return None
"""


def _add_model(repo: Path, name: str, source: str) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG)
    (repo / name / "1" / "model.py").write_text(source)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    _add_model(repo, "echo", GOOD_MODEL)
    _add_model(repo, "broken", BROKEN_MODEL)
    return repo


def _group_members(pgid: int) -> list[int]:
    """Pids whose process group is ``pgid`` (Triton and its python stubs)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # Field 5 (pgrp) follows the parenthesised command name, which may itself hold spaces.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_start_stop_leaves_no_process(repo: Path) -> None:
    server = EmbeddedTriton(repo, models=["echo"], startup_timeout=120)
    with server:
        pid = server.pid
        assert pid is not None and server.is_running()
        members = _group_members(pid)
        assert any("triton_python_backend_stub" in _cmdline(p) for p in members), members
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/echo/ready", timeout=5) as resp:
            assert resp.status == 200
        with urllib.request.urlopen(server.metrics_url, timeout=5) as resp:
            assert resp.status == 200
        assert server.grpc_url.startswith("127.0.0.1:")
    assert not server.is_running() and server.pid is None
    assert not Path(f"/proc/{pid}").exists() or _group_members(pid) == []
    assert _group_members(pid) == []
    server.stop()  # idempotent


def test_broken_model_raises_with_reason(repo: Path) -> None:
    server = EmbeddedTriton(repo, models=["echo", "broken"], startup_timeout=120)
    with pytest.raises(TritonLaunchError, match="kaboom-4711") as info:
        server.start()
    assert "broken" in str(info.value)
    assert not server.is_running()


def test_unknown_model_raises(repo: Path) -> None:
    server = EmbeddedTriton(repo, models=["no-such-model"], startup_timeout=120)
    with pytest.raises(TritonLaunchError, match="no-such-model"):
        server.start()
    assert not server.is_running()


def test_started_from_short_lived_thread_survives(repo: Path) -> None:
    """PR_SET_PDEATHSIG is per thread: a start() from a thread that then exits must not kill Triton."""
    server = EmbeddedTriton(repo, models=["echo"], startup_timeout=120)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            server.start()
        except BaseException as exc:  # noqa: BLE001 - re-raised by the assertion below
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    try:
        assert not errors, errors
        time.sleep(1.0)
        assert server.is_running()
        assert server.pid is not None and os.getpgid(server.pid) == server.pid
    finally:
        server.stop()
    assert not server.is_running()
