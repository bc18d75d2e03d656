"""SmolLM2-135M-Instruct reference LLM for Triton's Python backend, TensorRT-LLM's text interface.

One Python model with the tensors of tensorrtllm_backend's ``ensemble`` (and ``tensorrt_llm_bls``) model,
answering as that pipeline does: the ``preprocessing`` model tokenizes ``text_input`` and the words
lists, ``tensorrt_llm`` generates, ``postprocessing`` decodes each response's tokens.  Not a Triton
ensemble (one model, one engine), so the wire is the same and the start-up cost is one model's.

Wire contract (``max_batch_size: 8``, so every tensor has a leading batch dim that must be 1):

* inputs: ``text_input`` BYTES [1, 1] (the prompt, already templated; tokenized with the model's own
  ``tokenizer.json``, special tokens added as the preprocessing model does), ``max_tokens`` INT32
  [1, 1] (>= 1); optional ``end_id``/``pad_id``/``top_k``/``min_tokens`` INT32 [1, 1],
  ``top_p``/``temperature``/``repetition_penalty``/``presence_penalty``/``frequency_penalty``/
  ``length_penalty`` FP32 [1, 1] (``length_penalty`` only matters to beam search: accepted, no effect),
  ``seed`` UINT64 [1, 1], ``stream``/``exclude_input_in_output``/``return_log_probs``/
  ``return_num_input_tokens``/``return_num_output_tokens`` BOOL [1, 1], ``beam_width`` and
  ``num_return_sequences`` INT32 [1, 1] (1 only), ``stop_words``/``bad_words`` BYTES [1, N] (one word
  per element, each tokenized on its own without special tokens, as the preprocessing model's
  ``_to_word_list_format``), ``guided_decoding_guide_type``/``guided_decoding_guide`` BYTES [1, 1]
  (types ``json``, ``json_schema``, ``regex``, ``ebnf_grammar``; rules in ``smollm2_guide.py``).
* outputs: ``text_output`` BYTES [1, 1]; ``output_log_probs`` FP32 [1, 1, T] and ``cum_log_probs``
  FP32 [1, 1] with ``return_log_probs``; ``num_input_tokens`` / ``num_output_tokens`` INT32 [1, 1] when
  their ``return_*`` input is true; with ``return_perf_metrics`` BOOL [1, 1] true, TensorRT-LLM's perf outputs
  (``kv_cache_reused_blocks`` etc., as the ensemble maps them from its tensorrt_llm model) on every response,
  from the engine's prefix KV cache (config parameters ``enable_kv_cache_reuse``, ``tokens_per_block``,
  ``kv_cache_reuse_bytes``; see ``smollm2_prefix_cache.py``).
* streaming (``stream`` true): one response per generated token whose ``text_output`` is that token
  decoded ON ITS OWN with special tokens skipped, as the postprocessing model decodes each streamed
  response: a delta (a token ending inside a UTF-8 character decodes to U+FFFD, as there), and
  ``num_output_tokens`` 1.  When generation ends on ``end_id`` (never emitted) the last response has
  empty text and ``num_output_tokens`` 0.  The last response carries
  ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``.
* non-streaming: one FINAL response, ``text_output`` the decoded prompt + generation (generation only
  with ``exclude_input_in_output``; the prompt's special tokens are skipped, so it is not the prompt
  text), ``num_output_tokens`` the number of tokens decoded (TensorRT-LLM counts ``output_ids``).
* stops: ``max_tokens`` tokens; ``end_id`` sampled (masked until ``min_tokens``); the generated suffix
  equals a ``stop_words`` entry (kept in the output, as TensorRT-LLM does); a complete guide ("stop").
  ``bad_words`` entries are masked.
* errors (missing inputs, batch > 1, beam or sequence count > 1, prompt + output over 8192 tokens, a
  bad guide) come back as a FINAL response carrying a ``TritonError``; cancellation and concurrency
  are the shared engine's (``../../smollm2-135m-instruct/1/smollm2_engine.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

# The engine lives in the TensorRT-LLM reference model's version folder (a top-level folder of its
# own would be taken for a model by Triton).
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "smollm2-135m-instruct" / "1"))
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
)

_FLAGS = ("exclude_input_in_output", "return_log_probs", "return_num_input_tokens", "return_num_output_tokens",
          "return_perf_metrics")


class TritonPythonModel(SmolLM2Engine):
    """Decoupled SmolLM2 generator, TensorRT-LLM ensemble/BLS text tensors; see the module docstring."""

    TEXT_PROMPTS = True

    def _words(self, request: Any, name: str) -> list[list[int]]:
        """A BYTES [1, N] words input as token sequences (empty words dropped, as the preprocessing does)."""
        arr = input_array(request, name)
        if arr is None or arr.size == 0:
            return []
        if arr.ndim != 2 or arr.shape[0] != 1:
            raise RequestError(f"{name}: expected shape [1, N] (one list of words), got {list(arr.shape)}")
        words = []
        for raw in arr[0].tolist():
            word = raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
            ids = self.tokenizer.encode(word, add_special_tokens=False).ids
            if ids:
                words.append(ids)
        return words

    def parse(self, request: Any, sender: Any) -> Job:
        text = batched_string(request, "text_input")
        if text is None:
            raise RequestError("text_input is required: one string, shape [1, 1]")
        max_tokens = batched_scalar(request, "max_tokens", None)
        if max_tokens is None or int(max_tokens) < 1:
            raise RequestError("max_tokens must be a single value > 0")
        for name in ("beam_width", "num_return_sequences"):
            if int(batched_scalar(request, name, 1)) != 1:
                raise RequestError(f"{name}: only 1 is supported by this model")
        prompt = self.encode_text(text, "text_input")
        max_new = int(max_tokens)
        self.validate_prompt(prompt, max_new, "max_tokens")
        temperature = checked_temperature(float(batched_scalar(request, "temperature", 1.0)))
        return Job(
            request=request,
            sender=sender,
            prompt=prompt,
            max_new=max_new,
            end_id=int(batched_scalar(request, "end_id", self.default_end_id)),
            streaming=bool(batched_scalar(request, "stream", False)),
            temperature=temperature,
            top_k=int(batched_scalar(request, "top_k", 0)),
            top_p=float(batched_scalar(request, "top_p", 1.0)),
            repetition_penalty=float(batched_scalar(request, "repetition_penalty", 1.0)),
            presence_penalty=float(batched_scalar(request, "presence_penalty", 0.0)),
            frequency_penalty=float(batched_scalar(request, "frequency_penalty", 0.0)),
            min_tokens=int(batched_scalar(request, "min_tokens", 0)),
            stop_words=self._words(request, "stop_words"),
            bad_words=self._words(request, "bad_words"),
            generator=seeded_generator(batched_scalar(request, "seed", None)),
            guide=trtllm_guide(batched_string(request, "guided_decoding_guide_type"),
                               batched_string(request, "guided_decoding_guide")),
            state={name: bool(batched_scalar(request, name, False)) for name in _FLAGS},
        )

    def respond(self, job: Job, new_tokens: list[int], final: bool) -> None:
        """Streaming: ``new_tokens`` decoded on their own; otherwise the whole output decoded at once."""
        state = job.state
        if job.streaming:
            ids = new_tokens
            log_probs = job.log_probs[len(job.log_probs) - len(new_tokens):]
        else:
            ids = job.generated if state["exclude_input_in_output"] else job.prompt + job.generated
            log_probs = job.log_probs
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        outputs = [pb_utils.Tensor("text_output", np.asarray([[text.encode("utf-8")]], dtype=np.object_))]
        if state["return_log_probs"]:
            lp = np.asarray(log_probs, dtype=np.float32).reshape(1, 1, -1)
            outputs.append(pb_utils.Tensor("output_log_probs", lp))
            outputs.append(pb_utils.Tensor("cum_log_probs", np.asarray([[sum(job.log_probs)]], dtype=np.float32)))
        if state["return_num_input_tokens"]:
            outputs.append(pb_utils.Tensor("num_input_tokens", np.asarray([[len(job.prompt)]], dtype=np.int32)))
        if state["return_num_output_tokens"]:
            outputs.append(pb_utils.Tensor("num_output_tokens", np.asarray([[len(ids)]], dtype=np.int32)))
        if state["return_perf_metrics"]:
            outputs += self.perf_metric_tensors(job)
        self.send(job, outputs, final)
