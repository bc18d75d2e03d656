"""OpenAI's Chat Completions API (`/v1/chat/completions`) at the HTTP edge.

Its body is validated once from the request's bytes (`http.fastpath`) into `ChatCompletionRequest`, with
OpenAI's own field names in every 400 (`param`); `parse` then reads each message's list of content parts once
into typed parts (`services.parts.chat_parts`: text and images; an image's shape and role checked, any other
part type a 400 naming `messages[i].content[j]`), so the services render `ChatParts`, never the client's
dicts. Its answer is a `chat.completion` or `chat.completion.chunk` events (`services.chat.ChatStreamEncoder`);
its errors are OpenAI's (`base.OpenAIDialect`).
"""

from __future__ import annotations

from openai_api.http.dialects.base import OpenAIDialect
from openai_api.schemas.openai import ChatCompletionRequest
from openai_api.services.parts import typed_messages

PATH = "/v1/chat/completions"


class OpenAIChat(OpenAIDialect):
    name = "openai_chat"


def parse(body: ChatCompletionRequest) -> ChatCompletionRequest:
    """The typed call of a chat body: the body, its content parts typed (see the module docstring). Run after
    admission, whose depth check reads the parts as the client sent them."""
    typed = typed_messages(body.messages)
    return body if typed is body.messages else body.model_copy(update={"messages": typed})


DIALECT = OpenAIChat()
