"""Replay LLM for Triton's Python backend, the vLLM backend's text interface.

The same recorded completions as ``replay-llm`` (``../../replay-llm/1/replay_core.py``: the marker
``replay:<family>/<case>`` in the prompt, the golden corpus, the family's tokenizer), spoken over the
wire of the Triton vLLM backend (``max_batch_size: 0``: no batch dim), as ``smollm2-vllm`` speaks it:

* inputs: ``text_input`` BYTES [1] (the templated prompt; the marker is read from it); optional
  ``stream`` BOOL [1], ``sampling_parameters`` BYTES [1] (JSON of vLLM ``SamplingParams``),
  ``exclude_input_in_output`` BOOL [1], ``return_finish_reason`` / ``return_num_input_tokens`` /
  ``return_num_output_tokens`` / ``return_cumulative_logprob`` / ``return_logprobs`` BOOL [1].
* ``sampling_parameters`` keys honoured: ``max_tokens`` (default 16, as vLLM; null = all),
  ``skip_special_tokens`` (default true, as vLLM: special tokens' text is dropped from
  ``text_output``; false keeps it, which is what a gateway parsing ``[TOOL_CALLS]`` or
  ``<|channel|>`` needs), ``stop_token_ids`` and ``ignore_eos``.  Sampling keys (temperature, seed,
  ...) are accepted and ignored: a replay is deterministic.  A guide is accepted and ignored too.
* generation: the recorded ids; the family's end-of-sequence ids (its generation_config.json) and
  ``stop_token_ids`` end it without being emitted ("stop"); ``max_tokens`` ids end it ("length");
  running out of recorded ids ends it ("stop").
* outputs, per response: ``text_output`` BYTES [1], the text new since the previous response
  (incrementally detokenized with the family's tokenizer, primed with the prompt's last ids; the prompt
  text is prepended to a non-streamed answer unless ``exclude_input_in_output``); ``finish_reason``
  BYTES [1] ("None" until the last response); ``num_output_tokens`` UINT32 [1], ids new since the
  previous response; ``num_input_tokens`` UINT32 [1]; ``cumulative_logprob`` FP32 [1] (zero);
  ``logprobs`` BYTES [1] ("null").  Optional outputs only when their ``return_*`` input is true.
* streaming: one response per id, plus an empty FINAL one when the output ends on an end id;
  otherwise the last id's response is FINAL.  Non-streaming: one FINAL response.
* errors (no marker, unknown family or case, bad JSON) come back as a FINAL ``TritonError``.
"""

from __future__ import annotations

import json
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "replay-llm" / "1"))
from replay_core import ReplayError, ReplayLibrary, serve_jobs

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
DECODE_PREFIX = 8  # prompt ids that prime the detokenizer (leading-space handling as in a whole decode)
FLAGS = ("return_finish_reason", "return_cumulative_logprob", "return_logprobs", "return_num_input_tokens",
         "return_num_output_tokens")


