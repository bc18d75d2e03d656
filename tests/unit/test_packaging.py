"""The package as `pip install .` ships it (what docker/Dockerfile installs): every module it imports at run time
comes from a dependency pyproject.toml declares, and the files it reads (default model config, chat templates,
OpenAI's cl100k_base vocabulary) are package data. The installed package itself is run in
tests/e2e/test_installed_package.py; these are the fast, static halves of the same promise."""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

from openai_api.config import BUNDLED_CONFIG, BUNDLED_TEMPLATES, PACKAGE_ROOT
from tests.helpers import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
# openai_api/embedded/ is set-up tooling for the embedded Triton and the reference models: the `triton` extra
# (torch, transformers, peft) and the families' tokenizers of the dev extra; the gateway imports it only under
# --embedded-triton (cli.py).
EXTRA_ONLY = PACKAGE_ROOT / "embedded"
# Imported directly, installed by the declared dependency named here (which must really require it, below):
# FastAPI's own toolkit, pydantic's core, and tritonclient's transports.
COMES_WITH = {"starlette": "fastapi", "pydantic_core": "pydantic", "grpc": "tritonclient[grpc]",
              "aiohttp": "tritonclient[http]"}


def _name(spec: str) -> str:
    return re.sub(r"[-_.]+", "-", spec).lower()


def _runtime_imports() -> dict[str, list[str]]:
    """Top-level module -> the files of the shipped package (all but `EXTRA_ONLY`) that import it."""
    found: dict[str, list[str]] = {}
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        if path.is_relative_to(EXTRA_ONLY):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "openai_api" and top not in sys.stdlib_module_names:
                    found.setdefault(top, []).append(str(path.relative_to(REPO)))
    return found


def test_every_runtime_import_is_a_declared_dependency() -> None:
    declared = {_name(Requirement(d).name) for d in PYPROJECT["project"]["dependencies"]}
    owners = metadata.packages_distributions()
    problems = []
    for module, files in _runtime_imports().items():
        dists = {_name(d) for d in owners.get(module, [])}
        if dists & declared:
            continue
        if module in COMES_WITH:
            continue  # checked below
        problems.append(f"{module} (from {sorted(dists) or 'no installed distribution'}) imported by "
                        f"{sorted(set(files))[:3]}: not in [project].dependencies")
    assert not problems, "\n".join(problems)


def test_the_transitive_imports_come_with_the_dependency_named() -> None:
    declared = {_name(Requirement(d).name): Requirement(d) for d in PYPROJECT["project"]["dependencies"]}
    for module, via in COMES_WITH.items():
        parent = Requirement(via)
        assert _name(parent.name) in declared and parent.extras <= declared[_name(parent.name)].extras, \
            f"{module}: {via} is not declared"
        wanted = {_name(d) for d in metadata.packages_distributions()[module]}
        requires = [Requirement(r) for r in metadata.requires(parent.name) or []]
        brought = {_name(r.name) for r in requires
                   if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in parent.extras or {""})}
        assert wanted & brought, f"{module}: {via} does not require {sorted(wanted)}"


def test_the_default_config_and_templates_are_package_data() -> None:
    # Inside the package, so `pip install .` carries them (not a path next to site-packages).
    assert BUNDLED_CONFIG.is_file() and BUNDLED_CONFIG.is_relative_to(PACKAGE_ROOT)
    assert BUNDLED_TEMPLATES.is_dir() and BUNDLED_TEMPLATES.is_relative_to(PACKAGE_ROOT)
    data = PYPROJECT["tool"]["setuptools"]["package-data"]["openai_api"]
    shipped = {p.relative_to(PACKAGE_ROOT).as_posix() for p in PACKAGE_ROOT.rglob("*")
               if p.is_file() and p.suffix not in (".py", ".pyc") and "__pycache__" not in p.parts}
    assert shipped, "no data files"
    for rel in sorted(shipped):
        assert any(Path(rel).match(pattern) for pattern in data), f"{rel} is not in package-data"
