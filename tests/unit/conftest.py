"""Unit-tier fixtures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture(scope="module")
def validate(openai_schema: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    """OpenAI schema validation (skips the test when ../shared/openai-spec is absent)."""
    return openai_schema
