"""`openai-api check-config FILE [--probe]` (openai_api/checkconfig.py), `openai-api --version` and
`python -m openai_api`: every problem of a config listed, one line each, from all three passes (the file,
building each model, asking Triton); exit 1 when any. The probe against a real tritonserver runs in
tests/e2e/test_installed_package.py, through the installed console script."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from openai_api.checkconfig import main as check_config_main
from tests.helpers import REPO, free_port
from tests.unit.test_config import make_tokenizer_dir, seed_config, write

__all__ = ["seed_config"]  # the fixture, shared with test_config.py


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[str]]:
    code = check_config_main(list(args))
    return code, capsys.readouterr().out.splitlines()


def test_a_good_config_is_ok_and_exits_0(tmp_path: Path, seed_config: dict[str, Any],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, seed_config)
    code, lines = run(capsys, str(path))
    assert code == 0 and lines == [f"{path}: OK (3 models read and built)"]


def test_every_problem_of_every_pass_is_listed(tmp_path: Path, seed_config: dict[str, Any],
                                               capsys: pytest.CaptureFixture[str]) -> None:
    seed_config["model_infos"][0]["temprature"] = 0.5  # pass 1: the file
    seed_config["embedding"][0]["path"] = str(tmp_path / "nowhere")
    broken = make_tokenizer_dir(tmp_path / "broken")
    (broken / "tokenizer.json").write_text("{}", encoding="utf-8")  # there, but no tokenizer: pass 2, building
    seed_config["rerank"][0]["path"] = str(broken)
    dead = f"127.0.0.1:{free_port()}"  # pass 3: nothing listens there
    for kind in ("llm", "embedding", "rerank"):
        seed_config[kind][0]["url"] = dead
    path = write(tmp_path, seed_config)
    code, lines = run(capsys, str(path), "--probe", "--timeout", "5")
    assert code == 1
    assert lines[:2] == [f"{path}: model_infos[0].temprature: unknown field",
                         f"{path}: embedding[0].path: tokenizer folder not found: {tmp_path / 'nowhere'}"]
    assert lines[2].startswith(f"{path}: rerank[0]: model 'bge-reranker' cannot be built: "), lines  # tokenizers' words
    # Every entry is probed, whatever else is wrong with it.
    assert [line.split(": ")[1] for line in lines[3:-1]] == ["llm[0].url", "embedding[0].url", "rerank[0].url"]
    assert all(f".url: {dead}: " in line and "unreachable" in line for line in lines[3:-1]), lines
    assert lines[-1] == f"{path}: 6 problems"


def test_an_unreadable_file_is_one_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "{not json")
    code, lines = run(capsys, str(path), "--probe")
    assert code == 1 and len(lines) == 2 and "invalid JSON" in lines[0] and lines[1] == f"{path}: 1 problem"


def test_a_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        check_config_main([])
    assert e.value.code == 2 and "FILE" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["-m", "openai_api"], ["openai_api_cli.py"]], ids=["python-m", "script"])
def test_the_module_and_the_script_run_the_same_command(tmp_path: Path, seed_config: dict[str, Any],
                                                        command: list[str]) -> None:
    version = subprocess.run([sys.executable, *command, "--version"], cwd=REPO, capture_output=True, text=True,
                             timeout=120, check=False)
    assert version.returncode == 0 and version.stdout.strip() == \
        f"openai-api {importlib.metadata.version('openai-api-triton')}"
    seed_config["llm"][0]["chat_template"] = "no-such.jinja"
    path = write(tmp_path, json.loads(json.dumps(seed_config)))
    proc = subprocess.run([sys.executable, *command, "check-config", str(path)], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.splitlines() == [f"{path}: llm[0].chat_template: template file not found: no-such.jinja",
                                        f"{path}: 1 problem"]
