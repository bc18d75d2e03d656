"""Adapter for the TensorRT-LLM token-id protocol (`tensorrt_llm` backend or its ensemble/BLS).

Wire contract (see design/triton-protocols.md): with `max_batch_size > 0` every tensor carries a
leading batch dim of 1 (`input_ids` [1, L], scalars [1, 1]). Decoupled models are called over one
gRPC stream per request with `streaming=true`: every response holds only the new tokens in
`output_ids` [1, beams, k]; the stream ends after the model's FINAL response. Non-decoupled models
get one unary `infer` with `exclude_input_in_output=true` (or the prompt stripped if that input is
absent). The model's config is read once to learn input names, dtypes and decoupling, so releases
that use UINT32 scalars or `random_seed`/`min_length` work unchanged.

Prompt-cache reuse (tensorrtllm_backend docs/model_config.md): a model whose config declares the optional input
`return_perf_metrics` (BOOL [1]) and the output `kv_cache_reused_blocks` (INT32 [1]) is sent
`return_perf_metrics=true` and asked for that output alone; every response then carries the KV cache blocks
the request reused, which become `GenerationChunk.cached_tokens` (blocks x the model's `tokens_per_block`, at
most the prompt). A model without them is asked nothing and reports nothing.

KV-cache retention (TensorRT-LLM's `KvCacheRetentionConfig`, tensorrt_llm model config): a model whose config
declares `retention_token_range_starts`, `retention_token_range_ends` and `retention_token_range_priorities`
(INT32 [n]) is sent a request's `GenerationRequest.retention` ranges (Anthropic `cache_control` breakpoints,
`services.retention`) as [1, n] tensors, each at priority `RETENTION_PRIORITY`, with
`retention_token_range_durations_ms` (INT32 [n]) when declared. `retention_decode_*` are not sent: the
generated tokens keep the engine's default priority. A model without those inputs is sent nothing.
"""

from __future__ import annotations

import json
import logging
from array import array
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any

from openai_api.errors import BackendError, InvalidRequestError
from openai_api.lora import AdapterError, LoraAdapter
from openai_api.triton.base import SpecAdapter
from openai_api.triton.llm import GUIDE_KINDS, GenerationChunk, GenerationRequest, Guide, GuideKind
from openai_api.triton.wire import (
    InferRequest,
    ModelSpec,
    cached_prompt_tokens,
    output_int,
    priority_for,
    raw_output,
    words_tensor,
)

logger = logging.getLogger(__name__)

# OpenAI-side parameter -> candidate Triton input names, newest release first.
_PARAM_INPUTS = {
    "temperature": ("temperature",),
    "top_p": ("runtime_top_p",),
    "top_k": ("runtime_top_k",),
    "seed": ("seed", "random_seed"),
    "repetition_penalty": ("repetition_penalty",),
    "presence_penalty": ("presence_penalty",),
    "frequency_penalty": ("frequency_penalty",),
    "min_tokens": ("min_tokens", "min_length"),
    "stop_words": ("stop_words_list",),
    "bad_words": ("bad_words_list",),
    "return_logprobs": ("return_log_probs",),
}


# The TensorRT-LLM backend's guided-decoding inputs (both BYTES [1]): a type and the guide itself.
_GUIDE_TYPE, _GUIDE = "guided_decoding_guide_type", "guided_decoding_guide"


def trtllm_guide(guide: Guide) -> tuple[str, str]:
    """(guided_decoding_guide_type, guided_decoding_guide) for a guide. TensorRT-LLM's types are
    `json` (any JSON value), `json_schema`, `regex` and `ebnf_grammar`: a JSON object is the schema
    `{"type": "object"}`, and a choice the grammar of its alternatives (as vLLM builds it)."""
    if guide.kind == "json_schema":
        return "json_schema", guide.value or "{}"
    if guide.kind == "json_object":
        return "json_schema", '{"type": "object"}'
    if guide.kind == "regex":
        return "regex", guide.value or ""
    if guide.kind == "grammar":
        return "ebnf_grammar", guide.value or ""
    choices = json.loads(guide.value or "[]")
    return "ebnf_grammar", "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


