"""Each model's Triton backend, assembled in one place.

An LLM: `AutoLLMBackend` per Triton URL (it reads the model's config, picks the protocol adapter and
gives it the stall timeout), a `ReplicatedLLMBackend` over them when the config lists several URLs,
and `InstrumentedLLMBackend` outermost (metrics). An encoder (embeddings, rerank): `EncoderAdapter` per
URL, `ReplicatedEncoder` over several, `InstrumentedEncoder` outermost. Each layer is a real type with
the interface it implements (`LLMBackend`, `EncoderBackend`), nothing forwarded implicitly. The replica
set, when there is one, is returned beside the backend, for the prober and `/v1/models`.

Per token, the metrics wrapper is one generator layer: a clock read and one histogram observation per
chunk; token counters, the sequence's phase (waiting for its first output, then running), duration, token
histograms and how it ended are recorded once per sequence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from numpy.typing import NDArray

from openai_api.config import DNS_SCHEME, EmbeddingModel, LLMModel, RerankModel
from openai_api.errors import GatewayError
from openai_api.lora import LoraAdapter
from openai_api.observability import Metrics, RequestStats, current_stats
from openai_api.quota.caller import current_meter
from openai_api.triton.auto import AutoLLMBackend
from openai_api.triton.client import TritonClientPool
from openai_api.triton.encoder import EncoderAdapter, EncoderBackend
from openai_api.triton.health import model_ready
from openai_api.triton.llm import GenerationChunk, GenerationRequest, GuideKind, LLMBackend
from openai_api.triton.replicas import Replica, ReplicaSet, ReplicatedEncoder, ReplicatedLLMBackend
from openai_api.triton.text import TextWire


def _triton_error(metrics: Metrics, model: str, err: GatewayError) -> None:
    if err.status >= 500:
        metrics.triton_errors.labels(model, err.code or err.type).inc()


class _WrappedLLMBackend:
    """What a wrapper of an `LLMBackend` answers as the backend it wraps (`inner`)."""

    inner: LLMBackend

    @property
    def protocol(self) -> str:
        return self.inner.protocol

    @property
    def guide_kinds(self) -> frozenset[GuideKind] | None:
        return self.inner.guide_kinds

    def supports(self, param: str) -> bool:
        return self.inner.supports(param)

    async def check(self) -> None:
        await self.inner.check()


def _ended(error: BaseException | None, stats: RequestStats | None, produced: int, max_tokens: int) -> str:
    """How a sequence ended, in vLLM's words (`finished_reason`): abort when the client left (the task was
    cancelled, or the request's record says so), error when the backend failed, length at `max_tokens`, else
    stop (end of sequence, a stop word, or the caller closing it at a stop string)."""
    if isinstance(error, asyncio.CancelledError) or (stats is not None and stats.disconnected):
        return "abort"
    if error is not None and not isinstance(error, GeneratorExit):
        return "error"
    return "length" if error is None and max_tokens and produced >= max_tokens else "stop"


class InstrumentedLLMBackend(_WrappedLLMBackend):
    """An `LLMBackend` that records, for any protocol: time to first token, inter-token latency, token
    counters (prompt tokens as Triton read them, and of those the ones its backend reported reading from its KV
    cache), Triton errors, and per sequence its phase, duration, tokens and end (and the request's token counts
    for the access log)."""

    def __init__(self, inner: LLMBackend, metrics: Metrics, model: str) -> None:
        self.inner = inner
        self.model = model
        self._metrics = metrics
        self._ttft = metrics.ttft.labels(model)
        self._itl = metrics.itl.labels(model)
        self._prompt = metrics.prompt_tokens.labels(model)
        self._completion = metrics.completion_tokens.labels(model)
        self._cached = metrics.cached_prompt_tokens.labels(model)
        self._seq = metrics.sequence_metrics(model)

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        stats = current_stats()
        meter = current_meter()
        counted_prompt = True
        prompt = 0 if request.prompt_counted else len(request.prompt_ids)  # a budget's phase 2: counted by phase 1
        if meter is not None:  # a key with limits: its tokens (prompt + max_tokens) reserved, or the 429 raised
            counted_prompt = await meter.reserve(request.prompt_ids, prompt, request.max_tokens)
        if stats is not None and stats.on_first_token is not None and not stats.ttft:
            # The scheduler waits for this request's first token (a batch line's prefill, an interactive request
            # that holds batch starts): per-token responses from Triton, or a whole answer's one response would
            # say so only at its end.
            request.stream_tokens = True
        clock = time.perf_counter
        last = start = stats.start if stats is not None else clock()
        first = True
        produced = 0
        cached: int | None = None
        seq = self._seq
        error: BaseException | None = None
        chunks = self.inner.generate(request)
        seq.waiting.inc()
        try:
            async for chunk in chunks:
                now = clock()
                n = len(chunk.token_ids) or chunk.num_tokens or 0  # a text-out protocol's count, where it gives one
                if chunk.cached_tokens is not None:
                    cached = chunk.cached_tokens
                if first:
                    self._ttft.observe(now - last)
                    first = False
                    if stats is not None and not stats.ttft:
                        stats.ttft = now - start  # the access log's (the first sequence's, with n > 1)
                        if stats.on_first_token is not None:
                            stats.on_first_token(stats.ttft)
                    seq.waiting.dec()
                    seq.running.inc()
                elif n:
                    self._itl.observe((now - last) / n)
                last = now
                produced += n
                yield chunk
        except GatewayError as e:
            error = e
            _triton_error(self._metrics, self.model, e)
            raise
        except BaseException as e:  # the caller closed it (GeneratorExit) or the task was cancelled
            error = e
            raise
        finally:
            await chunks.aclose()
            (seq.waiting if first else seq.running).dec()
            seq.finished[_ended(error, stats, produced, request.max_tokens)].inc()
            seq.duration.observe(clock() - start)
            seq.prompt_tokens.observe(len(request.prompt_ids))
            seq.generation_tokens.observe(produced)
            self._prompt.inc(len(request.prompt_ids))  # what Triton read (a budget's phase 2 reads the prompt again)
            if cached:
                self._cached.inc(cached)  # of what Triton read, so per sequence as well
            if produced:
                self._completion.inc(produced)
            if stats is not None:
                # n > 1 sends the same prompt once per choice; usage (and the log) count it once.
                stats.prompt_tokens = max(stats.prompt_tokens, prompt)
                stats.completion_tokens += produced
            if meter is not None:
                meter.used(prompt if counted_prompt else 0, produced)


class LoraBackend(_WrappedLLMBackend):
    """A LoRA adapter served as a model: its base model's backend, with the adapter named on every request
    (`GenerationRequest.lora`) and each sequence counted per adapter. No generator layer of its own."""

    def __init__(self, inner: LLMBackend, adapter: LoraAdapter) -> None:
        self.inner = inner
        self.adapter = adapter
        self.model = adapter.name

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        request.lora = self.adapter
        self.adapter.count("requests")
        return self.inner.generate(request)


class InstrumentedEncoder:
    """An `EncoderBackend` that records input tokens (the attention mask's sum) and Triton errors."""

    def __init__(self, inner: EncoderBackend, metrics: Metrics, model: str) -> None:
        self.inner = inner
        self.model = model
        self._metrics = metrics
        self._prompt = metrics.prompt_tokens.labels(model)
        self._seq = metrics.sequence_metrics(model)

    @property
    def max_batch_size(self) -> int | None:
        return self.inner.max_batch_size

    async def check(self) -> None:
        await self.inner.check()

    async def infer(self, features: dict[str, NDArray[Any]]) -> NDArray[Any]:
        mask = features.get("attention_mask")
        tokens = int(mask.sum()) if mask is not None else 0
        meter = current_meter()
        if meter is not None:  # a key with limits: its input tokens reserved, or the 429 raised
            await meter.reserve(features, tokens, 0)
        # One call is one sequence, running from the moment it is sent (Triton answers it whole).
        seq = self._seq
        stats = current_stats()
        start = stats.start if stats is not None else time.perf_counter()
        seq.running.inc()
        error: BaseException | None = None
        try:
            out = await self.inner.infer(features)
        except GatewayError as e:
            error = e
            _triton_error(self._metrics, self.model, e)
            raise
        except BaseException as e:
            error = e
            raise
        finally:
            seq.running.dec()
            seq.finished[_ended(error, stats, 0, 0)].inc()
            seq.duration.observe(time.perf_counter() - start)
            seq.prompt_tokens.observe(tokens)
        if meter is not None:
            meter.used(tokens, 0)
        self._prompt.inc(tokens)
        if stats is not None:
            stats.prompt_tokens += tokens
        return out


def _set_options(m: LLMModel | EmbeddingModel | RerankModel, pool: TritonClientPool, metrics: Metrics,
                 make: Callable[[str], Any]) -> dict[str, Any]:
    """A replica set's routing, discovery, adapter factory and readiness check (`ReplicaSet` fields)."""

    async def ready(url: str) -> bool:
        return await model_ready(pool, m.transport, url, m.triton_name, m.triton_version)

    return {"routing": m.routing, "discovery": m.discovery, "sources": m.urls, "factory": make, "ready": ready,
            "metrics": metrics}


def _watched(m: LLMModel | EmbeddingModel | RerankModel, only: tuple[str, Any], pool: TritonClientPool,
             metrics: Metrics, make: Callable[[str], Any]) -> ReplicaSet[Any] | None:
    """A single Triton with a `routing.metrics_port`: a replica set of one, never in the request's path (the
    adapter is used directly, no layer added), so its load and KV use are scraped (`/metrics`, the vLLM view's
    KV-cache gauge, `/v1/models`, the status page) as a replicated model's are. None without a metrics port."""
    if m.routing.metrics_port_of(only[0]) is None:
        return None
    return ReplicaSet(m.name, m.transport, [Replica(only[0], only[1])], **_set_options(m, pool, metrics, make))


def llm_backend(m: LLMModel, pool: TritonClientPool, metrics: Metrics,
                stream_idle_timeout_s: float | None) -> tuple[LLMBackend, ReplicaSet[Any] | None]:
    """The backend of one LLM entry: protocol adapter(s), replicas, metrics (see the module docstring)."""
    wire = TextWire.configured(m.text_protocol.model_dump()) if m.text_protocol is not None else None

    def make(u: str) -> LLMBackend:
        return AutoLLMBackend(pool, u, m.name, m.triton_name, m.triton_version, protocol=m.protocol,
                              stream_idle_timeout_s=stream_idle_timeout_s, vllm_guide_key=m.guided_decoding_key,
                              text_wire=wire, tokens_per_block=m.tokens_per_block)

    adapters = [(u, make(u)) for u in m.urls if not u.startswith(DNS_SCHEME)]
    inner: LLMBackend
    replicas: ReplicaSet[Any] | None = None
    if len(adapters) == 1 and not m.discovered:
        inner = adapters[0][1]
        replicas = _watched(m, adapters[0], pool, metrics, make)
    else:
        replicated = ReplicatedLLMBackend(m.name, m.transport, adapters, **_set_options(m, pool, metrics, make))
        inner, replicas = replicated, replicated.set
    return InstrumentedLLMBackend(inner, metrics, m.name), replicas


def encoder_backend(m: EmbeddingModel | RerankModel, pool: TritonClientPool,
                    metrics: Metrics) -> tuple[EncoderBackend, ReplicaSet[Any] | None]:
    """The backend of one embedding or rerank entry: adapter(s), replicas, metrics."""
    output = m.output_name if isinstance(m, EmbeddingModel) else m.output_config.name

    def make(u: str) -> EncoderBackend:
        return EncoderAdapter(pool, transport=m.transport, url=u, model=m.name, triton_model=m.triton_name,
                              version=m.triton_version, input_config=m.input_config, input_dtype=m.input_dtype,
                              output_name=output, timeout_s=m.timeout_s)

    adapters = [(u, make(u)) for u in m.urls if not u.startswith(DNS_SCHEME)]
    inner: EncoderBackend
    replicas: ReplicaSet[Any] | None = None
    if len(adapters) == 1 and not m.discovered:
        inner = adapters[0][1]
        replicas = _watched(m, adapters[0], pool, metrics, make)
    else:
        replicated = ReplicatedEncoder(m.name, m.transport, adapters, **_set_options(m, pool, metrics, make))
        inner, replicas = replicated, replicated.set
    return InstrumentedEncoder(inner, metrics, m.name), replicas
