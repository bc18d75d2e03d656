"""Unit-tier fixtures."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


@pytest.fixture(scope="module")
def validate(openai_schema: Callable[[str, Any], None]) -> Callable[[str, Any], None]:
    """OpenAI schema validation (the vendored tests/openai_spec/; never skips)."""
    return openai_schema
