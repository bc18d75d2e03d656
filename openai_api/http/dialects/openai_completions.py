"""OpenAI's (legacy) Completions API (`/v1/completions`) at the HTTP edge.

Its body is the services' typed call already: `CompletionRequest`, validated once from the request's bytes
(`http.fastpath`). Its answer is a `text_completion` or its chunks (`services.completions`); its errors are
OpenAI's (`base.OpenAIDialect`).
"""

from __future__ import annotations

from openai_api.http.dialects.base import OpenAIDialect
from openai_api.schemas.openai import CompletionRequest

PATH = "/v1/completions"


class OpenAICompletions(OpenAIDialect):
    name = "openai_completions"


def parse(body: CompletionRequest) -> CompletionRequest:
    """The typed call of a completions body: the body itself."""
    return body


DIALECT = OpenAICompletions()
