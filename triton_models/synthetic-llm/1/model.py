"""Synthetic LLM for Triton's Python backend: the TensorRT-LLM tensor interface, no model maths.

It exists to measure what a client of an LLM pays *outside* the model (gRPC, Triton, the gateway),
so it produces tokens as fast as Triton takes them.  Same wire contract as
``smollm2-135m-instruct`` (``max_batch_size: 8``; every tensor has a leading batch dim that must be 1):

* inputs: ``input_ids`` INT32 [1, L], ``input_lengths`` INT32 [1, 1], ``request_output_len`` INT32
  [1, 1]; optional ``end_id``/``min_tokens`` INT32 [1, 1], ``streaming``/``exclude_input_in_output``
  BOOL [1, 1], ``stop_words_list`` INT32 [1, 2, N].  The sampling inputs (``temperature``,
  ``runtime_top_p``, ``seed``, penalties, ``bad_words_list``, ...) are accepted and ignored.
* outputs: ``output_ids`` INT32 [1, 1, T], ``sequence_length`` INT32 [1, 1], ``output_log_probs``
  FP32 [1, 1, T] (zeros), ``cum_log_probs`` FP32 [1, 1] (zero).  Only the outputs the request asks
  for are built (all four when it names none).
* tokens: the i-th generated token is ``TOKEN_CYCLE[i % len(TOKEN_CYCLE)]``, real SmolLM2 ids that
  decode to " The quick brown fox jumps over the lazy dog ..." (one English word per token), so a
  client's detokenization does realistic work.
* guided decoding: the TensorRT-LLM inputs ``guided_decoding_guide_type`` / ``guided_decoding_guide``
  (BYTES [1, 1]) are declared and checked as the reference model checks them (type one of json,
  json_schema, regex, ebnf_grammar; a guide required except for json; a json_schema guide must be a
  JSON object) but not compiled: whatever the guide, a guided request emits one fixed JSON object,
  ``JSON_PREFIX`` + body + ``JSON_SUFFIX``, i.e. ``{"text": " The quick brown fox ..."}`` with the
  body words from ``TOKEN_CYCLE``, sized so the closing ``"}`` is the last token: with an ``end_id``
  the object takes ``request_output_len - 1`` tokens and the request then ends as on ``end_id`` (a
  client sees "stop"), without one it takes all ``request_output_len`` tokens.  Below 5 tokens (the
  empty object ``{"text": ""}``) the object is cut after ``request_output_len`` tokens, as a model's
  would be.  So a gateway's JSON / tool-call path parses real JSON in benchmarks.
* streaming: one response per token holding only that token; ``sequence_length`` is the running
  total (prompt included unless ``exclude_input_in_output``).  The last token's response carries
  ``TRITONSERVER_RESPONSE_COMPLETE_FINAL``; when generation ends on ``end_id`` (never emitted) or
  ``request_output_len`` is 0, the FINAL response has an empty ``output_ids`` [1, 1, 0].
* non-streaming: one FINAL response with prompt + generation (generation only when
  ``exclude_input_in_output``).
* stops: ``request_output_len`` tokens; ``end_id`` (once ``min_tokens`` tokens exist); the generated
  suffix equals a ``stop_words_list`` entry (stop tokens included, as TensorRT-LLM does).
* reasoning: config parameter ``reasoning`` "1" makes every output start with a thinking section,
  ``REASONING_PREAMBLE`` (``<think>`` ... ``</think>``), as a reasoning model's does; a guided output's
  JSON object follows it, as a reasoning model's backend applies a guide once the thinking has ended.
  The tests derive a ``synthetic-reasoning`` copy with it set (default "0").
* pacing: config parameter ``delay_ms`` (default 0) or request parameter ``delay_ms`` puts that pause
  between two tokens of a request, so benchmarks can hold many streams open cheaply.
* engine steps: config parameters ``step_ms`` and ``step_per_seq_ms`` (default 0: off) make the unpaced requests
  advance as an engine's in-flight batch does: one token for every active request per step, then a pause of
  ``step_ms + step_per_seq_ms x active requests`` (non-streaming ones too, answered when done); with
  ``max_active`` N > 0 at most N requests are in the batch and the others wait first-come-first-served, as in an
  engine whose batch is full. Capacity is fixed, at almost no CPU (bench/priority_batch.py).
* prefill (off by default): config parameter ``prefill_per_token_ms`` > 0 makes the prompt cost what a real
  engine's prefill costs - each prompt token processed in a step adds that much to the step - and
  ``step_token_budget`` N > 0 is the engine's tokens per step (vLLM's ``max_num_batched_tokens``, TensorRT-LLM's
  ``max_num_tokens``) with chunked prefill: every decoding request takes one token of it, the prompts still
  being prefilled share the rest first-come-first-served (a long prompt spans several steps). A step then takes
  ``step_ms + step_per_seq_ms x requests that emit a token + prefill_per_token_ms x prompt tokens in it``, and its
  tokens are sent when it ends: a request's first token at the end of the step that finishes its prompt (``plan_step``
  in ``synthetic_engine.py`` beside this file). Sending a step's tokens overlaps the next step (up to its length),
  as a real engine's output thread does, so per-token responses cost the host's CPU, not the engine's steps.
* errors (bad shapes, batch > 1, missing inputs, prompt + output over ``max_sequence``) come back as
  a FINAL response carrying a ``TritonError``, as the reference model does.
* cancellation: ``is_cancelled()`` is polled at least every ``CANCEL_POLL_S`` seconds and before every
  paced token; a cancelled request is dropped and a CANCELLED error is sent with the FINAL flag.

Concurrency: ``execute`` validates and enqueues, then returns (decoupled mode).  One worker thread
serves every request: unpaced requests round-robin one token each, paced ones wait in a heap keyed
by their next due time, so 1,000 open streams cost 1,000 small objects, not 1,000 threads.

Counters (started, completed, cancelled, errors, tokens_generated, active) are written as JSON to
``$OPENAI_API_REF_STATS_DIR/<model name>.json`` after every request ends, when that env var is set.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

# The engine-step cost model and the request readers live beside this file; this folder first on sys.path makes
# them importable wherever model.py runs (Triton's stub, a copied repository), as the SmolLM2 models import theirs.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from synthetic_engine import plan_step
from synthetic_requests import (
    RequestError,
    batched_scalar,
    guided,
    input_array,
    word_list,
)

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
VOCAB_SIZE = 49152  # SmolLM2's vocabulary: prompt ids outside it are refused, as the reference does
DEFAULT_MAX_SEQUENCE = 131072
# How often a free-running request asks Triton whether it was cancelled (the call is an IPC round
# trip to the server process, so asking before every token would halve the token rate).
CANCEL_POLL_S = 0.005
BUSY_GAP_S = 0.002  # an engine step this soon after the last one's sending follows straight on (`_engine_step`)
# " The quick brown fox jumps over the lazy dog and then it runs across the green field to find a
# small river where the water is cold and clear so the animals come here every day to drink"
TOKEN_CYCLE = (
    378, 2365, 6354, 16438, 27003, 690, 260, 23790, 2767, 284, 965, 357, 7313, 1699, 260, 2654, 1955,
    288, 1042, 253, 1165, 4626, 837, 260, 913, 314, 4011, 284, 2437, 588, 260, 2355, 1690, 1535, 897,
    1194, 288, 5968,
)
OUTPUT_NAMES = ("output_ids", "sequence_length", "output_log_probs", "cum_log_probs")
# A reasoning model's thinking section, in SmolLM2 ids: "<think>\nThe user wants an answer; let me think it
# through step by step.\n</think>\n\n". Written first when the config parameter `reasoning` is "1".
REASONING_PREAMBLE = (44, 17400, 46, 198, 504, 2914, 5988, 354, 2988, 43, 1303, 549, 1510, 357, 738, 1833, 411,
                      1833, 30, 198, 9617, 17400, 46, 1116)
# The guided output: '{"text": "' and '"}' in SmolLM2 ids; the body between them comes from TOKEN_CYCLE
# (the concatenation is also the canonical tokenization of the whole object).
JSON_PREFIX = (39428, 2692, 1799, 476)
JSON_SUFFIX = (23597,)


def _error(message: str, code_name: str = "INVALID_ARG") -> Any:
    code = getattr(pb_utils.TritonError, code_name, None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


def _json_script(max_new: int, end_id: int) -> list[int]:
    """The guided output's token ids; see the module docstring."""
    budget = max_new - 1 if end_id >= 0 else max_new
    shortest = len(JSON_PREFIX) + len(JSON_SUFFIX)
    if budget < shortest:
        return list(JSON_PREFIX + JSON_SUFFIX)[:max_new]
    body = [TOKEN_CYCLE[i % len(TOKEN_CYCLE)] for i in range(budget - shortest)]
    return [*JSON_PREFIX, *body, *JSON_SUFFIX]


