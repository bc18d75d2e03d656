"""Process-wide settings (CLI flags and environment), separate from the model config file.

Every limit has a default that a real deployment can live with and one line of why; each one has a
CLI flag (see `openai_api.cli`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Settings:
    config_file: Path
    api_keys: list[str] = field(default_factory=list)
    host: str = "localhost"
    port: int = 5100
    # Routes that stay reachable without a key; everything else in the route table is guarded
    # (/metrics included: Prometheus sends the key with `authorization: {credentials: KEY}`).
    open_paths: frozenset[str] = frozenset({"/health", "/health/ready", "/ping"})
    cors_origins: list[str] = field(default_factory=list)

    # --- request limits --------------------------------------------------------------------------
    # 2,048 embedding inputs of ~8 KB each fit; anything bigger is abuse, and the body is held in memory.
    max_body_bytes: int = 16 * 1024 * 1024
    # Far more turns than any context window holds; bounds the template-rendering work per request.
    max_messages: int = 2048
    # OpenAI's own maximum number of inputs per embeddings request.
    max_embedding_inputs: int = 2048
    # Cohere's documented maximum number of documents per rerank request.
    max_rerank_documents: int = 1000

    # --- connections --------------------------------------------------------------------------------
    # A connection must send its request line and headers within this long of opening (or of starting
    # its next request), or it is closed: silent and slow-header connections cannot pile up.
    header_timeout_s: float = 10.0
    # Open connections beyond this are closed at once; kept below the process's open-files limit.
    max_connections: int = 10000

    # --- overload ----------------------------------------------------------------------------------
    # Requests (POSTs) in flight in the whole gateway; past it an immediate 429, never a queue.
    max_in_flight: int = 512
    # Requests in flight per model; a Triton LLM instance batches tens to a few hundred sequences.
    max_in_flight_per_model: int = 256
    # What a 429 tells the client to wait (Retry-After, seconds).
    retry_after_s: int = 1

    # --- CPU work off the event loop ---------------------------------------------------------------
    # Threads that render templates and tokenize big inputs; bounded so a burst of big requests cannot
    # take every core from the event loop.
    cpu_workers: int = field(default_factory=lambda: min(4, os.cpu_count() or 1))
    # One chat-template render may take this long and build values (the prompt included) of at most
    # this many characters; past either, the request is a 400. Twice the largest body a request may send.
    template_timeout_s: float = 10.0
    template_max_chars: int = 32 * 1024 * 1024

    # --- timeouts ----------------------------------------------------------------------------------
    # A generation that had a response from Triton and then none for this long is ended (504 before the
    # first byte, an SSE error event after). Before the first response only a Triton that also fails a
    # liveness probe is (see `StallGuard`): queueing and one-piece answers may take minutes. None or 0: off.
    stream_idle_timeout_s: float | None = 60.0

    # --- streaming -----------------------------------------------------------------------------------
    # SSE events arriving within this long of the previous socket write go out together in the next
    # one (each still its own event). A write costs more CPU than all the gateway's per-token work, so
    # an engine streaming faster than this saves most of them; slower streams and the first token are
    # never held back. At most this much delay on a fast stream; 0 writes every event at once.
    stream_flush_interval_s: float = 0.002
    # On SIGTERM: new requests get 503 while requests in flight get this long to finish.
    shutdown_grace_s: float = 30.0

    # --- logging -------------------------------------------------------------------------------------
    # Prompts and completions never reach the logs unless asked for (debug level only, even then).
    log_prompts: bool = False
    # One structured access-log line per request (logger `openai_api.access`).
    access_log: bool = True
