"""Prometheus metrics and per-request stats: what every layer may record into, and nothing that records.

One `Metrics` object per app (its own `CollectorRegistry`, so several apps can live in one process, as
the tests do). The per-token hot path costs O(1): the instrumented backend (`services.backends`) reads
the clock once per chunk and makes one histogram observation; token counts are accumulated locally and
added to the counters once per sequence.

With `--workers N` (`openai_api.supervisor`) each worker process has its own `Metrics`, and `/metrics`
on any of them must answer for all of them. The supervisor sets `PROMETHEUS_MULTIPROC_DIR` (a fresh
directory) in every worker's environment before it imports prometheus_client, which then keeps every
value in a per-process file there; `render` reads them all (`MultiProcessCollector`): counters and
histograms are summed over every worker that ever ran (a restarted worker's counts stay in), the
in-flight gauges are summed over the live ones (`livesum`; the supervisor calls `mark_process_dead`
for a worker that ended). The process metrics (RSS, CPU, fds) cannot be summed from files: they are
read from /proc for every process in `PROCESSES_FILE` (written by the supervisor) at each scrape,
one series per process labelled `worker` (0..N-1, or `supervisor`) and `pid`.

The outermost middleware (`RequestContextMiddleware` in `openai_api.http.middleware`) opens a
`RequestStats` per request, reachable anywhere below it through `current_stats()` (a context variable:
it follows the request into the tasks Starlette and `asyncio.gather` create), and records the request's
metrics and access-log line from it when the response is done.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable, Mapping
from contextvars import ContextVar, Token
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

from openai_api.vllm_metrics import (
    FINISH_REASONS,
    PHASES,
    TOKEN_BUCKETS,
    VLLM_E2E_BUCKETS,
    VLLM_ITL_BUCKETS,
    VLLM_TTFT_BUCKETS,
    Served,
    union,
    vllm_families,
)

METRICS_CONTENT_TYPE = CONTENT_TYPE_LATEST
# End-to-end latency: from a few ms (embeddings) to minutes (long generations).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# Time to first token: dominated by queueing and prefill. Stored (and shown) with vLLM's bounds added, so its
# vLLM-named view (openai_api.vllm_metrics) is exact without a second observation.
TTFT_BUCKETS = union((0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0), VLLM_TTFT_BUCKETS)
# Inter-token latency: a decode step, from sub-millisecond to a stalled second (with vLLM's bounds, as above:
# one observation per chunk feeds both names).
ITL_BUCKETS = union((0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56), VLLM_ITL_BUCKETS)
# One Triton sequence, the request's arrival to its end (with vLLM's end-to-end bounds).
SEQUENCE_BUCKETS = union(REQUEST_BUCKETS, VLLM_E2E_BUCKETS)
# One image fetch: a local store in ms, a slow host up to the fetch timeout (5 s by default).
IMAGE_FETCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
# prometheus_client's own switch to multiprocess mode (read once, when it is imported).
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# In the multiprocess directory: {"worker label": pid} of the processes whose /proc figures are exported.
PROCESSES_FILE = "processes.json"


def write_processes(folder: Path, processes: Mapping[str, int]) -> None:
    """Record the gateway's processes for the process metrics (whole-file replace: a scrape never reads
    half of it)."""
    tmp = folder / (PROCESSES_FILE + ".tmp")
    tmp.write_text(json.dumps(dict(processes)), encoding="utf-8")
    os.replace(tmp, folder / PROCESSES_FILE)


def process_ended(folder: Path, pid: int) -> None:
    """A worker ended: its live gauges leave the sums (its counters and histograms stay in them)."""
    untyped: Any = mark_process_dead  # prometheus_client leaves it unannotated
    untyped(pid, str(folder))


def _constant(pid: int) -> Callable[[], int]:
    return lambda: pid


class GatewayProcessCollector:
    """`ProcessCollector`'s metrics for each process listed in `PROCESSES_FILE`, labelled `worker` and
    `pid` (a sum over them is the host's gateway footprint). Without the file, this process alone."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _processes(self) -> dict[str, int]:
        try:
            data = json.loads((self.folder / PROCESSES_FILE).read_text(encoding="utf-8"))
            return {str(k): int(v) for k, v in data.items()}
        except (OSError, ValueError, AttributeError):
            return {"self": os.getpid()}

    def collect(self) -> Iterable[Metric]:
        families: dict[str, Metric] = {}
        for worker, pid in self._processes().items():
            # A process that ended between the file and the read just contributes nothing.
            for family in ProcessCollector(pid=_constant(pid), registry=None).collect():
                out = families.setdefault(family.name, Metric(family.name, family.documentation, family.type))
                for sample in family.samples:
                    out.add_sample(sample.name, {**sample.labels, "worker": worker, "pid": str(pid)}, sample.value)
        return list(families.values())


class _Families:
    """Already collected families, as `generate_latest` takes them (anything with `collect`)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class Metrics:
    """Every metric the gateway exports (`GET /metrics`, Prometheus text format), and, with `vllm_names`, the
    same measurements under vLLM's names (`openai_api.vllm_metrics`), derived at each scrape."""

    def __init__(self, vllm_names: bool = True) -> None:
        self.vllm_names = vllm_names
        # The models served now, for the vLLM view (set by the app: it reads the current config generation).
        self.catalog: Callable[[], Served] = Served
        self._base_of: dict[str, str] = {}  # every adapter seen, and its base (series outlive an unload)
        r = self.registry = CollectorRegistry(auto_describe=True)
        folder = os.environ.get(MULTIPROC_ENV)
        self.multiprocess_dir = Path(folder) if folder else None
        if self.multiprocess_dir is None:
            # The operator's first questions under load: memory (process_resident_memory_bytes), CPU seconds,
            # open file descriptors against their limit (process_open_fds, process_max_fds), from /proc.
            ProcessCollector(registry=r)
            self.exported = r
        else:
            # What /metrics shows: every worker's values from their files, and every process's /proc figures.
            self.exported = CollectorRegistry(auto_describe=True)
            # (prometheus_client leaves this constructor unannotated; called through Any for mypy strict)
            merged: Any = MultiProcessCollector
            merged(self.exported, path=str(self.multiprocess_dir))
            self.exported.register(GatewayProcessCollector(self.multiprocess_dir))
        self.requests = Counter("openai_api_requests", "HTTP requests by route template, model and status.",
                                ["route", "model", "status"], registry=r)
        # livesum: with workers, the host's figure (what is in flight in the processes alive now).
        self.in_flight = Gauge("openai_api_requests_in_flight", "HTTP requests being served now.", registry=r,
                               multiprocess_mode="livesum")
        self.model_in_flight = Gauge("openai_api_model_requests_in_flight",
                                     "Generations (Triton sequences) in flight per model.",
                                     ["model"], registry=r, multiprocess_mode="livesum")
        # The priority scheduler's queues (http.scheduler; --max-queue-per-model).
        self.queued = Gauge("openai_api_queued_requests", "Requests waiting for an in-flight slot, by model and "
                            "priority class (interactive, standard, batch).", ["model", "class"], registry=r,
                            multiprocess_mode="livesum")
        self.batch_share = Gauge("openai_api_batch_slot_share", "The batch class's share of each in-flight limit "
                                 "per model, as the adaptive batch share (--batch-share-adaptive) set it last.",
                                 ["model"], registry=r, multiprocess_mode="liveall")
        self.latency = Histogram("openai_api_request_duration_seconds",
                                 "End-to-end request latency (until the last byte), by route and model.",
                                 ["route", "model"], buckets=REQUEST_BUCKETS, registry=r)
        self.ttft = Histogram("openai_api_time_to_first_token_seconds",
                              "From the request's arrival to the first token from Triton.", ["model"],
                              buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("openai_api_inter_token_latency_seconds",
                             "Time between streamed chunks from Triton, per token.", ["model"],
                             buckets=ITL_BUCKETS, registry=r)
        self.prompt_tokens = Counter("openai_api_prompt_tokens", "Prompt / input tokens sent to Triton.",
                                     ["model"], registry=r)
        self.completion_tokens = Counter("openai_api_completion_tokens", "Tokens generated by Triton.",
                                         ["model"], registry=r)
        # Per Triton sequence (a generation; an encoder call): its phase while in flight (waiting = sent, no output
        # yet: queued or prefilling in Triton; running = output streaming), its duration, its tokens, how it ended.
        self.sequences_in_flight = Gauge("openai_api_sequences_in_flight", "Triton sequences in flight per model "
                                         "and phase (waiting: sent, no output yet; running: output streaming).",
                                         ["model", "phase"], registry=r, multiprocess_mode="livesum")
        self.sequence_duration = Histogram("openai_api_sequence_duration_seconds", "From the request's arrival to "
                                           "the end of one Triton sequence.", ["model"], buckets=SEQUENCE_BUCKETS,
                                           registry=r)
        self.sequence_prompt_tokens = Histogram("openai_api_sequence_prompt_tokens", "Prompt tokens per Triton "
                                                "sequence.", ["model"], buckets=TOKEN_BUCKETS, registry=r)
        self.sequence_generation_tokens = Histogram("openai_api_sequence_generation_tokens", "Tokens generated per "
                                                    "Triton sequence.", ["model"], buckets=TOKEN_BUCKETS, registry=r)
        self.sequences_finished = Counter("openai_api_sequences_finished", "Triton sequences ended, by model and "
                                          "reason (stop, length, abort, error).", ["model", "reason"], registry=r)
        # Of the prompt tokens, those the backend reported reading from its KV cache instead of computing them
        # (TensorRT-LLM's reused blocks x the model's tokens_per_block); a backend that cannot say adds nothing.
        self.cached_prompt_tokens = Counter("openai_api_cached_prompt_tokens", "Prompt tokens Triton reported "
                                            "reading from its KV cache (prefix reuse), as its backend counts them.",
                                            ["model"], registry=r)
        self.triton_errors = Counter("openai_api_triton_errors", "Failed Triton calls by model and error code.",
                                     ["model", "code"], registry=r)
        # LoRA adapters served as models (their tokens are in the token counters under the adapter's name):
        # sequences generated on each, weights sent to Triton, and Triton LoRA cache misses answered by resending.
        self.lora_events = Counter("openai_api_lora_events", "LoRA adapter events by base model, adapter and event "
                                   "(requests, weights_sent, cache_misses).", ["model", "adapter", "event"], registry=r)
        self.rejected = Counter("openai_api_rejected_requests",
                                "Requests and connections refused before reaching a model (overload, body too large, "
                                "draining, header too large, header or body timeout, connection limit, a full queue, "
                                "shed or timed out in the queue).",
                                ["reason"], registry=r)

        # Images in chat (services.images): what was taken, how big, how long the fetches took, what was refused.
        self.images = Counter("openai_api_images", "Images taken into requests, by source (url, data, cache).",
                              ["source"], registry=r)
        self.image_bytes = Counter("openai_api_image_bytes", "Bytes of images read (fetched, or decoded from data "
                                   "URLs), by source.", ["source"], registry=r)
        self.image_fetch_seconds = Histogram("openai_api_image_fetch_seconds",
                                             "Time to fetch one image URL (redirects included), refused or not.",
                                             buckets=IMAGE_FETCH_BUCKETS, registry=r)
        self.image_refusals = Counter("openai_api_image_refusals", "Image parts refused, by reason.", ["reason"],
                                      registry=r)

        # Config reloads (SIGHUP or a changed file, `openai_api.reload`): applied, or refused (the old config stays).
        self.config_reloads = Counter("openai_api_config_reloads", "Model config reloads by result (ok, refused).",
                                      ["result"], registry=r)

        # Routing over replicas (openai_api.triton.replicas / routing): why each request's first replica was
        # chosen, and each replica's load as routing sees it (scraped from Triton where configured).
        self.routing_decisions = Counter("openai_api_routing_decisions", "Replica choices by model, policy and "
                                         "reason (prefix, session, imbalance, no_match, all_down, or the policy "
                                         "name).", ["model", "policy", "reason"], registry=r)
        self.replica_load_gauge = Gauge("openai_api_replica_load", "A replica's load score as routing sees it.",
                                        ["model", "replica"], registry=r, multiprocess_mode="max")
        self.replica_in_flight = Gauge("openai_api_replica_requests_in_flight", "This gateway's requests in "
                                       "flight per replica.", ["model", "replica"], registry=r,
                                       multiprocess_mode="livesum")
        self.replica_triton_in_flight = Gauge("openai_api_replica_triton_in_flight", "Requests the replica's "
                                              "Triton reported holding at the last scrape.", ["model", "replica"],
                                              registry=r, multiprocess_mode="max")
        self.replica_kv_fraction = Gauge("openai_api_replica_kv_cache_fraction", "The replica's KV-cache fill "
                                         "fraction at the last scrape (TensorRT-LLM).", ["model", "replica"],
                                         registry=r, multiprocess_mode="max")

    def replica_load(self, model: str, replica: str, load: float, own: int, triton: float | None,
                     kv: float | None) -> None:
        """One replica's figures (called by the scrape loop every `routing.scrape_interval_s`)."""
        self.replica_load_gauge.labels(model, replica).set(load)
        self.replica_in_flight.labels(model, replica).set(own)
        if triton is not None:
            self.replica_triton_in_flight.labels(model, replica).set(triton)
        if kv is not None:
            self.replica_kv_fraction.labels(model, replica).set(kv)

    def forget_replica(self, model: str, replica: str) -> None:
        """A retired replica's series leave /metrics."""
        for g in (self.replica_load_gauge, self.replica_in_flight, self.replica_triton_in_flight,
                  self.replica_kv_fraction):
            try:
                g.remove(model, replica)
            except KeyError:
                pass

    def rejected_connection(self, reason: str) -> None:
        """A connection closed by the connection guard (`http.connections`: `header_too_large`, `header_timeout`,
        `body_timeout`, `connection_evicted`, `connection_limit`)."""
        self.rejected.labels(reason).inc()

    def sequence_metrics(self, model: str) -> SequenceMetrics:
        """`model`'s per-sequence children (made now, so its series read 0 before its first request)."""
        return SequenceMetrics(self, model)

    def served(self) -> Served:
        """The catalog, with every adapter seen so far mapped to its base (an unloaded adapter's series stay)."""
        served = self.catalog()
        self._base_of.update(served.base_of)
        return Served(served.models, served.adapters, dict(self._base_of))

    def render(self, vllm_only: bool = False) -> bytes:
        """The exposition: every family, then the vLLM-named view (when on); `vllm_only`: the view alone."""
        if not self.vllm_names:
            return generate_latest(self.exported)
        families = list(self.exported.collect())
        view = vllm_families(families, self.served(), time.time())
        return generate_latest(_Families(view if vllm_only else families + view))


class SequenceMetrics:
    """One model's per-sequence children, cached (`.labels()` validates and locks on every call). Per sequence:
    a handful of updates, none per token."""

    __slots__ = ("duration", "finished", "generation_tokens", "prompt_tokens", "running", "waiting")

    def __init__(self, metrics: Metrics, model: str) -> None:
        phases = metrics.sequences_in_flight
        self.waiting, self.running = (phases.labels(model, p) for p in PHASES)
        self.duration = metrics.sequence_duration.labels(model)
        self.prompt_tokens = metrics.sequence_prompt_tokens.labels(model)
        self.generation_tokens = metrics.sequence_generation_tokens.labels(model)
        self.finished = {reason: metrics.sequences_finished.labels(model, reason) for reason in FINISH_REASONS}


class RequestStats:
    """What one request learnt about itself on the way: filled in by the layers below the outermost
    middleware, which owns it (one per HTTP request, never shared between requests).

    `status` is the status of the response start as sent (0 until then); `complete` turns true when
    the last body message (`more_body` false) is handed to the server, so the guard can tell a client
    that left mid-response (499) from one that closed after reading everything."""

    __slots__ = ("complete", "completion_tokens", "disconnected", "event_stream", "model", "object_id",
                 "on_first_token", "priority_class", "prompt_tokens", "request_id", "span_id", "start", "status",
                 "trace_id", "ttft")

    def __init__(self, start: float, request_id: str = "") -> None:
        self.start = start
        self.request_id = request_id
        self.model = ""
        # The scheduler class admission gave it (`interactive`, `standard`, `batch`; "" before): the Triton adapters
        # send it as the request's `priority` (`triton.wire.priority_for`).
        self.priority_class = ""
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.disconnected = False
        self.status = 0
        self.complete = False
        self.event_stream = False  # the response is text/event-stream (set with `status`)
        # The id the gateway gave what this request made (a response's `resp_...`): logged beside the request id.
        self.object_id = ""
        self.ttft = 0.0  # seconds from the arrival to the first token of its first sequence (0: none)
        # Called once with `ttft` when it is set (the scheduler's adaptive batch share reads the interactive class's).
        self.on_first_token: Callable[[float], None] | None = None
        # The server span's ids (hex) while tracing is on, for the access log.
        self.trace_id = ""
        self.span_id = ""


_CURRENT: ContextVar[RequestStats | None] = ContextVar("openai_api_request_stats", default=None)


def current_stats() -> RequestStats | None:
    return _CURRENT.get()


def bind_stats(stats: RequestStats) -> Token[RequestStats | None]:
    """Make `stats` what `current_stats()` returns in this context (and the tasks it creates)."""
    return _CURRENT.set(stats)


def unbind_stats(token: Token[RequestStats | None]) -> None:
    _CURRENT.reset(token)
