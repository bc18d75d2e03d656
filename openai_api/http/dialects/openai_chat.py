"""OpenAI's Chat Completions API (`/v1/chat/completions`) at the HTTP edge.

Its body is the services' typed call already: `ChatCompletionRequest`, validated once from the request's bytes
(`http.fastpath`), with OpenAI's own field names in every 400 (`param`). Its answer is a `chat.completion` or
`chat.completion.chunk` events (`services.chat.ChatStreamEncoder`); its errors are OpenAI's (`base.OpenAIDialect`).
"""

from __future__ import annotations

from openai_api.http.dialects.base import OpenAIDialect
from openai_api.schemas.openai import ChatCompletionRequest

PATH = "/v1/chat/completions"


class OpenAIChat(OpenAIDialect):
    name = "openai_chat"


def parse(body: ChatCompletionRequest) -> ChatCompletionRequest:
    """The typed call of a chat body: the body itself (see the module docstring)."""
    return body


DIALECT = OpenAIChat()
