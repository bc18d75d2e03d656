"""Request bodies of the OpenAI API, as this gateway accepts them.

Unknown fields are accepted and ignored (logged at debug), as vLLM does, so newer clients keep
working; fields we know but cannot honour are refused with a 400 naming them by the services.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# Token counts and top-k travel as INT32 in every Triton LLM protocol (and vLLM turns them into int32 tensors).
_INT32_MAX = 2**31 - 1


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    def unknown_fields(self) -> list[str]:
        return sorted((self.model_extra or {}).keys())


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool = False


class ToolCallFunction(BaseModel):
    model_config = ConfigDict(extra="allow")
    name: str
    arguments: str = ""


class ToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")
    id: str = ""
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class _Sampling(_Request):
    model: str = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=_INT32_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=_INT32_MAX)
    seed: int | None = Field(default=None, ge=0, lt=2**64)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # OpenAI's own cap; the in-flight limits bound prompts x n further (see http.limits.Ticket).
    n: int = Field(default=1, ge=1, le=128)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    # Beyond these a penalty only overflows the logits (1e-300 divides them to inf): no model means it.
    repetition_penalty: float | None = Field(default=None, ge=0.01, le=100)
    min_tokens: int | None = Field(default=None, ge=0, le=_INT32_MAX)
    user: str | None = None
    logit_bias: dict[str, float] | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @model_validator(mode="after")
    def _check_stop(self) -> _Sampling:
        if isinstance(self.stop, list) and len(self.stop) > 16:
            raise ValueError("at most 16 stop sequences are allowed")
        return self


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=_INT32_MAX)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=5)
    suffix: str | None = None
    best_of: int | None = None
    # vLLM's extension: the tokenizer's added tokens (BOS) around a text prompt; false sends the text alone.
    add_special_tokens: bool = True


class ResponsesRequest(_Request):
    """OpenAI's Responses API request, as far as a self-hosted model can honour it (`services.responses`)."""

    model: str = Field(min_length=1)
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1, le=_INT32_MAX)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None


class EmbeddingRequest(_Request):
    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: str = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: str | None = None
    # NVIDIA NIM's retrieval fields: `input_type` `query` / `passage` (the model config's prefixes), and
    # `truncate` `NONE` / `START` / `END` (unset: the model config's `truncate`).
    input_type: str | None = None
    truncate: str | bool | None = None


class RerankDocument(BaseModel):
    model_config = ConfigDict(extra="allow")
    text: str


class RerankRequest(_Request):
    """Seed / Jina / Cohere v1 body: documents as strings or `{text}` objects; `top_n` may be a string
    in the seed system's clients."""

    model: str = Field(min_length=1)
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = None
    return_documents: bool = False

    @model_validator(mode="before")
    @classmethod
    def _coerce_top_n(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("top_n"), str) and data["top_n"].strip().isdigit():
            data = {**data, "top_n": int(data["top_n"])}
        return data

    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]
