"""Request bodies of the retrieval and tokenizer dialects beside OpenAI's: NVIDIA NIM's `/v1/ranking`,
Hugging Face TEI's `/embed` and `/rerank`, Infinity's `/rerank`, and vLLM's `/tokenize` / `/detokenize`.

As for OpenAI's bodies, unknown fields are accepted and ignored, known ones have strict JSON types (a wrong
type is a 400 naming the field); what a field may hold beyond its type
(one of `texts` / `documents`, a truncation spelling) is checked by the services, with a 400 naming it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from openai_api.schemas.openai import STRICT, ChatMessage, RerankDocument, _Request


class RankingText(BaseModel):
    model_config = STRICT
    text: str


class RankingRequest(_Request):
    """NIM `/v1/ranking`: `{model, query: {text}, passages: [{text}], truncate?}`."""

    model: str = Field(min_length=1)
    query: RankingText
    passages: list[RankingText]
    truncate: str | None = None


class TEIEmbedRequest(_Request):
    """TEI `/embed`. TEI serves one model and has no `model` field: unset, the first embedding model."""

    inputs: str | list[str]
    model: str | None = None
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: str | None = None
    dimensions: int | None = Field(default=None, ge=1)


class RootRerankRequest(_Request):
    """`/rerank` without a prefix, where two servers' clients post: TEI (`texts`, `raw_scores`,
    `return_text`, `truncate`, `truncation_direction`; no `model`) and Infinity (`documents` as strings,
    `return_documents`, `raw_scores`, `top_n`, `model`). Which one a request is follows from its body."""

    query: str
    model: str | None = None
    texts: list[str] | None = None
    documents: list[str | RerankDocument] | None = None
    raw_scores: bool = False
    return_text: bool = False
    return_documents: bool = False
    top_n: int | None = None
    truncate: bool | None = None
    truncation_direction: str | None = None


class TokenizeRequest(_Request):
    """vLLM `/tokenize`: a `prompt`, or chat `messages` rendered with the model's template as
    `/v1/chat/completions` renders them. `model` unset: the first LLM (else the first model)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool | None = None
    return_token_strs: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Request):
    """vLLM `/detokenize`: `{model, tokens}` -> `{prompt}`."""

    model: str | None = None
    tokens: list[int]
