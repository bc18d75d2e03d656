"""Process-wide settings: every one declared once, here, with its default, its one line of why, its CLI
flag and its environment variable.

`Settings` is the one model. Each field carries an `Option` (help text, flag, unit; `openai_api.options`
derives the rest from it); from them come the argparse parser (`add_arguments`), the environment
(`OPENAI_API_<FIELD>`, e.g. `OPENAI_API_MAX_IN_FLIGHT=64`; lists comma-separated), and the docs' table of flags
(`markdown_table`, in docs/reference/cli.md, checked by a test). Precedence:
a flag given on the command line, then the environment, then the default. The model config file
(`model_config.json`, see `openai_api.config`) is separate: settings are how this process runs, the
config is which models it serves.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, get_origin

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from openai_api.config import BUNDLED_CONFIG
from openai_api.options import (
    Option,
    add_model_arguments,
    env_name,
    field_options,
    flag_of,
    from_env_text,
    model_markdown_table,
)
from openai_api.stored.factory import store_kind

UVICORN_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS has one). A container's CPU quota
    (cgroup cpu.max) is not an affinity and is not seen here: there, give the number."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def worker_count(text: str) -> int:
    """`--workers` text: a number, or `auto` for the usable cores."""
    text = text.strip().lower()
    if text == "auto":
        return usable_cores()
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"expected a number of processes or auto, not {text!r}") from None


class Settings(BaseModel):
    """How this gateway process runs. Construct it with keywords (tests do), or from the command line and
    the environment with `from_args`."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    # --- server ------------------------------------------------------------------------------------------
    config_file: Annotated[Path, Option("the model config JSON", metavar="FILE",
                                        shown_default="the bundled model_config.json")] = BUNDLED_CONFIG
    host: Annotated[str, Option("address to listen on", metavar="HOST")] = "localhost"
    port: Annotated[int, Option("port to listen on", metavar="PORT")] = 5100
    workers: Annotated[int, Option(
        "gateway processes serving the one port (a number, or auto = the usable cores), under a supervisor that "
        "restarts a worker that dies and drains them all on SIGTERM. Limits (--max-in-flight, "
        "--max-in-flight-per-model, --max-connections, --cpu-workers) and replica health are per worker; "
        "/metrics sums them all. 1 = one process, no supervisor", metavar="N",
        parse=worker_count)] = Field(default=1, ge=1)
    worker_timeout_s: Annotated[float, Option(
        "with --workers > 1: a worker whose event loop has not run for this many seconds (blocked, hung, "
        "stopped) is killed and started again, as a worker that dies is; 0 = never", flag="--worker-timeout",
        metavar="SECONDS")] = Field(default=30.0, ge=0)
    api_keys: Annotated[list[str], Option(
        "accept this API key (repeatable; the environment takes a comma-separated list). With keys set, every "
        "route except /health, /health/ready and /ping needs `Authorization: Bearer KEY`. A flag shows in `ps`: "
        "prefer the environment or --api-key-file", flag="--api-key",
        metavar="KEY", env="OPENAI_API_KEYS")] = Field(default_factory=list)
    api_key_file: Annotated[Path | None, Option(
        "accept the API keys in this file, one a line (blank lines and lines starting with # skipped): unlike "
        "--api-key, they do not show in `ps` (a Kubernetes or Docker secret mounted as a file); read at start",
        metavar="FILE", shown_default="none")] = None
    cors_origins: Annotated[list[str], Option(
        "allow cross-origin requests from ORIGIN (repeatable)", flag="--cors-origin", metavar="ORIGIN",
        shown_default="CORS off")] = Field(default_factory=list)

    # --- the embedded Triton ---------------------------------------------------------------------------------
    embedded_triton: Annotated[bool, Option(
        "prepare the bundled models and start tritonserver (from the nvidia-pytriton wheel) with "
        "--model-repository, pointing every configured model at it; it is supervised (restarted if it dies)",
        group="triton")] = False
    model_repository: Annotated[Path | None, Option("model repository of the embedded Triton", group="triton",
                                                    metavar="DIR", shown_default="triton_models/")] = None
    triton_grpc_port: Annotated[int | None, Option("gRPC port of the embedded Triton", group="triton",
                                                   metavar="PORT", shown_default="a free one")] = None
    triton_http_port: Annotated[int | None, Option("HTTP port of the embedded Triton", group="triton",
                                                   metavar="PORT", shown_default="a free one")] = None

    # --- limits, overload and timeouts -----------------------------------------------------------------------
    max_body_bytes: Annotated[int, Option(
        "largest request body (Content-Length, or counted while a chunked body streams); 413 past it. 2,048 "
        "embedding inputs of ~8 KB fit; the body is held in memory", group="limits", metavar="N")] = 16 * 1024 * 1024
    max_messages: Annotated[int, Option(
        "chat messages per request; 400 past it (more turns than any context holds; bounds template work)",
        group="limits", metavar="N")] = 2048
    max_embedding_inputs: Annotated[int, Option("inputs per embeddings request (OpenAI's own limit); 400 past it",
                                                group="limits", metavar="N")] = 2048
    max_rerank_documents: Annotated[int, Option("documents per rerank request (Cohere's limit); 400 past it",
                                                group="limits", metavar="N")] = 1000
    max_in_flight: Annotated[int, Option(
        "requests (POSTs) in flight in one gateway process, a request that fans out counting once per Triton "
        "sequence; an immediate 429 with Retry-After past it, never a queue. Per worker: a host with --workers N "
        "admits up to N x this", group="limits", metavar="N")] = 512
    max_in_flight_per_model: Annotated[int, Option(
        "generations (Triton sequences) in flight per model: a request takes one per prompt x n; an immediate "
        "429 past it, a 400 (too_many_sequences) for a request that could never fit. A Triton LLM instance "
        "batches tens to a few hundred sequences. Per worker, like --max-in-flight", group="limits",
        metavar="N")] = 256
    max_queue_per_model: Annotated[int, Option(
        "requests that may wait per model for an in-flight slot, ordered by priority class (interactive, standard, "
        "batch) and round-robin between keys; a full queue sheds its lowest class first. 0 = no queue: an "
        "immediate 429 past a limit (docs/guides/batches.md)", group="limits", metavar="N")] = Field(default=0, ge=0)
    queue_timeout_s: Annotated[float, Option(
        "how long a queued request waits for a slot before its 429", group="limits", flag="--queue-timeout",
        metavar="SECONDS")] = Field(default=30.0, gt=0)
    standard_slot_share: Annotated[float, Option(
        "the part of each in-flight limit requests of the standard class may fill (the rest is kept for the "
        "interactive class)", group="limits", metavar="FRACTION")] = Field(default=1.0, gt=0, le=1)
    batch_slot_share: Annotated[float, Option(
        "the part of each in-flight limit requests of the batch class (the Batch API's lines, service_tier flex) "
        "may fill, so that interactive and standard requests find slots free", group="limits",
        metavar="FRACTION")] = Field(default=0.5, gt=0, le=1)
    batch_share_adaptive: Annotated[bool, Option(
        "move the batch class's share of each model's in-flight limit with the interactive class's time to first "
        "token: widened one slot at a time (up to --batch-slot-share) while it stays within --batch-ttft-target "
        "of its level without batch work, cut by a quarter (down to --batch-share-min) when it rises "
        "(docs/guides/batches.md)", group="limits")] = False
    batch_share_min: Annotated[float, Option(
        "the adaptive batch share's floor, and where it starts", group="limits", metavar="FRACTION")] = Field(
        default=0.25, gt=0, le=1)
    batch_ttft_target: Annotated[float, Option(
        "the adaptive batch share keeps the interactive class's time to first token (its --batch-ttft-quantile) "
        "within this factor of its level without batch work", group="limits", metavar="RATIO")] = Field(
        default=1.1, ge=1)
    batch_ttft_quantile: Annotated[float, Option(
        "which quantile of the interactive time to first token the adaptive batch share holds to "
        "--batch-ttft-target: 0.5 the median, 0.99 the tail (any request of a window past the target x the "
        "unloaded p99 narrows the share)", group="limits", metavar="Q")] = Field(default=0.5, gt=0, le=1)
    batch_prefills_per_model: Annotated[int, Option(
        "batch-class generations per model that may be starting at once (admitted, no first token yet: their "
        "prompts' prefill), the rest wait in the queue, so that a chat arriving next finds few batch prompts "
        "ahead of its own in the engine; 0 = no limit (docs/guides/batches.md)", group="limits",
        metavar="N")] = Field(default=0, ge=0)
    retry_after_s: Annotated[int, Option("the Retry-After of a 429", group="limits", flag="--retry-after",
                                         metavar="SECONDS")] = 1
    header_timeout_s: Annotated[float, Option(
        "a connection whose request line and headers are not complete this long after it opened (or began its "
        "next request) is closed, so silent and slow-header connections cannot pile up; 0 = never",
        group="limits", flag="--header-timeout", metavar="SECONDS")] = 10.0
    max_header_bytes: Annotated[int, Option(
        "largest request line and headers together; a 431 past it, counted as the bytes arrive (the HTTP "
        "parser's cost grows faster than a header's size); 0 = no cap", group="limits",
        metavar="N")] = Field(default=64 * 1024, ge=0)
    body_timeout_s: Annotated[float, Option(
        "a request body must be complete this long after its headers, plus one second per 64 KiB received (a big "
        "upload that keeps coming is never cut, a trickle is); past it a 408, and the connection is closed, "
        "also after an early answer such as a 401; 0 = never", group="limits", flag="--body-timeout",
        metavar="SECONDS")] = Field(default=30.0, ge=0)
    keep_alive_timeout_s: Annotated[float, Option(
        "an idle keep-alive connection is closed after this many seconds (uvicorn's default is 5): an agent that "
        "ran a tool for a while keeps its connection, so its next turn reaches the same worker (whose prompt "
        "cache holds the session) with --workers", group="limits", flag="--keep-alive-timeout",
        metavar="SECONDS")] = Field(default=30.0, gt=0)
    max_connections: Annotated[int, Option(
        "open connections at most (kept below the open-files limit, which is raised to fit): a new one past it "
        "replaces the connection that has waited longest without being served (reading a request, or idle), or "
        "is closed at once when every connection is being served; 0 = no cap. Per worker", group="limits",
        metavar="N")] = 10000
    cpu_workers: Annotated[int, Option(
        "threads that render chat templates and tokenize big inputs off the event loop; bounded so a burst of "
        "big requests cannot take every core from it. Per worker", group="limits", metavar="N",
        shown_default="up to 4 (cores)")] = Field(default_factory=lambda: min(4, os.cpu_count() or 1), ge=1)
    template_timeout_s: Annotated[float, Option(
        "longest one chat-template render may take; past it the request is a 400 (template_limit_exceeded)",
        group="limits", flag="--template-timeout", metavar="SECONDS")] = 10.0
    template_max_chars: Annotated[int, Option(
        "largest value (the prompt included) one chat-template render may build (twice the largest body); past "
        "it, a 400", group="limits", metavar="N")] = 32 * 1024 * 1024
    prompt_cache_mb: Annotated[float, Option(
        "memory for the token ids of prompt segments already seen (a long conversation's earlier turns), so each "
        "turn tokenizes only what it adds; exact, whatever the model. Per worker; with --workers > 1 the workers "
        "also share the ids they tokenize, up to this much again in files in the supervisor's run directory (the "
        "system's temporary folder), so a turn that lands on another worker is not tokenized again; 0 = off",
        group="limits",
        metavar="MB")] = Field(default=128.0, ge=0)
    stream_idle_timeout_s: Annotated[float | None, Option(
        "a generation that had a response from Triton and then none for this long ends with a 504 (or an SSE "
        "error event once streaming); before its first response silence is normal (queued, prefilling, or a "
        "one-piece answer) and only a Triton that also fails a ServerLive probe ends it; 0 = never",
        group="limits", flag="--stream-idle-timeout", metavar="SECONDS")] = 60.0
    shutdown_grace_s: Annotated[float, Option(
        "on SIGTERM, how long requests in flight may finish while new ones get 503; then streams still running "
        "get a final shutting_down error event", group="limits", flag="--shutdown-grace", metavar="SECONDS")] = 30.0

    # --- keys and quotas (openai_api/quota/, docs/guides/keys-quotas.md) ----------------------------------------
    keys_file: Annotated[Path | None, Option(
        "per-key policies (YAML or JSON): name, team, secret (SHA-256 or an environment variable), allowed models, "
        "requests and tokens per minute, concurrent requests, token budgets per day and month, priority, admin; "
        "reloaded on SIGHUP and when it changes. --api-key keys stay valid, without limits", group="keys",
        metavar="FILE", shown_default="none")] = None
    redis_url: Annotated[str | None, Option(
        "keep the keys' counters in this Redis or Valkey (redis://HOST:PORT/DB), shared by every worker and every "
        "gateway replica using it; without it they live in this process, or in the supervisor with --workers",
        group="keys", metavar="URL", shown_default="none")] = None
    redis_fail_mode: Annotated[Literal["open", "closed"], Option(
        "when Redis does not answer (refused, or --redis-timeout passed): open = serve and count in this process "
        "(logged), closed = 503 for keys with limits", group="keys")] = "open"
    redis_timeout_s: Annotated[float, Option(
        "each Redis call's budget, in milliseconds; a call past it fails alone, three in a row (or a refused "
        "connection) mark Redis down for a second", group="keys", flag="--redis-timeout", metavar="MS", unit=0.001,
        env="OPENAI_API_REDIS_TIMEOUT_MS", old_env="OPENAI_API_REDIS_TIMEOUT_S")] = Field(default=1.0, gt=0)

    # --- streaming -------------------------------------------------------------------------------------------
    stream_flush_interval_s: Annotated[float, Option(
        "SSE events arriving within this many milliseconds of the previous socket write share the next write "
        "(each stays its own event); the first event and slower streams are never held back; 0 = one write per "
        "event. A write costs more CPU than all of the gateway's per-token work", group="streaming",
        flag="--stream-flush-interval", metavar="MS", unit=0.001, env="OPENAI_API_STREAM_FLUSH_INTERVAL_MS",
        old_env="OPENAI_API_STREAM_FLUSH_INTERVAL_S")] = 0.002

    # --- APIs -----------------------------------------------------------------------------------------------
    responses_store: Annotated[int, Option(
        "keep up to this many /v1/responses answers (with store: true), each owned by the key that made it, for "
        "previous_response_id, GET and DELETE /v1/responses/{id} and its input_items; 0 = no store "
        "(previous_response_id is then a 400). Oldest evicted first", group="server", metavar="N")] = Field(
        default=0, ge=0)
    responses_background_max: Annotated[int, Option(
        "how many /v1/responses with background: true one key may have running at once in a worker (each also "
        "holds an in-flight slot of its model until it ends); past it a 429. Needs --responses-store",
        group="server", metavar="N")] = Field(default=8, ge=1)
    responses_ws_max_age_s: Annotated[float, Option(
        "a Responses WebSocket connection lasts at most this long (OpenAI's mode: 60 minutes): then, once the "
        "response it is generating has finished, it gets an error event websocket_connection_limit_reached and "
        "is closed; the client opens a new one", group="server", flag="--responses-ws-max-age",
        metavar="SECONDS")] = Field(default=3600.0, gt=0)
    responses_store_url: Annotated[str | None, Option(
        "where the stored responses live: memory (this process), sqlite:///DIR (a file in DIR shared by every "
        "worker of this host, kept across restarts) or redis://HOST:PORT/DB (shared by every gateway using it)",
        group="server", metavar="URL",
        shown_default="memory; with --workers > 1 an SQLite file in the supervisor's run directory")] = None
    responses_store_max_bytes: Annotated[int, Option(
        "the stored responses' total size (their JSON); oldest evicted first past it", group="server",
        metavar="N")] = Field(default=256 * 1024 * 1024, gt=0)
    responses_store_ttl_s: Annotated[float, Option(
        "a stored response is forgotten this long after it was made (OpenAI keeps them 30 days)", group="server",
        flag="--responses-store-ttl", metavar="SECONDS", shown_default="2592000 (30 days)")] = Field(
        default=30 * 86400.0, gt=0)
    batch_dir: Annotated[Path | None, Option(
        "where the Batch API (/v1/files, /v1/batches, /v1/messages/batches) keeps its files and job state: an "
        "SQLite file and a files/ folder, made on first use, kept across restarts and shared by the workers of "
        "this host (several gateways: --batch-store-url, docs/guides/batches.md)",
        group="server", metavar="DIR",
        shown_default="$XDG_STATE_HOME/openai-api/batches (~/.local/state/openai-api/batches)")] = None
    batch_store_url: Annotated[str | None, Option(
        "keep the Batch API's jobs, leases and answers in this Redis or Valkey (redis://HOST:PORT/DB), shared by "
        "every gateway using it, each running jobs made through any of them; files stay in --batch-dir, which "
        "must then be a volume every gateway mounts", group="server", metavar="URL",
        shown_default="none: SQLite in --batch-dir")] = None
    batch_max_file_bytes: Annotated[int, Option(
        "largest file /v1/files takes (a 400 past it); an upload is also bounded by --max-body-bytes",
        group="server", metavar="N")] = Field(default=16 * 1024 * 1024, gt=0)
    batch_max_lines: Annotated[int, Option(
        "requests per batch input file (OpenAI's limit; Anthropic's message batches take up to 100,000): a "
        "message batch past it is a 400, a batch over a longer file ends failed (too_many_tasks)", group="server",
        metavar="N")] = Field(default=50_000, gt=0)
    batch_max_jobs_per_key: Annotated[int, Option(
        "batch jobs one key may have unfinished at once; a 400 past it", group="server", metavar="N")] = Field(
        default=16, gt=0)
    batch_concurrency: Annotated[int, Option(
        "batch lines this gateway process runs at once (each through the routes in the batch priority class, so "
        "they also keep to --batch-slot-share); 0 = this process runs no batch jobs (another gateway on the "
        "same store does). Shared fairly: round-robin between the keys whose jobs wait for a slot, then between "
        "each key's jobs", group="server", metavar="N")] = Field(default=8, ge=0)
    batch_running_jobs: Annotated[int, Option(
        "batch jobs this gateway process runs at once (they share --batch-concurrency); a key running two or more "
        "gives one back when another key's job waits for a place", group="server", metavar="N")] = Field(
        default=8, gt=0)
    ready_models: Annotated[Literal["any", "all", "none"], Option(
        "what /health/ready (and /ping) need besides a loaded config and no drain: any = at least one configured "
        "model ready (vLLM and NIM serve one model: ready when it is), all = every model, none = the gateway "
        "alone. Per-model readiness is in /v1/models and /metrics", group="server")] = "any"
    keep_billing_header: Annotated[bool, Option(
        "keep Claude Code's `x-anthropic-billing-header: ...` system line in /v1/messages prompts; by default it is "
        "left out, since its hash changes with every request and no prompt or KV cache could then hit",
        group="server")] = False
    allow_runtime_lora: Annotated[bool, Option(
        "serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's shapes): adapters from a model's "
        "adapters_dir are loaded and unloaded while the gateway runs; with a keys file only admin keys may. "
        "Per worker process, and in memory (the adapters_dir scan brings them back at a restart); a model's "
        "`persist_adapters` records them for a restart and for the other workers, which follow the record within "
        "about a second",
        group="server")] = False

    # --- images in chat (services.images, images.fetch) -------------------------------------------------------
    image_allowed_hosts: Annotated[list[str], Option(
        "fetch image URLs from this host name, address or network (CIDR) even when it is loopback, private or "
        "link-local (repeatable; the environment takes a comma-separated list)", group="images",
        flag="--image-allowed-hosts", metavar="HOST", shown_default="none: public addresses only")] = Field(
        default_factory=list)
    image_fetch: Annotated[Literal["public", "allowed_only", "off"], Option(
        "which image URLs are fetched: public = public addresses and --image-allowed-hosts; allowed_only = only "
        "the hosts and networks in --image-allowed-hosts (a name not listed is refused unresolved, unless "
        "addresses or networks are listed); "
        "off = none: images come as data URLs only", group="images")] = "public"
    image_allow_private: Annotated[bool, Option(
        "fetch image URLs from private addresses (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7); loopback, "
        "link-local and cloud metadata stay refused unless named in --image-allowed-hosts",
        group="images")] = False
    image_fetch_timeout_s: Annotated[float, Option(
        "the whole fetch of one image URL (every redirect, connect, header and byte) must end within this; "
        "else a 400 (timeout)", group="images", flag="--image-fetch-timeout", metavar="SECONDS")] = Field(
        default=5.0, gt=0)
    image_max_bytes: Annotated[int, Option(
        "largest image, fetched (counted while reading) or in a data URL (which the body cap, --max-body-bytes, "
        "also bounds); 400 past it", group="images", metavar="N")] = Field(default=20 * 1024 * 1024, gt=0)
    image_max_pixels: Annotated[int, Option(
        "largest image in pixels (width x height), read from its header before decoding: a decompression bomb "
        "is refused unopened; 400 past it", group="images", metavar="N")] = Field(default=50_000_000, gt=0)
    max_images_per_request: Annotated[int, Option(
        "image parts per request, every message counted; 400 past it", group="images", metavar="N")] = Field(
        default=16, ge=0)
    image_max_redirects: Annotated[int, Option(
        "redirects followed per image URL, each hop checked like the URL itself; 0 = none", group="images",
        metavar="N")] = Field(default=3, ge=0)
    image_fetch_concurrency: Annotated[int, Option(
        "image URLs fetched at once by one gateway process (more wait their turn, within their timeout)",
        group="images", metavar="N")] = Field(default=16, ge=1)
    image_cache_bytes: Annotated[int, Option(
        "verified images kept in memory by content hash (and URLs for a minute), so the same image in a "
        "multi-turn conversation is fetched and decoded once; 0 = no cache", group="images",
        metavar="N")] = Field(default=64 * 1024 * 1024, ge=0)

    # --- logging ---------------------------------------------------------------------------------------------
    verbose: Annotated[bool, Option("log more about requests, models and Triton (debug level)",
                                    group="logging")] = False
    uvicorn_log_level: Annotated[Literal["critical", "error", "warning", "info", "debug", "trace"], Option(
        "uvicorn's own log level", group="logging")] = "info"
    access_log: Annotated[bool, Option(
        "one structured access-log line per request (logger openai_api.access)", group="logging",
        flag="--no-access-log", negate=True)] = True
    log_prompts: Annotated[bool, Option(
        "with --verbose, log request bodies (prompts) at debug level; never otherwise", group="logging")] = False
    otlp_traces_endpoint: Annotated[str | None, Option(
        "export OpenTelemetry traces (OTLP/HTTP protobuf) to this URL, e.g. http://collector:4318/v1/traces; "
        "without it tracing is off unless OTEL_EXPORTER_OTLP_TRACES_ENDPOINT or OTEL_EXPORTER_OTLP_ENDPOINT is "
        "set (the other OTEL_* variables apply). Traced requests carry W3C traceparent into Triton",
        group="logging", metavar="URL", shown_default="none")] = None

    log_format: Annotated[Literal["text", "json"], Option(
        "text: one line per record (`time level logger: message`); json: one JSON object per line with the time, "
        "level, logger and message, and, inside a request, its request id and (tracing on) trace and span ids; the "
        "access log's fields (key name, model, status, timings, tokens) as fields of their own", group="logging")
    ] = "text"

    # --- metrics, status page and docs ----------------------------------------------------------------------------
    vllm_metrics: Annotated[bool, Option(
        "also show every measurement under vLLM's metric names (vllm:num_requests_waiting, "
        "vllm:time_to_first_token_seconds, ... label model_name) in /metrics, for the dashboards, autoscaler rules "
        "and endpoint pickers that read them; derived at each scrape, nothing recorded twice",
        group="observability", flag="--no-vllm-metrics", negate=True)] = True
    open_vllm_metrics: Annotated[bool, Option(
        "with keys set, answer GET /metrics without a key too, with the vLLM-named families alone (models and "
        "adapters, never a key's name): the inference extension's endpoint picker scrapes pods without credentials. "
        "A key marked metrics or admin still reads everything", group="observability")] = False
    status_page: Annotated[bool, Option(
        "serve GET /status: a read-only HTML page of models, replicas, adapters, requests in flight and queued, "
        "recent error rates and key usage (with keys set: admin keys only; a browser may send the key as the "
        "password of HTTP basic auth)", group="observability", flag="--no-status-page", negate=True)] = True
    docs: Annotated[bool, Option(
        "serve the API's interactive docs (/docs: Swagger UI, /redoc) with their scripts and styles from the "
        "gateway itself (no CDN: they work offline); /openapi.json stays", group="observability", flag="--no-docs",
        negate=True)] = True

    # Routes that stay reachable without a key; everything else in the route table is guarded (/metrics
    # included: Prometheus sends the key with `authorization: {credentials: KEY}`). Not a setting.
    open_paths: frozenset[str] = Field(default=frozenset({"/health", "/health/ready", "/ping"}), exclude=True)

    @field_validator("responses_store_url")
    @classmethod
    def _store_url(cls, value: str | None) -> str | None:
        if value is not None:
            store_kind(value)  # ValueError naming what is accepted
        return value or None

    @field_validator("batch_store_url")
    @classmethod
    def _batch_store_url(cls, value: str | None) -> str | None:
        if value and store_kind(value) != "redis":
            raise ValueError(f"{value!r} is not a Redis URL: redis://HOST:PORT/DB (without it, SQLite in --batch-dir)")
        return value or None

    # What `from_args` found worth a warning (a variable under its former name), for the caller to log once
    # logging is set up.
    _notices: list[str] = PrivateAttr(default_factory=list)

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> Any:
        return worker_count(value) if isinstance(value, str) else value  # `Settings(workers="auto")` too

    @model_validator(mode="after")
    def _normalise(self) -> Settings:
        if self.workers > 1 and self.responses_store and self.responses_store_url is not None and \
                store_kind(self.responses_store_url) == "memory":
            # Refused rather than documented: with a shared listening socket any worker may take the
            # follow-up request, so previous_response_id would fail at random (N-1 times in N).
            raise ValueError(f"--responses-store-url memory keeps answers in one process's memory; with --workers "
                             f"{self.workers} a previous_response_id would reach another worker. Use sqlite:///DIR "
                             f"or redis://..., or leave it unset (the workers then share an SQLite file)")
        if self.image_fetch == "allowed_only" and not self.image_allowed_hosts:
            raise ValueError("--image-fetch allowed_only fetches only from --image-allowed-hosts, and none is given: "
                             "name the hosts, or use --image-fetch off for data URLs only")
        if self.stream_idle_timeout_s is not None and self.stream_idle_timeout_s <= 0:
            object.__setattr__(self, "stream_idle_timeout_s", None)
        if self.api_key_file is not None:
            keys = read_key_file(self.api_key_file)
            object.__setattr__(self, "api_keys", [*self.api_keys, *(k for k in keys if k not in self.api_keys)])
        if self.open_vllm_metrics:
            if not self.vllm_metrics:
                raise ValueError("--open-vllm-metrics opens the vLLM-named metrics, which --no-vllm-metrics turns "
                                 "off: drop one of them")
            object.__setattr__(self, "open_paths", self.open_paths | {"/metrics"})  # the route decides what it shows
        if self.log_prompts and not self.verbose:
            object.__setattr__(self, "log_prompts", False)  # prompts reach the logs only when asked twice
        object.__setattr__(self, "stream_flush_interval_s", max(self.stream_flush_interval_s, 0.0))
        return self

    def auth_mode(self) -> str:
        """How requests are authenticated, in words for the start-up log."""
        ways = [f"the keys file {self.keys_file}"] if self.keys_file is not None else []
        if self.api_keys:
            ways.append(f"{len(self.api_keys)} API key{'s' if len(self.api_keys) > 1 else ''}"
                        + (" (--api-key-file)" if self.api_key_file is not None else ""))
        return f"auth: {' and '.join(ways)}" if ways else "auth off: no API key, every route is open"

    def start_warnings(self) -> list[str]:
        """What the start-up log should warn about: variables under their former names, and serving every
        route without a key on an address other hosts can reach."""
        out = list(self._notices)
        if self.keys_file is None and not self.api_keys and self.host not in ("localhost", "127.0.0.1", "::1"):
            out.append(f"listening on {self.host} with no API key: anyone who can reach this port can use every "
                       "model; set --api-key-file, OPENAI_API_KEYS or --keys-file")
        return out

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from parsed flags (`add_arguments`) over the environment over the defaults. A bad value
        raises ValueError naming the flag or variable and why."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        notices: list[str] = []
        for name, opt in options():
            if opt.old_env is not None and env.get(opt.old_env, "") != "":
                new_name = env_name(name, opt)
                if env.get(new_name, "") != "":
                    notices.append(f"{opt.old_env} is ignored: {new_name} is set (the variable's new name)")
                else:
                    env = {**env, new_name: env[opt.old_env]}
                    notices.append(f"{opt.old_env} is read as {new_name} (milliseconds, as before); the old name "
                                   f"goes in the next release: rename it")
            given = getattr(args, name, None)
            if get_origin(cls.model_fields[name].annotation) is list:
                merged = list(given or [])
                raw = env.get(env_name(name, opt))
                merged += [v.strip() for v in raw.split(",") if v.strip()] if raw else []
                if merged:
                    values[name] = merged
                continue
            if given is not None:
                values[name] = given * opt.unit if opt.unit != 1.0 else given
                continue
            raw = env.get(env_name(name, opt))
            if raw is not None and raw != "":
                values[name] = from_env_text(cls, name, opt, raw)
        try:
            settings = cls(**values)
            settings._notices.extend(notices)
            return settings
        except ValidationError as e:
            err = e.errors()[0]
            name = str(err["loc"][0]) if err["loc"] else ""
            option = dict(options()).get(name)
            if option is None and isinstance(err.get("ctx", {}).get("error"), ValueError):
                raise ValueError(str(err["ctx"]["error"])) from None  # a rule across settings: in its own words
            where = f"{flag_of(name, option)} / {env_name(name, option)}" if option else "settings"
            raise ValueError(f"{where}: {err['msg']}") from None


def read_key_file(path: Path) -> list[str]:
    """The API keys in `path`: one a line, surrounding whitespace dropped, blank lines and `#` comments skipped.
    ValueError (naming the flag and the file) when it cannot be read or holds no key."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"--api-key-file {path}: cannot be read ({e.__class__.__name__}: {e})") from None
    keys = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    if not keys:
        raise ValueError(f"--api-key-file {path}: holds no key (one a line)")
    return keys


def options() -> list[tuple[str, Option]]:
    """(field name, Option) of every setting, in declaration order."""
    return field_options(Settings)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every setting as a flag (its default None: `from_args` tells "not given" from a value)."""
    add_model_arguments(parser, Settings)


def markdown_table() -> str:
    """The docs' table of flags (docs/reference/cli.md), generated from the settings (a test keeps it in step)."""
    return model_markdown_table(Settings)


if __name__ == "__main__":  # python -m openai_api.settings: the docs' table of flags
    print(markdown_table())