# TensorRT-LLM's per-request perf metrics: the flag that asks for them, and the one output read (INT32 [1]).
PERF_METRICS, REUSED_BLOCKS = "return_perf_metrics", "kv_cache_reused_blocks"

# KV-cache retention inputs (INT32 [n] each); durations are optional in the backend too.
_RETAIN_STARTS, _RETAIN_ENDS, _RETAIN_PRIORITIES, _RETAIN_DURATIONS = (
    "retention_token_range_starts", "retention_token_range_ends", "retention_token_range_priorities",
    "retention_token_range_durations_ms")
# TensorRT-LLM's retention priorities run 0-100, default 35: a breakpoint's prefix outlives ordinary blocks,
# and leaves 91-100 to an operator's own pinned prompts.
RETENTION_PRIORITY = 90

# LoRA (see `openai_api.lora` for the tensors' layout): the task id, and the weights with their config.
_LORA_ID, _LORA_WEIGHTS, _LORA_CONFIG = "lora_task_id", "lora_weights", "lora_config"


def is_lora_cache_miss(err: BackendError) -> bool:
    """Whether Triton refused a request because its LoRA cache no longer holds the task (TensorRT-LLM:
    "LoRA task <id> not found in cache. Please send LoRA weights with request")."""
    detail = (err.detail or "").lower()
    return "lora task" in detail and "not found in cache" in detail


