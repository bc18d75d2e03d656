"""Which dialect answers a path: the route table's dialect column (a new API: its module plus a row here)."""

from __future__ import annotations

from openai_api.http.dialects import anthropic_messages
from openai_api.http.dialects.base import OPENAI_ERRORS, ErrorWriter

# (path prefix, dialect), the first match wins; every other path is OpenAI's.
ROUTES: tuple[tuple[str, ErrorWriter], ...] = ((anthropic_messages.PREFIX, anthropic_messages.ANTHROPIC_ERRORS),)


def dialect_for(path: str) -> ErrorWriter:
    for prefix, dialect in ROUTES:
        if path.startswith(prefix):
            return dialect
    return OPENAI_ERRORS
