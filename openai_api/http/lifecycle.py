"""The process's drain state, shared by the server's signal handling and the guard middleware.

After the first SIGTERM (`server.DrainingServer`) the gateway drains: `draining` is set and the guard
(`http.guard`) answers new requests 503 (`shutting_down`, health and metrics excepted) while those in flight, each
registered in `tasks` by the guard, get the grace period to finish. When the grace is over, `cut()` cancels what is
left, and the guard ends each of them in OpenAI's shape: a 503 if nothing was sent yet, else a final SSE error event
and the end of the body. Left to uvicorn, they would be cancelled mid-write and logged as tracebacks, and a streaming
client would see the stream just stop.
"""

from __future__ import annotations

import asyncio
from typing import Any

# Reachable while draining: liveness and metrics (readiness answers 503, so balancers stop routing).
DRAINING_OPEN_PATHS = frozenset({"/health", "/metrics"})


class Lifecycle:
    """`draining`: new requests get 503. `cutting`: the drain's grace is over and `cut()` ended the requests in
    `tasks` (each HTTP request's task while its route runs)."""

    def __init__(self) -> None:
        self.draining = False
        self.cutting = False
        self.tasks: set[asyncio.Task[Any]] = set()

    def cut(self) -> int:
        """End every request in flight now; returns how many there were."""
        self.cutting = True
        for task in self.tasks:
            task.cancel()
        return len(self.tasks)
