"""Loading a config file: read, validated, its names checked across entries, then its files and adapters resolved;
`load_config` stops at the first problem, `check_config` lists them all, each one `ConfigError` naming the file, the
field (its path in the JSON: `llm[2].chat_template`) and the reason."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from openai_api.config.adapters import resolve_adapters
from openai_api.config.entries import EmbeddingModel, LLMModel, ModelInfo, RerankModel
from openai_api.config.files import _resolve_files
from openai_api.config.gateway import GatewayConfig, naming_problems
from openai_api.config.problems import ConfigError, _Problems


def _field_path(loc: tuple[Any, ...], data: Any) -> str:
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, str) and not isinstance(node, dict):
            continue  # a pydantic union-branch tag ("str", "list[int]"), not a key of the config
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
        try:
            node = node[item]
        except (KeyError, IndexError, TypeError):
            node = None
    return "".join(parts)


# The loader checks the naming rules across entries itself (`naming_problems`), so that each names its field.
_LOADER = {"names_checked_by_loader": True}
_ENTRY_MODELS: dict[str, type[BaseModel]] = {"model_infos": ModelInfo, "llm": LLMModel, "embedding": EmbeddingModel,
                                              "rerank": RerankModel}


def load_config(path: Path | str) -> GatewayConfig:
    """Read, validate and resolve a config file; raise `ConfigError` naming file, field and reason (the first
    problem found: `check_config` lists every one)."""
    config = _load(Path(path), _Problems(strict=True))
    assert config is not None  # a strict load raises instead
    return config


def check_config(path: Path | str) -> tuple[GatewayConfig | None, list[ConfigError]]:
    """Every problem `load_config` would stop at, in file order (a bad entry's own problems, then the
    checks across entries, then each valid entry's files), and the config of the entries that passed (None
    when the file itself cannot be read as a config)."""
    problems = _Problems(strict=False)
    config = _load(Path(path), problems)
    return config, problems.found


def _validation_reason(err: Any) -> str:
    if err["type"] == "missing":
        return "missing required field"
    if err["type"] == "extra_forbidden":
        return "unknown field"
    return str(err["msg"]).removeprefix("Value error, ")


def _valid_entries(data: dict[str, Any]) -> GatewayConfig:
    """The entries of `data` that validate on their own (what a config with errors can still be checked for)."""
    kept: dict[str, list[Any]] = {}
    positions: dict[str, list[int]] = {}
    for kind, model in _ENTRY_MODELS.items():
        entries = data.get(kind)
        kept[kind], positions[kind] = [], []
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            try:
                kept[kind].append(model.model_validate(entry))
            except ValidationError:
                continue  # reported already, with the whole config's errors
            positions[kind].append(i)
    config = GatewayConfig.model_construct(model_infos=kept["model_infos"], llm=kept["llm"],
                                           embedding=kept["embedding"], rerank=kept["rerank"])
    config._positions = positions
    return config


def _load(path: Path, problems: _Problems) -> GatewayConfig | None:
    if not path.is_file():
        problems.add(path, "", "config file not found")
        return None
    try:
        raw = path.read_bytes()
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        problems.add(path, "", f"not UTF-8 text ({e.reason})")
        return None
    except json.JSONDecodeError as e:
        problems.add(path, "", f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}")
        return None
    if not isinstance(data, dict):
        problems.add(path, "", "the top level must be a JSON object with model_infos/llm/embedding/rerank")
        return None
    for key in list(data):
        if key not in GatewayConfig.model_fields or key == "source":
            problems.add(path, key, "unknown model kind (expected model_infos, llm, embedding or rerank)")
            del data[key]
    llm_names: set[str] | None = None
    try:
        config = GatewayConfig.model_validate(data, context=_LOADER)
    except ValidationError as e:
        for err in e.errors():
            problems.add(path, _field_path(tuple(err["loc"]), data), _validation_reason(err))
        config = _valid_entries(data)
        entries = data.get("llm")
        llm_names = {e["name"] for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)} \
            if isinstance(entries, list) else set()
    for field, reason in naming_problems(config, llm_names):
        problems.add(path, field, reason)

    base = path.resolve().parent
    config.source = path.resolve()
    config._digest = hashlib.sha256(raw).hexdigest()
    for where, m in config.entries():
        _resolve_files(path, base, where, m, problems)
    resolve_adapters(config, path, problems)  # the adapters' files are read once, here
    return config
