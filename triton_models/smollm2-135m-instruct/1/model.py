"""SmolLM2-135M-Instruct reference LLM for Triton's Python backend, TensorRT-LLM tensor interface.

Wire contract (``max_batch_size: 8``, so every tensor has a leading batch dim that must be 1):

* inputs: ``input_ids`` INT32 [1, L], ``input_lengths`` INT32 [1, 1], ``request_output_len`` INT32
  [1, 1]; optional ``end_id``/``pad_id``/``runtime_top_k``/``min_tokens`` INT32 [1, 1],
  ``runtime_top_p``/``temperature``/``repetition_penalty``/``presence_penalty``/``frequency_penalty``
  FP32 [1, 1], ``seed`` UINT64 [1, 1], ``streaming``/``return_log_probs``/``exclude_input_in_output``
  BOOL [1, 1], ``stop_words_list``/``bad_words_list`` INT32 [1, 2, N] (row 0 concatenated ids, row 1
  cumulative end offsets padded with -1), ``guided_decoding_guide_type``/``guided_decoding_guide``
  BYTES [1, 1] (TYPE_STRING, as the TensorRT-LLM backend declares them).
* guided decoding: guide type ``json`` (any JSON object or array; the guide is not needed),
  ``json_schema`` (the guide is a JSON schema), ``regex`` or ``ebnf_grammar`` (xgrammar EBNF,
  ``root ::= ...``), enforced token by token with xgrammar (rules in ``smollm2_guide.py``).  Other
  types (``structural_tag`` included, which the Triton backends do not map either), a guide without
  a type, a missing guide and a guide that does not compile are refused with an error naming the
  problem.  The output ends with "stop" (end id never emitted) when the grammar is complete, or after
  ``request_output_len`` tokens with the partial output.
* outputs: ``output_ids`` INT32 [1, 1, T], ``sequence_length`` INT32 [1, 1], ``output_log_probs``
  FP32 [1, 1, T] (log-prob of each generated token after penalties and temperature, zeros unless
  ``return_log_probs``), ``cum_log_probs`` FP32 [1, 1].
* streaming: one response per generated token holding only that token; ``sequence_length`` is the
  running total (prompt included unless ``exclude_input_in_output``).  The last response carries
  ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; when generation ends on ``end_id`` (never emitted) or
  produces nothing, that last response has an empty ``output_ids`` [1, 1, 0].
* non-streaming: one FINAL response with prompt + generation (generation only when
  ``exclude_input_in_output``).
* stops: ``request_output_len`` tokens generated; ``end_id`` sampled (masked until ``min_tokens``
  tokens exist); the generated suffix equals a ``stop_words_list`` entry (stop tokens included in the
  output, as TensorRT-LLM does).  ``bad_words_list`` entries are masked (multi-token entries only
  when their prefix matches the generated suffix).
* LoRA, as the TensorRT-LLM backend takes it: ``lora_task_id`` UINT64 [1, 1], ``lora_weights`` FP32
  [1, N, W] (each row: A [r, in] flattened, then B [out, r] with the scale folded in, zero-padded) and
  ``lora_config`` INT32 [1, N, 3] (module id, layer, r; ids 1-7 = q, k, v, o, gate (mlp_h_to_4h), down
  (mlp_4h_to_h), up (mlp_gate)).  Weights with a task id are cached (an LRU of ``lora_cache_size``
  adapters, the config's parameter; TensorRT-LLM's host cache) and applied in every forward pass of the
  request (``smollm2_lora.LoraHooks``); a task id alone must be cached, else the request fails with
  TensorRT-LLM's words: "LoRA task <id> not found in cache. Please send LoRA weights with request".
  Counters ``lora_loads``, ``lora_hits``, ``lora_misses``, ``lora_evictions`` count each case.
* KV cache reuse, as TensorRT-LLM's ``enable_kv_cache_reuse`` (``smollm2_prefix_cache.py``): with the config's
  ``enable_kv_cache_reuse`` parameter true, prompts are cut into blocks of ``tokens_per_block`` tokens kept
  (LRU, at most ``kv_cache_reuse_bytes``) for later requests, which prefill only the tokens after the longest
  cached run of blocks. ``return_perf_metrics`` BOOL [1, 1] true adds TensorRT-LLM's perf outputs to every
  response: ``kv_cache_reused_blocks``, ``kv_cache_alloc_new_blocks``, ``kv_cache_alloc_total_blocks`` INT32
  [1, 1] and ``arrival_time_ns``, ``first_scheduled_time_ns``, ``first_token_time_ns``, ``last_token_time_ns``
  INT64 [1, 1] (``SmolLM2Engine.perf_metric_tensors``). Requests with a LoRA adapter neither read nor store
  blocks.
* KV-cache retention, as TensorRT-LLM's ``KvCacheRetentionConfig`` inputs: ``retention_token_range_starts`` /
  ``_ends`` / ``_priorities`` / ``_durations_ms`` INT32 [1, n] and ``retention_decode_priority`` /
  ``retention_decode_duration_ms`` INT32 [1, 1], all optional. Checked as the backend checks them (a bad set
  fails the request with its words) and recorded as the stats' ``kv_retention`` (the last request's ranges, as
  received) and ``kv_retention_requests``; the reuse cache itself stays LRU.
* errors (bad shapes, batch > 1, missing inputs, prompt + output over 8192 tokens) come back as a
  FINAL response carrying a ``TritonError``.
* cancellation (client cancels the gRPC stream) is polled before every token step; the request is
  dropped, its KV cache freed and a CANCELLED error sent with the FINAL flag.

Concurrency: ``execute`` only validates and enqueues, then returns (decoupled mode).  A single
background worker thread owns the model and batches decoding in flight: each round it prefills the
newly queued requests one by one, then advances every other active request by one token in one
forward pass, each request keeping its own KV cache (attention runs per request).  Concurrent
requests are therefore served fairly, and N of them cost about one forward pass a token, not N.

The decoding engine (weights, worker, cancellation, stats) lives in ``smollm2_engine.py`` beside this file, with
its parts beside it (sampling in ``smollm2_sampling.py``, LoRA in ``smollm2_lora.py``, the request-reading helpers
in ``smollm2_requests.py``), and is shared with ``smollm2-vllm`` and ``smollm2-ft``; this file is the protocol.

Torch runs one intra-op thread unless ``OPENAI_API_REF_TORCH_THREADS`` says otherwise.

Counters (started, completed, cancelled, errors, tokens_generated, active) are written as JSON to
``$OPENAI_API_REF_STATS_DIR/<model name>.json`` after every request ends, when that env var is set.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The shared engine is importable once this directory is on sys.path.
from smollm2_engine import SmolLM2Engine
from smollm2_guide import trtllm_guide
from smollm2_job import Job
from smollm2_requests import (
    RequestError,
    batched_scalar,
    batched_string,
    checked_temperature,
    input_array,
    seeded_generator,
    word_list,
)


class TritonPythonModel(SmolLM2Engine):
    """Decoupled SmolLM2 generator, TensorRT-LLM tensors; see the module docstring for the wire contract."""

    def parse(self, request: Any, sender: Any) -> Job:
        ids = input_array(request, "input_ids")
        if ids is None:
            raise RequestError("input_ids is required")
        if ids.ndim == 1:  # tolerate a client that dropped the batch dim
            ids = ids[None]
        if ids.ndim != 2:
            raise RequestError(f"input_ids: expected shape [1, L], got {list(ids.shape)}")
        if ids.shape[0] != 1:
            raise RequestError(
                f"input_ids: batch size {ids.shape[0]} not supported, send one sequence per request "
                f"(shape [1, L]), got {list(ids.shape)}"
            )
        if input_array(request, "request_output_len") is None:
            raise RequestError("request_output_len is required")
        prompt = [int(t) for t in ids[0].tolist()]
        length = int(batched_scalar(request, "input_lengths", len(prompt)))
        if length < 1 or length > len(prompt):
            raise RequestError(f"input_lengths {length} does not fit input_ids of length {len(prompt)}")
        prompt = prompt[:length]
        max_new = int(batched_scalar(request, "request_output_len", 16))
        self.validate_prompt(prompt, max_new, "request_output_len")
        temperature = checked_temperature(float(batched_scalar(request, "temperature", 1.0)))
        self._retention(request)
        lora = self._lora(request)
        return Job(
            lora=lora,
            request=request,
            sender=sender,
            prompt=prompt,
            max_new=max_new,
            end_id=int(batched_scalar(request, "end_id", self.default_end_id)),
            streaming=bool(batched_scalar(request, "streaming", False)),
            temperature=temperature,
            top_k=int(batched_scalar(request, "runtime_top_k", 0)),
            top_p=float(batched_scalar(request, "runtime_top_p", 1.0)),
            repetition_penalty=float(batched_scalar(request, "repetition_penalty", 1.0)),
            presence_penalty=float(batched_scalar(request, "presence_penalty", 0.0)),
            frequency_penalty=float(batched_scalar(request, "frequency_penalty", 0.0)),
            min_tokens=int(batched_scalar(request, "min_tokens", 0)),
            stop_words=word_list(request, "stop_words_list"),
            bad_words=word_list(request, "bad_words_list"),
            generator=seeded_generator(batched_scalar(request, "seed", None)),
            guide=trtllm_guide(batched_string(request, "guided_decoding_guide_type"),
                               batched_string(request, "guided_decoding_guide")),
            state={
                "exclude_input": bool(batched_scalar(request, "exclude_input_in_output", False)),
                "return_log_probs": bool(batched_scalar(request, "return_log_probs", False)),
                "return_perf_metrics": bool(batched_scalar(request, "return_perf_metrics", False)),
            },
        )

    def _retention(self, request: Any) -> None:
        """TensorRT-LLM's KV-cache retention inputs, checked as its backend checks them (ends and priorities of
        the starts' length, durations too when sent; priorities 0-100; start < end, or end -1) and recorded as
        the stats' ``kv_retention`` (the last request's, as received) with a ``kv_retention_requests`` count."""
        starts = input_array(request, "retention_token_range_starts")
        if starts is None:
            return
        def row(a: np.ndarray) -> list[int]:  # [1, n] (batch dim) or [n] -> n ints
            return [int(x) for x in a.reshape(-1).tolist()]

        got = {"token_range_starts": row(starts)}
        n = len(got["token_range_starts"])
        for name, needed in (("ends", True), ("priorities", True), ("durations_ms", False)):
            arr = input_array(request, f"retention_token_range_{name}")
            if arr is None:
                if needed:
                    raise RequestError(f"retention_token_range_{name} must be provided, and have the same length "
                                       "as retention_token_range_starts")
                continue
            got[f"token_range_{name}"] = row(arr)
            if len(got[f"token_range_{name}"]) != n:
                raise RequestError(f"retention_token_range_{name} must have the same length as "
                                   "retention_token_range_starts")
        for start, end, priority in zip(got["token_range_starts"], got["token_range_ends"],
                                        got["token_range_priorities"], strict=True):
            if start < 0 or (end != -1 and end <= start) or not 0 <= priority <= 100:
                raise RequestError(f"retention token range [{start}, {end}) at priority {priority}: a range needs "
                                   "0 <= start < end (or end -1) and a priority from 0 to 100")
        record: dict[str, Any] = dict(got)
        for name in ("retention_decode_priority", "retention_decode_duration_ms"):
            value = batched_scalar(request, name, None)
            if value is not None:
                record[name.removeprefix("retention_")] = int(value)
        with self.stats_lock:
            self.stats["kv_retention"] = record
            self.stats["kv_retention_requests"] = int(self.stats.get("kv_retention_requests", 0)) + 1

    def _lora(self, request: Any) -> Any:
        """The request's adapter, as TensorRT-LLM's PEFT cache answers: weights + config with a task id are
        stored (evicting the least recently used adapter past ``lora_cache_size``) and used; a task id alone
        must name a cached adapter, else the request fails with TensorRT-LLM's own cache-miss error."""
        task = batched_scalar(request, "lora_task_id", None)
        weights = input_array(request, "lora_weights")
        config = input_array(request, "lora_config")
        if weights is not None and weights.size and config is not None and config.size:
            if task is None:
                raise RequestError("lora_task_id is required with lora_weights and lora_config")
            if weights.shape[0] != 1 or config.shape[0] != 1:
                raise RequestError("lora_weights / lora_config: batch size must be 1")
            lora = self.lora_modules.from_trtllm(weights[0].astype(np.float32), config[0])
            evicted = self.lora_cache.put(int(task), lora)
            self._bump("lora_loads")
            if evicted:
                self._bump("lora_evictions", n=evicted)
            return lora
        if task is None:
            return None
        lora = self.lora_cache.get(int(task))
        if lora is None:
            self._bump("lora_misses")
            raise RequestError(f"LoRA task {int(task)} not found in cache. Please send LoRA weights with request")
        self._bump("lora_hits")
        return lora

    def respond(self, job: Job, new_tokens: list[int], final: bool) -> None:
        """Streaming: send ``new_tokens`` (the tail of ``job.generated``); otherwise the whole output."""
        exclude_input = job.state["exclude_input"]
        if job.streaming:
            ids = new_tokens
            log_probs = job.log_probs[len(job.log_probs) - len(new_tokens) :]
            seq_len = len(job.generated) + (0 if exclude_input else len(job.prompt))
        else:
            ids = job.generated if exclude_input else job.prompt + job.generated
            log_probs = job.log_probs
            seq_len = len(ids)
        wanted = job.state["return_log_probs"]
        lp = log_probs if wanted else [0.0] * len(log_probs)
        cum = float(sum(job.log_probs)) if wanted else 0.0
        outputs = [
            pb_utils.Tensor("output_ids", np.asarray(ids, dtype=np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.asarray([[seq_len]], dtype=np.int32)),
            pb_utils.Tensor("output_log_probs", np.asarray(lp, dtype=np.float32).reshape(1, 1, -1)),
            pb_utils.Tensor("cum_log_probs", np.asarray([[cum]], dtype=np.float32)),
        ]
        if job.state["return_perf_metrics"]:
            outputs += self.perf_metric_tensors(job)
        self.send(job, outputs, final)
