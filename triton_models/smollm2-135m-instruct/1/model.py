"""SmolLM2-135M-Instruct reference LLM for Triton's Python backend, TensorRT-LLM tensor interface.

Wire contract (``max_batch_size: 8``, so every tensor has a leading batch dim that must be 1):

* inputs: ``input_ids`` INT32 [1, L], ``input_lengths`` INT32 [1, 1], ``request_output_len`` INT32
  [1, 1]; optional ``end_id``/``pad_id``/``runtime_top_k``/``min_tokens`` INT32 [1, 1],
  ``runtime_top_p``/``temperature``/``repetition_penalty``/``presence_penalty``/``frequency_penalty``
  FP32 [1, 1], ``seed`` UINT64 [1, 1], ``streaming``/``return_log_probs``/``exclude_input_in_output``
  BOOL [1, 1], ``stop_words_list``/``bad_words_list`` INT32 [1, 2, N] (row 0 concatenated ids, row 1
  cumulative end offsets padded with -1).
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
* errors (bad shapes, batch > 1, missing inputs, prompt + output over 8192 tokens) come back as a
  FINAL response carrying a ``TritonError``.
* cancellation (client cancels the gRPC stream) is polled before every token step; the request is
  dropped, its KV cache freed and a CANCELLED error sent with the FINAL flag.

Concurrency: ``execute`` only validates and enqueues, then returns (decoupled mode).  A single
background worker thread owns the model and interleaves decoding round-robin: each round it picks up
newly queued requests (prefilled on their first step) and advances every active request by one
token, each request keeping its own KV cache.  Concurrent requests are therefore served fairly, at
the cost of not batching forward passes (fine for a 135M model on CPU).

Torch runs one intra-op thread unless ``OPENAI_API_REF_TORCH_THREADS`` says otherwise.

Counters (started, completed, cancelled, errors, tokens_generated, active) are written as JSON to
``$OPENAI_API_REF_STATS_DIR/<model name>.json`` after every request ends, when that env var is set.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModelForCausalLM

MODEL_FOLDER = "smollm2-135m-instruct"
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# Never make a KV cache longer than the checkpoint's position range (config.json says 8192).
DEFAULT_MAX_SEQUENCE = 8192


class RequestError(ValueError):
    """Invalid request; the message goes back to the client verbatim."""


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
        raise RequestError(f"{name}: batch size {arr.shape[0]} not supported, send one sequence per request")
    return arr.reshape(-1)[0].item()


def _word_list(request: Any, name: str) -> list[list[int]]:
    """Decode a TensorRT-LLM words list ([1, 2, N]: ids, cumulative end offsets) into id sequences."""
    arr = _tensor(request, name)
    if arr is None or arr.size == 0:
        return []
    if arr.ndim == 2:  # tolerate a client that dropped the batch dim
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[0] != 1 or arr.shape[1] != 2:
        raise RequestError(f"{name}: expected shape [1, 2, N], got {list(arr.shape)}")
    ids, offsets = arr[0, 0].tolist(), arr[0, 1].tolist()
    words: list[list[int]] = []
    start = 0
    for end in offsets:
        if end < 0:
            break
        if end <= start or end > len(ids):
            if end == start:
                continue
            raise RequestError(f"{name}: bad offset {end}")
        words.append([int(t) for t in ids[start:end]])
        start = end
    return words


@dataclass
class Job:
    """One generation request and its decoding state (owned by the worker thread)."""

    request: Any
    sender: Any
    prompt: list[int]
    max_new: int
    end_id: int
    streaming: bool
    exclude_input: bool
    return_log_probs: bool
    temperature: float
    top_k: int
    top_p: float
    repetition_penalty: float
    presence_penalty: float
    frequency_penalty: float
    min_tokens: int
    stop_words: list[list[int]]
    bad_single: list[int]
    bad_multi: list[list[int]]
    generator: torch.Generator | None
    cache: Any = None
    pending: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    counts: Counter[int] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)


class TritonPythonModel:
    """Decoupled SmolLM2 generator; see the module docstring for the wire contract."""

    def initialize(self, args: dict[str, str]) -> None:
        self.model_name = args.get("model_name", MODEL_FOLDER)
        self.logger = pb_utils.Logger
        weights = self._weights_dir()
        t0 = time.monotonic()
        # One intra-op thread by default: on a small shared CPU box, OpenMP threads spin at barriers
        # whenever another process holds a core, and decode speed collapses from ~18 to ~4 tokens/s.
        threads = int(os.environ.get("OPENAI_API_REF_TORCH_THREADS", "1"))
        torch.set_num_threads(max(1, threads))
        self.model = AutoModelForCausalLM.from_pretrained(str(weights), dtype=torch.float32)
        self.model.eval()
        self.max_sequence = int(getattr(self.model.config, "max_position_embeddings", DEFAULT_MAX_SEQUENCE))
        eos = getattr(self.model.config, "eos_token_id", None)
        self.default_end_id = int(eos[0] if isinstance(eos, list) else eos) if eos is not None else -1
        self.vocab_size = int(self.model.config.vocab_size)
        self.logger.log_info(f"{self.model_name}: loaded {weights} in {time.monotonic() - t0:.1f} s")

        stats_dir = os.environ.get("OPENAI_API_REF_STATS_DIR")
        self.stats_path = Path(stats_dir) / f"{self.model_name}.json" if stats_dir else None
        self.stats = {
            "started": 0,
            "completed": 0,
            "cancelled": 0,
            "errors": 0,
            "tokens_generated": 0,
            "active": 0,
        }
        self.stats_lock = threading.Lock()
        self._write_stats()

        self.incoming: queue.Queue[Job | None] = queue.Queue()
        self.stopping = threading.Event()
        self.worker = threading.Thread(target=self._worker, name=f"{self.model_name}-decode", daemon=True)
        self.worker.start()

    def _weights_dir(self) -> Path:
        candidates = []
        if os.environ.get("OPENAI_API_MODELS_DIR"):
            candidates.append(Path(os.environ["OPENAI_API_MODELS_DIR"]) / MODEL_FOLDER)
        candidates.append(Path(__file__).resolve().parents[3] / "models" / MODEL_FOLDER)
        for path in candidates:
            if (path / "config.json").is_file():
                return path
        raise pb_utils.TritonModelException(
            f"weights not found in {[str(p) for p in candidates]}; run python -m openai_api.embedded.prepare"
        )

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
            self.incoming.put(job)

    def _parse(self, request: Any, sender: Any) -> Job:
        ids = _tensor(request, "input_ids")
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
        if _tensor(request, "request_output_len") is None:
            raise RequestError("request_output_len is required")
        prompt = [int(t) for t in ids[0].tolist()]
        length = int(_scalar(request, "input_lengths", len(prompt)))
        if length < 1 or length > len(prompt):
            raise RequestError(f"input_lengths {length} does not fit input_ids of length {len(prompt)}")
        prompt = prompt[:length]
        if any(t < 0 or t >= self.vocab_size for t in prompt):
            raise RequestError(f"input_ids: token ids must be in [0, {self.vocab_size})")
        max_new = int(_scalar(request, "request_output_len", 16))
        if max_new < 0:
            raise RequestError("request_output_len must be >= 0")
        if len(prompt) + max_new > self.max_sequence:
            raise RequestError(
                f"prompt ({len(prompt)} tokens) + request_output_len ({max_new}) exceeds the maximum "
                f"sequence length {self.max_sequence}"
            )
        top_p = float(_scalar(request, "runtime_top_p", 1.0))
        temperature = float(_scalar(request, "temperature", 1.0))
        if temperature < 0:
            raise RequestError("temperature must be >= 0")
        seed = _scalar(request, "seed", None)
        generator: torch.Generator | None = None
        if seed is not None:
            generator = torch.Generator().manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)
        bad = _word_list(request, "bad_words_list")
        return Job(
            request=request,
            sender=sender,
            prompt=prompt,
            max_new=max_new,
            end_id=int(_scalar(request, "end_id", self.default_end_id)),
            streaming=bool(_scalar(request, "streaming", False)),
            exclude_input=bool(_scalar(request, "exclude_input_in_output", False)),
            return_log_probs=bool(_scalar(request, "return_log_probs", False)),
            temperature=temperature,
            top_k=int(_scalar(request, "runtime_top_k", 0)),
            top_p=top_p,
            repetition_penalty=float(_scalar(request, "repetition_penalty", 1.0)),
            presence_penalty=float(_scalar(request, "presence_penalty", 0.0)),
            frequency_penalty=float(_scalar(request, "frequency_penalty", 0.0)),
            min_tokens=int(_scalar(request, "min_tokens", 0)),
            stop_words=_word_list(request, "stop_words_list"),
            bad_single=[w[0] for w in bad if len(w) == 1],
            bad_multi=[w for w in bad if len(w) > 1],
            generator=generator,
            pending=list(prompt),
        )

    # ------------------------------------------------------------------ decode loop
    def _worker(self) -> None:
        active: list[Job] = []
        while not self.stopping.is_set():
            try:
                # Block only when idle; otherwise just pick up what arrived since the last round.
                job = self.incoming.get(timeout=0.1) if not active else self.incoming.get_nowait()
                if job is not None:
                    active.append(job)
                continue
            except queue.Empty:
                pass
            for job in list(active):
                try:
                    done = self._step(job)
                except Exception as exc:  # noqa: BLE001 - one bad request must not stop the others
                    self.logger.log_error(f"{self.model_name}: request failed: {type(exc).__name__}: {exc}")
                    self._send_error(
                        job.sender, f"generation failed: {type(exc).__name__}: {exc}", "INTERNAL"
                    )
                    self._finish(job, "errors")
                    done = True
                if done:
                    active.remove(job)
        while True:  # shutting down: release whatever is still queued or in flight
            try:
                queued = self.incoming.get_nowait()
            except queue.Empty:
                break
            if queued is not None:
                active.append(queued)
        for job in active:
            self._send_error(job.sender, "model is shutting down", "UNAVAILABLE")
            self._finish(job, "errors")

    def _cancelled(self, job: Job) -> bool:
        for obj in (job.sender, job.request):
            check = getattr(obj, "is_cancelled", None)
            if check is not None:
                return bool(check())
        return False

    def _step(self, job: Job) -> bool:
        """Advance one token; returns True when the job is finished (and answered)."""
        if self._cancelled(job):
            self.logger.log_info(
                f"{self.model_name}: request cancelled after {len(job.generated)} tokens; dropping it"
            )
            job.cache = None
            self._send_error(job.sender, "request cancelled", "CANCELLED")
            self._finish(job, "cancelled")
            return True
        if job.max_new == 0:
            self._respond(job, [], final=True)
            self._finish(job, "completed")
            return True
        with torch.inference_mode():
            out = self.model(
                input_ids=torch.tensor([job.pending], dtype=torch.long),
                past_key_values=job.cache,
                use_cache=True,
                # Only the last position is sampled; full prefill logits would be L x 49152 floats.
                logits_to_keep=1,
            )
            job.cache = out.past_key_values
            token, log_prob = self._sample(job, out.logits[0, -1].float())
        if token == job.end_id:
            self._respond(job, [], final=True)
            self._finish(job, "completed")
            return True
        job.generated.append(token)
        job.log_probs.append(log_prob)
        job.counts[token] += 1
        job.pending = [token]
        self._bump("tokens_generated")
        done = len(job.generated) >= job.max_new or any(
            job.generated[-len(w) :] == w for w in job.stop_words if len(w) <= len(job.generated)
        )
        if job.streaming or done:
            self._respond(job, [token], final=done)
        if done:
            self._finish(job, "completed")
        return done

    def _sample(self, job: Job, logits: torch.Tensor) -> tuple[int, float]:
        if job.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(job.prompt) | set(job.generated)), dtype=torch.long)
            vals = logits[seen]
            logits[seen] = torch.where(vals > 0, vals / job.repetition_penalty, vals * job.repetition_penalty)
        if job.counts and (job.presence_penalty or job.frequency_penalty):
            toks = torch.tensor(list(job.counts), dtype=torch.long)
            cnt = torch.tensor([job.counts[t] for t in job.counts], dtype=logits.dtype)
            logits[toks] -= job.presence_penalty + job.frequency_penalty * cnt
        masked = [t for t in job.bad_single if 0 <= t < logits.numel()]
        for word in job.bad_multi:
            prefix = word[:-1]
            if (
                len(prefix) <= len(job.generated)
                and job.generated[len(job.generated) - len(prefix) :] == prefix
            ):
                masked.append(word[-1])
        if len(job.generated) < job.min_tokens and 0 <= job.end_id < logits.numel():
            masked.append(job.end_id)
        if masked:
            logits[torch.tensor(masked, dtype=torch.long)] = float("-inf")

        greedy = job.temperature == 0.0 or job.top_k == 1
        scaled = logits if greedy else logits / job.temperature
        log_probs = torch.log_softmax(scaled, dim=-1)
        if greedy:
            token = int(torch.argmax(scaled))
            return token, float(log_probs[token])
        filtered = scaled.clone()
        if job.top_k > 0 and job.top_k < filtered.numel():
            kth = torch.topk(filtered, job.top_k).values[-1]
            filtered[filtered < kth] = float("-inf")
        if 0.0 < job.top_p < 1.0:
            sorted_logits, order = torch.sort(filtered, descending=True)
            cum = torch.cumsum(torch.softmax(sorted_logits, dim=-1), dim=-1)
            # Drop tokens once the mass before them already reaches top_p (the first always stays).
            drop = (cum - torch.softmax(sorted_logits, dim=-1)) >= job.top_p
            filtered[order[drop]] = float("-inf")
        probs = torch.softmax(filtered, dim=-1)
        token = int(torch.multinomial(probs, 1, generator=job.generator))
        return token, float(log_probs[token])

    # ------------------------------------------------------------------ responses and stats
    def _respond(self, job: Job, new_tokens: list[int], final: bool) -> None:
        """Streaming: send ``new_tokens`` (the tail of ``job.generated``); otherwise the whole output."""
        if job.streaming:
            ids = new_tokens
            log_probs = job.log_probs[len(job.log_probs) - len(new_tokens) :]
            seq_len = len(job.generated) + (0 if job.exclude_input else len(job.prompt))
        else:
            ids = job.generated if job.exclude_input else job.prompt + job.generated
            log_probs = job.log_probs
            seq_len = len(ids)
        lp = log_probs if job.return_log_probs else [0.0] * len(log_probs)
        cum = float(sum(job.log_probs)) if job.return_log_probs else 0.0
        outputs = [
            pb_utils.Tensor("output_ids", np.asarray(ids, dtype=np.int32).reshape(1, 1, -1)),
            pb_utils.Tensor("sequence_length", np.asarray([[seq_len]], dtype=np.int32)),
            pb_utils.Tensor("output_log_probs", np.asarray(lp, dtype=np.float32).reshape(1, 1, -1)),
            pb_utils.Tensor("cum_log_probs", np.asarray([[cum]], dtype=np.float32)),
        ]
        job.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL if final else 0)

    def _send_error(self, sender: Any, message: str, code_name: str = "INVALID_ARG") -> None:
        try:
            sender.send(
                pb_utils.InferenceResponse(output_tensors=[], error=_error(message, code_name)), flags=FINAL
            )
        except Exception as exc:  # noqa: BLE001 - the client may already be gone
            self.logger.log_warn(f"{self.model_name}: could not send error response: {exc}")

    def _finish(self, job: Job, outcome: str) -> None:
        job.cache = None
        self._bump(outcome, active=-1)

    def _bump(self, key: str, active: int = 0) -> None:
        with self.stats_lock:
            self.stats[key] += 1
            self.stats["active"] += active
        if key != "tokens_generated" and key != "started":
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
        self.incoming.put(None)
        self.worker.join(timeout=10)
