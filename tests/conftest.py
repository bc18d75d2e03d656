"""Shared test helpers: repository paths and the optional OpenAI schema validator."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED_SPEC = REPO.parent / "shared" / "openai-spec"
MODELS = REPO / "models"


def _load_validator() -> Callable[[str, Any], None] | None:
    if not (SHARED_SPEC / "validate.py").is_file():
        return None
    sys.path.insert(0, str(SHARED_SPEC))
    try:
        from validate import validate  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(SHARED_SPEC))
    return validate  # type: ignore[no-any-return]


_VALIDATOR = _load_validator()


@pytest.fixture(scope="session")
def openai_schema() -> Callable[[str, Any], None]:
    """`openai_schema("CreateChatCompletionResponse", payload)` raises on any violation of OpenAI's
    published schema; skips the calling test when ../shared/openai-spec is not beside the clone."""

    def check(name: str, payload: Any) -> None:
        if _VALIDATOR is None:
            pytest.skip("../shared/openai-spec is not available in this clone")
        _VALIDATOR(name, payload)

    return check


def requires_models(*names: str) -> pytest.MarkDecorator:
    missing = [n for n in names if not (MODELS / n / "tokenizer.json").is_file()]
    return pytest.mark.skipif(bool(missing), reason=f"prepared models missing: {missing} (run scripts/setup.sh)")
