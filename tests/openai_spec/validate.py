#!/usr/bin/env python3
"""Validate a JSON payload against a component schema of OpenAI's OpenAPI description (openapi.json
beside this file; see README.md).

    python tests/openai_spec/validate.py CreateChatCompletionResponse response.json
    python tests/openai_spec/validate.py --list

From Python: `from tests.openai_spec.validate import validate`, then
`validate("CreateChatCompletionStreamResponse", chunk)` raises ValueError listing every violation.

The description is an OpenAPI 3.1 document that still carries OpenAPI 3.0 `nullable: true` in places;
JSON Schema 2020-12 ignores that keyword, so it is rewritten here into "null is also allowed".
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Any

SPEC = Path(__file__).with_name("openapi.json")


def _null_ok(node: Any) -> Any:
    """Rewrite OpenAPI 3.0 `nullable: true` into JSON Schema that also accepts null."""
    if isinstance(node, list):
        return [_null_ok(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = {k: _null_ok(v) for k, v in node.items()}
    if node.pop("nullable", False):
        return {"anyOf": [node, {"type": "null"}]}
    return node


@functools.lru_cache(maxsize=1)
def _schemas() -> dict[str, Any]:
    spec = json.loads(SPEC.read_text(encoding="utf-8"))
    return {"components": {"schemas": _null_ok(spec["components"]["schemas"])}}


def schema_names() -> list[str]:
    return sorted(_schemas()["components"]["schemas"])


@functools.cache
def _validator(name: str) -> Any:
    import jsonschema

    schemas = _schemas()
    if name not in schemas["components"]["schemas"]:
        raise KeyError(f"no schema named {name!r} in {SPEC.name}")
    return jsonschema.Draft202012Validator({"$ref": f"#/components/schemas/{name}", **schemas})


def validate(name: str, payload: Any) -> None:
    """Raise ValueError listing every violation of schema `name` in `payload` (KeyError: no such schema)."""
    errors = sorted(_validator(name).iter_errors(payload), key=lambda e: [str(p) for p in e.absolute_path])
    if errors:
        lines = [f"{'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message[:300]}" for e in errors[:20]]
        raise ValueError(f"{len(errors)} violation(s) of {name}:\n" + "\n".join(lines))


def main(argv: list[str]) -> int:
    if argv[1:2] == ["--list"]:
        print("\n".join(schema_names()))
        return 0
    if len(argv) != 3:
        print(f"{__doc__}\nusage: validate.py SCHEMA FILE.json | --list", file=sys.stderr)
        return 2
    payload = json.loads(Path(argv[2]).read_text(encoding="utf-8"))
    try:
        validate(argv[1], payload)
    except ValueError as e:
        print(e)
        return 1
    print(f"ok: {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
