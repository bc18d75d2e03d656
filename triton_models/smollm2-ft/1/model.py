"""SmolLM2-135M-Instruct reference LLM for Triton's Python backend, legacy FasterTransformer GPT interface.

Wire contract (``max_batch_size: 8``, so every tensor has a leading batch dim that must be 1):

* inputs: ``input_ids`` UINT32 [1, L], ``input_lengths`` UINT32 [1, 1], ``request_output_len`` UINT32
  [1, 1]; optional ``runtime_top_k``/``beam_width``/``min_length``/``start_id``/``end_id`` UINT32
  [1, 1], ``runtime_top_p``/``temperature``/``len_penalty``/``repetition_penalty`` FP32 [1, 1],
  ``random_seed`` UINT64 [1, 1], ``is_return_log_probs`` BOOL [1, 1], ``stop_words_list`` /
  ``bad_words_list`` INT32 [1, 2, N].  No ``streaming``, ``presence_penalty`` or
  ``frequency_penalty`` input: FasterTransformer deployments did not have them.
* FasterTransformer sampling semantics: ``temperature`` must be > 0 (greedy is ``runtime_top_k=1``);
  ``runtime_top_k=0`` with ``runtime_top_p=0`` (the defaults) also means greedy; ``beam_width`` must
  be 1 (no beam search here); ``len_penalty`` and ``start_id`` are accepted and ignored.
* outputs: ``output_ids`` UINT32 [1, 1, T] (prompt + generation so far), ``sequence_length`` UINT32
  [1, 1] (= T), ``output_log_probs`` FP32 [1, 1, T - L] (zeros unless ``is_return_log_probs``),
  ``cum_log_probs`` FP32 [1, 1].
* streaming (the model is decoupled, so it always streams): one response per generated token, each
  carrying the WHOLE sequence so far (cumulative, not a delta), as FasterTransformer's streaming
  callback does.  The last response carries ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; when generation
  ends on ``end_id`` (never emitted) that last response repeats the sequence unchanged.
* stops: ``request_output_len`` tokens; ``end_id`` (masked until ``min_length`` tokens exist); the
  generated suffix equals a ``stop_words_list`` entry (stop tokens included in the output).
* errors and cancellation: as ``smollm2-135m-instruct`` (the engine is shared: see
  ``../../smollm2-135m-instruct/1/smollm2_engine.py``).
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
from smollm2_job import Job
from smollm2_requests import RequestError, batched_scalar, input_array, seeded_generator, word_list


class TritonPythonModel(SmolLM2Engine):
    """Decoupled SmolLM2 generator, FasterTransformer tensors with cumulative streaming."""

    GUIDED_DECODING = False  # FasterTransformer has no guide inputs

    def parse(self, request: Any, sender: Any) -> Job:
        ids = input_array(request, "input_ids")
        if ids is None:
            raise RequestError("input_ids is required")
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise RequestError(f"input_ids: expected shape [1, L] (one sequence per request), got {list(ids.shape)}")
        if input_array(request, "request_output_len") is None:
            raise RequestError("request_output_len is required")
        prompt = [int(t) for t in ids[0].tolist()]
        length = int(batched_scalar(request, "input_lengths", len(prompt)))
        if length < 1 or length > len(prompt):
            raise RequestError(f"input_lengths {length} does not fit input_ids of length {len(prompt)}")
        prompt = prompt[:length]
        max_new = int(batched_scalar(request, "request_output_len", 16))
        self.validate_prompt(prompt, max_new, "request_output_len")
        if int(batched_scalar(request, "beam_width", 1)) != 1:
            raise RequestError("beam_width: only 1 is supported by this model")
        temperature = float(batched_scalar(request, "temperature", 1.0))
        if temperature <= 0:
            raise RequestError("temperature must be > 0 (FasterTransformer has no greedy temperature; "
                               "send runtime_top_k=1 for greedy decoding)")
        top_k = int(batched_scalar(request, "runtime_top_k", 0))
        top_p = float(batched_scalar(request, "runtime_top_p", 0.0))
        if top_k == 0 and top_p == 0.0:
            top_k = 1  # FasterTransformer: neither top-k nor top-p set means greedy
        return Job(
            request=request,
            sender=sender,
            prompt=prompt,
            max_new=max_new,
            end_id=int(batched_scalar(request, "end_id", self.default_end_id)),
            streaming=True,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=float(batched_scalar(request, "repetition_penalty", 1.0)),
            min_tokens=int(batched_scalar(request, "min_length", 0)),
            stop_words=word_list(request, "stop_words_list"),
            bad_words=word_list(request, "bad_words_list"),
            generator=seeded_generator(batched_scalar(request, "random_seed", None)),
            state={"return_log_probs": bool(batched_scalar(request, "is_return_log_probs", False))},
        )

    def respond(self, job: Job, new_tokens: list[int], final: bool) -> None:
        """Every response is cumulative: the prompt and everything generated so far."""
        ids = job.prompt + job.generated
        wanted = job.state["return_log_probs"]
        lp = job.log_probs if wanted else [0.0] * len(job.log_probs)
        cum = float(sum(job.log_probs)) if wanted else 0.0
        outputs = [
            pb_utils.Tensor("output_ids", np.asarray(ids, dtype=np.uint32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.asarray([[len(ids)]], dtype=np.uint32)),
            pb_utils.Tensor("output_log_probs", np.asarray(lp, dtype=np.float32).reshape(1, 1, -1)),
            pb_utils.Tensor("cum_log_probs", np.asarray([[cum]], dtype=np.float32)),
        ]
        self.send(job, outputs, final)
