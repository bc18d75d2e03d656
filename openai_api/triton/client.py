"""One shared Triton client per (transport, url), created lazily and closed at shutdown.

gRPC channels multiplex every request of a model (and of every model on the same server), so a
channel per request or per model would only add connection set-up to the hot path.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import grpc
import tritonclient.grpc.aio as grpc_aio

from openai_api.triton.rpc import TritonRPC

if TYPE_CHECKING:
    import tritonclient.http.aio as http_aio

# Keepalive must respect Triton's server-side ping policy (defaults: at most one ping per 300 s without
# data, none without calls): faster pings earn GOAWAY "too_many_pings", which kills the connection and
# every stream on it. A dead Triton is noticed anyway: a killed process resets its connections at
# once, and a hung one is ended by the stream idle timeout and the per-request deadline.
_GRPC_KEEPALIVE_MS = 300_000
_GRPC_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.keepalive_time_ms", _GRPC_KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", 20_000),
    ("grpc.keepalive_permit_without_calls", 0),
    ("grpc.http2.max_pings_without_data", 2),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class TritonClientPool:
    """Owns every Triton client of the process. Must be used from the event loop thread."""

    def __init__(self) -> None:
        self._grpc: dict[str, grpc_aio.InferenceServerClient] = {}
        self._http: dict[str, http_aio.InferenceServerClient] = {}
        self._rpc: dict[str, TritonRPC] = {}

    def rpc(self, url: str) -> TritonRPC:
        """The inference RPCs (the hot path) of the Triton at `url`: a channel of their own, so
        tritonclient's housekeeping calls (configs, health) never queue in front of tokens."""
        rpc = self._rpc.get(url)
        if rpc is None:
            rpc = TritonRPC(grpc.aio.insecure_channel(url, options=_GRPC_CHANNEL_ARGS))
            self._rpc[url] = rpc
        return rpc

    def grpc(self, url: str) -> grpc_aio.InferenceServerClient:
        client = self._grpc.get(url)
        if client is None:
            client = grpc_aio.InferenceServerClient(url, channel_args=_GRPC_CHANNEL_ARGS)
            self._grpc[url] = client
        return client

    def http(self, url: str) -> http_aio.InferenceServerClient:
        client = self._http.get(url)
        if client is None:
            # Imported on first use: tritonclient's HTTP client and aiohttp cost every gateway process ~0.4 CPU-s
            # of start-up, and a gateway whose Tritons all speak gRPC never needs them.
            from tritonclient.http import aio as http_client

            client = http_client.InferenceServerClient(url, conn_limit=256, conn_timeout=10.0)
            self._http[url] = client
        return client

    def urls(self) -> set[str]:
        """The addresses that have a client open."""
        return {*self._grpc, *self._http, *self._rpc}

    async def close_urls(self, urls: set[str]) -> None:
        """Close the clients of `urls` (a config reload removed them); asked for again, they are made anew."""
        clients: list[Any] = [c for u in urls for c in (self._grpc.pop(u, None), self._http.pop(u, None),
                                                         self._rpc.pop(u, None)) if c is not None]
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)

    async def close(self) -> None:
        clients: list[Any] = [*self._grpc.values(), *self._http.values(), *self._rpc.values()]
        self._grpc.clear()
        self._http.clear()
        self._rpc.clear()
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
