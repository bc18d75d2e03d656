"""The model config's JSON Schema (docs/reference/model-config.schema.json) is what `openai_api.config_schema`
generates from the pydantic models start-up loads the file with; the configs this repository ships and the
examples the docs show validate against it; what the loader refuses the schema refuses too; and every key
of the config is documented on docs/reference/model-config.md."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from openai_api import config as cfg
from openai_api.config_schema import json_schema, schema_text
from tests.helpers import REPO

SCHEMA_FILE = REPO / "docs" / "reference" / "model-config.schema.json"
PAGE = REPO / "docs" / "reference" / "model-config.md"


def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_committed_schema_is_what_the_code_generates() -> None:
    assert SCHEMA_FILE.read_text(encoding="utf-8") == schema_text(), (
        "docs/reference/model-config.schema.json is stale: run `.venv/bin/python scripts/docs.py`")


def shipped_configs() -> dict[str, Any]:
    configmap = yaml.safe_load((REPO / "deploy" / "kubernetes" / "configmap.yaml").read_text(encoding="utf-8"))
    return {
        "openai_api/model_config.json": json.loads(cfg.BUNDLED_CONFIG.read_text(encoding="utf-8")),
        "docker/model_config.compose.json": json.loads(
            (REPO / "docker" / "model_config.compose.json").read_text(encoding="utf-8")),
        "deploy/kubernetes/configmap.yaml": json.loads(configmap["data"]["model_config.json"]),
    }


def docs_examples() -> dict[str, Any]:
    """Every JSON block of docs/ that is a whole model config (no `...` placeholders)."""
    out: dict[str, Any] = {}
    for page in sorted((REPO / "docs").rglob("*.md")):
        for i, block in enumerate(re.findall(r"```json\n(.*?)```", page.read_text(encoding="utf-8"), re.S)):
            if "..." in block:
                continue
            try:
                data = json.loads(block)
            except ValueError:
                continue
            if isinstance(data, dict) and data and set(data) <= {"model_infos", "llm", "embedding", "rerank"}:
                out[f"{page.relative_to(REPO)}#{i}"] = data
    return out


@pytest.mark.parametrize("name", [*shipped_configs(), *docs_examples()])
def test_shipped_configs_and_docs_examples_validate(name: str) -> None:
    data = {**shipped_configs(), **docs_examples()}[name]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(data)]
    assert not errors, errors
    cfg.GatewayConfig.model_validate(data)  # and the loader's own models take it


def test_the_docs_show_whole_configs() -> None:
    assert len(docs_examples()) >= 2


@pytest.mark.parametrize("bad", [
    {"llm": [{"name": "m", "url": "h:8001", "path": "/m", "chat_templte": "x.jinja"}]},  # a typo
    {"llm": [{"name": "m", "url": "h:8001", "path": "/m", "protocol": "tensorrt"}]},  # not a protocol
    {"llm": [{"name": "m", "url": "h:8001"}]},  # no path
    {"embedding": [{"name": "e", "url": "h:8000", "path": "/e", "pooling": "max"}]},
    {"model_infos": [{"name": "m", "top_p": 1.5}]},
    {"llm": [{"name": "m", "url": "h:8001", "path": "/m", "routing": {"policy": "random"}}]},
    {"models": []},  # not a kind of entry
])
def test_what_the_loader_refuses_the_schema_refuses(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # pydantic's ValidationError is a ValueError
        cfg.GatewayConfig.model_validate(bad)
    assert list(validator().iter_errors(bad)), f"the schema accepts {bad}"


def fields(model: type[BaseModel]) -> set[str]:
    return {name for name, f in model.model_fields.items() if not f.exclude and name != "kind"}


def test_every_key_of_the_config_is_documented() -> None:
    page = PAGE.read_text(encoding="utf-8")
    documented = set(re.findall(r"`([a-z_][a-z0-9_.]*)`", page))
    models: dict[str, type[BaseModel]] = {
        "": cfg.GatewayConfig, "model_infos": cfg.ModelInfo, "llm": cfg.LLMModel, "embedding": cfg.EmbeddingModel,
        "rerank": cfg.RerankModel, "text_protocol": cfg.TextProtocolConfig, "output_config": cfg.RerankOutputConfig}
    missing = [f"{where}.{name}".lstrip(".") for where, model in models.items() for name in fields(model)
               if name not in documented and name != "source"]
    missing += [f"routing.{n}" for n in fields(cfg.RoutingConfig) if f"routing.{n}" not in page]
    missing += [f"discovery.{n}" for n in fields(cfg.DiscoveryConfig) if f"discovery.{n}" not in page]
    # LoRA adapter entries are documented with the LoRA guide.
    lora = (REPO / "docs" / "guides" / "lora.md").read_text(encoding="utf-8")
    missing += [f"adapters[].{n}" for n in fields(cfg.LoraAdapterEntry) if f'"{n}"' not in lora]
    assert not missing, f"config keys not documented on docs/reference/model-config.md: {missing}"


def test_the_schema_has_no_key_the_file_cannot_hold() -> None:
    assert "source" not in json_schema()["properties"]
    assert json_schema()["additionalProperties"] is False
