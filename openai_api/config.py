"""The model config (`model_config.json`): pydantic models of the seed format plus optional extensions.

The seed format has four arrays: `model_infos` (generation defaults per LLM, keyed by `name`),
`llm`, `embedding` and `rerank`. Everything added by this gateway is an optional key with a default,
so a seed config loads unchanged. `load_config` reports any problem as one `ConfigError` line that
names the file, the field and the reason.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from openai_api.lora import (
    RUNTIME_STATE,
    AdapterError,
    BaseShape,
    LoraAdapter,
    abs_path,
    base_matches,
    read_adapter,
    read_runtime_state,
    scan_dir,
)
from openai_api.text.families import ReasoningParserName, ToolParserName
from openai_api.text.templates import ChatTemplate, TemplateError

logger = logging.getLogger(__name__)
PACKAGE_ROOT = Path(__file__).resolve().parent
# Package data (pyproject's package-data), so that `pip install .` carries them and an installed copy finds
# them where a checkout does. The default config is where the seed system kept it (openai_api/openai_api/);
# its model folders are the reference models scripts/setup.sh prepares in the checkout's models/.
BUNDLED_CONFIG = PACKAGE_ROOT / "model_config.json"
BUNDLED_TEMPLATES = PACKAGE_ROOT / "chat_templates"

Transport = Literal["grpc", "http"]
LLMProtocol = Literal["auto", "tensorrt_llm", "vllm", "fastertransformer", "tensorrt_llm_text", "text"]
# Request parameters a text_protocol block can map to model inputs (`triton.text.TEXT_PARAMS`).
TextParam = Literal["temperature", "top_p", "top_k", "seed", "repetition_penalty", "presence_penalty",
                    "frequency_penalty", "min_tokens", "end_id", "pad_id"]


class ConfigError(Exception):
    """A config problem, already phrased as `file: field: reason` for the operator."""

    def __init__(self, file: Path | str, field: str, reason: str) -> None:
        self.file, self.field, self.reason = str(file), field, reason
        where = f"{self.file}: {field}: " if field else f"{self.file}: "
        super().__init__(where + reason)


class _Strict(BaseModel):
    # Typos in a model entry ("chat_templte") must fail loudly rather than silently use a default.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


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


RoutingPolicy = Literal["least_outstanding", "round_robin", "least_load", "prefix_affinity"]
DNS_SCHEME = "dns:///"


class RoutingConfig(_Strict):
    """How a request picks one replica of a model (`openai_api.triton.routing`). Every policy skips replicas
    marked down and fails over as before; they differ in which healthy replica comes first:
    - `least_outstanding` (default): fewest requests in flight from this gateway process.
    - `round_robin`: in turn.
    - `least_load`: lowest load score = requests in flight (Triton's own count from its metrics port, plus what
      this process started since the last scrape; never less than this process's own count) + `kv_weight` x the
      replica's KV-cache fill fraction (TensorRT-LLM only). Without a `metrics_port` it is least_outstanding.
    - `prefix_affinity`: the replica that most recently served the longest run of this prompt's leading
      `block_tokens`-token blocks (chained block hashes), so its KV cache likely holds that prefix; least load
      when no replica holds at least `min_match_blocks`, when the holder is down, or when the replicas are
      imbalanced (max load - min load > `imbalance_abs` and max load > `imbalance_rel` x min load). With a
      session key (`session_header`'s value; with `agent_sessions`, on by default, OpenAI's `prompt_cache_key`
      or the session header Claude Code and Codex send; the request's `user` when `session_user`) the
      session's last replica is preferred the same way, so an agent's turns reach the KV cache of its prefix.
    """

    policy: RoutingPolicy = "least_outstanding"
    # Triton's metrics port on every replica (its /metrics in Prometheus text); the host is the replica's. Or
    # a map replica url -> port, for several Tritons on one host (a replica it does not name is not scraped).
    metrics_port: int | dict[str, int] | None = None
    scrape_interval_s: float = Field(default=1.0, gt=0, description="seconds between two scrapes of a replica")
    scrape_timeout_s: float = Field(default=0.5, gt=0, description="deadline of one scrape (connect + read)")
    kv_weight: float = Field(default=4.0, ge=0, description="load added by a full KV cache (fraction 1.0)")
    block_tokens: int = Field(default=16, ge=1, le=4096, description="tokens per hashed prefix block")
    max_blocks: int = Field(default=65536, ge=1, description="block hashes remembered (oldest forgotten first)")
    min_match_blocks: int = Field(default=1, ge=1, description="shortest cached prefix worth following")
    imbalance_abs: float = Field(default=8.0, ge=0)
    imbalance_rel: float = Field(default=1.5, ge=1.0)
    session_header: str | None = Field(default=None, min_length=1, description="request header naming a session")
    agent_sessions: bool = Field(default=True, description=(
        "OpenAI's prompt_cache_key and the coding agents' session headers (Claude Code's X-Claude-Code-Session-Id, "
        "Codex's session_id) name a session"))
    session_user: bool = Field(default=False, description="the request's `user` names a session")
    max_sessions: int = Field(default=65536, ge=1, description="sessions remembered (oldest forgotten first)")

    @field_validator("metrics_port")
    @classmethod
    def _ports(cls, v: int | dict[str, int] | None) -> int | dict[str, int] | None:
        for port in ([] if v is None else [v] if isinstance(v, int) else v.values()):
            if not 0 < port < 65536:
                raise ValueError(f"{port} is not a TCP port")
        return v

    def metrics_port_of(self, replica_url: str) -> int | None:
        """The metrics port of the Triton at `replica_url` (None: not scraped)."""
        port = self.metrics_port
        return port.get(replica_url) if isinstance(port, dict) else port


class DiscoveryConfig(_Strict):
    """Re-resolution of `dns:///host:port` urls: every A/AAAA record of `host` is a replica."""

    interval_s: float = Field(default=5.0, gt=0, description="seconds between two resolutions")
    resolve_timeout_s: float = Field(default=2.0, gt=0, description="deadline of one resolution")
    # A new address serves only after Triton answers that the model is ready there.
    ready_timeout_s: float = Field(default=2.0, gt=0, description="deadline of one readiness check")


def _check_url(u: str) -> None:
    if u.startswith(DNS_SCHEME):
        host, sep, port = u[len(DNS_SCHEME):].rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in host:
            raise ValueError(f"{u!r}: a DNS url is dns:///host:port")
    elif u.startswith("dns:"):
        raise ValueError(f"{u!r}: a DNS url is dns:///host:port (three slashes: no DNS server named)")


class _Served(_Strict):
    name: str = Field(min_length=1)
    # One "host:port", or a list of them for several Triton replicas serving the same model. A
    # "dns:///host:port" entry stands for every address `host` resolves to, re-resolved every
    # `discovery.interval_s` (a Kubernetes headless Service: one address per ready pod).
    url: str | list[str] = Field(description="host:port of the Triton endpoint(s) for `transport`")
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    discovery: DiscoveryConfig = Field(default_factory=DiscoveryConfig)
    path: Path = Field(description="folder with tokenizer.json (and the model's own configs)")
    triton_model: str | None = Field(default=None, description="Triton's model name, if not `name`")
    triton_version: str = ""
    timeout_s: float = Field(default=600.0, gt=0, description="per-request deadline")

    @property
    def triton_name(self) -> str:
        return self.triton_model or self.name

    @property
    def urls(self) -> list[str]:
        return [self.url] if isinstance(self.url, str) else list(self.url)

    @field_validator("url")
    @classmethod
    def _urls_not_empty(cls, v: str | list[str]) -> str | list[str]:
        items = [v] if isinstance(v, str) else v
        if not items or any(not u.strip() for u in items):
            raise ValueError("must be a non-empty host:port, or a non-empty list of them")
        if len(set(items)) != len(items):
            raise ValueError("lists the same replica twice")
        for u in items:
            _check_url(u)
        return v

    @model_validator(mode="after")
    def _prefix_for_llms(self) -> _Served:
        if self.routing.policy == "prefix_affinity" and getattr(self, "kind", "llm") != "llm":
            raise ValueError("routing.policy prefix_affinity is for llm models (an encoder keeps no KV cache)")
        return self

    @property
    def discovered(self) -> bool:
        """Whether any url is a `dns:///` name (its replicas change at run time)."""
        return any(u.startswith(DNS_SCHEME) for u in self.urls)


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


class GatewayConfig(_Strict):
    model_infos: list[ModelInfo] = Field(default_factory=list)
    llm: list[LLMModel] = Field(default_factory=list)
    embedding: list[EmbeddingModel] = Field(default_factory=list)
    rerank: list[RerankModel] = Field(default_factory=list)

    source: Path | None = Field(default=None, exclude=True)
    # SHA-256 of the file as `load_config` read it (a reload skips a file whose content is the same), and the
    # embedded Triton's endpoints once `with_triton_endpoint` applied them (a reloaded config gets them too).
    _digest: str | None = PrivateAttr(default=None)
    _triton_endpoint: tuple[str, str] | None = PrivateAttr(default=None)
    # Where each model entry stood in the file, when entries that failed validation were left out (`check_config`).
    _positions: dict[str, list[int]] | None = PrivateAttr(default=None)

    @property
    def digest(self) -> str | None:
        return self._digest

    @property
    def triton_endpoint(self) -> tuple[str, str] | None:
        return self._triton_endpoint

    @model_validator(mode="after")
    def _names_across_entries(self, info: ValidationInfo) -> GatewayConfig:
        # A config built in code is checked here; `load_config` checks a file's itself, naming each field.
        if not (info.context or {}).get("names_checked_by_loader"):
            problems = naming_problems(self)
            if problems:
                raise ValueError(problems[0][1])
        return self

    def all_models(self) -> list[LLMModel | EmbeddingModel | RerankModel]:
        return [*self.llm, *self.embedding, *self.rerank]

    def entries(self) -> list[tuple[str, LLMModel | EmbeddingModel | RerankModel]]:
        """Every model entry with the field it is in the file (`llm[2]`), for messages that name it."""
        out: list[tuple[str, LLMModel | EmbeddingModel | RerankModel]] = []
        for kind in ("llm", "embedding", "rerank"):
            for i, m in enumerate(getattr(self, kind)):
                out.append((f"{kind}[{self._positions[kind][i] if self._positions else i}]", m))
        return out

    def model_info(self, name: str) -> ModelInfo:
        for info in self.model_infos:
            if info.name == name:
                return info
        return ModelInfo(name=name)

    def with_triton_endpoint(self, grpc_url: str, http_url: str) -> GatewayConfig:
        """Point every model at one Triton (the embedded one), keeping each model's transport."""
        for m in self.all_models():
            m.url = grpc_url if m.transport == "grpc" else http_url
        self._triton_endpoint = (grpc_url, http_url)
        return self


def naming_problems(config: GatewayConfig, llm_names: set[str] | None = None) -> list[tuple[str, str]]:
    """(field, reason) of every naming rule across entries a config breaks: a name used twice within a kind
    (the list's own validator reports it first) or across kinds, an alias that is empty or already a name, and a
    `model_infos` entry that names no `llm` entry (`llm_names`: those names, when entries failed validation)."""
    problems: list[tuple[str, str]] = []
    for kind in ("model_infos", "llm", "embedding", "rerank"):
        names = [m.name for m in getattr(config, kind)]
        problems += [(kind, f"duplicate model name {n!r}") for n in sorted({n for n in names if names.count(n) > 1})]
    seen: dict[str, str] = {}
    for kind in ("llm", "embedding", "rerank"):
        for m in getattr(config, kind):
            if m.name in seen and seen[m.name] != kind:
                problems.append(("", f"model name {m.name!r} is used by both {seen[m.name]} and {kind}"))
            seen.setdefault(m.name, kind)
    taken = set(seen)
    for m in config.llm:
        for alias in m.aliases:
            if not alias or alias in taken:
                problems.append(("", f"alias {alias!r} of model {m.name!r} is empty or already names a model or alias"))
            taken.add(alias)
    llms = {m.name for m in config.llm} if llm_names is None else llm_names
    for i, info in enumerate(config.model_infos):
        if info.name not in llms:
            at = config._positions["model_infos"][i] if config._positions else i
            problems.append((f"model_infos[{at}].name", f"{info.name!r} names no llm entry (model_infos hold the "
                                                      f"generation defaults of llm entries: {sorted(llms)})"))
    return problems


def _field_path(loc: tuple[Any, ...], data: Any) -> str:
    parts: list[str] = []
    node = data
    for item in loc:
        if isinstance(item, str) and not isinstance(node, dict):
            continue  # a pydantic union-branch tag ("str", "list[int]"), not a key of the config
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
        try:
            node = node[item]
        except (KeyError, IndexError, TypeError):
            node = None
    return "".join(parts)


def _resolve(base: Path, value: Path) -> Path:
    value = Path(os.path.expandvars(os.path.expanduser(str(value))))
    return value if value.is_absolute() else (base / value).resolve()


def _resolve_template(base: Path, value: Path) -> Path | None:
    """A template is looked up next to the config, then in its chat_templates/, then in the bundled set,
    because the seed names templates by bare file name (`"chat_template": "chatglm2.jinja"`)."""
    candidates = [_resolve(base, value)]
    if not value.is_absolute():
        candidates += [base / "chat_templates" / value, BUNDLED_TEMPLATES / value]
    return next((c.resolve() for c in candidates if c.is_file()), None)


class _Problems:
    """Where the loader puts what it finds: `load_config` stops at the first (raised), `check_config` keeps
    going and lists them all."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.found: list[ConfigError] = []

    def add(self, file: Path, field: str, reason: str) -> None:
        error = ConfigError(file, field, reason)
        if self.strict:
            raise error from None  # one line: never the exception the problem was found in
        self.found.append(error)


# The loader checks the naming rules across entries itself (`naming_problems`), so that each names its field.
_LOADER = {"names_checked_by_loader": True}
_ENTRY_MODELS: dict[str, type[BaseModel]] = {"model_infos": ModelInfo, "llm": LLMModel, "embedding": EmbeddingModel,
                                              "rerank": RerankModel}


def load_config(path: Path | str) -> GatewayConfig:
    """Read, validate and resolve a config file; raise `ConfigError` naming file, field and reason (the first
    problem found: `check_config` lists every one)."""
    config = _load(Path(path), _Problems(strict=True))
    assert config is not None  # a strict load raises instead
    return config


def check_config(path: Path | str) -> tuple[GatewayConfig | None, list[ConfigError]]:
    """Every problem `load_config` would stop at, in file order (a bad entry's own problems, then the
    checks across entries, then each valid entry's files), and the config of the entries that passed (None
    when the file itself cannot be read as a config)."""
    problems = _Problems(strict=False)
    config = _load(Path(path), problems)
    return config, problems.found


def _validation_reason(err: Any) -> str:
    if err["type"] == "missing":
        return "missing required field"
    if err["type"] == "extra_forbidden":
        return "unknown field"
    return str(err["msg"]).removeprefix("Value error, ")


def _valid_entries(data: dict[str, Any]) -> GatewayConfig:
    """The entries of `data` that validate on their own (what a config with errors can still be checked for)."""
    kept: dict[str, list[Any]] = {}
    positions: dict[str, list[int]] = {}
    for kind, model in _ENTRY_MODELS.items():
        entries = data.get(kind)
        kept[kind], positions[kind] = [], []
        for i, entry in enumerate(entries if isinstance(entries, list) else []):
            try:
                kept[kind].append(model.model_validate(entry))
            except ValidationError:
                continue  # reported already, with the whole config's errors
            positions[kind].append(i)
    config = GatewayConfig.model_construct(model_infos=kept["model_infos"], llm=kept["llm"],
                                           embedding=kept["embedding"], rerank=kept["rerank"])
    config._positions = positions
    return config


def _load(path: Path, problems: _Problems) -> GatewayConfig | None:
    if not path.is_file():
        problems.add(path, "", "config file not found")
        return None
    try:
        raw = path.read_bytes()
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        problems.add(path, "", f"not UTF-8 text ({e.reason})")
        return None
    except json.JSONDecodeError as e:
        problems.add(path, "", f"invalid JSON at line {e.lineno} column {e.colno}: {e.msg}")
        return None
    if not isinstance(data, dict):
        problems.add(path, "", "the top level must be a JSON object with model_infos/llm/embedding/rerank")
        return None
    for key in list(data):
        if key not in GatewayConfig.model_fields or key == "source":
            problems.add(path, key, "unknown model kind (expected model_infos, llm, embedding or rerank)")
            del data[key]
    llm_names: set[str] | None = None
    try:
        config = GatewayConfig.model_validate(data, context=_LOADER)
    except ValidationError as e:
        for err in e.errors():
            problems.add(path, _field_path(tuple(err["loc"]), data), _validation_reason(err))
        config = _valid_entries(data)
        entries = data.get("llm")
        llm_names = {e["name"] for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str)} \
            if isinstance(entries, list) else set()
    for field, reason in naming_problems(config, llm_names):
        problems.add(path, field, reason)

    base = path.resolve().parent
    config.source = path.resolve()
    config._digest = hashlib.sha256(raw).hexdigest()
    for where, m in config.entries():
        _resolve_files(path, base, where, m, problems)
    resolve_adapters(config, path, problems)  # the adapters' files are read once, here
    return config


def _resolve_files(path: Path, base: Path, where: str, m: LLMModel | EmbeddingModel | RerankModel,
                   problems: _Problems) -> None:
    """One entry's files made absolute and checked: its tokenizer folder, and what is built from files at
    start-up (the chat template compiled, the cl100k_base vocabulary loaded), so that each stops start-up with
    one line instead of failing later."""
    m.path = _resolve(base, m.path)
    if not m.path.is_dir():
        problems.add(path, f"{where}.path", f"tokenizer folder not found: {m.path}")
    elif not (m.path / "tokenizer.json").is_file():
        problems.add(path, f"{where}.path", f"no tokenizer.json in {m.path}")
    if isinstance(m, EmbeddingModel) and m.token_ids == "cl100k_base" and not m.accept_token_ids:
        from openai_api.text.cl100k import VocabularyUnavailable, cl100k

        try:
            cl100k()
        except VocabularyUnavailable as e:
            problems.add(path, f"{where}.token_ids", f"{e}; or set token_ids to 'refuse' or 'accept_token_ids'")
    if not isinstance(m, LLMModel):
        return
    if m.chat_template is not None:
        found = _resolve_template(base, m.chat_template)
        if found is None:
            problems.add(path, f"{where}.chat_template", f"template file not found: {m.chat_template}")
            return
        m.chat_template = found
    elif not m.path.is_dir():
        return  # the tokenizer folder's template: its folder is reported already
    try:
        if m.chat_template is not None:
            ChatTemplate.from_file(m.chat_template)
        else:
            ChatTemplate.from_tokenizer_dir(m.path)
    except TemplateError as e:
        problems.add(path, f"{where}.chat_template", str(e))


def _load_entry(m: LLMModel, entry: LoraAdapterEntry, shape: BaseShape | None) -> LoraAdapter:
    """One configured adapter, read and checked against its base model `m` (`AdapterError` if it cannot be
    served); without a `source` an adapter whose weights only the backend holds."""
    if entry.source is None:
        return LoraAdapter(name=entry.name, base=m.name, lora_name=entry.lora_name or "")
    adapter = read_adapter(Path(entry.source), entry.name, m.name, shape)
    adapter.lora_name = entry.lora_name or entry.name
    adapter.check(shape, m.max_lora_rank)
    if entry.base is not None and not base_matches(adapter, entry.base):
        raise AdapterError(f"adapter {entry.name!r} was trained on {adapter.base_model or 'an unnamed base model'!r}, "
                           f"not {entry.base!r} (its `base` check)")
    return adapter


def resolve_adapters(config: GatewayConfig, file: Path, problems: _Problems | None = None) -> None:
    """Read, check and attach every LLM's adapters (listed, and found in its `adapters_dir`); a problem, or an
    adapter name that is already a model's, an alias or another adapter's, is a `ConfigError` naming both
    (raised, or each added to `problems`)."""
    problems = problems or _Problems(strict=True)
    base = file.resolve().parent
    taken: dict[str, str] = {m.name: f"model {m.name!r}" for m in config.all_models()}
    for m in config.llm:
        for alias in m.aliases:
            taken.setdefault(alias, f"alias {alias!r} of model {m.name!r}")
    for llm, m in ((where, m) for where, m in config.entries() if isinstance(m, LLMModel)):
        entries = [e.model_copy(update={"source": abs_path(base, e.source) if e.source is not None else None})
                   for e in m.adapters]
        if m.adapters_dir is not None:
            m.adapters_dir = abs_path(base, m.adapters_dir)
            try:
                scanned = scan_dir(m.adapters_dir)
            except AdapterError as e:
                problems.add(file, f"{llm}.adapters_dir", str(e))
                scanned = []
            listed = {e.name for e in entries}
            entries += [LoraAdapterEntry(name=n, source=src, lora_name=None if ln == n else ln)
                        for n, src, ln in scanned if n not in listed]
        runtime: dict[str, str] = {}
        if m.persist_adapters:
            if m.adapters_dir is None:
                problems.add(file, f"{llm}.persist_adapters",
                             "needs adapters_dir (where runtime loads are read from and recorded)")
            else:
                runtime, unloaded = read_runtime_state(m.adapters_dir)
                entries = [e for e in entries if e.name not in unloaded and e.name not in runtime]
        shape = BaseShape.from_folder(m.path) if entries or runtime else None
        loaded = []
        for j, entry in enumerate(entries):
            where = f"{llm}.adapters[{j}]" if j < len(m.adapters) else f"{llm}.adapters_dir"
            if entry.name in taken:
                problems.add(file, where, f"adapter {entry.name!r} of model {m.name!r} has the same name as "
                                          f"{taken[entry.name]}")
                continue
            taken[entry.name] = f"adapter {entry.name!r} of model {m.name!r}"
            try:
                loaded.append(_load_entry(m, entry, shape))
            except AdapterError as e:
                problems.add(file, where, str(e))
        if runtime:
            loaded += _restore_runtime(m, runtime, shape, taken)
        m._lora = loaded


def _restore_runtime(m: LLMModel, runtime: dict[str, str], shape: BaseShape | None,
                     taken: dict[str, str]) -> list[LoraAdapter]:
    """The runtime loads recorded for `m` (`persist_adapters`), read and checked again; one that no longer serves
    (folder gone, name taken by a model since, outside adapters_dir) is skipped with a warning, never fatal."""
    assert m.adapters_dir is not None
    restored = []
    for name, rel in runtime.items():
        source = abs_path(m.adapters_dir, rel)
        problem = (f"its name is already {taken[name]}" if name in taken else
                   "it is not inside adapters_dir" if not source.is_relative_to(m.adapters_dir) else None)
        if problem is None:
            try:
                restored.append(_load_entry(m, LoraAdapterEntry(name=name, source=source), shape))
                taken[name] = f"adapter {name!r} of model {m.name!r}"
            except AdapterError as e:
                problem = str(e)
        if problem is not None:
            logger.warning("model %s: the runtime-loaded adapter %s (%s, recorded in %s) is not restored: %s",
                           m.name, name, source, RUNTIME_STATE, problem)
    return restored


def adapters_of(m: LLMModel) -> list[LoraAdapter]:
    """The adapters of LLM entry `m`: as `load_config` read them, else (a config built in code) read now."""
    if m._lora is None:
        shape = BaseShape.from_folder(m.path) if m.adapters else None
        m._lora = [_load_entry(m, e, shape) for e in m.adapters]
    return list(m._lora)