class TensorRTLLMAdapter(SpecAdapter):
    """`LLMBackend` over the TensorRT-LLM token-id protocol (module docstring).

    LoRA: a request on an adapter carries `lora_task_id`, plus `lora_weights` and `lora_config` the first time
    this replica (this adapter instance: one per Triton URL) is sent that task; after that only the id. When
    Triton answers that its cache no longer holds the task (evicted, or Triton restarted), the request is sent
    once more with the weights, before anything reached the client, so the client never sees the miss."""

    protocol = "tensorrt_llm"

    param_inputs = _PARAM_INPUTS

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # The LoRA task ids this replica was sent the weights of (and answered): only their ids are sent.
        self.lora_sent: set[int] = set()
        # Whether the model reports KV cache reuse (module docstring): asked on every request, or never.
        self.reports_reuse = PERF_METRICS in self.spec.inputs and REUSED_BLOCKS in self.spec.outputs
        # Whether the model takes KV-cache retention ranges (module docstring).
        self.takes_retention = all(n in self.spec.inputs for n in (_RETAIN_STARTS, _RETAIN_ENDS, _RETAIN_PRIORITIES))

    def supports(self, param: str) -> bool:
        if param == "lora":
            return all(n in self.spec.inputs for n in (_LORA_ID, _LORA_WEIGHTS, _LORA_CONFIG))
        if param == "kv_retention":
            return self.takes_retention
        return super().supports(param)

    def _add_lora(self, r: InferRequest, lora: LoraAdapter, weights: bool) -> None:
        spec = self.spec
        r.add(spec, _LORA_ID, lora.task_id)
        if not weights:
            return
        dtype = spec.inputs[_LORA_WEIGHTS].dtype
        try:
            w, c = lora.trtllm_tensors(dtype)
            raw = lora.wire_bytes(dtype)  # encoded once per adapter and dtype: a resend costs no conversion
        except AdapterError as e:
            raise InvalidRequestError(f"The model {lora.name!r}: {e}", param="model") from None
        r._add(_LORA_WEIGHTS, dtype, [1, *w.shape] if spec.batched else list(w.shape), raw)
        r.add(spec, _LORA_CONFIG, c)

    @property
    def guide_kinds(self) -> frozenset[GuideKind]:
        return GUIDE_KINDS if _GUIDE_TYPE in self.spec.inputs and _GUIDE in self.spec.inputs else frozenset()

    def _request(self, req: GenerationRequest, streaming: bool, lora_weights: bool = False) -> InferRequest:
        req = self.eos_ignored(req)
        spec = self.spec
        names = spec.inputs
        r = InferRequest(self.triton_model, self.version, req.request_id, priority_for(self.spec))
        r.add(spec, "input_ids", req.prompt_ids)
        r.add(spec, "request_output_len", req.max_tokens)
        if "input_lengths" in names:
            r.add(spec, "input_lengths", len(req.prompt_ids))
        if req.end_id is not None and "end_id" in names:
            r.add(spec, "end_id", req.end_id)
        if req.pad_id is not None and "pad_id" in names:
            r.add(spec, "pad_id", req.pad_id)
        if "streaming" in names:
            r.add(spec, "streaming", streaming)
        if not streaming and "exclude_input_in_output" in names:
            r.add(spec, "exclude_input_in_output", True)
        for param in _PARAM_INPUTS:
            value = getattr(req, param)
            if value is None or value is False or value == []:
                continue
            name = self.value_input(param, value)
            if name is not None:
                r.add(spec, name, words_tensor(value) if param in ("stop_words", "bad_words") else value)
        if req.guide is not None:
            if not self.guide_kinds:
                raise self.refuse_guide(req.guide)
            kind, text = trtllm_guide(req.guide)
            r.add(spec, _GUIDE_TYPE, kind)
            r.add(spec, _GUIDE, text)
        if req.lora is not None:
            self._add_lora(r, req.lora, lora_weights)
        if req.retention and self.takes_retention:
            ranges = req.retention
            r.add(spec, _RETAIN_STARTS, [x.start for x in ranges])
            r.add(spec, _RETAIN_ENDS, [x.end for x in ranges])
            r.add(spec, _RETAIN_PRIORITIES, [RETENTION_PRIORITY] * len(ranges))
            if _RETAIN_DURATIONS in names:
                r.add(spec, _RETAIN_DURATIONS, [x.duration_ms for x in ranges])
        r.output("output_ids")
        if not streaming and "sequence_length" in spec.outputs:  # streamed responses hold new tokens only
            r.output("sequence_length")
        if req.return_logprobs and "output_log_probs" in spec.outputs:
            r.output("output_log_probs")
        if self.reports_reuse:
            r.add(spec, PERF_METRICS, True)
            r.output(REUSED_BLOCKS)
        return r

    def _cached(self, resp: object, req: GenerationRequest) -> int | None:
        """The prompt tokens a response says were read from the KV cache (None: it says nothing)."""
        return cached_prompt_tokens(output_int(resp, REUSED_BLOCKS), self.tokens_per_block, len(req.prompt_ids))

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        lora = request.lora
        if lora is None:
            return self._generate(request, False)
        if not self.supports("lora"):
            raise InvalidRequestError(f"The model {lora.name!r} is a LoRA adapter of {self.model!r}, whose Triton "
                                      f"model {self.triton_model!r} takes no LoRA (no lora_task_id, lora_weights and "
                                      "lora_config inputs).", param="model", code="lora_not_supported")
        if not lora.modules:
            raise InvalidRequestError(f"The model {lora.name!r} is a LoRA adapter without weights (no `source` "
                                      f"folder), which the TensorRT-LLM protocol of {self.model!r} needs.",
                                      param="model", code="adapter_without_weights")
        return self._generate_lora(request, lora)

    async def _generate_lora(self, request: GenerationRequest, lora: LoraAdapter
                             ) -> AsyncGenerator[GenerationChunk, None]:
        """`_generate` with the adapter's id, and its weights when this replica may not hold them; a cache miss
        answered before any output is retried once with the weights."""
        send = lora.task_id not in self.lora_sent
        while True:
            produced = False
            if send:
                lora.count("weights_sent")
            chunks = self._generate(request, send)
            try:
                async with aclosing(chunks):
                    async for chunk in chunks:
                        if not produced:
                            produced = True
                            self.lora_sent.add(lora.task_id)
                        yield chunk
                self.lora_sent.add(lora.task_id)
                return
            except BackendError as e:
                if produced or send or not is_lora_cache_miss(e):
                    raise
                lora.count("cache_misses")
                logger.info("model %s: Triton's LoRA cache no longer holds %s (task %d); sending its weights again",
                            self.model, lora.name, lora.task_id)
                self.lora_sent.discard(lora.task_id)
                send = True

    async def _generate(self, request: GenerationRequest, lora_weights: bool
                        ) -> AsyncGenerator[GenerationChunk, None]:
        spec = self.spec
        if not spec.decoupled:
            result = await self.rpc.infer(self._request(request, streaming=False, lora_weights=lora_weights),
                                          model=self.model,
                                          timeout_s=request.timeout_s)
            yield self._final_chunk(spec, request, result)
            return
        # A decoupled model can still answer with one response (streaming=false): per-token responses
        # cost a gRPC message, a tensor parse and an event-loop wake-up each, for nobody when the
        # client did not ask for a stream.
        streaming = request.stream_tokens or "streaming" not in spec.inputs
        ids_dtype = "I" if getattr(spec.inputs.get("input_ids"), "dtype", "INT32") == "UINT32" else "i"
        reuse = self.reports_reuse
        # The deadline (`timeout_s`) covers the whole request, first token to last; the stall guard ends a
        # stream that stops producing (Triton hung, GPU wedged) long before that.
        responses = self.rpc.stream(self._request(request, streaming, lora_weights), model=self.model,
                                    timeout_s=request.timeout_s, idle_s=self.stream_idle_timeout_s)
        # aclosing: closing this generator early must close the stream (and so cancel the request) now.
        async with aclosing(responses):
            async for result in responses:
                if not streaming:
                    yield self._final_chunk(spec, request, result)
                    continue
                resp = result.get_response()
                raw = raw_output(resp, "output_ids")
                if raw is None:
                    continue
                # Straight from the raw bytes: per streamed token several times cheaper than a numpy
                # round trip.
                tokens = array(ids_dtype, raw).tolist()
                logprobs = None
                if request.return_logprobs and tokens:
                    lp = result.as_numpy("output_log_probs")
                    logprobs = lp.reshape(-1)[-len(tokens):].tolist() if lp is not None else None
                chunk = GenerationChunk(tokens, logprobs)
                if reuse:
                    chunk.cached_tokens = self._cached(resp, request)
                yield chunk

    def _final_chunk(self, spec: ModelSpec, req: GenerationRequest, result: Any) -> GenerationChunk:
        """The whole generation from a single (non-streaming) response: prompt stripped when the model
        echoes it, `sequence_length` and end/pad padding trimmed."""
        ids = result.as_numpy("output_ids")
        tokens = ids.reshape(-1).tolist() if ids is not None else []
        seq = result.as_numpy("sequence_length")
        if seq is not None:
            tokens = tokens[: int(seq.reshape(-1)[0])]
        if "exclude_input_in_output" not in spec.inputs and tokens[: len(req.prompt_ids)] == req.prompt_ids:
            tokens = tokens[len(req.prompt_ids):]
        if req.end_id is not None and req.end_id in tokens:
            tokens = tokens[: tokens.index(req.end_id)]  # TensorRT-LLM pads the tail with end_id
        tokens = [t for t in tokens if t >= 0]
        logprobs = None
        if req.return_logprobs:
            lp = result.as_numpy("output_log_probs")
            logprobs = lp.reshape(-1)[: len(tokens)].tolist() if lp is not None and tokens else None
        chunk = GenerationChunk(tokens, logprobs)
        if self.reports_reuse:
            chunk.cached_tokens = self._cached(result.get_response(), req)
        return chunk
