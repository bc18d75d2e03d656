"""What every test tier shares, defined once: repository paths, a free local port, the skip for prepared
models that are not there, and the OpenAI schema validator (vendored in tests/openai_spec/)."""

from __future__ import annotations

import logging
import os
import re
import shutil
import socket
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from openai_api.embedded.launcher import EmbeddedTriton

REPO = Path(__file__).resolve().parents[1]
# Prepared weights as scripts/setup.sh lays them out in the clone.
MODELS = REPO / "models"
# Where the launcher and the reference Triton models read them: $OPENAI_API_MODELS_DIR, else MODELS.
PREPARED_MODELS = Path(os.environ.get("OPENAI_API_MODELS_DIR", MODELS))
OPENAI_SPEC = REPO / "tests" / "openai_spec"


def reference_module(name: str) -> ModuleType:
    """A module beside the reference SmolLM2 engine (triton_models/smollm2-135m-instruct/1/<name>.py), loaded under
    its own name, as the Triton models import it, for unit tests of its parts that need no Triton."""
    import importlib.util

    path = REPO / "triton_models" / "smollm2-135m-instruct" / "1" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(name, module)
    spec.loader.exec_module(module)
    return module


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_now(server: EmbeddedTriton) -> None:
    """Stop a tritonserver a test started for itself, at teardown, without its graceful exit: Triton counts its
    models down in one-second steps after SIGTERM (3 s for one model here, 5-6 s for a few), ~30 such stops a
    run. `stop(timeout=0)` is the launcher's own stop, past the wait: SIGKILL to the process group, the stubs'
    shared memory removed, nothing left behind. Not for tests of the graceful stop itself."""
    logger = logging.getLogger("openai_api.embedded.launcher")
    level = logger.level
    logger.setLevel(logging.ERROR)  # its "did not exit in 0 s; killing it" is the point here
    try:
        server.stop(timeout=0)
    finally:
        logger.setLevel(level)


def derived_model(root: Path, source: str, name: str, parameters: dict[str, str]) -> Path:
    """Copy reference model `source` from triton_models/ into repository `root` as `name`, with config
    `parameters` set (each must exist in the source config): a variant without a second copy in the tree."""
    src, dst = REPO / "triton_models" / source, root / name
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
    cfg = (dst / "config.pbtxt").read_text(encoding="utf-8").replace(f'name: "{source}"', f'name: "{name}"')
    for key, value in parameters.items():
        pattern = rf'(key: "{re.escape(key)}" value: {{ string_value: )"[^"]*"'
        cfg, count = re.subn(pattern, rf'\1"{value}"', cfg)
        if count != 1:
            raise ValueError(f"{source}/config.pbtxt has no parameter {key!r}")
    (dst / "config.pbtxt").write_text(cfg, encoding="utf-8")
    return dst


def missing_models(*names: str, files: Iterable[str] = ("tokenizer.json",), root: Path = MODELS) -> str | None:
    """Why a test needing these prepared models (each folder under `root` holding `files`) must skip;
    None when they are all there. For a module that others import from, skip its import too:

        if reason := missing_models(MODEL):
            pytest.skip(reason, allow_module_level=True)
    """
    needed = tuple(files)
    missing = [n for n in names if not all((root / n / f).is_file() for f in needed)]
    if not missing:
        return None
    where = "" if root == MODELS else f" in {root}"
    return f"prepared models missing{where}: {missing} (run scripts/setup.sh)"


def requires_models(*names: str, files: Iterable[str] = ("tokenizer.json",),
                    root: Path = MODELS) -> pytest.MarkDecorator:
    """Skip the test (or the module, as `pytestmark`) unless these prepared models are there."""
    reason = missing_models(*names, files=files, root=root)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


def openai_validator() -> Callable[[str, Any], None]:
    """`validate(schema_name, payload)` against OpenAI's published OpenAPI description; raises
    ValueError listing every violation, KeyError for an unknown schema name."""
    from tests.openai_spec.validate import validate

    return validate
