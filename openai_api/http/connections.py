"""Connection-level limits uvicorn does not have: a header-read timeout and a cap on open connections.

uvicorn (0.54, httptools) arms no timer on a new connection and cancels its keep-alive timer as soon as
any byte arrives, so a connection that never sends a request, or sends its headers one byte at a time,
is held forever; twenty thousand of them exhaust the process's file descriptors and every API call and
`/health` then fails. `guarded_protocol` returns uvicorn's own protocol class with two rules added:

* **header timeout**: from the moment a connection opens, or a new request on it begins, its request
  line and headers must be complete within `header_timeout_s`; otherwise the connection is closed
  (as nginx's `client_header_timeout`). Idle keep-alive connections stay governed by uvicorn's own
  `timeout_keep_alive`. A request whose headers arrived is never affected (bodies and streams take as
  long as the request limits allow).
* **connection cap**: a connection beyond `max_connections` open ones is closed at once, before any
  byte is read, so file descriptors are never exhausted; with the timeout above, silent connections
  free their slots within `header_timeout_s`.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections.abc import Callable
from typing import cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

logger = logging.getLogger(__name__)


def guarded_protocol(header_timeout_s: float | None, max_connections: int | None,
                     on_reject: Callable[[str], None] | None = None) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the header timeout and the connection cap (None: off);
    `on_reject(reason)` is called for each connection closed by either rule (metrics)."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _refused = False

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            tcp = cast(asyncio.Transport, transport)  # a stream server's transports are
            if max_connections is not None and len(self.connections) >= max_connections:
                self._refused = True
                self.transport = tcp
                tcp.abort()  # no response: nothing was read, and every byte costs a full server
                if on_reject is not None:
                    on_reject("connection_limit")
                return
            super().connection_made(tcp)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._refused:
                return
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def _arm(self) -> None:
            if header_timeout_s and self._header_timer is None:
                self._header_timer = self.loop.call_later(header_timeout_s, self._header_timeout)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timeout(self) -> None:
            self._header_timer = None
            if not self.transport.is_closing():
                self.transport.close()
                if on_reject is not None:
                    on_reject("header_timeout")

    return GuardedHttpToolsProtocol


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
