"""The vendored OpenAI OpenAPI description is the one its README names, and our validator reads it
the way the schema checks rely on (nullable means null is allowed; every violation is reported)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import OPENAI_SPEC


def test_vendored_copy_matches_its_readme() -> None:
    data = (OPENAI_SPEC / "openapi.json").read_bytes()
    readme = (OPENAI_SPEC / "README.md").read_text(encoding="utf-8")
    sha = re.search(r"sha256\s+`([0-9a-f]{64})`", readme)
    assert sha and hashlib.sha256(data).hexdigest() == sha.group(1), "openapi.json changed: update README.md"
    assert f"{len(data):,} bytes" in readme
    info = json.loads(data)["info"]
    assert f"**{info['version']}**" in readme
    assert info["license"]["name"] == "MIT"
    assert "OpenAI" in (OPENAI_SPEC / "LICENSE").read_text(encoding="utf-8")
    assert len(data) < 5 * 1024 * 1024


def test_nullable_fields_accept_null(openai_schema: Callable[[str, Any], None]) -> None:
    # Every stream chunk but the last has `finish_reason: null`, which the description allows only
    # through OpenAPI 3.0 `nullable: true` (a no-op keyword in JSON Schema 2020-12).
    spec = json.loads((OPENAI_SPEC / "openapi.json").read_text(encoding="utf-8"))
    choice = spec["components"]["schemas"]["CreateChatCompletionStreamResponse"]["properties"]["choices"]["items"]
    assert choice["properties"]["finish_reason"].get("nullable") is True
    chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m", "usage": None,
             "choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": None, "finish_reason": None}]}
    openai_schema("CreateChatCompletionStreamResponse", chunk)


def test_violations_are_all_listed(openai_schema: Callable[[str, Any], None]) -> None:
    with pytest.raises(ValueError, match=r"2 violation\(s\) of ErrorResponse") as err:
        openai_schema("ErrorResponse", {"error": {"message": 1, "type": "x", "param": None}})
    assert "error/message" in str(err.value) and "code" in str(err.value)
    with pytest.raises(KeyError):
        openai_schema("NoSuchSchema", {})
