"""The interface every LLM adapter implements, whatever Triton backend is behind it."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from openai_api.lora import LoraAdapter

GuideKind = Literal["json_schema", "json_object", "regex", "grammar", "choice"]
GUIDE_KINDS: frozenset[GuideKind] = frozenset({"json_schema", "json_object", "regex", "grammar", "choice"})
# Wire protocols whose models take the prompt as text and tokenize it themselves (and answer with text).
TEXT_PROTOCOLS = frozenset({"vllm", "tensorrt_llm_text", "text"})
# Wire protocols on which a family's marker tokens reach the gateway's output parser: the token-id protocols
# (decoded here) and vLLM's (told to keep them); other text protocols drop special tokens.
_MARKER_PROTOCOLS = frozenset({"vllm", "tensorrt_llm", "fastertransformer"})


def takes_prompt_text(backend: object) -> bool:
    """Whether `backend` takes the prompt as text (tokenizing it itself) rather than as token ids: what a
    service asks of the adapter layer instead of naming protocols (`LLMBackend.protocol`; False for a
    backend that names none)."""
    return getattr(backend, "protocol", "") in TEXT_PROTOCOLS


def keeps_marker_tokens(backend: object) -> bool:
    """Whether a family's special marker tokens reach the output parser through `backend`."""
    return getattr(backend, "protocol", "") in _MARKER_PROTOCOLS


@dataclass(frozen=True, slots=True)
class GuideOrigin:
    """Where a part of a guide came from: the part at JSON pointer `at` of the guide's schema (`#`: all of it)
    is the request's `param` (`tools[1].function.parameters`, `...$defs.Address`), of the tool `tool` ("": none)."""

    at: str
    param: str
    tool: str = ""


