"""The model config's JSON Schema, generated from the pydantic models that load it (`openai_api.config`).

Why generated: a hand-written schema drifts from what start-up accepts; this one is what the loader
validates with, field by field, so an editor pointed at it flags exactly what the gateway would refuse (an
unknown key, a wrong type, a value out of bounds). What only start-up can check (folders, templates, names
unique across entries) stays in `config.load_config`. The committed copy is
`docs/reference/model-config.schema.json` (`python scripts/docs.py` rewrites it; a test keeps it current).

`python -m openai_api.config_schema` prints it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from openai_api.config import GatewayConfig

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
# Fields of the models that are not keys of the file: set by the loader, never read from JSON.
_NOT_IN_FILE = ("source",)


def json_schema() -> dict[str, Any]:
    """The model config file's JSON Schema (validation mode: what the file may hold, defaults included)."""
    schema = GatewayConfig.model_json_schema(mode="validation")
    for name in _NOT_IN_FILE:
        schema["properties"].pop(name, None)
    schema["title"] = "openai-api-triton model config"
    schema["description"] = (
        "The gateway's model config (--config-file): the models it serves, each with the Triton that serves it "
        "(url) and its tokenizer folder (path). Generated from openai_api/config/; start-up also checks that "
        "folders and templates exist and that names and aliases are unique across entries.")
    return {"$schema": SCHEMA_DIALECT, **schema}


def schema_text() -> str:
    """The schema as committed: sorted keys, two-space indent, a final newline (stable diffs)."""
    return json.dumps(json_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    sys.stdout.write(schema_text())


if __name__ == "__main__":
    main()
