"""One shared Triton client per (transport, url), created lazily and closed at shutdown.

gRPC channels multiplex every request of a model (and of every model on the same server), so a
channel per request or per model would only add connection set-up to the hot path.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException

from openai_api.errors import BackendError, BackendTimeoutError, BackendUnavailableError, GatewayError

logger = logging.getLogger(__name__)

# Keepalive lets a dead Triton surface as UNAVAILABLE within seconds instead of a hung stream.
_GRPC_KEEPALIVE = grpc_aio.KeepAliveOptions(keepalive_time_ms=10_000, keepalive_timeout_ms=5_000,
                                            keepalive_permit_without_calls=True)
_GRPC_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 5_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.initial_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 2_000),
]


class TritonClientPool:
    """Owns every Triton client of the process. Must be used from the event loop thread."""

    def __init__(self) -> None:
        self._grpc: dict[str, grpc_aio.InferenceServerClient] = {}
        self._http: dict[str, http_aio.InferenceServerClient] = {}

    def grpc(self, url: str) -> grpc_aio.InferenceServerClient:
        client = self._grpc.get(url)
        if client is None:
            client = grpc_aio.InferenceServerClient(url, channel_args=_GRPC_CHANNEL_ARGS)
            self._grpc[url] = client
        return client

    def http(self, url: str) -> http_aio.InferenceServerClient:
        client = self._http.get(url)
        if client is None:
            client = http_aio.InferenceServerClient(url, conn_limit=256, conn_timeout=10.0)
            self._http[url] = client
        return client

    async def close(self) -> None:
        clients: list[Any] = [*self._grpc.values(), *self._http.values()]
        self._grpc.clear()
        self._http.clear()
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


def map_triton_error(err: BaseException, model: str) -> GatewayError:
    """Translate a tritonclient exception into the gateway's taxonomy without leaking internals."""
    if isinstance(err, GatewayError):
        return err
    if isinstance(err, asyncio.TimeoutError):
        return BackendTimeoutError(f"The model {model!r} did not answer in time.")
    status = ""
    message = str(err)
    if isinstance(err, InferenceServerException):
        status = str(err.status() or "")
        message = err.message() or message
    lowered = message.lower()
    if "deadline" in status.lower() or "deadline exceeded" in lowered:
        return BackendTimeoutError(f"The model {model!r} did not answer in time.")
    if ("unavailable" in status.lower() or "failed to connect" in lowered or "connect call failed" in lowered
            or "cannot connect" in lowered or "connection refused" in lowered or "socket closed" in lowered):
        return BackendUnavailableError(f"The Triton server for model {model!r} is unreachable.")
    if "unknown model" in lowered or "is not ready" in lowered or ("not found" in lowered and "model" in lowered):
        return BackendUnavailableError(f"The model {model!r} is not loaded or not ready in Triton.")
    if "cancelled" in status.lower():
        return BackendUnavailableError(f"The request to model {model!r} was cancelled by Triton.")
    logger.warning("triton error for model %s: %s %s", model, status, message)
    # Triton's own message names tensors and shapes: useful to the caller, and not gateway internals.
    return BackendError(f"Triton failed the request for model {model!r}: {message[:500]}")
