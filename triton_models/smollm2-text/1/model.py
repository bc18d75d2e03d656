"""SmolLM2-135M-Instruct reference LLM for Triton's Python backend, behind a custom text interface.

Stands for the hand-written Python-backend LLMs people serve from Triton: tensor names of its own, no
protocol a gateway could recognise.  The gateway speaks to it through its model config entry
(protocol ``text``: ``text_protocol`` names these tensors; dtypes come from Triton's model config).

Wire contract (``max_batch_size: 0``: no batch dim):

* inputs: ``prompt`` BYTES [1] (the templated prompt; tokenized with the model's own ``tokenizer.json``),
  ``max_new_tokens`` INT64 [1] (>= 1); optional ``stream`` BOOL [1], ``temperature``/``top_p``/
  ``repetition_penalty`` FP32 [1], ``top_k`` INT32 [1], ``seed`` INT64 [1], ``min_new_tokens`` INT64
  [1].  No stop strings (the gateway matches them and cancels), no guided decoding.
* output: ``completion`` BYTES [1], CUMULATIVE: every response holds the whole completion so far (the
  generated tokens decoded together, special tokens skipped; never the prompt), so a character still
  incomplete at the end of a response shows as U+FFFD there and complete in the next.
* streaming (``stream`` true): one response per generated token, plus a last one repeating the text
  when generation ends on the end token; the last carries ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``.
  Otherwise one FINAL response.
* stops: ``max_new_tokens`` tokens, or the end token (masked until ``min_new_tokens``).
* errors and cancellation: as ``smollm2-135m-instruct`` (the engine is shared: see
  ``../../smollm2-135m-instruct/1/smollm2_engine.py``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "smollm2-135m-instruct" / "1"))
from smollm2_engine import SmolLM2Engine
from smollm2_job import Job
from smollm2_requests import RequestError, batched_scalar, batched_string, checked_temperature, seeded_generator


class TritonPythonModel(SmolLM2Engine):
    """Decoupled SmolLM2 generator, custom text tensors, cumulative output; see the module docstring."""

    TEXT_PROMPTS = True
    GUIDED_DECODING = False  # no guide inputs


    def parse(self, request: Any, sender: Any) -> Job:
        text = batched_string(request, "prompt")
        if text is None:
            raise RequestError("prompt is required: one string, shape [1]")
        max_new = batched_scalar(request, "max_new_tokens", None)
        if max_new is None or int(max_new) < 1:
            raise RequestError("max_new_tokens is required and must be at least 1")
        prompt = self.encode_text(text, "prompt")
        self.validate_prompt(prompt, int(max_new), "max_new_tokens")
        temperature = checked_temperature(float(batched_scalar(request, "temperature", 1.0)))
        return Job(
            request=request,
            sender=sender,
            prompt=prompt,
            max_new=int(max_new),
            end_id=self.default_end_id,
            streaming=bool(batched_scalar(request, "stream", False)),
            temperature=temperature,
            top_k=int(batched_scalar(request, "top_k", 0)),
            top_p=float(batched_scalar(request, "top_p", 1.0)),
            repetition_penalty=float(batched_scalar(request, "repetition_penalty", 1.0)),
            min_tokens=int(batched_scalar(request, "min_new_tokens", 0)),
            generator=seeded_generator(batched_scalar(request, "seed", None)),
        )

    def respond(self, job: Job, new_tokens: list[int], final: bool) -> None:
        """The whole completion so far, every time."""
        text = self.tokenizer.decode(job.generated, skip_special_tokens=True)
        self.send(job, [pb_utils.Tensor("completion", np.asarray([text.encode("utf-8")], dtype=np.object_))], final)
