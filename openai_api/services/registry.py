"""Every configured model, loaded once at start-up: tokenizer, template, Triton adapter, defaults."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Literal

from openai_api.config import EmbeddingModel, GatewayConfig, LLMModel, ModelInfo, RerankModel
from openai_api.errors import InvalidRequestError, ModelNotFoundError
from openai_api.text.templates import ChatTemplate
from openai_api.text.tokenizer import TextTokenizer
from openai_api.triton.auto import AutoLLMBackend
from openai_api.triton.client import TritonClientPool
from openai_api.triton.encoder import EncoderAdapter
from openai_api.triton.llm import LLMBackend
from openai_api.triton.replicas import ReplicaSet, ReplicatedEncoder, ReplicatedLLMBackend

logger = logging.getLogger(__name__)

ModelKind = Literal["llm", "embedding", "rerank"]
DEFAULT_CONTEXT_LENGTH = 2048


@dataclass
class LLMRuntime:
    config: LLMModel
    info: ModelInfo
    tokenizer: TextTokenizer
    template: ChatTemplate | None
    backend: LLMBackend
    context_length: int
    end_id: int | None
    pad_id: int | None
    # Token-level stop words (config) go to Triton; their text forms also feed the stop matcher so
    # the stop token itself never reaches the client.
    stop_token_words: list[list[int]] = field(default_factory=list)
    stop_strings: list[str] = field(default_factory=list)
    bad_token_words: list[list[int]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.config.name


@dataclass
class EncoderRuntime:
    config: EmbeddingModel | RerankModel
    tokenizer: TextTokenizer
    adapter: EncoderAdapter

    @property
    def name(self) -> str:
        return self.config.name


def _words(tokenizer: TextTokenizer, words: list[str | list[int]]) -> list[list[int]]:
    out = []
    for w in words:
        ids = tokenizer.encode(w) if isinstance(w, str) else list(w)
        if ids:
            out.append(ids)
    return out


def _make_backend(m: LLMModel, pool: TritonClientPool) -> LLMBackend:
    """The adapter for `m.protocol`; "auto" reads the Triton model's config (at start-up, or on first use
    when Triton is not up yet) and picks tensorrt_llm, vllm or fastertransformer from it. An explicit
    protocol is checked against that config the same way, so a mismatch names the missing tensors."""
    return AutoLLMBackend(pool, m.url, m.name, m.triton_name, m.triton_version, protocol=m.protocol)


def _replicated_backend(m: LLMModel, pool: TritonClientPool) -> LLMBackend:
    if len(m.urls) == 1:
        return _make_backend(m, pool)
    adapters = [(u, _make_backend(m.model_copy(update={"url": u}), pool)) for u in m.urls]
    return ReplicatedLLMBackend(m.name, m.transport, adapters)


def build_llm(m: LLMModel, info: ModelInfo, pool: TritonClientPool) -> LLMRuntime:
    tok = TextTokenizer.from_folder(m.path)
    template = ChatTemplate.from_file(m.chat_template) if m.chat_template else ChatTemplate.from_tokenizer_dir(m.path)
    end_id = info.end_id if info.end_id is not None and info.end_id >= 0 else (
        tok.eos_token_ids[0] if tok.eos_token_ids else None)
    pad_id = info.pad_id if info.pad_id is not None and info.pad_id >= 0 else (
        tok.pad_token_id if tok.pad_token_id is not None else end_id)
    stop_words = _words(tok, info.stop_words)
    # Extra EOS ids (Llama 3 has several) stop generation like end_id does.
    for eos in tok.eos_token_ids[1:]:
        if [eos] not in stop_words:
            stop_words.append([eos])
    stop_strings = [s for s in (tok.decode(w, skip_special_tokens=False) for w in stop_words) if s]
    stop_strings += [w for w in info.stop_words if isinstance(w, str)]
    context = info.max_len or tok.context_length or DEFAULT_CONTEXT_LENGTH
    return LLMRuntime(config=m, info=info, tokenizer=tok, template=template, backend=_replicated_backend(m, pool),
                      context_length=context, end_id=end_id, pad_id=pad_id, stop_token_words=stop_words,
                      stop_strings=sorted(set(stop_strings)), bad_token_words=_words(tok, info.bad_words))


def build_encoder(m: EmbeddingModel | RerankModel, pool: TritonClientPool) -> EncoderRuntime:
    output = m.output_name if isinstance(m, EmbeddingModel) else m.output_config.name
    adapters = [(u, EncoderAdapter(pool, transport=m.transport, url=u, model=m.name, triton_model=m.triton_name,
                                   version=m.triton_version, input_config=m.input_config,
                                   input_dtype=m.input_dtype, output_name=output, timeout_s=m.timeout_s))
                for u in m.urls]
    adapter = adapters[0][1] if len(adapters) == 1 else ReplicatedEncoder(m.name, m.transport, adapters)
    return EncoderRuntime(config=m, tokenizer=TextTokenizer.from_folder(m.path), adapter=adapter)  # type: ignore[arg-type]


class ModelRegistry:
    """Lookup by public model name, with the kind check every endpoint needs."""

    def __init__(self, config: GatewayConfig, pool: TritonClientPool) -> None:
        self.config = config
        self.pool = pool
        self.llms: dict[str, LLMRuntime] = {}
        self.encoders: dict[str, EncoderRuntime] = {}
        for m in config.llm:
            self.llms[m.name] = build_llm(m, config.model_info(m.name), pool)
        for e in [*config.embedding, *config.rerank]:
            self.encoders[e.name] = build_encoder(e, pool)

    def replica_sets(self) -> dict[str, ReplicaSet[Any]]:
        """The replica sets of models served by more than one Triton (LLM backends may be wrapped by
        instrumentation, so look through `.inner` too)."""
        out: dict[str, ReplicaSet[Any]] = {}
        for name, obj in [*((n, r.backend) for n, r in self.llms.items()),
                          *((n, e.adapter) for n, e in self.encoders.items())]:
            while not isinstance(obj, (ReplicatedLLMBackend, ReplicatedEncoder)) and hasattr(obj, "inner"):
                obj = obj.inner
            if isinstance(obj, (ReplicatedLLMBackend, ReplicatedEncoder)):
                out[name] = obj.set
        return out

    def kind_of(self, name: str) -> ModelKind | None:
        if name in self.llms:
            return "llm"
        enc = self.encoders.get(name)
        return enc.config.kind if enc else None

    def _missing(self, name: str, param: str = "model") -> ModelNotFoundError:
        return ModelNotFoundError(f"The model {name!r} does not exist.", param=param)

    def _wrong_kind(self, name: str, kind: str, wanted: str) -> InvalidRequestError:
        return InvalidRequestError(f"The model {name!r} is a {kind} model and cannot be used for {wanted}.",
                                   param="model", code="model_kind_mismatch")

    def llm(self, name: str) -> LLMRuntime:
        rt = self.llms.get(name)
        if rt is None:
            kind = self.kind_of(name)
            raise self._wrong_kind(name, kind, "completions") if kind else self._missing(name)
        return rt

    def encoder(self, name: str, kind: Literal["embedding", "rerank"]) -> EncoderRuntime:
        rt = self.encoders.get(name)
        if rt is None or rt.config.kind != kind:
            have = self.kind_of(name)
            raise self._wrong_kind(name, have, kind) if have else self._missing(name)
        return rt
