"""Shared helpers for the deployment tests: paths, a small Dockerfile parser, tool lookup."""

from __future__ import annotations

import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import REPO

DOCKER = REPO / "docker"
K8S = REPO / "deploy" / "kubernetes"
GATEWAY_DOCKERFILE = DOCKER / "Dockerfile"
TRITON_DOCKERFILE = DOCKER / "triton.Dockerfile"
COMPOSE_FILE = DOCKER / "compose.yaml"
COMPOSE_MODEL_CONFIG = DOCKER / "model_config.compose.json"
WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".bin", ".pt", ".pth", ".onnx", ".plan", ".engine", ".h5")


def find_tool(name: str) -> str | None:
    """`name` on PATH, else next to this interpreter (a tool installed in the venv that is not active)."""
    found = shutil.which(name)
    if found:
        return found
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.is_file() else None


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, ...
    args: str  # the rest of the (joined) line
    stage: int  # index of the build stage it belongs to (-1 before the first FROM)

    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction, else None (shell form)."""
        text = self.args
        if self.keyword == "HEALTHCHECK":
            text = text.split("CMD", 1)[1] if "CMD" in text else ""
        text = text.strip()
        if not text.startswith("["):
            return None
        value = json.loads(text)
        assert isinstance(value, list) and all(isinstance(v, str) for v in value)
        return value


@dataclass
class Dockerfile:
    path: Path
    instructions: list[Instruction] = field(default_factory=list)

    @classmethod
    def parse(cls, path: Path) -> Dockerfile:
        logical: list[str] = []
        current = ""
        for raw in path.read_text(encoding="utf-8").splitlines():
            stripped = raw.strip()
            if stripped.startswith("#"):
                continue  # comments (also inside continued lines, as Docker does)
            if not stripped and not current:
                continue
            if stripped.endswith("\\"):
                current += stripped[:-1] + " "
                continue
            current += stripped
            if current.strip():
                logical.append(current.strip())
            current = ""
        if current.strip():
            logical.append(current.strip())
        out = cls(path)
        stage = -1
        for line in logical:
            keyword, _, args = line.partition(" ")
            keyword = keyword.upper()
            if keyword == "FROM":
                stage += 1
            out.instructions.append(Instruction(keyword, re.sub(r"\s+", " ", args).strip(), stage))
        return out

    def all(self, keyword: str, stage: int | None = None) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword and (stage is None or i.stage == stage)]

    @property
    def final_stage(self) -> int:
        return max(i.stage for i in self.instructions)

    def arg_defaults(self) -> dict[str, str]:
        """Defaults of every ARG (global and per stage); later ones win."""
        out: dict[str, str] = {}
        for ins in self.all("ARG"):
            name, sep, value = ins.args.partition("=")
            if sep:
                out[name.strip()] = value.strip().strip('"')
        return out

    def expand(self, text: str) -> str:
        """Substitute ${ARG} / $ARG with the ARG defaults."""
        args = self.arg_defaults()
        return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), m.group(0)), text)

    def base_images(self) -> list[str]:
        """The image of each FROM (ARGs expanded, `AS name` and `--platform` dropped)."""
        images = []
        for ins in self.all("FROM"):
            words = [w for w in ins.args.split() if not w.startswith("--")]
            images.append(self.expand(words[0]))
        return images

    def env(self) -> dict[str, str]:
        """The final stage's ENV (key=value form), later ones winning."""
        out: dict[str, str] = {}
        for ins in self.all("ENV", self.final_stage):
            out.update(pair.split("=", 1) for pair in ins.args.split() if "=" in pair)
        return out

    def entrypoint(self) -> list[str]:
        found = self.all("ENTRYPOINT", self.final_stage)
        assert found, f"{self.path}: no ENTRYPOINT in the final stage"
        form = found[-1].exec_form()
        assert form is not None, f"{self.path}: ENTRYPOINT must be in exec form (JSON array)"
        return form

    def cmd(self) -> list[str]:
        found = self.all("CMD", self.final_stage)
        assert found, f"{self.path}: no CMD in the final stage"
        form = found[-1].exec_form()
        assert form is not None, f"{self.path}: CMD must be in exec form (JSON array)"
        return form


def option_value(argv: list[str], flag: str) -> str | None:
    """The value after the last `flag` (or `flag=value`) in argv, as argparse would take it."""
    value = None
    for i, word in enumerate(argv):
        if word == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def replace_option(argv: list[str], flag: str, value: str) -> list[str]:
    """argv with every value of `flag` replaced (the flag must be present)."""
    out = list(argv)
    hit = False
    for i, word in enumerate(out):
        if word == flag:
            out[i + 1] = value
            hit = True
        elif word.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            hit = True
    assert hit, f"{flag} not in {argv}"
    return out


def graceful_shutdown_seconds() -> float:
    """Worst-case seconds from SIGTERM to exit, read from the source rather than assumed: the drain
    phase (`Settings.shutdown_grace_s`, where the gateway has one) plus the largest
    `timeout_graceful_shutdown` the gateway passes to uvicorn."""
    from openai_api.settings import Settings

    found = [
        int(m.group(1))
        for source in sorted((REPO / "openai_api").rglob("*.py"))
        for m in re.finditer(r"timeout_graceful_shutdown\s*=\s*(\d+)", source.read_text(encoding="utf-8"))
    ]
    assert found, "openai_api/ no longer passes timeout_graceful_shutdown to uvicorn"
    drain = float(getattr(Settings(config_file=Path(".")), "shutdown_grace_s", 0.0) or 0.0)
    return drain + max(found)


def localize_model_config(config: dict, models_dir: Path, triton_url: str | None = None) -> dict:
    """A deployment model config rewritten for this machine: `/models/<x>` -> `<models_dir>/<x>`
    (absolute), and every url -> `triton_url` when given."""
    out = json.loads(json.dumps(config))
    for kind in ("llm", "embedding", "rerank"):
        for entry in out.get(kind, []):
            path = Path(entry["path"])
            assert path.is_absolute() and path.parts[:2] == ("/", "models"), (
                f"{kind}/{entry['name']}: path {entry['path']} is not under the /models mount"
            )
            entry["path"] = str(models_dir.joinpath(*path.parts[2:]))
            if triton_url is not None:
                entry["url"] = triton_url
    return out
