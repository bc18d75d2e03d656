"""WebSocket mode of `/v1/responses` (OpenAI's Responses WebSocket mode; Codex's `responses_websockets` transport).

The client opens a WebSocket on `/v1/responses` (Codex sends `OpenAI-Beta: responses_websockets=2026-02-06`;
the header is not required) with its key on the upgrade (`Authorization: Bearer KEY` or `x-api-key`); a missing
or wrong key is refused before the upgrade (401, OpenAI's error body), as is a draining gateway (503). Then, as
JSON text frames:

* client -> gateway: `{"type": "response.create", ...}` with the body `/v1/responses` takes (`stream` is implied;
  `background` is refused); `{"type": "response.processed", ...}` (Codex acknowledging a response) is taken and
  needs no answer. `"generate": false` prepares a response without generating it (Codex's warm-up): its
  `response.created` and `response.completed` (no output, `usage.input_tokens` counted) come back, and the next
  `response.create` may continue it with `previous_response_id`.
* gateway -> client: the same typed events as the SSE stream of `/v1/responses` (`response.created` ...
  `response.completed`), one per frame; a request refused before it started is one error event,
  `{"type": "error", "status": 4xx/5xx, "error": {"type", "code", "message", "param"}}` (the status and error of
  the HTTP answer; Codex reads `status`), and the connection stays open.

Requests on one connection run one after another, in the order sent. `previous_response_id` names the
connection's last response (kept in the connection's memory, so it works with `store: false`, as OpenAI's mode
does) or a stored one (`--responses-store`, `store: true`); an id it has neither of is the error event of
`previous_response_not_found`, on which Codex resends the whole conversation.

Each `response.create` is admitted as an HTTP request: its frame at most `--max-body-bytes` (else a 413 error
event), its nesting bounded, the key's allow-list, its in-flight slot (429 past a limit), and a counted key's
request and token limits, settled when it ends. A frame that is not JSON, not an object, of an unknown type or
binary is a 400 error event; the connection closes only when the client goes (the generation running for it is
then cancelled), or with 1001 when the gateway drains. Each request is counted in `openai_api_requests` and its
latency histogram under the route `websocket:/v1/responses` (499 for one whose client left) and gets an
access-log line (method `WEBSOCKET`); the connection's opening and close (with how many requests it served) are
logged.

A connection lasts at most `--responses-ws-max-age` (3600 s, OpenAI's 60 minutes). When it is up, a response
being generated is let finish (cutting it would lose the turn the client is waiting for; the limit is about
connections, not requests); then the connection sends one error event, `{"type": "error", "status": 400, "error":
{"type": "invalid_request_error", "code": "websocket_connection_limit_reached", ...}}` - at once if it is idle,
and in answer to any frames still waiting, which are not run - and closes (1000, reason
`websocket_connection_limit_reached`). OpenAI's answer to that code is "open a new connection"; a response kept
only in the old connection's memory (`store: false`) cannot be continued there, so the client resends the
conversation.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import orjson
from fastapi import APIRouter, WebSocket
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.responses import Response
from starlette.websockets import WebSocketDisconnect, WebSocketState

from openai_api.errors import (
    INTERNAL_ERROR_MESSAGE,
    AuthenticationError,
    GatewayError,
    InternalError,
    InvalidRequestError,
    PayloadTooLargeError,
    ShuttingDownError,
    error_body,
)
from openai_api.http.admission import Admission
from openai_api.http.deps import AppState
from openai_api.http.dialects.openai_responses import encode
from openai_api.http.inflight import Ticket
from openai_api.http.keys import presented_key
from openai_api.http.middleware import access_fields, access_logger
from openai_api.http.responses import validation_error
from openai_api.http.scheduler import OBJECTIVE_HEADER
from openai_api.logs import AccessLine
from openai_api.quota.caller import Caller, bind_caller, unbind_caller
from openai_api.quota.service import refusal
from openai_api.quota.store import Decision
from openai_api.schemas.openai import ResponsesRequest
from openai_api.services import response_ops
from openai_api.services.context import RequestContext
from openai_api.services.responses import ResponseBuilder, ResponsesService

logger = logging.getLogger(__name__)
router = APIRouter()
# Frames waiting while one request runs: past it the gateway stops reading (the client's sends back up).
MAX_PENDING = 8
WS_ROUTE = "websocket:/v1/responses"  # the `route` label of its requests in the request metrics
LIFETIME_CODE = "websocket_connection_limit_reached"  # OpenAI's error code when a connection's 60 minutes are up
LIFETIME_UP = "gateway.lifetime_up"  # the reader's wake-up for an idle worker (never a client frame type)


class ConnectionLimitError(InvalidRequestError):
    """The connection's lifetime (`--responses-ws-max-age`) is up: OpenAI's `websocket_connection_limit_reached`,
    after which the connection is closed and the client opens another."""

    default_code = LIFETIME_CODE


def error_event(err: GatewayError) -> dict[str, Any]:
    """A refused request as one event: the HTTP status and OpenAI's error object (and its headers, as Codex reads
    a `Retry-After` or rate-limit header from them)."""
    event: dict[str, Any] = {"type": "error", "status": err.status, **error_body(err)}
    if err.headers:
        event["headers"] = dict(err.headers)
    return event


async def _deny(websocket: WebSocket, err: GatewayError) -> None:
    """Refuse the upgrade with the HTTP answer `err` is (a 403-free close where the server cannot send one)."""
    headers = {"www-authenticate": "Bearer"} if err.status == 401 else None
    try:
        await websocket.send_denial_response(Response(orjson.dumps(error_body(err)), status_code=err.status,
                                                      media_type="application/json", headers=headers))
    except RuntimeError:  # the server has no denial-response extension: a policy close is all it can say
        await websocket.close(code=1008)


@router.websocket("/v1/responses")
async def responses_socket(websocket: WebSocket) -> None:
    """OpenAI's Responses WebSocket mode on `/v1/responses` (see the module docstring)."""
    state: AppState = websocket.app.state.gateway
    caller = state.quota.identify(presented_key(websocket.scope))
    if caller is None:
        await _deny(websocket, AuthenticationError("You didn't provide an API key, or it is not one of this "
                                                   "server's. Provide it as 'Authorization: Bearer YOUR_KEY'."))
        return
    if state.lifecycle.draining:
        await _deny(websocket, ShuttingDownError("The server is shutting down; retry on another instance."))
        return
    await websocket.accept()
    session = ResponsesSocket(websocket, state, caller)
    logger.info("responses websocket opened (key %s)", caller.name)
    try:
        await session.run()
    finally:
        logger.info("responses websocket closed after %d response.create (key %s)", session.served, caller.name)


