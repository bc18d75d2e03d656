"""uvicorn's server with a drain phase for graceful shutdown.

The first SIGTERM (or Ctrl-C) marks the app as draining: new requests get 503 (`shutting_down`) and
readiness fails, so a load balancer stops routing here, while requests in flight (streams included)
get up to `grace_s` seconds to finish. Then uvicorn's own shutdown runs (listening socket and idle
connections closed, lifespan shutdown). A second signal ends the drain at once; a third forces the
exit. The signal is handled rather than re-raised, so the process exits 0.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI

from openai_api.http.connections import EdgeLimits, guarded_protocol, raise_fd_limit
from openai_api.http.lifecycle import Lifecycle
from openai_api.settings import Settings
from openai_api.text.workers import map_big_allocations

logger = logging.getLogger("openai_api")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, *, lifecycle: Lifecycle, grace_s: float,
                 heartbeat: Callable[[], None] | None = None) -> None:
        super().__init__(config)
        self.lifecycle = lifecycle
        self.grace_s = grace_s
        self.drain_started: float | None = None
        self.heartbeat = heartbeat

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain_started is None:
            self.drain_started = time.monotonic()
            self.lifecycle.draining = True
            logger.info("signal %d: draining; %d requests in flight get up to %.0f s, new ones get 503",
                        sig, len(self.lifecycle.tasks), self.grace_s)
        elif not self.should_exit:
            logger.info("second signal: ending the drain now")
            self.config.timeout_graceful_shutdown = 1
            self.should_exit = True
        else:
            self.force_exit = True

    async def on_tick(self, counter: int) -> bool:
        # uvicorn ticks every 0.1 s on the event loop: a beat a second says the loop runs (see supervisor).
        if self.heartbeat is not None and counter % 10 == 0:
            self.heartbeat()
        if self.drain_started is not None and not self.should_exit:
            left = self.grace_s - (time.monotonic() - self.drain_started)
            if not self.lifecycle.tasks or left <= 0:
                if self.lifecycle.tasks:
                    cut = self.lifecycle.cut()
                    logger.warning("grace period over: %d requests still in flight are cut (streams get a final "
                                   "shutting_down error event)", cut)
                self.config.timeout_graceful_shutdown = 1
                self.should_exit = True
        return bool(await super().on_tick(counter))


# Open files the gateway needs beside its client connections (Triton channels, logs, models, the loop).
_FD_HEADROOM = 512


def uvicorn_config(app: FastAPI, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """uvicorn's config for the gateway: its own access log off (the gateway writes one), and the
    connection guard (`http.connections`) with the head cap, the head and body deadlines and the connection
    cap, the cap kept below the open-files limit (raised towards what it needs first)."""
    cap: int | None = settings.max_connections or None
    if cap is not None:
        limit = raise_fd_limit(cap + _FD_HEADROOM)
        if cap > limit - _FD_HEADROOM:
            cap = max(limit - _FD_HEADROOM, 16)
            logger.warning("open-files limit %d: at most %d client connections (--max-connections %d)", limit, cap,
                           settings.max_connections)
    state = getattr(app.state, "gateway", None)
    on_reject = state.metrics.rejected_connection if state is not None else None
    http = guarded_protocol(EdgeLimits(header_timeout_s=settings.header_timeout_s or None,
                                       max_header_bytes=settings.max_header_bytes or None,
                                       body_timeout_s=settings.body_timeout_s or None, max_connections=cap),
                            on_reject)
    kwargs: dict[str, Any] = {"host": settings.host, "port": settings.port, "access_log": False,
                              "timeout_graceful_shutdown": 5, "timeout_keep_alive": settings.keep_alive_timeout_s,
                              "http": http,
                              # A Responses WebSocket frame is a request body (`http.routers.responses_ws`): one past
                              # the body limit (and the slack of its JSON framing) closes the socket unread (1009).
                              "ws_max_size": settings.max_body_bytes + 64 * 1024, **overrides}
    if settings.log_format == "json":  # uvicorn's own lines go through the gateway's (JSON) handler too
        kwargs.setdefault("log_config", None)
    return uvicorn.Config(app, **kwargs)


def serve(app: FastAPI, settings: Settings, sockets: list[socket.socket] | None = None,
          heartbeat: Callable[[], None] | None = None) -> None:
    """Serve `app` until a signal's drain ends: on `settings`' host and port, or on listening `sockets`
    already bound (a worker of `--workers`, sharing the supervisor's). `heartbeat` is called on the event
    loop once a second while it serves."""
    map_big_allocations()  # hostile multi-megabyte bodies must not ratchet the serving process's RSS up
    server = DrainingServer(uvicorn_config(app, settings, log_level=settings.uvicorn_log_level),
                            lifecycle=app.state.gateway.lifecycle, grace_s=settings.shutdown_grace_s,
                            heartbeat=heartbeat)
    server.run(sockets=sockets)