@dataclass(eq=False)
class Job:
    """One generation request and its progress (owned by the worker thread)."""

    sender: Any
    prompt: list[int]
    max_new: int
    end_id: int
    min_tokens: int
    streaming: bool
    exclude_input: bool
    stop_words: list[list[int]]
    outputs: frozenset[str]
    delay_s: float
    # Guided requests: the whole output, fixed in advance (the request ends when it is used up).
    script: list[int] | None = None
    generated: list[int] = field(default_factory=list)
    next_check: float = 0.0
    # Prompt tokens not yet prefilled (the prefill cost model only; see `plan_step`).
    prefill_left: int = 0


class TritonPythonModel:
    """Decoupled synthetic generator; see the module docstring for the wire contract."""

    def initialize(self, args: dict[str, str]) -> None:
        self.model_name = args.get("model_name", "synthetic-llm")
        self.logger = pb_utils.Logger
        params = json.loads(args.get("model_config", "{}")).get("parameters", {})

        def param(key: str, default: str) -> str:
            return str(params.get(key, {}).get("string_value", default) or default)

        self.delay_s = max(0.0, float(param("delay_ms", "0")) / 1000.0)
        self.reasoning = param("reasoning", "0") == "1"
        self.step_s = max(0.0, float(param("step_ms", "0")) / 1000.0)
        self.step_per_seq_s = max(0.0, float(param("step_per_seq_ms", "0")) / 1000.0)
        self.max_active = max(0, int(param("max_active", "0")))
        self.prefill_per_token_s = max(0.0, float(param("prefill_per_token_ms", "0")) / 1000.0)
        self.step_budget = max(0, int(param("step_token_budget", "0")))
        self.prefill = bool(self.prefill_per_token_s or self.step_budget)
        self.sent_end = 0.0  # when the last step's tokens were all sent (monotonic; `_engine_step`)
        self.sending_s = 0.0  # how long sending them took
        self.max_sequence = int(param("max_sequence", str(DEFAULT_MAX_SEQUENCE)))
        # One-token output arrays, built once: the hot path only wraps them in pb_utils.Tensor.
        self.token_arrays = {t: np.asarray([[[t]]], dtype=np.int32)
                             for t in (*TOKEN_CYCLE, *JSON_PREFIX, *JSON_SUFFIX, *REASONING_PREAMBLE)}
        self.zero_lp1 = np.zeros((1, 1, 1), dtype=np.float32)
        self.zero_cum = np.zeros((1, 1), dtype=np.float32)

        stats_dir = os.environ.get("OPENAI_API_REF_STATS_DIR")
        self.stats_path = Path(stats_dir) / f"{self.model_name}.json" if stats_dir else None
        self.stats = dict.fromkeys(("started", "completed", "cancelled", "errors", "tokens_generated", "active"), 0)
        self.stats_lock = threading.Lock()
        self._write_stats()

        self.incoming: deque[Job] = deque()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.worker = threading.Thread(target=self._worker, name=f"{self.model_name}-emit", daemon=True)
        self.worker.start()
        self.logger.log_info(f"{self.model_name}: synthetic LLM ready (delay {self.delay_s * 1000:.0f} ms/token)")

    # ------------------------------------------------------------------ request intake
    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = self._parse(request, sender)
            except RequestError as exc:
                self._bump("errors")
                self._send_error(sender, str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - any parse failure is the client's error
                self._bump("errors")
                self._send_error(sender, f"invalid request: {type(exc).__name__}: {exc}")
                continue
            self._bump("started", active=1)
            self.incoming.append(job)
        self.wake.set()

    def _parse(self, request: Any, sender: Any) -> Job:
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
        prompt = ids[0].tolist()
        length = int(batched_scalar(request, "input_lengths", len(prompt)))
        if length < 1 or length > len(prompt):
            raise RequestError(f"input_lengths {length} does not fit input_ids of length {len(prompt)}")
        prompt = prompt[:length]
        if min(prompt) < 0 or max(prompt) >= VOCAB_SIZE:
            raise RequestError(f"input_ids: token ids must be in [0, {VOCAB_SIZE})")
        max_new = int(batched_scalar(request, "request_output_len", 16))
        if max_new < 0:
            raise RequestError("request_output_len must be >= 0")
        if len(prompt) + max_new > self.max_sequence:
            raise RequestError(
                f"prompt ({len(prompt)} tokens) + request_output_len ({max_new}) exceeds the maximum "
                f"sequence length {self.max_sequence}"
            )
        temperature = float(batched_scalar(request, "temperature", 1.0))
        if temperature < 0:
            raise RequestError("temperature must be >= 0")
        delay_s = self.delay_s
        raw_params = request.parameters()
        if raw_params and raw_params != "{}":
            delay = json.loads(raw_params).get("delay_ms")
            if delay is not None:
                delay_s = max(0.0, float(delay) / 1000.0)
        try:
            requested = frozenset(request.requested_output_names()) or frozenset(OUTPUT_NAMES)
        except AttributeError:  # older stubs: send everything
            requested = frozenset(OUTPUT_NAMES)
        end_id = int(batched_scalar(request, "end_id", -1))
        return Job(
            sender=sender,
            prompt=prompt,
            max_new=max_new,
            end_id=end_id,
            min_tokens=int(batched_scalar(request, "min_tokens", 0)),
            streaming=bool(batched_scalar(request, "streaming", False)),
            exclude_input=bool(batched_scalar(request, "exclude_input_in_output", False)),
            stop_words=word_list(request, "stop_words_list"),
            outputs=requested,
            delay_s=delay_s,
            script=self._script(max_new, end_id, guided(request)),
            prefill_left=len(prompt) if self.prefill else 0,
        )

    def _script(self, max_new: int, end_id: int, guided: bool) -> list[int] | None:
        """A fixed output: the JSON object of a guided request, after the thinking preamble when the model
        reasons (as a reasoning model's backend applies a guide once the thinking ends)."""
        if not self.reasoning:
            return _json_script(max_new, end_id) if guided else None
        room = max(0, max_new - len(REASONING_PREAMBLE))
        body = _json_script(room, end_id) if guided else [TOKEN_CYCLE[i % len(TOKEN_CYCLE)] for i in range(room)]
        return [*REASONING_PREAMBLE, *body][:max_new]

    # ------------------------------------------------------------------ emission loop
    def _worker(self) -> None:
        ready: deque[Job] = deque()  # unpaced jobs (and paced ones now due), served round-robin
        paced: list[tuple[float, int, Job]] = []  # heap of (due time, tie-breaker, job)
        tie = itertools.count()
        while not self.stopping.is_set():
            self.wake.clear()
            now = time.monotonic()
            while self.incoming and not (self.max_active and len(ready) >= self.max_active):
                job = self.incoming.popleft()
                job.next_check = now + CANCEL_POLL_S
                ready.append(job)
            while paced and paced[0][0] <= now:
                ready.append(heapq.heappop(paced)[2])
            if not ready:
                self.wake.wait(min(paced[0][0] - now, 0.5) if paced else 0.5)
                continue
            if self.prefill:
                self._engine_step(ready, paced, tie)
                continue
            # One round: every ready job advances by one token (paced ones then go back to the heap).
            stepped = len(ready)
            for _ in range(stepped):
                self._token_and_requeue(ready.popleft(), ready, paced, tie)
            if self.step_s or self.step_per_seq_s:  # the engine's step time for this batch
                self.stopping.wait(self.step_s + self.step_per_seq_s * stepped)
        # Shutting down: release whatever is still queued or in flight.
        leftovers = list(ready) + [j for _, _, j in paced] + list(self.incoming)
        for job in leftovers:
            self._send_error(job.sender, "model is shutting down", "UNAVAILABLE")
            self._finish("errors")

    def _engine_step(self, ready: deque[Job], paced: list[tuple[float, int, Job]], tie: itertools.count[int]) -> None:
        """One step of the prefill cost model (module docstring, `plan_step`): the step's time first, then its
        tokens; a request still prefilling only advances its prompt (and is dropped when cancelled)."""
        jobs = list(ready)
        seconds, chunks = plan_step([j.prefill_left for j in jobs], self.step_budget, self.step_s,
                                    self.step_per_seq_s, self.prefill_per_token_s)
        # A real engine sends a step's responses while its next step computes (TensorRT-LLM's and vLLM's output
        # threads); this one sends them from this thread after the step, so the next step waits that much less -
        # at most its own length (an engine that cannot keep up with its responses slows down), and only when it
        # follows straight on (after idling there is nothing to overlap).
        began = time.monotonic()
        busy = began - self.sent_end < BUSY_GAP_S  # straight after the last step's sending, not after idling
        self.stopping.wait(seconds - (min(self.sending_s, seconds) if busy else 0.0))
        computed = time.monotonic()
        try:
            self._emit_step(ready, paced, tie, jobs, chunks)
        finally:
            self.sent_end = time.monotonic()
            self.sending_s = self.sent_end - computed

    def _emit_step(self, ready: deque[Job], paced: list[tuple[float, int, Job]], tie: itertools.count[int],
                   jobs: list[Job], chunks: list[int]) -> None:
        """A step's tokens: each job's prompt advanced by its chunk, a token for those whose prompt is done."""
        ready.clear()
        for job, chunk in zip(jobs, chunks, strict=True):
            if chunk < job.prefill_left:
                job.prefill_left -= chunk
                if self._cancelled(job):
                    self._send_error(job.sender, "request cancelled", "CANCELLED")
                    self._finish("cancelled")
                else:
                    ready.append(job)
                continue
            job.prefill_left = 0
            self._token_and_requeue(job, ready, paced, tie)

    def _token_and_requeue(self, job: Job, ready: deque[Job], paced: list[tuple[float, int, Job]],
                           tie: itertools.count[int]) -> None:
        """Give `job` its next token; then, unless it ended, back in line: `ready`, or `paced` until its delay."""
        try:
            done = self._step(job)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the others
            self.logger.log_error(f"{self.model_name}: request failed: {type(exc).__name__}: {exc}")
            self._send_error(job.sender, f"generation failed: {type(exc).__name__}: {exc}", "INTERNAL")
            self._finish("errors")
            return
        if done:
            return
        if job.delay_s:
            heapq.heappush(paced, (time.monotonic() + job.delay_s, next(tie), job))
        else:
            ready.append(job)

    def _cancelled(self, job: Job) -> bool:
        if job.delay_s == 0.0:
            now = time.monotonic()
            if now < job.next_check:
                return False
            job.next_check = now + CANCEL_POLL_S
        return bool(job.sender.is_cancelled())

    def _step(self, job: Job) -> bool:
        """Emit the next token (or, non-streaming and unpaced, all of them); True when finished."""
        if self._cancelled(job):
            self._send_error(job.sender, "request cancelled", "CANCELLED")
            self._finish("cancelled")
            return True
        if not job.streaming and job.delay_s == 0.0 and not (self.step_s or self.step_per_seq_s):
            while not self._advance(job):
                pass
            return True
        return self._advance(job)

    def _advance(self, job: Job) -> bool:
        n = len(job.generated)
        # request_output_len == 0, or a guided request's JSON object is complete (it ends as on end_id)
        if n >= job.max_new or (job.script is not None and n >= len(job.script)):
            self._finish("completed")
            self._respond(job, None, final=True)
            return True
        token = TOKEN_CYCLE[n % len(TOKEN_CYCLE)] if job.script is None else job.script[n]
        if token == job.end_id and n >= job.min_tokens:
            self._finish("completed")
            self._respond(job, None, final=True)
            return True
        job.generated.append(token)
        self.stats["tokens_generated"] += 1  # only this thread writes it; read under the lock
        done = n + 1 >= job.max_new or (
            bool(job.stop_words) and any(job.generated[-len(w):] == w for w in job.stop_words if len(w) <= n + 1)
        )
        if done:  # counters first: once the client holds the last response, the stats file shows this request
            self._finish("completed")
        if job.streaming or done:
            self._respond(job, token, final=done)
        return done

    # ------------------------------------------------------------------ responses and stats
    def _respond(self, job: Job, token: int | None, final: bool) -> None:
        """Streaming: ``token`` alone (None = empty); otherwise the whole output."""
        if job.streaming:
            ids = self.token_arrays[token] if token is not None else np.zeros((1, 1, 0), dtype=np.int32)
            seq_len = len(job.generated) + (0 if job.exclude_input else len(job.prompt))
        else:
            out = job.generated if job.exclude_input else job.prompt + job.generated
            ids = np.asarray(out, dtype=np.int32).reshape(1, 1, -1)
            seq_len = len(out)
        wanted = job.outputs
        tensors = [pb_utils.Tensor("output_ids", ids)]
        if "sequence_length" in wanted:
            tensors.append(pb_utils.Tensor("sequence_length", np.asarray([[seq_len]], dtype=np.int32)))
        if "output_log_probs" in wanted:
            lp = self.zero_lp1 if ids.shape[2] == 1 else np.zeros(ids.shape, dtype=np.float32)
            tensors.append(pb_utils.Tensor("output_log_probs", lp))
        if "cum_log_probs" in wanted:
            tensors.append(pb_utils.Tensor("cum_log_probs", self.zero_cum))
        job.sender.send(pb_utils.InferenceResponse(output_tensors=tensors), flags=FINAL if final else 0)

    def _send_error(self, sender: Any, message: str, code_name: str = "INVALID_ARG") -> None:
        try:
            sender.send(
                pb_utils.InferenceResponse(output_tensors=[], error=_error(message, code_name)), flags=FINAL
            )
        except Exception as exc:  # noqa: BLE001 - the client may already be gone
            self.logger.log_warn(f"{self.model_name}: could not send error response: {exc}")

    def _finish(self, outcome: str) -> None:
        self._bump(outcome, active=-1)

    def _bump(self, key: str, active: int = 0) -> None:
        with self.stats_lock:
            self.stats[key] += 1
            self.stats["active"] += active
        if key != "started":
            self._write_stats()

    def _write_stats(self) -> None:
        if self.stats_path is None:
            return
        with self.stats_lock:
            data = json.dumps(self.stats)
        try:
            self.stats_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.stats_path.with_name(f".{self.stats_path.name}.{threading.get_ident()}.tmp")
            tmp.write_text(data)
            os.replace(tmp, self.stats_path)
        except OSError as exc:
            self.logger.log_warn(f"{self.model_name}: cannot write stats to {self.stats_path}: {exc}")

    def finalize(self) -> None:
        self.stopping.set()
        self.wake.set()
        self.worker.join(timeout=10)
