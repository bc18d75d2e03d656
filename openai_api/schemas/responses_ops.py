"""Bodies of `/v1/responses/input_tokens` and `/v1/responses/compact` (`services.response_ops`): a `/v1/responses`
body whose `input` may be left out (OpenAI's `TokenCountsBody` and `CompactResponseMethodPublicBody`), as when a
`previous_response_id` alone names the conversation."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from openai_api.schemas.openai import ResponsesRequest


class ResponsesOpRequest(ResponsesRequest):
    input: str | list[dict[str, Any]] = Field(default_factory=list)
