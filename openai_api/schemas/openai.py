"""Request bodies of the OpenAI API, as this gateway accepts them.

Unknown fields are accepted and ignored (logged at debug), as vLLM does, so newer clients keep
working; fields we know but cannot honour are refused with a 400 naming them by the services.

Every known field has a strict JSON type (pydantic strict mode, `STRICT`): no integer for a boolean, no
string for a number, no boolean for an integer; an integer is a number (OpenAI takes `"temperature": 1`).
A wrong type is a 400 naming the field (`http.responses.validation_error`), never a silent coercion. Two
documented exceptions keep the seed system's clients working: `stream` of chat and completions takes the
strings "true" / "false" (`StreamFlag`), and rerank's `top_n` a numeric string.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError, core_schema

# Token counts and top-k travel as INT32 in every Triton LLM protocol (and vLLM turns them into int32 tensors).
_INT32_MAX = 2**31 - 1


# Strict on every request model, nested ones included: strictness is per model, not inherited by fields.
STRICT = ConfigDict(extra="allow", strict=True)


def _stream_flag(value: Any) -> Any:
    """`"stream": "true"` / `"false"` as the booleans they spell: the seed system's manual sends the string
    (shared seeds 002, `POST /v1/completions`), and the scripts of teams migrating from it do. Only these two
    strings, and only here: every other field stays strict (`"stream": "1"` or `1` is still a 400)."""
    return {"true": True, "false": False}.get(value, value) if isinstance(value, str) else value


# `stream` of chat and completions (the seed system's generation routes).
StreamFlag = Annotated[bool, BeforeValidator(_stream_flag)]


class _Request(BaseModel):
    model_config = STRICT

    def unknown_fields(self) -> list[str]:
        return sorted((self.model_extra or {}).keys())


class StreamOptions(BaseModel):
    model_config = STRICT
    include_usage: bool = False


class ToolCallFunction(BaseModel):
    model_config = STRICT
    name: str
    arguments: str = ""


class ToolCall(BaseModel):
    model_config = STRICT
    id: str = ""
    type: Literal["function"] = "function"
    function: ToolCallFunction


class TypedContent:
    """A message's content after its dialect parsed the client's list of parts (`services.parts.ChatParts`):
    set by the gateway in place of that list, never read from JSON (a body cannot produce one). A request's
    Python copies (`model_validate` of a request built by a service) keep it as it is; dumped, it is the list
    of chat parts it stands for (`wire`), as stored and as JSON."""

    __slots__ = ()

    def wire(self) -> list[dict[str, Any]]:
        """The content as chat's list of parts (`{"type": "text", ...}`, `{"type": "image_url", ...}`)."""
        raise NotImplementedError

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.is_instance_schema(
            cls, serialization=core_schema.plain_serializer_function_ser_schema(lambda value: value.wire()))


# What a client may send as `content`, for the OpenAPI document (a `TypedContent` never comes from JSON).
_CONTENT_SCHEMA = {"anyOf": [{"type": "string"}, {"items": {"additionalProperties": True, "type": "object"},
                                                  "type": "array"}, {"type": "null"}]}


class ChatMessage(BaseModel):
    model_config = STRICT
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # The client's parts (a list) are typed at the edge (`http.dialects.openai_chat`): a `TypedContent` below it.
    content: Annotated[str | list[dict[str, Any]] | TypedContent | None, WithJsonSchema(_CONTENT_SCHEMA)] = None
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
    stream: StreamFlag = False
    stream_options: StreamOptions | None = None
    # OpenAI's own cap; the in-flight limits bound prompts x n further (see http.inflight.Ticket).
    n: int = Field(default=1, ge=1, le=128)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    # Beyond these a penalty only overflows the logits (1e-300 divides them to inf): no model means it.
    repetition_penalty: float | None = Field(default=None, ge=0.01, le=100)
    min_tokens: int | None = Field(default=None, ge=0, le=_INT32_MAX)
    user: str | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's extensions, typed here so that a wrong type is a 400 like any other field. The guided fields
    # become a guide (`services.guides`); `ignore_eos` goes to the backend (`triton.llm.GenerationRequest`);
    # `skip_special_tokens` false is refused by the services (no Triton protocol here carries it), its default
    # is accepted.
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    structured_outputs: dict[str, Any] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        # As OpenAI, vLLM and Triton's own frontend: options for a stream on a plain answer are a client bug,
        # not something to ignore. `stream` is declared first, so it is in `info.data` (unless invalid itself).
        if value is not None and info.data.get("stream") is False:
            raise PydanticCustomError("stream_options", "stream_options can only be used when stream is true")
        return value

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
    # vLLM's name for a thinking budget: the thinking section's tokens, its end included, forced by the gateway
    # (`services.generation.budgeted_chunks`); Anthropic's `thinking.budget_tokens` arrives here too.
    thinking_token_budget: int | None = Field(default=None, ge=1, le=_INT32_MAX)


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
    background: bool | None = None  # generated by a task, polled with GET (`services.response_background`)
    previous_response_id: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    # Accepted with these meanings (`services.responses.check_fields`): `reasoning` {effort, summary} the
    # model's reasoning controls; `include` what items carry (`reasoning.encrypted_content`); `truncation`
    # auto | disabled; `prompt_cache_key` and `service_tier` echoed (Triton has no per-request cache key or
    # tier); `safety_identifier` the end user's id (the `user` when that is unset); `client_metadata`
    # (Codex's session ids) ignored.
    reasoning: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: str | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    safety_identifier: str | None = Field(default=None, max_length=64)
    client_metadata: dict[str, Any] | None = None


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
    model_config = STRICT
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
