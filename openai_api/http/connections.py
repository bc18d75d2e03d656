"""Connection-level limits uvicorn does not have: a cap on a request's head, deadlines for its head and its
body, and a cap on open connections that slow clients cannot fill.

uvicorn (0.54, httptools) arms no timer on a new connection, cancels its keep-alive timer whenever a byte
arrives, never times a request body out, and puts no bound on a request's headers, which httptools joins
piece by piece with a cost that grows with the square of their size (one 16 MiB header: 0.25 s of event
loop, 64 MiB: 4 s). So one client without a key could stall every request, and a few hundred sockets that
send a byte now and then held every connection slot for good. `guarded_protocol` returns uvicorn's own
protocol class with these rules added (`EdgeLimits`):

* **head size** (`max_header_bytes`): a request line and headers larger than this are answered 431
  (`request_header_fields_too_large`). The bytes are counted as they arrive, before the parser holds them:
  a head still incomplete when more than the cap has arrived since the request began is refused there (at
  most one socket read, 256 KiB, past the cap, so its parsing cost is bounded); a head that completes within
  a read is measured exactly (the request target, and each header's name and value plus 4 bytes).
* **head deadline** (`header_timeout_s`): from the moment a connection opens, or a new request on it
  begins, its request line and headers must be complete within this; otherwise the connection is closed
  (as nginx's `client_header_timeout`). Idle keep-alive connections stay governed by uvicorn's own
  `timeout_keep_alive` (`--keep-alive-timeout`).
* **body deadline** (`body_timeout_s`): from the moment a request's headers are complete, its body must be
  complete within this, plus one second per `body_min_rate` bytes received (Apache mod_reqtimeout's
  `body=N,MinRate=R`): a big upload that keeps coming is never cut, a trickle is. Past it the request is
  answered 408 (`request_timeout`) when no response has started, and the connection is closed in any case:
  also after an early answer (a 401 to a body still trickling in, which uvicorn would otherwise read for as
  long as it kept coming). A deadline that falls while the gateway itself has stopped reading (its buffer
  full, the app not yet reading) is put off.
* **connection cap** (`max_connections`): when that many connections are open, a new one takes the place
  of the open connection that has waited longest without being served (reading a request's head or body,
  or idle between requests), which is closed. Only when every open connection is being served (its
  request read, its response not finished) is the new one closed at once, before any byte is read. So
  silent or slow clients cannot keep `/health` and real requests out, and file descriptors stay bounded.

A refusal (431, 408) is written, then the connection is half-closed and what the client still sends is
read and dropped, for at most `LINGER_S` seconds (nginx's lingering close): closing at once with unread
bytes would reset the connection, and the client would often never read the status. The app's own answers
that close the connection before the request's body has arrived (the guard's 413 to a `Content-Length` over
`--max-body-bytes`) close the same way. Every connection
closed by these rules is counted (`on_reject(reason)`: `header_too_large`, `header_timeout`,
`body_timeout`, `connection_evicted`, `connection_limit`).
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from openai_api.errors import GatewayError, HeadersTooLargeError, RequestTimeoutError
from openai_api.http.dialects.table import dialect_for

logger = logging.getLogger(__name__)

# How long a refused connection's remaining input is read and dropped after the refusal was written.
LINGER_S = 2.0
# scope["state"] key: the status the connection guard answered a request with itself (408), for the access log.
EDGE_STATUS = "edge_status"


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """The connection guard's limits (None or 0: that rule is off); see the module docstring."""

    header_timeout_s: float | None = 10.0
    max_header_bytes: int | None = 64 * 1024
    body_timeout_s: float | None = 30.0
    body_min_rate: float = 64 * 1024.0
    max_connections: int | None = 10000


