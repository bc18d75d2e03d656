"""Fixtures for every tier (plain helpers live in tests/helpers.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.helpers import openai_validator


@pytest.fixture(scope="session")
def openai_schema() -> Callable[[str, Any], None]:
    """`openai_schema("CreateChatCompletionResponse", payload)` raises on any violation of OpenAI's
    published schema (the copy vendored in tests/openai_spec/)."""
    return openai_validator()
