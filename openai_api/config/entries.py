"""The model entries of the file, one pydantic model per kind: `ModelInfo` (an LLM's generation defaults, the seed's
`model_infos`), `LLMModel` with its blocks (`TextProtocolConfig` for a custom text model, a `LoraAdapterEntry` per
adapter), `EmbeddingModel`, and `RerankModel` with its `RerankOutputConfig`. What each key means and defaults to is
said here, once, and reaches the JSON Schema (`config_schema`) through its `Field(description=...)`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from openai_api.config.problems import _Strict
from openai_api.config.serving import _Served
from openai_api.text.families import ReasoningParserName, ToolParserName

Transport = Literal["grpc", "http"]
LLMProtocol = Literal["auto", "tensorrt_llm", "vllm", "fastertransformer", "tensorrt_llm_text", "text"]
# Request parameters a text_protocol block can map to model inputs (`triton.text.TEXT_PARAMS`).
TextParam = Literal["temperature", "top_p", "top_k", "seed", "repetition_penalty", "presence_penalty",
                    "frequency_penalty", "min_tokens", "end_id", "pad_id"]


class ModelInfo(_Strict):
    """Generation defaults for one LLM (seed `model_infos`), keyed by the name of an `llm` entry. As in a model
    entry, an unknown key is an error (a typo such as "temprature" would otherwise be a silent default)."""

    name: str
    start_id: int | None = None
    # Negative ids (the seed uses -1/-2) mean "take it from the tokenizer / generation_config.json".
    end_id: int | None = None
    pad_id: int | None = None
    max_len: int | None = Field(default=None, gt=0, description="context length: prompt + completion")
    # Each entry is one stop (or bad) word: a string, or a sequence of token ids.
    stop_words: list[str | list[int]] = Field(default_factory=list)
    bad_words: list[str | list[int]] = Field(default_factory=list)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_tokens: int | None = Field(default=None, gt=0, description="default completion budget")
    # The seed system's FasterTransformer ChatGLM key (the [gMASK] position): accepted so that its configs load
    # unchanged; no Triton protocol here takes it.
    mask_positions: int | None = None


class TextProtocolConfig(_Strict):
    """The tensors of a custom text-in / text-out Triton model (protocol `text`). Each value is a Triton
    tensor name; dtypes and dims are read from Triton's model config. Unset optional keys: the model has
    no such tensor (a request setting a parameter the block does not map is a 400 naming it)."""

    input: str = Field(min_length=1, description="BYTES input: the prompt, already templated")
    output: str = Field(min_length=1, description="BYTES output: the generated text")
    max_tokens: str = Field(min_length=1, description="integer input: the completion budget")
    stream: str | None = Field(default=None, description="BOOL input: true for one response per step")
    exclude_input: str | None = Field(default=None, description="BOOL input sent true: never echo the prompt")
    stop_words: str | None = Field(default=None, description="BYTES [-1] input: stop strings")
    bad_words: str | None = Field(default=None, description="BYTES [-1] input: banned strings")
    guide_type: str | None = Field(default=None, description="BYTES input: TensorRT-LLM guide type")
    guide: str | None = Field(default=None, description="BYTES input: the guide (schema, regex, grammar)")
    num_tokens: str | None = Field(default=None, description="integer output: tokens the response's text took")
    # TensorRT-LLM's LLM-API model declares `image_url` (BYTES [-1]) and loads http(s) URLs itself: the gateway
    # sends it only data URLs of images it fetched and verified.
    image_url: str | None = Field(default=None, description="BYTES [-1] input: one data:image/jpeg URL per image")
    # KV cache reuse as TensorRT-LLM's LLM-API model reports it: `sampling_param_return_perf_metrics` asks,
    # `kv_cache_reused_block` answers (see `tokens_per_block`).
    return_perf_metrics: str | None = Field(default=None, description="BOOL input sent true: ask for reuse figures")
    reused_blocks: str | None = Field(default=None, description="integer output: KV cache blocks the request reused")
    output_mode: Literal["delta", "cumulative"] = Field(
        default="delta", description="whether each response holds the new text (and count) or all so far")
    parameters: dict[TextParam, str] = Field(default_factory=dict, description="request parameter -> input name")

    @model_validator(mode="after")
    def _guide_pair(self) -> TextProtocolConfig:
        if (self.guide_type is None) != (self.guide is None):
            raise ValueError("guide_type and guide name the two guided-decoding inputs: set both or neither")
        if self.return_perf_metrics is not None and self.reused_blocks is None:
            raise ValueError("return_perf_metrics asks for KV cache reuse figures: name the output that carries the "
                             "reused blocks (reused_blocks) too")
        return self


class LoraAdapterEntry(_Strict):
    """One LoRA adapter served as a model of its own on the LLM entry that lists it (see `openai_api.lora`)."""

    name: str = Field(min_length=1, description="the adapter's model name (unique across every model)")
    # A folder in PEFT format (adapter_config.json + adapter_model.safetensors) or TensorRT-LLM's (the two .npy
    # files). Unset: the Triton backend holds the weights itself (vLLM's multi_lora.json).
    source: Path | None = None
    # Optional check: the adapter's `base_model_name_or_path` must name this model (its last path part is enough).
    base: str | None = None
    # The name the Triton backend knows the adapter by (vLLM's multi_lora.json key), when not `name`.
    lora_name: str | None = None


class LLMModel(_Served):
    kind: Literal["llm"] = "llm"
    chat_template: Path | None = None
    transport: Transport = "grpc"
    protocol: LLMProtocol = "auto"
    # How tool calls are read from the output: one family of `text/families/`. `auto` (the default) picks
    # the family from the chat template, else the tokenizer's added tokens, logged at start-up; a warning
    # when it can only guess (hermes when nothing says otherwise).
    tool_parser: ToolParserName | Literal["auto"] | None = Field(
        default="auto", description="how tool calls are read from the output (a family name, or auto)")
    # A user who writes `<|im_start|>system` in a message must not open a system turn: special-token text in
    # message content is tokenized as plain text, so only the template's own markup yields control tokens.
    escape_special_tokens: bool = True
    # How a reasoning model's thinking is told from its answer (`reasoning_content`): see text/families/reasoning.py.
    # `auto`: from the template and tokenizer (a template that writes `<think>`, `[THINK]`, harmony channels);
    # null: no reasoning section is split off.
    reasoning_parser: ReasoningParserName | Literal["auto"] | None = "auto"
    # Other names the model answers to on Anthropic's `/v1/messages` (coding agents insist on a Claude model
    # name, e.g. "claude-sonnet-4-5"); each alias is unique across every model name and alias.
    aliases: list[str] = Field(default_factory=list)
    # How guides reach a Triton vLLM backend: `structured_outputs` (current vLLM), `guided_decoding` (older),
    # or `auto`: the current one until the backend refuses it by name, then the older one.
    guided_decoding_key: Literal["auto", "structured_outputs", "guided_decoding"] = "auto"
    # A custom text model's tensors (protocol `text`; with `auto` the block selects `text`).
    text_protocol: TextProtocolConfig | None = None
    # Tokens per KV cache block of the model's engine (TensorRT-LLM's `tokens_per_block`, 32 unless the engine
    # was built or configured otherwise): a backend reports reused blocks, and usage's cached prompt tokens are
    # those blocks x this. The gateway cannot read it from Triton; set it to the engine's value.
    tokens_per_block: int = Field(default=32, ge=1, le=65536,
                                  description="tokens per KV cache block of the engine (cached tokens = reused blocks "
                                              "x this)")
    # Images (a backend with an image input): the text that stands for one image in the prompt, written by
    # the gateway where each image part was, for a chat template that does not render image parts itself
    # (unset: the template gets `{"type": "image"}` parts, as transformers and vLLM pass them).
    image_placeholder: str | None = Field(default=None, min_length=1)
    # The context each image takes beyond its placeholder's own tokens (vision tokens are real context):
    # counted in the prompt for the context-length check and usage.
    image_tokens: int = Field(default=0, ge=0)
    # LoRA adapters on this model, each served as a model (`/v1/models`: parent = this model): the listed ones,
    # and every adapter folder (and multi_lora.json entry) found in `adapters_dir` at start-up, which is also
    # the only place runtime loading (/v1/load_lora_adapter) may read from. A rank above `max_lora_rank`
    # (TensorRT-LLM's default largest adapter size) is refused.
    adapters: list[LoraAdapterEntry] = Field(default_factory=list)
    adapters_dir: Path | None = None
    max_lora_rank: int = Field(default=64, gt=0)
    # Runtime loads and unloads of this model's adapters survive a restart: each is recorded in
    # `<adapters_dir>/.runtime_adapters.json` and replayed at start-up (`openai_api.lora.RUNTIME_STATE`).
    # Off: they last until the gateway stops, as in vLLM. Needs `adapters_dir`.
    persist_adapters: bool = False
    # The adapters as read and checked at start-up (`resolve_adapters`): `lora.LoraAdapter`s.
    _lora: list[Any] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _text_block(self) -> LLMModel:
        if self.protocol == "text" and self.text_protocol is None:
            raise ValueError('protocol "text" needs a text_protocol block naming the model\'s tensors')
        if self.text_protocol is not None and self.protocol not in ("text", "auto"):
            raise ValueError(f'text_protocol is for protocol "text" (or "auto"), not {self.protocol!r}')
        return self


class EmbeddingModel(_Served):
    kind: Literal["embedding"] = "embedding"
    transport: Transport = "http"
    max_tokens: int = Field(default=512, gt=0)
    pooling: Literal["mean", "cls"] = "mean"
    normalize: bool = True
    # `last_hidden_state` ([B, L, H], pooled here) or `sentence_embedding` ([B, H], pooled in the model).
    output_name: str = "last_hidden_state"
    truncate: bool = Field(default=False, description="truncate over-long inputs instead of a 400")
    # Retrieval models trained with instructions (e5: "query: " / "passage: "; bge: "Represent this sentence for
    # searching relevant passages: ") get them prepended to each text of a request's `input_type` (NIM's field).
    query_prefix: str = ""
    passage_prefix: str = ""
    # Token-id input (`input` as lists of ints). OpenAI's API defines it in OpenAI's tokenizer, and
    # LangChain's OpenAIEmbeddings sends cl100k ids by default: `cl100k_base` decodes them back to the exact
    # text and embeds that (text/cl100k.py; the vocabulary must load offline, else start-up stops);
    # `accept_token_ids`: the ids are this model's own vocabulary (clients that tokenize for it); `refuse`:
    # a 400. `accept_token_ids: true` is the older spelling of `token_ids: accept_token_ids`.
    token_ids: Literal["cl100k_base", "accept_token_ids", "refuse"] = "cl100k_base"
    accept_token_ids: bool = False
    max_batch_size: int = Field(default=32, gt=0, description="inputs per Triton request")
    input_config: dict[str, str] = Field(
        default_factory=lambda: {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                 "token_type_ids": "token_type_ids"})
    input_dtype: Literal["INT64", "INT32"] = "INT64"


class RerankOutputConfig(_Strict):
    name: str = "logits"
    process: Literal["normalize", "none", "softmax"] = "normalize"


class RerankModel(_Served):
    kind: Literal["rerank"] = "rerank"
    transport: Transport = "http"
    max_tokens: int = Field(default=512, gt=0)
    input_config: dict[str, str] = Field(
        default_factory=lambda: {"input_ids": "input_ids", "attention_mask": "attention_mask"})
    output_config: RerankOutputConfig = Field(default_factory=RerankOutputConfig)
    max_batch_size: int = Field(default=32, gt=0, description="pairs per Triton request")
    input_dtype: Literal["INT64", "INT32"] = "INT64"
