"""Shared test helpers: repository paths and the OpenAI schema validator."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models"


@pytest.fixture(scope="session")
def openai_schema() -> Callable[[str, Any], None]:
    """`openai_schema("CreateChatCompletionResponse", payload)` raises on any violation of OpenAI's
    published schema (the copy vendored in tests/openai_spec/)."""
    from tests.openai_spec.validate import validate

    return validate


def requires_models(*names: str) -> pytest.MarkDecorator:
    missing = [n for n in names if not (MODELS / n / "tokenizer.json").is_file()]
    return pytest.mark.skipif(bool(missing), reason=f"prepared models missing: {missing} (run scripts/setup.sh)")
