"""Request bodies of Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`).

As the OpenAI bodies: unknown top-level fields are accepted and ignored (Anthropic adds fields often:
`service_tier`, `container`, `mcp_servers`, ...), known ones have strict JSON types, and a wrong type is a
400 naming the field. Content blocks, tools and `tool_choice` are kept as plain objects here and checked
block by block by `services.messages`, so that an unknown block type is a 400 naming its exact path
(`messages[1].content[0].type`) rather than a union-validation message.

Ranges follow Anthropic's API reference (https://docs.anthropic.com/en/api/messages): `max_tokens` >= 1
(required on `/v1/messages`), `temperature` 0-1, `top_p` 0-1, `top_k` >= 0. `thinking.budget_tokens` must be
below `max_tokens` (checked by the service, as Anthropic does); Anthropic's minimum budget of 1,024 tokens
is not required here, since small self-hosted models think in fewer.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from openai_api.schemas.openai import _INT32_MAX, _Request


class CountTokensRequest(_Request):
    """`/v1/messages/count_tokens`: the prompt part of a Messages request."""

    model: str = Field(min_length=1)
    messages: list[dict[str, Any]]
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None
    # `effort` (a reasoning control, `services.effort`); `format` (a JSON schema the answer follows)
    output_config: dict[str, Any] | None = None
    # Anthropic's context editing (`services.context_edits`)
    context_management: dict[str, Any] | None = None


class MessagesRequest(CountTokensRequest):
    """`/v1/messages`: Anthropic's Messages API request (see `services.messages` for each field's mapping)."""

    max_tokens: int = Field(ge=1, le=_INT32_MAX)
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=_INT32_MAX)
    metadata: dict[str, Any] | None = None
    stream: bool = False