class ResponsesSocket:
    """One connection: a reader of frames, and one worker that runs the requests in order."""

    def __init__(self, websocket: WebSocket, state: AppState, caller: Caller) -> None:
        self.websocket = websocket
        self.state = state
        self.caller = caller
        # The connection's last response: its id -> the conversation a `previous_response_id` continues.
        self.local: dict[str, list[dict[str, Any]]] = {}
        self.served = 0  # response.create requests answered (for the close's log line)
        # Past --responses-ws-max-age the response being generated finishes and nothing else starts.
        self.deadline = time.monotonic() + state.settings.responses_ws_max_age_s
        self.expired = False  # the limit's error event was sent: the close says why

    async def run(self) -> None:
        pending: asyncio.Queue[dict[str, Any]] = asyncio.Queue(MAX_PENDING)
        worker = asyncio.create_task(self._work(pending), name="responses websocket")
        receiving: asyncio.Future[Any] | None = None
        woken = False  # the worker has been told the lifetime is up
        try:
            while not worker.done():
                if receiving is None:
                    receiving = asyncio.ensure_future(self.websocket.receive())
                left = None if woken else max(0.0, self.deadline - time.monotonic())
                await asyncio.wait([receiving, worker], timeout=left, return_when=asyncio.FIRST_COMPLETED)
                if worker.done():
                    break
                if not receiving.done():  # the connection's lifetime is up
                    woken = True
                    # Wakes an idle worker; a busy one (or one with frames waiting) sees the deadline as it
                    # takes its next frame, once the response it is generating has finished.
                    with contextlib.suppress(asyncio.QueueFull):
                        pending.put_nowait({"type": LIFETIME_UP})
                    continue
                message, receiving = receiving.result(), None
                if message["type"] == "websocket.disconnect":
                    break
                await pending.put(dict(message))
        except (WebSocketDisconnect, RuntimeError):
            pass  # the client went while we read
        finally:
            if receiving is not None and not receiving.done():
                receiving.cancel()
            worker.cancel()  # a generation still running for a client that left is cancelled with it
            await asyncio.wait([worker])
            if not worker.cancelled() and worker.exception() is not None:
                logger.error("responses websocket worker failed", exc_info=worker.exception())
            if self.websocket.application_state == WebSocketState.CONNECTED:
                with contextlib.suppress(Exception):
                    await self.websocket.close(code=1001 if self.state.lifecycle.draining else 1000,
                                               reason=LIFETIME_CODE if self.expired else None)

    async def _send(self, payload: bytes | dict[str, Any]) -> None:
        text = payload.decode() if isinstance(payload, bytes) else orjson.dumps(payload).decode()
        await self.websocket.send_text(text)

    async def _work(self, pending: asyncio.Queue[dict[str, Any]]) -> None:
        with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):  # the client went: nothing to say
            while True:
                message = await pending.get()
                if time.monotonic() >= self.deadline:  # frames still waiting get this one event, then the close
                    self.expired = True
                    await self._send(error_event(ConnectionLimitError(
                        f"This connection reached its limit of {self.state.settings.responses_ws_max_age_s:g} "
                        "seconds; open a new connection to continue.")))
                    return
                if self.state.lifecycle.draining:
                    await self._send(error_event(ShuttingDownError("The server is shutting down; open a new "
                                                                   "connection to another instance.")))
                    return
                try:
                    body = self._frame(message)
                    if body is not None:
                        await self._create(body)
                except GatewayError as e:
                    await self._send(error_event(e))
                except (WebSocketDisconnect, OSError, RuntimeError):
                    raise
                except Exception:  # a bug answers this request with a 500 event; the connection goes on
                    logger.exception("responses websocket request failed")
                    await self._send(error_event(InternalError(INTERNAL_ERROR_MESSAGE)))

    def _frame(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """A frame's `response.create` body; None for a frame that needs no answer; a 4xx for a bad one."""
        text = message.get("text")
        if text is None:
            raise InvalidRequestError("Binary frames are not taken: send JSON text frames.", code="invalid_frame")
        limit = self.state.settings.max_body_bytes
        if len(text) > limit and len(text.encode()) > limit:
            raise PayloadTooLargeError(f"The frame is larger than this server's limit of {limit} bytes.")
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            raise InvalidRequestError("The frame is not valid JSON.", code="invalid_json") from None
        if not isinstance(data, dict):
            raise InvalidRequestError("A frame must be a JSON object with a 'type'.", param="type")
        kind = data.pop("type", None)
        if kind == "response.processed":
            return None
        if kind != "response.create":
            raise InvalidRequestError(f"Frame type {kind!r} is not supported; send 'response.create'.", param="type",
                                      code="unsupported_frame")
        return data

    async def _create(self, data: dict[str, Any]) -> None:
        """One `response.create`, admitted and counted as an HTTP request would be (see the module docstring)."""
        state, caller = self.state, self.caller
        quota = state.quota
        start = time.perf_counter()
        begun: Decision | None = None
        status = 500
        ticket = Ticket(state.limiter)
        token = bind_caller(caller)
        request_id = uuid.uuid4().hex
        object_id = ""
        try:
            if caller.policy.counted:
                begun = await quota.begin(caller)
                if not begun.ok:
                    raise refusal(begun, quota.limits(caller), caller.name)
                caller.meter = quota.meter(caller)
            generate = data.pop("generate", True)
            try:
                req = ResponsesRequest.model_validate({**data, "stream": True})
            except ValidationError as e:
                raise validation_error(RequestValidationError(e.errors())) from None
            if req.background:
                raise InvalidRequestError("background is not taken over a WebSocket; POST /v1/responses instead.",
                                          param="background", code="unsupported_parameter")
            await Admission(ticket, state.settings, self.websocket.headers.get(OBJECTIVE_HEADER)).responses(req)
            self.served += 1
            service: ResponsesService = state.services.responses
            # The upgrade's headers stand for every request on the socket (Codex's session id routes them all).
            ctx = RequestContext(request_id, caller, self.websocket.scope.get("headers", ()))
            if response_ops.compaction_triggered(req):  # Codex's remote compaction v2: one `compaction` item
                turn = await response_ops.compaction_turn(service, req, ctx, self.local)
                object_id = turn.response["id"]
                self.local = {object_id: turn.conversation}
                for event in turn.events():
                    await self._send(event)
                status = 200
                return
            resp = await service.prepare(req, ctx, self.local)
            object_id = resp.id
            if generate is False:
                await self._warm_up(resp)
            else:
                await self._stream(service, resp)
            status = 200
        except GatewayError as e:
            status = e.status
            raise
        except (asyncio.CancelledError, WebSocketDisconnect, OSError, RuntimeError):
            status = 499  # the client went mid-answer (nginx's "client closed request", as the HTTP routes count it)
            raise
        finally:
            ticket.release()
            unbind_caller(token)
            model = data.get("model") if isinstance(data.get("model"), str) else ""
            # Counted as the HTTP routes are, under a route of its own; the model only once it is a configured one.
            state.metrics.requests.labels(WS_ROUTE, model if model in state.limiter.models else "",
                                          str(status)).inc()
            state.metrics.latency.labels(WS_ROUTE, model if model in state.limiter.models else "").observe(
                time.perf_counter() - start)
            self._log(status, time.perf_counter() - start, request_id, object_id,
                      model if model in state.limiter.models else "")
            if state.settings.keys_file is not None:  # as the keys middleware settles an HTTP request
                await asyncio.shield(quota.finish(caller, begun, status))

    def _log(self, status: int, duration: float, request_id: str, object_id: str, model: str) -> None:
        """The access-log line of one `response.create`, as the HTTP routes' (`http.middleware`), its method
        `WEBSOCKET` and its path the socket's."""
        if not self.state.settings.access_log or not access_logger.isEnabledFor(logging.INFO):
            return
        fields = access_fields("WEBSOCKET", self.websocket.scope.get("path", ""), status, duration, request_id,
                               object_id, model)
        if self.state.settings.keys_file is not None or self.state.settings.api_keys:
            fields["key"] = self.caller.name  # the keys file's name for the key (never the key)
        access_logger.info(AccessLine(fields))

    def _remember(self, resp: ResponseBuilder, conversation: list[dict[str, Any]] | None = None) -> None:
        self.local = {resp.id: conversation if conversation is not None else resp.conversation_after()}

    async def _stream(self, service: ResponsesService, resp: ResponseBuilder) -> None:
        events = encode(service.stream(resp, self.caller, self._remember))  # the Responses dialect's events
        try:
            async for chunk in events:
                for block in chunk.split(b"\n\n"):
                    for line in block.split(b"\n"):
                        if line.startswith(b"data: "):
                            await self._send(line[6:])
        finally:
            await events.aclose()  # a client gone mid-answer: its Triton request is cancelled

    async def _warm_up(self, resp: ResponseBuilder) -> None:
        """`generate: false`: the prompt prepared and counted, nothing generated; the next request continues it."""
        tokens = resp.prepared.prompt_tokens
        usage = {"input_tokens": tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                 "output_tokens": 0, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": tokens}
        self._remember(resp, resp.conversation)
        created = resp.response("in_progress", [], None)
        await self._send({"type": "response.created", "sequence_number": 0, "response": created})
        await self._send({"type": "response.completed", "sequence_number": 1,
                          "response": resp.response("completed", [], usage)})
