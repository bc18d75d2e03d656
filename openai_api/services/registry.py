"""Every configured model, loaded once at start-up: tokenizer, template, Triton backend, defaults."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from openai_api.config import EmbeddingModel, GatewayConfig, LLMModel, ModelInfo, RerankModel, adapters_of
from openai_api.errors import InvalidRequestError, ModelNotFoundError
from openai_api.lora import LoraAdapter
from openai_api.observability import Metrics
from openai_api.services.backends import InstrumentedLLMBackend, LoraBackend, encoder_backend, llm_backend
from openai_api.text.families import (
    FAMILIES,
    TOOL_PARSER_NAMES,
    ReasoningParserName,
    ToolParserName,
    detect_reasoning,
    detect_tool_format,
    keep_markers,
)
from openai_api.text.prompt_cache import NO_BOUNDARIES, Boundaries, find_boundaries, template_markers
from openai_api.text.templates import ChatTemplate
from openai_api.text.tokenizer import TextTokenizer
from openai_api.triton.client import TritonClientPool
from openai_api.triton.encoder import EncoderBackend
from openai_api.triton.llm import LLMBackend
from openai_api.triton.replicas import ReplicaSet
from openai_api.vllm_metrics import Served

logger = logging.getLogger(__name__)

ModelKind = Literal["llm", "embedding", "rerank"]
EncoderConfig = TypeVar("EncoderConfig", EmbeddingModel, RerankModel)
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
    # The bad words as text, for protocols that take words as strings.
    bad_strings: list[str] = field(default_factory=list)
    # The output's parser families, `auto` resolved at start-up (`text.families`); None: none.
    tool_parser: ToolParserName = "hermes"
    reasoning_parser: ReasoningParserName | None = None
    # Special tokens the detokenizer drops: every one but the parser families' markers. None: decode
    # with special tokens skipped (no marker of the families is a special token of this tokenizer).
    drop_ids: frozenset[int] | None = None
    # The families' markers that are special tokens here: removed from a call that falls back to content.
    control_markers: frozenset[str] = frozenset()
    # The model's end-of-sequence ids (end_id and the tokenizer's EOS ids) and their texts: what a request's
    # `ignore_eos` takes out of the stop words and stop strings (`services.generation`).
    eos_ids: frozenset[int] = frozenset()
    eos_texts: frozenset[str] = frozenset()
    # A LoRA adapter served as a model: its base model's runtime with this set (and a backend that sends it).
    adapter: LoraAdapter | None = None
    # Where its rendered prompts may be cut for the prompt cache (`text.prompt_cache`): the template's markers
    # that are safe cut points for this tokenizer; none: prompts are tokenized whole.
    prompt_boundaries: Boundaries = NO_BOUNDARIES

    @property
    def name(self) -> str:
        return self.adapter.name if self.adapter is not None else self.config.name


@dataclass
class EncoderRuntime(Generic[EncoderConfig]):
    config: EncoderConfig
    tokenizer: TextTokenizer
    adapter: EncoderBackend

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


def resolve_parsers(m: LLMModel, tok: TextTokenizer, template: ChatTemplate | None
                    ) -> tuple[ToolParserName, ReasoningParserName | None, frozenset[int] | None, frozenset[str]]:
    """The model's tool and reasoning families (`auto`: read from its template and special tokens), the
    special-token ids its detokenizer drops (all but the families' markers; None: skip every special),
    and the markers that are special tokens."""
    source = template.source if template is not None else ""
    configured, thinking = m.tool_parser, m.reasoning_parser
    found = None
    tool: ToolParserName
    if configured == "auto" or configured is None:
        found = detect_tool_format(source, [*tok.special_tokens, *tok.added_tokens])
        tool = found.family
    else:
        tool = configured
    reasoning = detect_reasoning(source, tool) if thinking == "auto" else thinking
    if found is not None or m.reasoning_parser == "auto":
        logger.info("model %s: tool parser %s%s, reasoning parser %s%s", m.name, tool,
                    f" (auto: {found.why})" if found is not None else "", reasoning,
                    " (auto)" if m.reasoning_parser == "auto" else "")
    # A template that does not render tools gets its family's call format described in a system message by the
    # gateway (`services.tools`); with no marker anywhere that is hermes: the gateway's own choice, not a guess.
    own_prompt = found is not None and found.evidence == "none" and template is not None and not template.uses_tools
    if found is not None and found.guess and not own_prompt:
        logger.warning("model %s: tool_parser auto could only guess %r (%s). If the model writes its tool calls "
                       "another way, set \"tool_parser\" in its llm entry of the model config to its family, one "
                       "of: %s (docs/guides/tools-and-families.md).", m.name, tool, found.why,
                       ", ".join(TOOL_PARSER_NAMES))
    specials = {tok.tokenizer.token_to_id(t): t for t in tok.special_tokens}
    keep = set(keep_markers(tool, reasoning))
    control = frozenset(keep & set(specials.values()))
    if not control:
        return tool, reasoning, None, control
    return tool, reasoning, frozenset(i for i, t in specials.items() if i is not None and t not in keep), control


def build_llm(m: LLMModel, info: ModelInfo, backend: LLMBackend, tok: TextTokenizer | None = None) -> LLMRuntime:
    tok = tok or TextTokenizer.from_folder(m.path)
    template = ChatTemplate.from_file(m.chat_template) if m.chat_template else ChatTemplate.from_tokenizer_dir(m.path)
    tool_parser, reasoning_parser, drop_ids, control = resolve_parsers(m, tok, template)
    end_id = info.end_id if info.end_id is not None and info.end_id >= 0 else (
        tok.eos_token_ids[0] if tok.eos_token_ids else None)
    pad_id = info.pad_id if info.pad_id is not None and info.pad_id >= 0 else (
        tok.pad_token_id if tok.pad_token_id is not None else end_id)
    stop_words = _words(tok, info.stop_words)
    for marker in FAMILIES[tool_parser].stops:  # e.g. gpt-oss's <|call|>: stops like its EOS does
        marker_id = tok.tokenizer.token_to_id(marker)
        if marker_id is not None and [marker_id] not in stop_words and marker_id != end_id:
            stop_words.append([marker_id])
    # Extra EOS ids (Llama 3 has several) stop generation like end_id does.
    for eos in tok.eos_token_ids[1:]:
        if [eos] not in stop_words:
            stop_words.append([eos])
    stop_strings = [s for s in (tok.decode(w, skip_special_tokens=False) for w in stop_words) if s]
    stop_strings += [w for w in info.stop_words if isinstance(w, str)]
    if drop_ids is not None:
        # A text-out backend told to keep special tokens may write the EOS token's text at the end.
        stop_strings += [t for t in (tok.eos_token, *(tok.decode([i], skip_special_tokens=False)
                                                      for i in tok.eos_token_ids)) if t and t not in control]
    eos_ids = frozenset(i for i in (end_id, *tok.eos_token_ids) if i is not None)
    eos_texts = frozenset(t for t in (tok.eos_token, *(tok.decode([i], skip_special_tokens=False) for i in eos_ids))
                          if t)
    context = info.max_len or tok.context_length or DEFAULT_CONTEXT_LENGTH
    bad_words = _words(tok, info.bad_words)
    bad_strings = [s for s in (w if isinstance(w, str) else tok.decode(w, skip_special_tokens=False)
                               for w in info.bad_words) if s]
    boundaries = NO_BOUNDARIES if template is None else find_boundaries(
        tok.tokenizer, template_markers(template.source, tok.tokenizer, (tok.bos_token, tok.eos_token)))
    return LLMRuntime(config=m, info=info, tokenizer=tok, template=template, backend=backend,
                      context_length=context, end_id=end_id, pad_id=pad_id, stop_token_words=stop_words,
                      stop_strings=sorted(set(stop_strings)), bad_token_words=bad_words, bad_strings=bad_strings,
                      tool_parser=tool_parser, reasoning_parser=reasoning_parser, drop_ids=drop_ids,
                      control_markers=control, eos_ids=eos_ids, eos_texts=eos_texts,
                      prompt_boundaries=boundaries)


def _stamp(folder: Path) -> tuple[tuple[int, int], ...]:
    """Modification time and size of each file `TextTokenizer.from_folder` reads ((0, -1): absent)."""
    out = []
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        try:
            st = (folder / name).stat()
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append((0, -1))
    return tuple(out)


class ModelRegistry:
    """Lookup by public model name, with the kind check every endpoint needs."""

    def __init__(self, config: GatewayConfig, pool: TritonClientPool, metrics: Metrics,
                 stream_idle_timeout_s: float | None = None, previous: ModelRegistry | None = None) -> None:
        self.config = config
        self.pool = pool
        # Tokenizers by folder, with the stamp of their files: models sharing a folder share one (it is read-only
        # once loaded), and a reloaded config (`previous`: the registry it replaces) reuses those whose files
        # are unchanged (loading one costs ~0.2 s of CPU).
        self.tokenizers: dict[Path, tuple[tuple[tuple[int, int], ...], TextTokenizer]] = \
            dict(previous.tokenizers) if previous is not None else {}
        self.llms: dict[str, LLMRuntime] = {}
        self.embeddings: dict[str, EncoderRuntime[EmbeddingModel]] = {}
        self.rerankers: dict[str, EncoderRuntime[RerankModel]] = {}
        # The models served by more than one Triton: their replica sets (probed, shown in /v1/models).
        self.replicas: dict[str, ReplicaSet[Any]] = {}
        self.metrics = metrics
        for m in config.llm:
            backend, replicas = llm_backend(m, pool, metrics, stream_idle_timeout_s)
            self.llms[m.name] = build_llm(m, config.model_info(m.name), backend, self.tokenizer(m.path))
            if replicas is not None:
                self.replicas[m.name] = replicas
        for m in config.llm:
            for lora in adapters_of(m):
                self.add_adapter(lora)
        for e in config.embedding:
            adapter, replicas = encoder_backend(e, pool, metrics)
            self.embeddings[e.name] = EncoderRuntime(e, self.tokenizer(e.path), adapter)
            if replicas is not None:
                self.replicas[e.name] = replicas
        for r in config.rerank:
            adapter, replicas = encoder_backend(r, pool, metrics)
            self.rerankers[r.name] = EncoderRuntime(r, self.tokenizer(r.path), adapter)
            if replicas is not None:
                self.replicas[r.name] = replicas

    def add_adapter(self, adapter: LoraAdapter) -> LLMRuntime:
        """Serve `adapter` as a model: its base model's runtime (tokenizer, template, parsers, limits) with a
        backend that names the adapter on every request, and metrics of its own."""
        base = self.llms[adapter.base]
        inner = base.backend.inner if isinstance(base.backend, InstrumentedLLMBackend) else base.backend
        lora = self.metrics.lora_events

        def event(kind: str, base_name: str = adapter.base, name: str = adapter.name) -> None:
            lora.labels(base_name, name, kind).inc()

        adapter.on_event = event
        rt = dataclasses.replace(base, backend=InstrumentedLLMBackend(LoraBackend(inner, adapter), self.metrics,
                                                                      adapter.name), adapter=adapter)
        self.llms[adapter.name] = rt
        return rt

    def remove_adapter(self, name: str) -> LLMRuntime | None:
        """Stop serving adapter `name` to new requests (those running keep their runtime and finish)."""
        rt = self.llms.get(name)
        if rt is None or rt.adapter is None:
            return None
        return self.llms.pop(name)

    def tokenizer(self, folder: Path) -> TextTokenizer:
        """The tokenizer of `folder`: the one loaded already while its files are unchanged, else loaded now."""
        stamp = _stamp(folder)
        known = self.tokenizers.get(folder)
        if known is not None and known[0] == stamp:
            return known[1]
        tok = TextTokenizer.from_folder(folder)
        self.tokenizers[folder] = (stamp, tok)
        return tok

    def carry_adapters(self, old: ModelRegistry, old_config: GatewayConfig) -> int:
        """Serve here the adapters `old` loaded at runtime (not from its config) whose base model this config
        keeps with the same weights folder (they were checked against it); returns how many. A config reload's."""
        configured = {a.name for m in old_config.llm for a in adapters_of(m)}
        kept = 0
        for adapter in old.adapters():
            base = self.llms.get(adapter.base)
            if adapter.name in configured or self.kind_of(adapter.name) is not None or base is None or \
                    base.adapter is not None or base.config.path != old.llms[adapter.base].config.path:
                continue
            self.add_adapter(adapter)
            kept += 1
        return kept

    def adapters(self, base: str | None = None) -> list[LoraAdapter]:
        """The adapters served now (of `base` only, when given)."""
        return [rt.adapter for rt in self.llms.values()
                if rt.adapter is not None and (base is None or rt.adapter.base == base)]

    def served(self) -> Served:
        """What the vLLM-named metrics view needs (`openai_api.vllm_metrics.Served`): the base models and encoders,
        each base model's adapters, each adapter's base."""
        adapters: dict[str, list[str]] = {}
        base_of: dict[str, str] = {}
        for a in self.adapters():
            adapters.setdefault(a.base, []).append(a.name)
            base_of[a.name] = a.base
        models = tuple(n for n in (*self.llms, *self.encoders) if n not in base_of)
        return Served(models, {b: tuple(names) for b, names in adapters.items()}, base_of)

    @property
    def encoders(self) -> dict[str, EncoderRuntime[EmbeddingModel] | EncoderRuntime[RerankModel]]:
        """Every embedding and rerank model, by name."""
        return {**self.embeddings, **self.rerankers}

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

    def _not_an_encoder(self, name: str, kind: str) -> InvalidRequestError | ModelNotFoundError:
        have = self.kind_of(name)
        return self._wrong_kind(name, have, kind) if have else self._missing(name)

    def embedding(self, name: str) -> EncoderRuntime[EmbeddingModel]:
        rt = self.embeddings.get(name)
        if rt is None:
            raise self._not_an_encoder(name, "embedding")
        return rt

    def reranker(self, name: str) -> EncoderRuntime[RerankModel]:
        rt = self.rerankers.get(name)
        if rt is None:
            raise self._not_an_encoder(name, "rerank")
        return rt
