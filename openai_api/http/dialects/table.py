"""Which dialect answers a path: the route table's dialect column (a new API: its module plus a row here).

Errors are written by the dialect of the request's path wherever they are answered (`base`), so this table,
not each route, decides a path's error shape; every path not named here speaks OpenAI's.
"""

from __future__ import annotations

from openai_api.http.dialects import anthropic_messages, openai_chat, openai_completions, openai_responses
from openai_api.http.dialects.base import OPENAI, Dialect

# (path prefix, dialect), the first match wins.
ROUTES: tuple[tuple[str, Dialect], ...] = (
    (anthropic_messages.PREFIX, anthropic_messages.DIALECT),  # /v1/messages, /v1/messages/count_tokens
    (openai_chat.PATH, openai_chat.DIALECT),
    (openai_completions.PATH, openai_completions.DIALECT),
    (openai_responses.PREFIX, openai_responses.DIALECT),
)


def dialect_for(path: str) -> Dialect:
    for prefix, dialect in ROUTES:
        if path.startswith(prefix):
            return dialect
    return OPENAI
