"""One shared Triton client per (transport, url), created lazily and closed at shutdown.

gRPC channels multiplex every request of a model (and of every model on the same server), so a
channel per request or per model would only add connection set-up to the hot path.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import grpc
import tritonclient.grpc.aio as grpc_aio
import tritonclient.http.aio as http_aio
from tritonclient.utils import InferenceServerException

from openai_api.errors import BackendError, BackendTimeoutError, BackendUnavailableError, GatewayError

if TYPE_CHECKING:
    from openai_api.triton.rpc import TritonRPC

logger = logging.getLogger(__name__)

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
            from openai_api.triton.rpc import TritonRPC

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
            client = http_aio.InferenceServerClient(url, conn_limit=256, conn_timeout=10.0)
            self._http[url] = client
        return client

    async def close(self) -> None:
        clients: list[Any] = [*self._grpc.values(), *self._http.values(), *self._rpc.values()]
        self._grpc.clear()
        self._http.clear()
        self._rpc.clear()
        await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)


# How long a stall probe waits for Triton's `ServerLive` (at most the idle timeout itself).
_PROBE_TIMEOUT_S = 10.0

# gRPC status codes (by name, so no grpc import is needed here) -> what they mean for the client.
_GRPC_UNAVAILABLE = {"UNAVAILABLE", "UNKNOWN_CONNECTION", "ABORTED"}
_CONNECTION_WORDS = ("failed to connect", "connect call failed", "cannot connect", "connection refused",
                     "socket closed", "connection reset", "server disconnected", "broken pipe",
                     "connection aborted", "end of tcp stream", "eof occurred", "transport is closing")


def _grpc_code(err: BaseException) -> str:
    """The gRPC status name of a raw grpc.aio.AioRpcError (what stream iteration raises), else ""."""
    code = getattr(err, "code", None)
    if callable(code):
        try:
            c = code()
        except Exception:  # noqa: BLE001 - not a gRPC error after all
            return ""
        return str(getattr(c, "name", c) or "")
    return ""


def map_triton_error(err: BaseException, model: str) -> GatewayError:
    """Translate a tritonclient / grpc / aiohttp exception into the gateway's taxonomy without leaking
    internals: unreachable Triton and unknown/unready models are 503 (naming the model), deadlines 504,
    everything else Triton refused is 502 naming the model (Triton's own message is logged, not sent)."""
    if isinstance(err, GatewayError):
        return err
    if isinstance(err, asyncio.TimeoutError | TimeoutError):
        return BackendTimeoutError(f"The model {model!r} did not answer in time.")
    status = ""
    message = str(err)
    if isinstance(err, InferenceServerException):
        status = str(err.status() or "")
        message = err.message() or message
    else:
        status = _grpc_code(err)
        details = getattr(err, "details", None)
        if callable(details):
            try:
                message = str(details() or message)
            except Exception:  # noqa: BLE001
                pass
    lowered = message.lower()
    status_l = status.lower()
    if "deadline" in status_l or "deadline exceeded" in lowered:
        return BackendTimeoutError(f"The model {model!r} did not answer in time.")
    if "unknown model" in lowered or "is not ready" in lowered or ("not found" in lowered and "model" in lowered) \
            or "no available versions" in lowered:
        return BackendUnavailableError(f"The model {model!r} is not loaded or not ready in Triton.")
    if (status.upper().removeprefix("STATUSCODE.") in _GRPC_UNAVAILABLE or "unavailable" in status_l
            or any(w in lowered for w in _CONNECTION_WORDS) or _is_connection_error(err)):
        return BackendUnavailableError(f"The Triton server for model {model!r} is unreachable.")
    if "cancelled" in status_l:
        return BackendUnavailableError(f"The request to model {model!r} was cancelled by Triton.")
    logger.warning("triton error for model %s: %s %s", model, status, message[:500])
    # Triton's message can carry the backend's own exception text (a model's RuntimeError, file paths):
    # it goes to the log, never to the client. The gateway validates requests before Triton sees them,
    # so what reaches here is the server side's failure.
    return BackendError(f"Triton failed the request for model {model!r}; the gateway's log has the details.")


def _is_connection_error(err: BaseException) -> bool:
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp comes with tritonclient[http]
        return isinstance(err, ConnectionError)
    return isinstance(err, ConnectionError | aiohttp.ClientConnectionError | aiohttp.ServerDisconnectedError)


class StallGuard:
    """Ends an iteration that stops making progress while waiting on Triton.

    `async with StallGuard(idle_s, model, probe=...) as g:` around a loop over a Triton stream that calls
    `g.hold()` as soon as an item arrived and `g.touch()` just before waiting for the next one, so
    time spent while the consumer holds a yielded chunk (a slow HTTP client) never counts.

    Only what can show progress is judged:

    * once the first item arrived, a wait of `idle_s` seconds is a stall: the waiting task is cancelled
      at its await (closing the Triton stream in the adapter's `finally`) and the block raises
      `BackendTimeoutError` (`stream_stalled`) instead;
    * before the first item (a request queued in Triton, a long prefill, or a request answered with one
      response at the very end) silence is normal, so after `idle_s` the guard asks `probe(timeout)`
      whether Triton is responsive at all: a live server means the request is still being worked on and
      the wait goes on (the request's own deadline bounds it); no answer (a frozen or wedged Triton) is
      a stall as above. Without a probe, the first wait is judged like the others.

    Per item it costs a clock read and a task lookup; the one timer is re-armed lazily when it fires,
    never per item.
    """

    __slots__ = ("_fired", "_handle", "_last", "_loop", "_probe", "_probing", "_seen", "_task", "_waiting", "idle_s",
                 "model")

    def __init__(self, idle_s: float | None, model: str,
                 probe: Callable[[float], Awaitable[bool]] | None = None) -> None:
        self.idle_s = idle_s if idle_s and idle_s > 0 else None
        self.model = model
        self._probe = probe
        self._fired = False
        self._waiting = False
        self._seen = False
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[Any] | None = None
        self._probing: asyncio.Task[None] | None = None

    async def __aenter__(self) -> StallGuard:
        if self.idle_s is not None:
            self._loop = asyncio.get_running_loop()
            self.touch()
            self._handle = self._loop.call_at(self._last + self.idle_s, self._check)
        return self

    def hold(self) -> None:
        """An item arrived: the clock stops until `touch`."""
        self._waiting = False
        self._seen = True

    def touch(self) -> None:
        """About to wait for the next item (possibly from another task than before)."""
        if self.idle_s is not None:
            self._last = self._loop.time()
            self._task = asyncio.current_task()
            self._waiting = True

    def _check(self) -> None:
        idle_s: float = self.idle_s  # type: ignore[assignment]
        now = self._loop.time()
        due = self._last + idle_s
        if self._waiting and now >= due and self._task is not None and not self._task.done():
            self._handle = None
            if not self._seen and self._probe is not None:
                self._probing = self._loop.create_task(self._ask(idle_s))
                return
            self._fire()
        else:
            # Not waiting on Triton right now (the consumer holds a chunk): look again a period later.
            self._handle = self._loop.call_at(due if self._waiting else now + idle_s, self._check)

    async def _ask(self, idle_s: float) -> None:
        """Silence before the first item: a stall only if Triton itself does not answer."""
        assert self._probe is not None
        alive = await self._probe(min(idle_s, _PROBE_TIMEOUT_S))
        self._probing = None
        if self._task is None or self._task.done():
            return
        if alive or not self._waiting or self._seen:
            if self._waiting and not self._seen:
                self._last = self._loop.time()  # still working: judge again a period from now
            self._handle = self._loop.call_at(self._last + idle_s, self._check)
            return
        self._fire()

    def _fire(self) -> None:
        assert self._task is not None
        self._fired = True
        self._task.cancel()

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> bool:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self._probing is not None:
            self._probing.cancel()
            self._probing = None
        if self._fired and exc_type is not None and issubclass(exc_type, asyncio.CancelledError):
            task = asyncio.current_task()
            if task is not None and task.uncancel() > 0:
                return False  # someone else cancelled this task too: let it go
            raise BackendTimeoutError(
                f"The model {self.model!r} produced no token for {self.idle_s:g} s; the stream was ended.",
                code="stream_stalled")
        return False
