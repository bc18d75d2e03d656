"""The SmolLM2-135M-Instruct decoding engine shared by every reference LLM in ``triton_models/``.

Three Triton models speak three wire protocols over the same weights and the same decoding:
``smollm2-135m-instruct`` (TensorRT-LLM tensors), ``smollm2-vllm`` (the vLLM backend's text interface)
and ``smollm2-ft`` (the legacy FasterTransformer tensors).  Each ``model.py`` subclasses
``SmolLM2Engine`` and implements only its protocol: ``parse`` turns a Triton request into a ``Job``
(``smollm2_job.py``; read with the helpers of ``smollm2_requests.py``, raising ``RequestError`` for the client's
mistakes) and ``respond`` turns decoding progress into Triton responses.  This module, with the modules beside
it that it names, owns everything else:

* loading the weights (``$OPENAI_API_MODELS_DIR/smollm2-135m-instruct``, else ``<repo>/models/...``);
* one background worker thread that owns the model and batches decoding in flight, as TensorRT-LLM and vLLM
  do: each round it picks up newly queued jobs and prefills each on its own (their first token), then advances
  every other active job by one token in one forward pass (``smollm2_batch.py`` beside this file: a batch per
  LoRA adapter, attention per job against its own KV cache; a batch of one is bit-identical to the model's own
  forward pass, a larger one may differ in the last bits, as batch sizes do in the production engines);
* sampling (``smollm2_sampling.py`` beside this file; greedy when ``temperature == 0`` or ``top_k == 1``; else
  temperature, top-k, top-p), repetition / presence / frequency penalties, ``min_tokens``, bad words, stop
  words, end ids; each sampled token's log-prob (``job.log_probs``) and, when ``job.top_logprobs`` is set, its
  rank and the ``top_logprobs`` most likely alternatives (``job.ranks``, ``job.alternatives``), all read from the
  one distribution the token was drawn from (``log_softmax`` of the logits after penalties, masks and
  temperature, before top-k / top-p), so the sampled token's value is the same number in both;
* LoRA (``smollm2_lora.py`` beside this file): a job's adapter (``job.lora``) added to every projection in its
  forward passes by hooks, installed on the first job with one; ``lora_cache`` keeps ``lora_cache_size`` adapters;
* cancellation, polled before every token step: the job is dropped, its KV cache freed and a
  CANCELLED error sent with the FINAL flag;
* guided decoding (``smollm2_guide.py`` beside this file: the wire forms, xgrammar compilation, the
  masking): a job whose ``parse`` set ``job.guide`` goes first to a grammar thread, which compiles
  the guide (or takes it from an LRU of 64 compiled grammars keyed by kind + guide) and creates the
  job's matcher; an invalid guide is answered there with an INVALID_ARG error and never reaches the
  decoder.  Compiling off the decode loop matters: xgrammar releases the GIL, so a 180 ms schema
  does not stall the other requests' tokens.  Each step the matcher's bitmask is applied after
  penalties, bad words and ``min_tokens``, before temperature / top-k / top-p (greedy included); each
  sampled token is accepted by the matcher; the end id is masked until the grammar may end, and when
  nothing but an end may follow the request ends with "stop" at once (no extra forward pass).  A
  budget that runs out mid-output ends with "length" and the partial text.  ``stop_words``,
  ``bad_words``, ``min_tokens`` (a finished grammar ends the request even before ``min_tokens``),
  seeds, streaming and cancellation apply as without a guide;
* a prefix KV cache, TensorRT-LLM's KV cache block reuse (``smollm2_prefix_cache.py`` beside this file), on
  when the model's config says ``enable_kv_cache_reuse: true``: blocks of ``tokens_per_block`` tokens keyed by
  chained prefix hashes, LRU within ``kv_cache_reuse_bytes``. A job's prefill reads the longest cached run of
  its prompt's blocks (at most ``len(prompt) - 1`` tokens) and computes only the rest; its prompt's blocks are
  stored after the prefill, the blocks its answer filled when it completes. Jobs with a LoRA adapter neither
  read nor store. ``job.reused_blocks`` and the job's times feed TensorRT-LLM's ``return_perf_metrics``
  outputs (``perf_metric_tensors``);
* counters (started, completed, cancelled, errors, tokens_generated, active; with the prefix cache
  ``kv_reused_blocks``, ``kv_stored_blocks``, ``kv_evicted_blocks``, ``kv_cache_bytes``, ``kv_cache_blocks``,
  ``kv_lookups``, ``kv_hits``) written as JSON to ``$OPENAI_API_REF_STATS_DIR/<model name>.json`` after every
  request ends and after every prefix cache lookup, when that env var is set.

The engine calls ``respond(job, new_tokens, final)`` after every generated token when
``job.streaming``, else once at the end; ``job.finish_reason`` is ``"stop"`` (end id, stop token or
stop word) or ``"length"`` on the final call.  An end id is never part of ``job.generated``.

Torch runs one intra-op thread unless ``OPENAI_API_REF_TORCH_THREADS`` says otherwise.

Measured costs: the prefix cache's time to first token in ``smollm2_prefix_cache.py``, guided decoding's per
token and per compile in ``smollm2_guide.py``.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from smollm2_batch import decode_step
from smollm2_guide import GuideCompiler, GuideEnded, GuideError, GuideUnavailable
from smollm2_job import Job
from smollm2_lora import LoraCache, LoraHooks
from smollm2_prefix_cache import PrefixCache
from smollm2_requests import RequestError, config_parameter, triton_error
from smollm2_sampling import sample
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

MODEL_FOLDER = "smollm2-135m-instruct"
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
# Never make a KV cache longer than the checkpoint's position range (config.json says 8192).
DEFAULT_MAX_SEQUENCE = 8192


class SmolLM2Engine:
    """Base of the reference ``TritonPythonModel``s; see the module docstring."""

    # A protocol without guide inputs (FasterTransformer) sets this False: no grammar thread, no compiler.
    GUIDED_DECODING = True
    # A protocol that takes prompt text (vLLM, the TensorRT-LLM ensemble, custom text) sets this True: the
    # engine then loads the model's tokenizer (`self.tokenizer`, `encode_text`).
    TEXT_PROMPTS = False

    def parse(self, request: Any, sender: Any) -> Job:
        raise NotImplementedError

    def respond(self, job: Job, new_tokens: list[int], final: bool) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ life cycle
    def initialize(self, args: dict[str, str]) -> None:
        self.model_name = args.get("model_name", MODEL_FOLDER)
        self.logger = pb_utils.Logger
        self.weights_dir = self._weights_dir()
        t0 = time.monotonic()
        # One intra-op thread by default: on a small shared CPU box, OpenMP threads spin at barriers
        # whenever another process holds a core, and decode speed collapses from ~18 to ~4 tokens/s.
        threads = int(os.environ.get("OPENAI_API_REF_TORCH_THREADS", "1"))
        torch.set_num_threads(max(1, threads))
        self.model = AutoModelForCausalLM.from_pretrained(str(self.weights_dir), dtype=torch.float32)
        self.model.eval()
        self.max_sequence = int(getattr(self.model.config, "max_position_embeddings", DEFAULT_MAX_SEQUENCE))
        eos = getattr(self.model.config, "eos_token_id", None)
        self.default_end_id = int(eos[0] if isinstance(eos, list) else eos) if eos is not None else -1
        self.vocab_size = int(self.model.config.vocab_size)
        if self.TEXT_PROMPTS:
            self.tokenizer = Tokenizer.from_file(str(self.weights_dir / "tokenizer.json"))
            self.tokenizer.no_truncation()
            self.tokenizer.no_padding()
        self.logger.log_info(f"{self.model_name}: loaded {self.weights_dir} in {time.monotonic() - t0:.1f} s")

        stats_dir = os.environ.get("OPENAI_API_REF_STATS_DIR")
        self.stats_path = Path(stats_dir) / f"{self.model_name}.json" if stats_dir else None
        self.stats = {"started": 0, "completed": 0, "cancelled": 0, "errors": 0, "tokens_generated": 0, "active": 0,
                      # LoRA: requests that carried weights, that named a cached adapter, that named one not
                      # cached (answered with the cache-miss error), and adapters evicted from the cache.
                      "lora_loads": 0, "lora_hits": 0, "lora_misses": 0, "lora_evictions": 0}
        self.lora_modules = LoraHooks(self.model)
        # How many adapters the model keeps (TensorRT-LLM: its host cache; vLLM: max_cpu_loras). The bundled
        # configs keep one, so the tests can force evictions with two adapters.
        self.lora_cache = LoraCache(int(config_parameter(args, "lora_cache_size", "8")))
        # Prefix KV cache (TensorRT-LLM's KV cache block reuse; ``smollm2_prefix_cache.py``): off unless the
        # config's `enable_kv_cache_reuse` says true; blocks of `tokens_per_block` tokens, at most
        # `kv_cache_reuse_bytes` of them.
        self.prefix_cache: PrefixCache | None = None
        if config_parameter(args, "enable_kv_cache_reuse", "false").strip().lower() in ("true", "1", "yes"):
            self.prefix_cache = PrefixCache(int(config_parameter(args, "tokens_per_block", "32")),
                                            int(config_parameter(args, "kv_cache_reuse_bytes", str(256 << 20))))
            self.stats.update(self.prefix_cache.stats.as_dict())
        self.stats_lock = threading.Lock()
        self._write_stats()

        self.incoming: queue.Queue[Job | None] = queue.Queue()
        self.stopping = threading.Event()
        self.worker = threading.Thread(target=self._worker, name=f"{self.model_name}-decode", daemon=True)
        self.worker.start()

        # Guided requests go through a grammar thread first: compiling a new schema there keeps the
        # decode loop going (xgrammar releases the GIL while compiling).  It builds the compiler once
        # at start-up, in the background, so the first guided request does not pay for it.
        self.guides = GuideCompiler(self.weights_dir, self.vocab_size, [self.default_end_id])
        self.to_compile: queue.Queue[Job | None] = queue.Queue()
        self.grammar_thread: threading.Thread | None = None
        if self.GUIDED_DECODING:
            self.grammar_thread = threading.Thread(target=self._grammar_worker, name=f"{self.model_name}-grammar",
                                                   daemon=True)
            self.grammar_thread.start()

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

    def finalize(self) -> None:
        self.stopping.set()
        if self.grammar_thread is not None:
            self.to_compile.put(None)
            self.grammar_thread.join(timeout=10)
        self.incoming.put(None)
        self.worker.join(timeout=10)

    # ------------------------------------------------------------------ request intake
    def execute(self, requests: list[Any]) -> None:
        for request in requests:
            sender = request.get_response_sender()
            try:
                job = self.parse(request, sender)
            except (RequestError, GuideError) as exc:
                self._bump("errors")
                self.send_error(sender, str(exc))
                continue
            except Exception as exc:  # noqa: BLE001 - any parse failure is the client's error
                self._bump("errors")
                self.send_error(sender, f"invalid request: {type(exc).__name__}: {exc}")
                continue
            self._bump("started", active=1)
            (self.to_compile if job.guide is not None else self.incoming).put(job)

    def encode_text(self, text: str, input_name: str) -> list[int]:
        """A text prompt's ids, with the tokenizer's added tokens (as the production backends' tokenizers
        add them); an empty prompt is refused, naming `input_name`."""
        prompt: list[int] = self.tokenizer.encode(text, add_special_tokens=True).ids
        if not prompt:
            raise RequestError(f"{input_name}: the prompt is empty")
        return prompt

    def validate_prompt(self, prompt: list[int], max_new: int, output_name: str) -> None:
        """Shared limits: ids in the vocabulary, a non-negative budget, prompt + budget within range."""
        if any(t < 0 or t >= self.vocab_size for t in prompt):
            raise RequestError(f"input_ids: token ids must be in [0, {self.vocab_size})")
        if max_new < 0:
            raise RequestError(f"{output_name} must be >= 0")
        if len(prompt) + max_new > self.max_sequence:
            raise RequestError(
                f"prompt ({len(prompt)} tokens) + {output_name} ({max_new}) exceeds the maximum "
                f"sequence length {self.max_sequence}"
            )

    # ------------------------------------------------------------------ grammar thread
    def _grammar_worker(self) -> None:
        """Compile (or fetch from the LRU) each guided job's grammar, then hand the job to the decoder."""
        t0 = time.monotonic()
        try:
            self.guides.ready()
            self.logger.log_info(f"{self.model_name}: guided decoding ready (xgrammar {self.guides.version}) "
                                 f"in {time.monotonic() - t0:.1f} s")
        except GuideUnavailable as exc:
            self.logger.log_warn(f"{self.model_name}: {exc}")
        while True:
            job = self.to_compile.get()
            if job is None:
                break
            if self.stopping.is_set():
                self.send_error(job.sender, "model is shutting down", "UNAVAILABLE")
                self._finish(job, "errors")
                continue
            try:
                job.guide_state = self.guides.start(job.guide)
            except GuideError as exc:
                self.send_error(job.sender, str(exc))
                self._finish(job, "errors")
                continue
            except GuideUnavailable as exc:
                self.send_error(job.sender, str(exc), "UNSUPPORTED")
                self._finish(job, "errors")
                continue
            except Exception as exc:  # noqa: BLE001 - one bad guide must not stop the thread
                self.logger.log_error(f"{self.model_name}: guide compilation failed: {type(exc).__name__}: {exc}")
                self.send_error(job.sender, f"guided decoding failed: {type(exc).__name__}: {exc}", "INTERNAL")
                self._finish(job, "errors")
                continue
            state = job.guide_state
            self.logger.log_verbose(
                f"{self.model_name}: {job.guide.kind} guide {'from cache' if state.compile_cached else 'compiled'} "
                f"in {state.compile_s * 1000:.1f} ms")
            self.incoming.put(job)
        while True:  # shutting down: nothing queued here may reach the decoder any more
            try:
                job = self.to_compile.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self.send_error(job.sender, "model is shutting down", "UNAVAILABLE")
                self._finish(job, "errors")

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
            # A round: each new job's prefill on its own (its first token), then one batched decode step for the
            # jobs that already had a token to feed (a group per LoRA adapter: a batch shares one), as an engine's
            # in-flight batching does.
            decoding: dict[int, list[Job]] = {}
            for job in list(active):
                ready = job.decoding
                if self._guarded(job, self._prefill_or_end):
                    active.remove(job)
                elif ready:
                    decoding.setdefault(id(job.lora), []).append(job)
            for group in decoding.values():
                try:
                    logits = self._decode(group)
                except Exception as exc:  # noqa: BLE001 - the batch's jobs fail, the engine goes on
                    for job in group:
                        self._fail(job, exc)
                        active.remove(job)
                    continue
                for row, job in zip(logits, group, strict=True):
                    if self._guarded(job, lambda j, r=row: self._advance(j, r)):
                        active.remove(job)
        while True:  # shutting down: release whatever is still queued or in flight
            try:
                queued = self.incoming.get_nowait()
            except queue.Empty:
                break
            if queued is not None:
                active.append(queued)
        for job in active:
            self.send_error(job.sender, "model is shutting down", "UNAVAILABLE")
            self._finish(job, "errors")

    def _guarded(self, job: Job, step: Callable[[Job], bool]) -> bool:
        """``step(job)``, whose failure ends the job with an error instead of the engine (``_fail``). Returns True
        when the job is finished (and answered)."""
        try:
            return step(job)
        except Exception as exc:  # noqa: BLE001 - one bad request must not stop the others
            self._fail(job, exc)
            return True

    def _fail(self, job: Job, exc: Exception) -> None:
        """Answer ``job`` with ``exc`` and end it: the client's mistake as INVALID_ARG, anything else as INTERNAL."""
        if isinstance(exc, (RequestError, GuideError)):
            self.send_error(job.sender, str(exc))
        else:
            self.logger.log_error(f"{self.model_name}: request failed: {type(exc).__name__}: {exc}")
            self.send_error(job.sender, f"generation failed: {type(exc).__name__}: {exc}", "INTERNAL")
        self._finish(job, "errors")

    @staticmethod
    def _cancelled(job: Job) -> bool:
        for obj in (job.sender, job.request):
            check = getattr(obj, "is_cancelled", None)
            if check is not None:
                return bool(check())
        return False

    def _prefill_or_end(self, job: Job) -> bool:
        """A job's part of a round before the batched decode: a cancelled job is dropped, an empty budget ends it,
        and a new job is prefilled (its prompt, less what the prefix cache holds) and gets its first token.
        Returns True when the job is finished (and answered); a job left for the decode step has one pending token."""
        if self._cancelled(job):
            self.logger.log_info(f"{self.model_name}: request cancelled after {len(job.generated)} tokens; dropping it")
            job.cache = None
            self.send_error(job.sender, "request cancelled", "CANCELLED")
            self._finish(job, "cancelled")
            return True
        if job.max_new == 0:
            job.finish_reason = "length"
            self._finish(job, "completed")
            self.respond(job, [], final=True)
            return True
        if job.decoding:
            return False
        keys: list[bytes] = []
        with torch.inference_mode():
            if not job.scheduled_ns:
                job.scheduled_ns = time.time_ns()
                keys = self._reuse(job)
            with self.lora_modules.applied(job.lora):
                out = self.model(
                    input_ids=torch.tensor([job.pending], dtype=torch.long),
                    past_key_values=job.cache,
                    use_cache=True,
                    # Only the last position is sampled; full prefill logits would be L x 49152 floats.
                    logits_to_keep=1,
                )
            job.cache = out.past_key_values
            if keys:
                self._store(keys, job, job.reused_blocks)
            return self._advance(job, out.logits[0, -1].float())

    def _decode(self, jobs: list[Job]) -> torch.Tensor:
        """One forward pass for the pending token of every job in ``jobs`` (which share one adapter or none), each
        against its own KV cache (``smollm2_batch.decode_step``; a batch of one is bit-identical to the model's own
        forward pass); the logits, [len(jobs), vocab]."""
        with torch.inference_mode(), self.lora_modules.applied(jobs[0].lora):
            return decode_step(self.model, [job.pending[0] for job in jobs], [job.cache for job in jobs])

    def _advance(self, job: Job, logits: torch.Tensor) -> bool:
        """Sample ``job``'s next token from ``logits`` (its last position) and answer as the protocol asks; returns
        True when the job is finished (and answered)."""
        with torch.inference_mode():
            try:
                token, log_prob, ranked = sample(job, logits)
            except GuideEnded:  # the grammar is complete and every end id is masked (min_tokens, no end id)
                token, log_prob, ranked = job.end_id, 0.0, None
        if token == job.end_id or token in job.stop_ids:
            job.finish_reason = "stop"
            self._keep_answer(job)
            self._finish(job, "completed")
            self.respond(job, [], final=True)
            return True
        if job.guide_state is not None:
            job.guide_state.accept(token)
        job.last_token_ns = time.time_ns()
        if not job.generated:
            job.first_token_ns = job.last_token_ns
        job.generated.append(token)
        job.log_probs.append(log_prob)
        if ranked is not None:
            job.ranks.append(ranked[0])
            job.alternatives.append(ranked[1])
        job.counts[token] += 1
        job.pending = [token]
        self._bump("tokens_generated")
        if any(job.generated[-len(w) :] == w for w in job.stop_words if len(w) <= len(job.generated)):
            job.finish_reason = "stop"
        elif len(job.generated) >= job.max_new:
            job.finish_reason = "length"
        elif job.guide_state is not None and job.guide_state.finished:
            # Only an end id could follow: stop now instead of running the model to sample it.
            job.finish_reason = "stop"
        done = job.finish_reason is not None
        if done:
            # Counters and the kept answer first: once the client holds the last response, the stats file and the
            # prefix cache already show this request (tests read both right after an answer).
            self._keep_answer(job)
            self._finish(job, "completed")
        if job.streaming or done:
            self.respond(job, [token], final=done)
        return done

    def _reuse(self, job: Job) -> list[bytes]:
        """Before a job's prefill: its prompt's block keys (for storing its blocks after the prefill; [] when
        the cache is off or the job runs an adapter, whose KV differs for the same tokens), and its past set to
        the longest cached run of blocks within ``prompt[:-1]`` (the last token is always computed: its logits
        give the first output token), so the prefill computes only the tokens after it."""
        cache = self.prefix_cache
        if cache is None or job.lora is not None:
            return []
        keys = cache.keys(job.prompt)
        blocks = cache.match(keys[: (len(job.prompt) - 1) // cache.tokens_per_block])
        if blocks:
            job.cache = cache.past(blocks)
            job.reused_blocks = len(blocks)
            job.pending = job.prompt[len(blocks) * cache.tokens_per_block:]
        return keys

    def _keep_answer(self, job: Job) -> None:
        """When a request ends (just before its last response): store the blocks its generated tokens filled (its
        cache holds the prompt and every generated token fed back so far), so the next turn of a conversation,
        whose prompt repeats this answer, finds them too (TensorRT-LLM stores a finished request's blocks as well)."""
        cache = self.prefix_cache
        if cache is None or job.lora is not None or job.cache is None:
            return
        length = job.cache.get_seq_length()
        first = len(job.prompt) // cache.tokens_per_block
        if length // cache.tokens_per_block > first:
            self._store(cache.keys((job.prompt + job.generated)[:length]), job, first)

    def _store(self, keys: list[bytes], job: Job, first: int) -> None:
        """Blocks ``first..`` of ``job``'s cache into the prefix cache. A cache that cannot take them (out of
        memory) is logged, never the request's failure: the request has its own cache either way."""
        if self.prefix_cache is None:
            return
        try:
            self.prefix_cache.store(keys, job.cache, first)
        except Exception as exc:  # noqa: BLE001 - the prefix cache is an optimisation of other requests
            self.logger.log_warn(f"{self.model_name}: prefix cache store failed: {type(exc).__name__}: {exc}")
        self._prefix_stats()

    def _prefix_stats(self) -> None:
        """The prefix cache's counters into the stats, written before the request's first response is sent
        (so a client reading the stats after its answer sees this request's reuse)."""
        if self.prefix_cache is not None:
            with self.stats_lock:
                self.stats.update(self.prefix_cache.stats.as_dict())
            self._write_stats()

    def perf_metric_tensors(self, job: Job) -> list[Any]:
        """TensorRT-LLM's ``return_perf_metrics`` outputs, each [1, 1] (the batch dim): ``kv_cache_reused_blocks``
        (prefix cache blocks this request read instead of computing), ``kv_cache_alloc_total_blocks`` (blocks its
        tokens so far fill, the last one partly), ``kv_cache_alloc_new_blocks`` (those not reused) INT32, and
        ``arrival_time_ns``, ``first_scheduled_time_ns``, ``first_token_time_ns``, ``last_token_time_ns`` INT64
        (ns since the epoch; 0 until reached). With the prefix cache off, blocks count as of 32 tokens and
        none is reused."""
        per_block = self.prefix_cache.tokens_per_block if self.prefix_cache is not None else 32
        total = -(-(len(job.prompt) + len(job.generated)) // per_block)
        ints = {"kv_cache_alloc_new_blocks": total - job.reused_blocks, "kv_cache_reused_blocks": job.reused_blocks,
                "kv_cache_alloc_total_blocks": total}
        times = {"arrival_time_ns": job.arrival_ns, "first_scheduled_time_ns": job.scheduled_ns,
                 "first_token_time_ns": job.first_token_ns, "last_token_time_ns": job.last_token_ns}
        return ([pb_utils.Tensor(k, np.asarray([[v]], dtype=np.int32)) for k, v in ints.items()]
                + [pb_utils.Tensor(k, np.asarray([[v]], dtype=np.int64)) for k, v in times.items()])

    # ------------------------------------------------------------------ responses and stats
    def send(self, job: Job, outputs: list[Any], final: bool) -> None:
        job.sender.send(pb_utils.InferenceResponse(output_tensors=outputs), flags=FINAL if final else 0)

    def send_error(self, sender: Any, message: str, code_name: str = "INVALID_ARG") -> None:
        try:
            sender.send(pb_utils.InferenceResponse(output_tensors=[], error=triton_error(message, code_name)),
                        flags=FINAL)
        except Exception as exc:  # noqa: BLE001 - the client may already be gone
            self.logger.log_warn(f"{self.model_name}: could not send error response: {exc}")

    def _finish(self, job: Job, outcome: str) -> None:
        job.cache = None
        state = job.guide_state
        if state is not None and state.steps:
            self.logger.log_verbose(
                f"{self.model_name}: guide cost {state.seconds * 1000:.1f} ms over {state.steps} steps "
                f"({state.seconds / state.steps * 1e6:.0f} us per token)")
        self._bump(outcome, active=-1)

    def _bump(self, key: str, active: int = 0, n: int = 1) -> None:
        with self.stats_lock:
            self.stats[key] += n
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
