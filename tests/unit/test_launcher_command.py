"""The tritonserver command line the launcher builds (`command.command_line`): config auto-completion off for
this repository's own models, whose configs are complete (checked here against the files themselves), and on
for any other repository, as Triton has it."""

from __future__ import annotations

import re
from pathlib import Path

from openai_api.embedded.command import DEFAULT_MODEL_REPOSITORY, command_line
from openai_api.embedded.launcher import EmbeddedTriton

FLAG = "--disable-auto-complete-config"


def _command(server: EmbeddedTriton) -> list[str]:
    return command_line(server, Path("/opt/triton"), Path("/opt/triton/backends"))


def test_auto_completion_is_off_for_this_repository_and_on_for_others(tmp_path: Path) -> None:
    assert FLAG in _command(EmbeddedTriton(models=["synthetic-llm"]))
    assert FLAG in _command(EmbeddedTriton(DEFAULT_MODEL_REPOSITORY))
    assert FLAG not in _command(EmbeddedTriton(tmp_path))
    assert FLAG in _command(EmbeddedTriton(tmp_path, auto_complete=False))
    assert FLAG not in _command(EmbeddedTriton(auto_complete=True))


def test_every_model_of_this_repository_has_a_complete_config() -> None:
    """With auto-completion off Triton takes each config.pbtxt as it is: it must name its backend and its
    tensors (a Python model with neither would have had them filled in from its model.py)."""
    configs = sorted(DEFAULT_MODEL_REPOSITORY.glob("*/config.pbtxt"))
    assert len(configs) >= 10
    for config in configs:
        text = config.read_text(encoding="utf-8")
        assert re.search(r'^\s*(backend|platform)\s*:\s*"\w+"', text, re.M), config
        assert re.search(r"^\s*input\s*\[", text, re.M), config
        assert re.search(r"^\s*output\s*\[", text, re.M), config