@dataclass(frozen=True, slots=True)
class Guide:
    """What a generation's output must match, enforced token by token by the model's backend.

    `kind` and `value`: `json_schema` (the schema as JSON text), `json_object` (any JSON object; no
    value), `regex` (the pattern), `grammar` (EBNF, xgrammar/GBNF dialect, `root ::= ...`), `choice`
    (a JSON list of the allowed strings). `param` is the request parameter it came from, for errors;
    `origins` say which client schema each part of a `json_schema` guide is, for a backend's refusal.
    """

    kind: GuideKind
    value: str | None
    param: str = "response_format"
    origins: tuple[GuideOrigin, ...] = ()


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image of a request, fetched and verified by the gateway (`services.images`): `data` the image's
    own bytes (its format as found by decoding, `mime`), `b64` the same bytes base64-encoded (what the vLLM
    backend's `image` input takes: one element per image, no `data:` prefix), `width` x `height` pixels,
    and `digest` (SHA-256 of `data`, hex) for caches and prompt-table ids. `param` is the request field
    that carried it (`messages[i].content[j]`), so an adapter's refusal names the part as the services'
    own refusals do."""

    data: bytes
    b64: bytes
    mime: str
    width: int
    height: int
    digest: str
    param: str = "messages"


@dataclass(slots=True)
class GenerationRequest:
    """One sequence to generate. Sampling fields left as None are not sent, so the backend's own
    defaults apply."""

    # Any sequence of ints; the prompt cache's `TokenIds` carry their INT32 tensor bytes (`wire.encode_tensor`).
    prompt_ids: Sequence[int]
    max_tokens: int
    # Text-in protocols (`TEXT_PROTOCOLS`) send this instead of ids; ids still count prompt tokens.
    prompt_text: str = ""
    request_id: str = ""
    end_id: int | None = None
    pad_id: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_tokens: int | None = None
    # vLLM's `ignore_eos`: generation goes on past the end-of-sequence token, to `max_tokens` (stop words other
    # than the model's end tokens, and stop strings, still stop it). The vLLM backend takes it as is
    # (`sampling_parameters.ignore_eos`); protocols without it get a minimum length of the whole budget
    # (`SpecAdapter.eos_ignored`); a model with neither refuses it.
    ignore_eos: bool = False
    stop_words: list[list[int]] = field(default_factory=list)
    bad_words: list[list[int]] = field(default_factory=list)
    # The same words as text, for protocols that take words as strings (the TensorRT-LLM ensemble's
    # `stop_words` / `bad_words`); `stop_texts` also holds the request's own stop strings.
    stop_texts: list[str] = field(default_factory=list)
    bad_texts: list[str] = field(default_factory=list)
    return_logprobs: bool = False
    # With `return_logprobs`: how many most likely alternatives per token to return as well (0: none).
    top_logprobs: int = 0
    timeout_s: float | None = None
    # False when nobody needs tokens as they come (a non-streamed answer with no stop strings to cut
    # at): the backend may then answer with one response instead of one per token.
    stream_tokens: bool = True
    guide: Guide | None = None
    # The model's parser families read special tokens (`[TOOL_CALLS]`, `<|channel|>`): a text-out backend
    # must keep them in its text (vLLM: `skip_special_tokens: false`).
    keep_special_tokens: bool = False
    # The request's images in prompt order (its placeholders' order); only a backend that supports
    # "images" is ever sent any.
    images: list[ImageInput] = field(default_factory=list)
    # The LoRA adapter to generate with (the request named an adapter model): TensorRT-LLM gets its task id and,
    # when the replica may not hold it, its weights; vLLM its name (`sampling_parameters.lora_name`).
    lora: LoraAdapter | None = None
    # The session this request belongs to, for routing's session affinity (`routing.session_key`); None: none.
    session: str | None = None
    # The gateway's thinking budget in tokens (Anthropic's `thinking.budget_tokens`, vLLM's
    # `thinking_token_budget`): never sent to Triton; `services.generation.backend_chunks` reads it and
    # generates in two phases (budget forcing). None: one generation, as sent.
    thinking_budget: int | None = None
    # Its prompt was counted already: a budget's second phase, whose prompt is the first phase's prompt and
    # output. Usage, key quotas and metrics count only its generated tokens (the client's prompt counts once).
    prompt_counted: bool = False
    # Prompt token ranges to keep in the KV cache (`services.retention`); sent only by an adapter whose model
    # declares the retention inputs (`supports("kv_retention")`), else nothing.
    retention: tuple[RetainedRange, ...] = ()


@dataclass(frozen=True, slots=True)
class RetainedRange:
    """Prompt tokens [start, end) the engine should keep in its KV cache for `duration_ms` at a high priority
    (TensorRT-LLM's `KvCacheRetentionConfig` token ranges; from Anthropic `cache_control` breakpoints)."""

    start: int
    end: int
    duration_ms: int


@dataclass(slots=True)
class GenerationChunk:
    """New tokens since the previous chunk (never cumulative), with their log-probs if asked for.

    Text-out protocols (`TEXT_PROTOCOLS`) fill `text` with the new text instead and `num_tokens` with
    how many tokens it took (when the backend says; else the count is estimated by the tokenizer).
    With `GenerationRequest.top_logprobs` > 0, `top_logprobs` holds per token of `token_ids` its most
    likely alternatives as (token id, log-prob), most likely first, at most `top_logprobs` of them.

    `cached_tokens`: how many of the request's prompt tokens the backend read from its KV cache instead of
    computing them, as the backend itself reported it with this response (TensorRT-LLM's reused KV blocks x
    the model's `tokens_per_block`, at most the prompt's length); None where this response says nothing.
    Unlike the rest it is the request's figure, not a delta: the latest one reported stands.
    """

    token_ids: list[int]
    logprobs: list[float] | None = None
    text: str | None = None
    num_tokens: int | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    cached_tokens: int | None = None


# Request fields an adapter may or may not be able to honour, by the name the OpenAI API uses.
OPTIONAL_PARAMS = ("temperature", "top_p", "top_k", "seed", "repetition_penalty", "presence_penalty",
                   "frequency_penalty", "min_tokens", "stop_words", "bad_words", "return_logprobs",
                   "top_logprobs", "images", "lora")


class LLMBackend(Protocol):
    """Token ids in, token ids out, streamed.

    `generate` yields `GenerationChunk`s in order as Triton produces them and returns when the
    sequence is complete (EOS, a stop word, or `max_tokens`). Closing the iterator early (the HTTP
    client went away, or a stop string matched) cancels the Triton request. Errors are raised as
    `GatewayError`s.
    """

    model: str

    @property
    def protocol(self) -> str:
        """The wire protocol (`tensorrt_llm`, `vllm`, `fastertransformer`, `tensorrt_llm_text`, `text`); the
        configured one until known."""
        ...

    @property
    def guide_kinds(self) -> frozenset[GuideKind] | None:
        """The guide kinds this model enforces (empty: none); None until Triton's config was read."""
        ...

    def supports(self, param: str) -> bool: ...

    async def check(self) -> None: ...

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]: ...