def guarded_protocol(limits: EdgeLimits, on_reject: Callable[[str], None] | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the rules of `limits`; `on_reject(reason)` is called for each connection
    a rule closes or refuses (metrics)."""
    header_timeout_s = limits.header_timeout_s or None
    max_head = limits.max_header_bytes or None
    body_timeout_s = limits.body_timeout_s or None
    min_rate = limits.body_min_rate
    max_connections = limits.max_connections or None

    # Connections not being served, the one waiting longest first (a dict keeps insertion order): the
    # candidates to close when a new connection finds the cap reached. One per server (per worker process).
    waiting: dict[GuardedHttpToolsProtocol, None] = {}

    def reject(reason: str) -> None:
        if on_reject is not None:
            on_reject(reason)

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None
        _linger_timer: asyncio.TimerHandle | None = None
        _refused = False  # closed at connect: uvicorn never saw it
        _lingering = False  # refused (431, 408): input is read and dropped until the client or LINGER_S ends it
        _in_head = False  # between a request's first byte and its complete headers
        _head_bytes = 0  # bytes received since the current request began (an upper bound on its head)
        _oversized = False  # the head just completed is over the cap: refuse it once the parser returns
        _body_start = 0.0
        _body_bytes = 0
        _body_complete = True  # the current request's body was read in full (or it has none)

        # --- connections -------------------------------------------------------------------------------------
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            tcp = cast(asyncio.Transport, transport)  # a stream server's transports are
            if max_connections is not None and len(self.connections) >= max_connections:
                victim = next(iter(waiting), None)
                if victim is None:
                    self._refused = True
                    self.transport = tcp
                    tcp.abort()  # no response: nothing was read, and every byte costs a full server
                    reject("connection_limit")
                    return
                victim._evict()
            super().connection_made(tcp)
            waiting[self] = None
            self._arm_header()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            waiting.pop(self, None)
            self._disarm()
            if self._linger_timer is not None:
                self._linger_timer.cancel()
                self._linger_timer = None
            super().connection_lost(exc)

        def _evict(self) -> None:
            waiting.pop(self, None)
            self._disarm()
            if self.cycle is not None and not self.cycle.response_complete:
                self.cycle.disconnected = True
                self.cycle.message_event.set()
            self.transport.abort()
            reject("connection_evicted")

        def data_received(self, data: bytes) -> None:
            if self._lingering:
                return  # the rest of a refused request: dropped unparsed
            super().data_received(data)
            if self._lingering or self.transport.is_closing():
                return
            if self._oversized:
                self._refuse(HeadersTooLargeError(
                    f"The request's headers are larger than this server's limit of {max_head} bytes."),
                    "header_too_large")
            elif self._in_head and max_head is not None:
                self._head_bytes += len(data)
                if self._head_bytes > max_head:
                    self._refuse(HeadersTooLargeError(
                        f"The request's headers are larger than this server's limit of {max_head} bytes."),
                        "header_too_large")

        # --- parser callbacks --------------------------------------------------------------------------------
        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._in_head = True
            self._head_bytes = 0  # this read is added whole once the parser returns: an upper bound
            self._arm_header()

        def on_headers_complete(self) -> None:
            self._in_head = False
            self._disarm()
            if self._oversized or self._lingering:
                return
            if max_head is not None and len(self.url) + sum(len(k) + len(v) + 4 for k, v in self.headers) > max_head:
                self._oversized = True  # refused once the parser returns; no request reaches the app
                return
            super().on_headers_complete()
            self._body_complete = False
            if self.cycle is not None:
                # uvicorn closes the connection once a `connection: close` answer is written (the guard's 413
                # before the body is read); with unread input that close would reset the connection.
                answer_then_close = _CloseAfterAnswer(self.transport, self.close_after_answer)
                self.cycle.transport = cast(asyncio.Transport, answer_then_close)
            if body_timeout_s is not None:
                self._body_start = self.loop.time()
                self._body_bytes = 0
                self._body_timer = self.loop.call_at(self._body_start + body_timeout_s, self._body_deadline)

        def on_body(self, body: bytes) -> None:
            if self._oversized or self._lingering:
                return
            self._body_bytes += len(body)
            super().on_body(body)

        def on_message_complete(self) -> None:
            if self._oversized or self._lingering:
                return
            self._body_complete = True
            if self._body_timer is not None:
                self._body_timer.cancel()
                self._body_timer = None
            super().on_message_complete()
            if self.cycle is not None and not self.cycle.response_complete:
                waiting.pop(self, None)  # read in full: being served until its response is done

        def on_response_complete(self) -> None:
            if self._lingering:  # answered before its body arrived: closing (`_close_after_answer`), not kept alive
                self.server_state.total_requests += 1
                return
            super().on_response_complete()
            if not self.transport.is_closing():
                waiting.pop(self, None)
                waiting[self] = None  # idle again (or still reading the body of an early answer): the newest

        # --- deadlines ---------------------------------------------------------------------------------------
        def _arm_header(self) -> None:
            if header_timeout_s and self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _disarm(self) -> None:
            for timer in (self._header_timer, self._body_timer):
                if timer is not None:
                    timer.cancel()
            self._header_timer = self._body_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()
                reject("header_timeout")

        def _body_deadline(self) -> None:
            self._body_timer = None
            assert body_timeout_s is not None
            now = self.loop.time()
            if self.flow is not None and self.flow.read_paused:
                # The gateway stopped reading (its buffer is full): not the client's delay; the deadline waits.
                self._body_start = now
                self._body_timer = self.loop.call_at(now + body_timeout_s, self._body_deadline)
                return
            due = self._body_start + body_timeout_s + self._body_bytes / min_rate
            if now < due:
                self._body_timer = self.loop.call_at(due, self._body_deadline)
                return
            if self.transport.is_closing():
                return
            if self.cycle is not None and self.cycle.response_started:
                self.transport.close()  # answered already (an early 401, 413): nothing left to say
                reject("body_timeout")
                return
            self._refuse(RequestTimeoutError(
                f"The request body did not arrive in time: {self._body_bytes} bytes in "
                f"{now - self._body_start:.0f} s (this server waits {body_timeout_s:g} s plus 1 s per "
                f"{min_rate:,.0f} bytes received)."), "body_timeout")

        # --- refusals ----------------------------------------------------------------------------------------
        def close_after_answer(self) -> None:
            """Close after an answer: at once when the request was read in full, else with a lingering close
            (`_linger`), so a client still uploading reads the answer (a 413 to a 27 MB file) instead of a reset."""
            if self._body_complete or self._lingering or self.transport.is_closing():
                self.transport.close()
                return
            self._linger()

        def _refuse(self, err: GatewayError, reason: str) -> None:
            """Answer `err` and close: written, half-closed, the rest of the input dropped (see the docstring)."""
            reject(reason)
            self._in_head = False
            cycle = self.cycle
            path = cycle.scope["path"] if cycle is not None else ""  # before the request line: OpenAI's shape
            if cycle is not None and not cycle.response_complete:
                # The app (waiting for this body) sees the client gone, and its access-log line the status.
                cycle.scope["state"][EDGE_STATUS] = err.status
                cycle.disconnected = True
                cycle.message_event.set()
            status, body = dialect_for(path).error(err, None)
            head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode("ascii")
            self.transport.write(head + body)
            self._linger()

        def _linger(self) -> None:
            """nginx's lingering close, once an answer is written: the write side shut after it, what the client
            still sends read and dropped for at most `LINGER_S`, then the connection aborted."""
            self._disarm()
            self._lingering = True
            if self.flow is not None:
                self.flow.resume_reading()  # read (and drop) what is on its way, so the client can read the status
            if self.transport.can_write_eof():
                self.transport.write_eof()
                self._linger_timer = self.loop.call_later(LINGER_S, self.transport.abort)
            else:
                self.transport.close()
            if not self.transport.is_closing():
                waiting.pop(self, None)
                waiting[self] = None

    return GuardedHttpToolsProtocol


class _CloseAfterAnswer:
    """The transport uvicorn's request cycle writes to: everything as the connection's own transport, except that
    `close()` is the guarded protocol's `close_after_answer` (a lingering close while the request's body is still
    arriving)."""

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        self._transport = transport
        self.close = close

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)


def raise_fd_limit(want: int) -> int:
    """Raise this process's soft open-files limit towards `want` (up to the hard limit); return the
    soft limit in force, so the connection cap can stay below it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            logger.warning("could not raise the open-files limit from %d to %d", soft, target)
    return int(soft)
