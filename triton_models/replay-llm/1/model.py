"""Replay LLM for Triton's Python backend, TensorRT-LLM tensor interface: streams a recorded completion.

It lets the gateway's whole real path run for every model family (render with the family's chat
template, tokenize with its tokenizer, Triton, detokenize, parse tool calls and reasoning, SSE)
without the family's weights.  The prompt names the scenario with a marker ``replay:<family>/<case>``;
the output is that case's recorded completion from the golden corpus, as the family's real token ids,
one per streamed response (``replay_core.py`` beside this file: where tokenizers and corpus live, how
the marker is found in token ids).

Wire contract (``max_batch_size: 8``: every tensor has a leading batch dim that must be 1), the same
declarations as ``smollm2-135m-instruct``:

* inputs: ``input_ids`` INT32 [1, L], ``input_lengths`` INT32 [1, 1], ``request_output_len`` INT32
  [1, 1]; optional ``end_id`` INT32 [1, 1], ``streaming`` / ``exclude_input_in_output`` BOOL [1, 1],
  ``stop_words_list`` INT32 [1, 2, N].  Sampling inputs (temperature, top-p, seed, penalties, bad
  words, ``min_tokens``, guides) are accepted and ignored: a replay is deterministic.
* outputs: ``output_ids`` INT32 [1, 1, T], ``sequence_length`` INT32 [1, 1], ``output_log_probs``
  FP32 [1, 1, T] (zeros), ``cum_log_probs`` FP32 [1, 1] (zero).
* generation: the recorded ids in order, ending when they run out (the client sees "stop"), after
  ``request_output_len`` ids ("length": cut-by-max_tokens cases), on ``end_id`` (never emitted), or
  on a ``stop_words_list`` entry (emitted, as TensorRT-LLM includes stop tokens).
* streaming: one response per id holding only that id; ``sequence_length`` is the running total
  (prompt included unless ``exclude_input_in_output``); the last id's response carries
  ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``, or an empty ``output_ids`` [1, 1, 0] FINAL response when
  the output ends on ``end_id`` or is empty.  Non-streaming: one FINAL response with prompt +
  generation (generation only when ``exclude_input_in_output``).
* errors (no marker, unknown family or case, bad shapes) come back as a FINAL response carrying a
  ``TritonError`` naming the problem.  Cancellation is polled before every id.

Concurrency: ``execute`` validates and enqueues; one worker thread advances every open request by one
id per round (round-robin), so concurrent streams interleave as on a real server.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from replay_core import ReplayError, ReplayLibrary, serve_jobs

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _error(message: str, code_name: str = "INVALID_ARG") -> Any:
    code = getattr(pb_utils.TritonError, code_name, None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


def _tensor(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def _scalar(request: Any, name: str, default: Any) -> Any:
    arr = _tensor(request, name)
    if arr is None or arr.size == 0:
        return default
    if arr.shape[0] != 1:
        raise ReplayError(f"{name}: batch size {arr.shape[0]} not supported, send one sequence per request")
    return arr.reshape(-1)[0].item()


def _word_list(request: Any, name: str) -> list[list[int]]:
    """A TensorRT-LLM words list ([1, 2, N]: ids, cumulative end offsets padded with -1) as id lists."""
    arr = _tensor(request, name)
    if arr is None or arr.size == 0:
        return []
    if arr.ndim == 2:
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[0] != 1 or arr.shape[1] != 2:
        raise ReplayError(f"{name}: expected shape [1, 2, N], got {list(arr.shape)}")
    ids, offsets = arr[0, 0].tolist(), arr[0, 1].tolist()
    words, start = [], 0
    for end in offsets:
        if end < 0:
            break
        if start < end <= len(ids):
            words.append([int(t) for t in ids[start:end]])
        start = end
    return words


@dataclass(eq=False)
class Job:
    sender: Any
    prompt: list[int]
    script: tuple[int, ...]
    max_new: int
    end_id: int
    streaming: bool
    exclude_input: bool
    stop_words: list[list[int]]
    generated: list[int] = field(default_factory=list)


class TritonPythonModel:
    """Decoupled replay generator, TensorRT-LLM tensors; see the module docstring for the wire contract."""

    def initialize(self, args: dict[str, str]) -> None:
        self.model_name = args.get("model_name", "replay-llm")
        params = json.loads(args.get("model_config", "{}")).get("parameters", {})
        self.library = ReplayLibrary(params)
        self.incoming: deque[Job] = deque()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.worker = threading.Thread(target=self._worker, name=f"{self.model_name}-emit", daemon=True)
        self.worker.start()
        pb_utils.Logger.log_info(f"{self.model_name}: replaying from {self.library.corpus_dir} with the "
                                 f"tokenizers in {self.library.families_dir}")

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
        ids = _tensor(request, "input_ids")
        if ids is None:
            raise ReplayError("input_ids is required")
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise ReplayError(f"input_ids: expected shape [1, L], got {list(ids.shape)}")
        if _tensor(request, "request_output_len") is None:
            raise ReplayError("request_output_len is required")
        prompt = [int(t) for t in ids[0].tolist()]
        length = int(_scalar(request, "input_lengths", len(prompt)))
        if length < 1 or length > len(prompt):
            raise ReplayError(f"input_lengths {length} does not fit input_ids of length {len(prompt)}")
        prompt = prompt[:length]
        max_new = int(_scalar(request, "request_output_len", 16))
        if max_new < 0:
            raise ReplayError("request_output_len must be >= 0")
        family, case = self.library.marker_in_ids(prompt)
        scenario = self.library.scenario(family, case)
        return Job(sender=sender, prompt=prompt, script=scenario.ids, max_new=max_new,
                   end_id=int(_scalar(request, "end_id", -1)),
                   streaming=bool(_scalar(request, "streaming", False)),
                   exclude_input=bool(_scalar(request, "exclude_input_in_output", False)),
                   stop_words=_word_list(request, "stop_words_list"))

    # ------------------------------------------------------------------ emission
    def _worker(self) -> None:
        serve_jobs(self.incoming, self.wake, self.stopping, self._step,
                   lambda job, message, code: self._send_error(job.sender, message, code))

    def _step(self, job: Job) -> bool:
        """Emit the next id (all of them when not streaming); True when the request is finished."""
        if job.sender.is_cancelled():
            self._send_error(job.sender, "request cancelled", "CANCELLED")
            return True
        while True:
            n = len(job.generated)
            if n >= job.max_new or n >= len(job.script) or job.script[n] == job.end_id:
                self._respond(job, None, final=True)
                return True
            token = job.script[n]
            job.generated.append(token)
            done = (n + 1 >= job.max_new or n + 1 >= len(job.script)
                    or any(job.generated[-len(w):] == w for w in job.stop_words if len(w) <= n + 1))
            if job.streaming:
                self._respond(job, token, final=done)
                return done
            if done:
                self._respond(job, None, final=True)
                return True

    def _respond(self, job: Job, token: int | None, final: bool) -> None:
        if job.streaming:
            ids = np.asarray([] if token is None else [token], dtype=np.int32).reshape(1, 1, -1)
            seq_len = len(job.generated) + (0 if job.exclude_input else len(job.prompt))
        else:
            out = job.generated if job.exclude_input else job.prompt + job.generated
            ids = np.asarray(out, dtype=np.int32).reshape(1, 1, -1)
            seq_len = len(out)
        tensors = [
            pb_utils.Tensor("output_ids", ids),
            pb_utils.Tensor("sequence_length", np.asarray([[seq_len]], dtype=np.int32)),
            pb_utils.Tensor("output_log_probs", np.zeros(ids.shape, dtype=np.float32)),
            pb_utils.Tensor("cum_log_probs", np.zeros((1, 1), dtype=np.float32)),
        ]
        job.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if final else 0)

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
