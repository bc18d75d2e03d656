"""Where scripts/setup.sh installs torch from (issue #20): TORCH_VARIANT=cpu tries PyTorch's CPU wheel
index and falls back to the default index when it does not answer (the case on these machines), and
says what and why. The index is played by a loopback server or a closed loopback port (no traffic
leaves the machine); setup.sh's `install_torch` runs against a stub python that records pip's calls."""

from __future__ import annotations

import http.server
import importlib.util
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from tests.helpers import REPO, free_port

SCRIPT = REPO / "scripts" / "torch_source.py"
SPEC = "torch==2.13.0"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("torch_source", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["torch_source"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


ts = _module()


@pytest.fixture
def closed_index() -> str:
    """An index URL nothing answers at (a loopback port no one listens on)."""
    return f"http://127.0.0.1:{free_port()}/whl/cpu"


@pytest.fixture
def open_index() -> Iterator[str]:
    """A loopback 'CPU index' that answers 200 for /whl/cpu/torch/."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path.rstrip("/") == "/whl/cpu/torch"
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"<a href='torch-2.13.0+cpu.whl'>torch</a>" if ok else b"")

        def log_message(self, *args: object) -> None:
            return None

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/whl/cpu"
    server.shutdown()
    server.server_close()


def test_cpu_falls_back_to_the_default_index_when_the_cpu_index_is_unreachable(closed_index: str) -> None:
    assert not ts.reachable(closed_index, timeout_s=2)
    choice = ts.choose("cpu", SPEC, closed_index)
    assert choice.pip_args == []
    assert "not reachable" in choice.message and "default package index" in choice.message and SPEC in choice.message


def test_cpu_uses_the_cpu_index_when_it_answers_and_says_why(open_index: str) -> None:
    assert ts.reachable(open_index, timeout_s=5)
    choice = ts.choose("cpu", SPEC, open_index)
    assert choice.pip_args == ["--index-url", open_index]
    assert "CPU-only" in choice.message and "190 MB" in choice.message and "TORCH_VARIANT=default" in choice.message


def test_default_never_probes_and_an_unknown_variant_is_refused() -> None:
    def probe(_: str) -> bool:
        raise AssertionError("the default variant must not probe the CPU index")

    choice = ts.choose("default", SPEC, probe=probe)
    assert choice.pip_args == [] and "CUDA" in choice.message
    with pytest.raises(ValueError, match="TORCH_VARIANT"):
        ts.choose("gpu", SPEC)


def _run_cli(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), SPEC], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def test_the_command_line_prints_pip_arguments_and_one_line_of_why(closed_index: str, open_index: str) -> None:
    r = _run_cli({"TORCH_VARIANT": "cpu", "TORCH_CPU_INDEX": closed_index})
    assert r.returncode == 0 and r.stdout.strip() == "" and r.stderr.count("\n") == 1 and "not reachable" in r.stderr
    r = _run_cli({"TORCH_VARIANT": "cpu", "TORCH_CPU_INDEX": open_index})
    assert r.returncode == 0 and r.stdout.split() == ["--index-url", open_index]
    r = _run_cli({"TORCH_VARIANT": "nope"})
    assert r.returncode == 2 and "TORCH_VARIANT" in r.stderr


def _install_torch(tmp_path: Path, env: dict[str, str], pip_fails_with_index: bool = False) -> list[str]:
    """Run setup.sh's `install_torch` with a stub python: torch not installed, scripts/torch_source.py run
    for real, each `pip install` recorded (and failing with --index-url when asked). Returns pip's calls."""
    text = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    found = re.search(r"^install_torch\(\) \{\n.*?^\}\n", text, re.S | re.M)
    assert found, "setup.sh defines install_torch()"
    log = tmp_path / "pip.log"
    stub = tmp_path / "python"
    fail = "1" if pip_fails_with_index else "0"
    stub.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "-c" ]; then exit 1; fi                       # importlib.metadata: torch is not installed
if [ "$1" = "-m" ] && [ "$2" = "pip" ]; then
  echo "${{*:3}}" >> {log}
  case " $* " in *" --index-url "*) exit {fail};; esac
  exit 0
fi
exec {sys.executable} "$@"
""")
    stub.chmod(0o755)
    script = f"set -euo pipefail\nPY={stub}\nTORCH_SPEC='{SPEC}'\n{found.group(0)}install_torch\n"
    r = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60,
                       env={**os.environ, **env})
    assert r.returncode == 0, r.stderr
    return log.read_text().splitlines() if log.exists() else []


def test_setup_installs_from_the_default_index_when_the_cpu_index_is_unreachable(tmp_path: Path,
                                                                                 closed_index: str) -> None:
    calls = _install_torch(tmp_path, {"TORCH_VARIANT": "cpu", "TORCH_CPU_INDEX": closed_index})
    assert calls == [f"install -q {SPEC}"]


def test_setup_uses_the_cpu_index_and_falls_back_when_it_cannot_serve_the_pin(tmp_path: Path,
                                                                            open_index: str) -> None:
    calls = _install_torch(tmp_path, {"TORCH_VARIANT": "cpu", "TORCH_CPU_INDEX": open_index})
    assert calls == [f"install -q --index-url {open_index} {SPEC}"]
    again = tmp_path / "again"
    again.mkdir()
    calls = _install_torch(again, {"TORCH_VARIANT": "cpu", "TORCH_CPU_INDEX": open_index}, pip_fails_with_index=True)
    assert calls == [f"install -q --index-url {open_index} {SPEC}", f"install -q {SPEC}"]
