"""OpenAI's Responses API (`/v1/responses`) at the HTTP edge.

`parse` reads the body's `input` once into typed items (`services.response_input.read_input`: messages with
text and image parts, the client's record of calls and their outputs, reasoning, compaction summaries), every
400 naming the client's field (`input[2].content[1].image_url`); the Responses service lowers those items to
the chat pipeline (`services.responses`) and never reads an item's `type` again. Requests the services make
themselves (a background response's, a compaction's) are read the same way there. This dialect puts the
service's answer on the wire and writes its errors in OpenAI's shape (`base.OpenAIDialect`).
"""

from __future__ import annotations

from openai_api.http.dialects.base import OpenAIDialect
from openai_api.schemas.openai import ResponsesRequest
from openai_api.services.response_input import ResponseInput, read_input

PREFIX = "/v1/responses"


class OpenAIResponses(OpenAIDialect):
    name = "openai_responses"


def parse(body: ResponsesRequest) -> ResponseInput:
    """The typed input of a Responses body (see the module docstring); run after admission, whose depth check
    reads the body as sent."""
    return read_input(body)


DIALECT = OpenAIResponses()
