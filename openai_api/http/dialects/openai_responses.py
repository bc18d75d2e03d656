"""OpenAI's Responses API (`/v1/responses`) at the HTTP edge: a thin adapter.

The Responses translation (input items, tools, stored responses) lives in `services.responses` and its
helpers, which map a `ResponsesRequest` onto the chat pipeline themselves; this dialect only puts that
service's answer on the wire and writes its errors in OpenAI's shape (`base.OpenAIDialect`).
"""

from __future__ import annotations

from openai_api.http.dialects.base import OpenAIDialect

PREFIX = "/v1/responses"


class OpenAIResponses(OpenAIDialect):
    name = "openai_responses"


DIALECT = OpenAIResponses()
