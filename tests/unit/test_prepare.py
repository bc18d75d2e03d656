"""``prepare_models`` is idempotent, adopts hand-prepared folders and fills in the chat template."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from openai_api.embedded.folders import default_models_dir
from openai_api.embedded.prepare import MARKER, MINILM_NAME, SMOLLM2_NAME, prepare_models


def _check_smollm2(folder: Path) -> None:
    for name in ("model.safetensors", "config.json", "tokenizer.json", "generation_config.json", MARKER):
        assert (folder / name).is_file(), name
    tc = json.loads((folder / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tc["chat_template"]
    assert (folder / "chat_template.jinja").read_text() == tc["chat_template"]


def _built(paths: dict[str, Path]) -> dict[str, tuple[int, int]]:
    """(inode, mtime) of each prepared weight file: a rebuild (temporary folder renamed in) changes both."""
    return {name: ((folder / "model.safetensors").stat().st_ino, (folder / "model.safetensors").stat().st_mtime_ns)
            for name, folder in paths.items()}


def test_default_dir_is_idempotent() -> None:
    first = prepare_models()  # cold only on a fresh checkout (~30 s)
    before = _built(first)
    second = prepare_models()
    assert first == second
    assert _built(second) == before, "a second run rebuilt a prepared folder"
    assert set(first) == {SMOLLM2_NAME, MINILM_NAME}
    _check_smollm2(first[SMOLLM2_NAME])
    assert (first[MINILM_NAME] / "model.safetensors").is_file()
    assert not list(default_models_dir().glob(".*tmp*")), "temporary build folders are cleaned up"


def test_adopts_hand_prepared_folder(tmp_path: Path) -> None:
    # A folder laid out by hand (no marker, no chat_template in tokenizer_config.json) is adopted
    # as-is instead of being converted again.
    src = prepare_models()[SMOLLM2_NAME]
    dst = tmp_path / SMOLLM2_NAME
    dst.mkdir()
    for name in ("model.safetensors", "tokenizer.json", "config.json", "chat_template.jinja"):
        (dst / name).symlink_to(src / name)
    tc = json.loads((src / "tokenizer_config.json").read_text())
    tc.pop("chat_template", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(tc))
    paths = prepare_models(tmp_path)
    assert paths[SMOLLM2_NAME] == dst.resolve()
    assert (dst / "model.safetensors").is_symlink(), "adoption must not re-convert the GGUF"
    _check_smollm2(dst)
    assert (paths[MINILM_NAME] / "model.safetensors").is_file()
    assert (paths[MINILM_NAME] / MARKER).is_file()
    before = _built(paths)
    assert prepare_models(tmp_path) == paths
    assert _built(paths) == before


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("OPENAI_API_SETUP_BUILT_COLD") == "1",
                    reason="this run's set-up prepared the models cold (scripts/test.sh): the same path, just run; "
                           "test_default_dir_is_idempotent checks its folder")
def test_cold_preparation(tmp_path: Path) -> None:
    t0 = time.monotonic()
    paths = prepare_models(tmp_path)
    cold = time.monotonic() - t0
    _check_smollm2(paths[SMOLLM2_NAME])
    assert not list(tmp_path.glob(".*tmp*")), "temporary build folders are cleaned up"
    before = _built(paths)
    assert prepare_models(tmp_path) == paths
    assert _built(paths) == before, f"the warm run after a {cold:.0f} s cold run rebuilt a folder"
    shutil.rmtree(tmp_path)