def _error(message: str, code_name: str = "INVALID_ARG") -> Any:
    code = getattr(pb_utils.TritonError, code_name, None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


def _array(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _flag(request: Any, name: str) -> bool | None:
    arr = _array(request, name)
    return None if arr is None or arr.size == 0 else bool(arr.reshape(-1)[0])


def _text(raw: Any) -> str:
    return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)


@dataclass(eq=False)
class Job:
    sender: Any
    tokenizer: Tokenizer
    script: tuple[int, ...]
    max_new: int
    stop_ids: frozenset[int]
    streaming: bool
    decoder: DecodeStream
    prompt_text: str  # sent before the output (non-streamed, exclude_input_in_output false)
    prompt_tokens: int
    flags: dict[str, bool]
    generated: list[int] = field(default_factory=list)
    sent: int = 0  # ids of `generated` already sent


class TritonPythonModel:
    """Decoupled replay generator, vLLM-backend text interface; see the module docstring."""

    def initialize(self, args: dict[str, str]) -> None:
        self.model_name = args.get("model_name", "replay-llm-vllm")
        params = json.loads(args.get("model_config", "{}")).get("parameters", {})
        self.library = ReplayLibrary(params)
        self.incoming: deque[Job] = deque()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.worker = threading.Thread(target=self._worker, name=f"{self.model_name}-emit", daemon=True)
        self.worker.start()

    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                self.incoming.append(self._parse(request, sender))
            except ReplayError as exc:
                self._send_error(sender, str(exc))
            except Exception as exc:  # noqa: BLE001 - any parse failure is the client's error
                self._send_error(sender, f"invalid request: {type(exc).__name__}: {exc}")
        self.wake.set()

    def _parse(self, request: Any, sender: Any) -> Job:
        arr = _array(request, "text_input")
        if arr is None or arr.size != 1:
            raise ReplayError("text_input is required: one string, shape [1]")
        prompt_text = _text(arr.reshape(-1)[0])
        stream = bool(_flag(request, "stream"))
        exclude = _flag(request, "exclude_input_in_output")
        prepend = (not exclude) if exclude is not None else not stream
        if prepend and stream:
            raise ReplayError("When streaming, `exclude_input_in_output` = False is not allowed.")
        params: dict[str, Any] = {}
        raw = _array(request, "sampling_parameters")
        if raw is not None and raw.size:
            try:
                params = json.loads(_text(raw.reshape(-1)[0]))
            except ValueError as exc:
                raise ReplayError(f"sampling_parameters: not valid JSON ({exc})") from None
            if not isinstance(params, dict):
                raise ReplayError("sampling_parameters: expected a JSON object")
        family, case = self.library.marker_in_text(prompt_text)
        scenario = self.library.scenario(family, case)
        tok = self.library.tokenizer(self.library.tokenizer_family(family))
        max_tokens = params.get("max_tokens", 16)
        max_new = len(scenario.ids) if max_tokens is None else int(max_tokens)
        if max_new < 1:
            raise ReplayError(f"sampling_parameters.max_tokens must be at least 1, got {max_new}")
        stop_ids = set(params.get("stop_token_ids") or [])
        if not params.get("ignore_eos"):
            stop_ids |= scenario.eos_ids
        prompt_ids = tok.encode(prompt_text, add_special_tokens=False).ids
        skip = params.get("skip_special_tokens", True) is not False
        return Job(sender=sender, tokenizer=tok, script=scenario.ids, max_new=max_new,
                   stop_ids=frozenset(int(t) for t in stop_ids), streaming=stream,
                   decoder=DecodeStream(ids=prompt_ids[-DECODE_PREFIX:], skip_special_tokens=skip),
                   prompt_text=prompt_text if prepend else "", prompt_tokens=len(prompt_ids),
                   flags={name: bool(_flag(request, name)) for name in FLAGS})

    # ------------------------------------------------------------------ emission
    def _worker(self) -> None:
        serve_jobs(self.incoming, self.wake, self.stopping, self._step,
                   lambda job, message, code: self._send_error(job.sender, message, code))

    def _step(self, job: Job) -> bool:
        if job.sender.is_cancelled():
            self._send_error(job.sender, "request cancelled", "CANCELLED")
            return True
        while True:
            n = len(job.generated)
            if n >= len(job.script) or job.script[n] in job.stop_ids:
                self._respond(job, final=True, reason="stop")
                return True
            if n >= job.max_new:
                self._respond(job, final=True, reason="length")
                return True
            job.generated.append(job.script[n])
            last = n + 1 >= len(job.script) or n + 1 >= job.max_new
            reason = ("length" if n + 1 >= job.max_new and n + 1 < len(job.script) else "stop") if last else None
            if job.streaming:
                self._respond(job, final=last, reason=reason)
                return last
            if last:
                self._respond(job, final=True, reason=reason)
                return True

    def _respond(self, job: Job, final: bool, reason: str | None) -> None:
        fresh = job.generated[job.sent:]
        job.sent = len(job.generated)
        pieces = [job.decoder.step(job.tokenizer, t) or "" for t in fresh]
        text = job.prompt_text + "".join(pieces)
        job.prompt_text = ""
        flags = job.flags

        def tensor(name: str, value: Any, dtype: Any) -> Any:
            return pb_utils.Tensor(name, np.asarray([value], dtype=dtype))

        outputs = [tensor("text_output", text.encode("utf-8"), np.object_)]
        if flags["return_finish_reason"]:
            outputs.append(tensor("finish_reason", str(reason if final else None).encode(), np.object_))
        if flags["return_cumulative_logprob"]:
            outputs.append(tensor("cumulative_logprob", 0.0, np.float32))
        if flags["return_logprobs"]:
            outputs.append(tensor("logprobs", b"null", np.object_))
        if flags["return_num_input_tokens"]:
            outputs.append(tensor("num_input_tokens", job.prompt_tokens, np.uint32))
        if flags["return_num_output_tokens"]:
            outputs.append(tensor("num_output_tokens", len(fresh), np.uint32))
        job.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL if final else 0)

    def _send_error(self, sender: Any, message: str, code_name: str = "INVALID_ARG") -> None:
        try:
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=_error(message, code_name)),
                        flags=FINAL)
        except Exception as exc:  # noqa: BLE001 - the client may already be gone
            pb_utils.Logger.log_warn(f"{self.model_name}: could not send error response: {exc}")

    def finalize(self) -> None:
        self.stopping.set()
        self.wake.set()
        self.worker.join(timeout=10)
