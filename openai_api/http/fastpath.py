"""A direct dispatch for the hot JSON POST routes (chat, completions, embeddings, rerank), pure ASGI.

FastAPI's per-request machinery (router match, exit stacks, dependency solving, `json.loads` then
`validate_python`, two `send` wrappers per SSE chunk) costs about as much CPU as the gateway's own
work on a short request. `JSONRouteMiddleware` sits innermost, right inside `GuardMiddleware` (which has
already buffered the body), and for `POST <one of its paths>` with an `application/json` body:

1. validates the body with the route's pydantic model straight from bytes (`model_validate_json`,
   Rust parser);
2. calls the route's own endpoint function with the body and its dependencies (each
   `Annotated[T, Depends(fn)]` parameter gets `fn(request)`, as FastAPI would give it; `http.deps`
   holds them all, plain functions of the request), and sends the `Response` it returns;
3. maps exceptions with the app's own handlers, as Starlette's route wrapper does (a handled
   exception after the response started is a RuntimeError; `Exception` itself goes up to the
   server-error middleware, which answers 500). Whether the response started is read from the
   request's `RequestStats`, so no `send` wrapper of ours runs per SSE chunk.

Everything else goes down the FastAPI stack untouched, and so does every request whose body fails
fast validation (except a body nested past the parser's depth limit, `bounds.PARSER_DEPTH`: that is
a 400 here, naming the top-level field that holds the deep part and the gateway's limit), so that
every error (invalid JSON, a missing field, a wrong content type) keeps
exactly the message FastAPI's validation gives it. The FastAPI routes stay registered for that, for
405s, and for the OpenAPI document. The request's `scope["route"]` is set to the route's `APIRoute`,
as the router would, so metrics label it by its template.
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from fastapi import params
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from openai_api.errors import InvalidRequestError
from openai_api.observability import RequestStats, current_stats
from openai_api.services.bounds import deep_body_error

Endpoint = Callable[..., Awaitable[Response]]
ExceptionHandler = Callable[[Request, Exception], Any]


Dependency = Callable[[Request], Any]


class _Route:
    __slots__ = ("api_route", "deps", "endpoint", "model", "wants_request")

    def __init__(self, api_route: APIRoute, endpoint: Endpoint) -> None:
        self.api_route = api_route
        self.endpoint = endpoint
        self.model, self.deps, self.wants_request = _signature(endpoint)


def _signature(endpoint: Endpoint) -> tuple[type[BaseModel], tuple[tuple[str, Dependency], ...], bool]:
    """The endpoint's pydantic `body` model, its `Annotated[T, Depends(fn)]` parameters, and whether it
    takes the `request` itself. Anything else is refused at start-up: the fast path must call the
    endpoint exactly as FastAPI would."""
    hints = typing.get_type_hints(endpoint, include_extras=True)
    model = hints.get("body")
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"{endpoint.__qualname__} takes no pydantic `body` parameter")
    deps: list[tuple[str, Dependency]] = []
    wants_request = False
    for name in inspect.signature(endpoint).parameters:
        hint = hints.get(name)
        if name == "body":
            continue
        if hint is Request:
            wants_request = True
            continue
        dep = next((m for m in getattr(hint, "__metadata__", ()) if isinstance(m, params.Depends)), None)
        if dep is None or dep.dependency is None or len(inspect.signature(dep.dependency).parameters) != 1:
            raise TypeError(f"{endpoint.__qualname__}: parameter {name!r} is not a dependency of the request alone")
        deps.append((name, dep.dependency))
    return model, tuple(deps), wants_request


def _is_json(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Content-Type is `application/json` (any parameters): the only type taken here. FastAPI also
    parses `+json` types and has its own rule for a missing header, so those requests go its way."""
    for k, v in headers:
        if k == b"content-type":
            return v.split(b";", 1)[0].strip().lower() == b"application/json"
    return False


class JSONRouteMiddleware:
    """Serves `POST` on `paths` directly (see the module docstring).

    `routes` are the `APIRoute`s as the app serves them (included without a prefix, so each one's
    `path` is its URL path): for each of `paths`, a `POST` route whose endpoint takes
    `body: <pydantic model>` and otherwise only `request: Request` and dependencies of the request.
    `handlers` are the app's exception handlers (`FastAPI.exception_handlers`), read when the first
    request builds the middleware stack."""

    def __init__(self, app: ASGIApp, *, paths: Iterable[str], routes: Iterable[Any],
                 handlers: Mapping[Any, ExceptionHandler]) -> None:
        self.app = app
        wanted = set(paths)
        self.routes: dict[str, _Route] = {}
        for r in routes:
            if isinstance(r, APIRoute) and r.path in wanted and "POST" in (r.methods or ()):
                self.routes[r.path] = _Route(r, r.endpoint)
        missing = wanted - self.routes.keys()
        if missing:
            raise ValueError(f"no POST route for {sorted(missing)}")
        # As Starlette's route wrapper: `Exception` (and 500) belong to the server-error middleware.
        self.handlers = {k: v for k, v in handlers.items() if k is not Exception and not isinstance(k, int)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = self.routes.get(scope["path"]) if scope["type"] == "http" else None
        if route is None or scope["method"] != "POST" or scope.get("root_path") or not _is_json(scope["headers"]):
            await self.app(scope, receive, send)
            return
        message = await receive()
        if message["type"] != "http.request" or message.get("more_body", False):
            # Not a body buffered by the guard: leave it all to the FastAPI stack.
            await self.app(scope, _replay(message, receive), send)
            return
        try:
            body = route.model.model_validate_json(message.get("body", b""))
        except ValidationError as e:
            too_deep = _too_deep(e, message.get("body", b""))
            if too_deep is None:
                await self.app(scope, _replay(message, receive), send)
                return
            # FastAPI's parser would take it, or die in a RecursionError a little deeper: refused here.
            handler = self._handler(too_deep)
            if handler is None:
                raise too_deep from None
            response = await handler(Request(scope, _replay(message, receive), send), too_deep)
            await response(scope, receive, send)
            return
        scope["route"] = route.api_route
        scope["endpoint"] = route.endpoint
        scope["path_params"] = {}
        # Whether the response started (a handled exception after that is an error, not a response):
        # the request context's `send` wrapper records it, so SSE chunks need no wrapper of ours.
        stats = current_stats()
        if stats is None:
            stats = RequestStats(0.0)
            send = _status_tracking(send, stats)
        # The request can still give its body (`await request.body()`), as under FastAPI.
        request = Request(scope, _replay(message, receive), send)
        try:
            kwargs: dict[str, Any] = {name: dep(request) for name, dep in route.deps}
            if route.wants_request:
                kwargs["request"] = request
            response = await route.endpoint(body=body, **kwargs)
            await response(scope, receive, send)
        except Exception as exc:
            handler = self._handler(exc)
            if handler is None:
                raise
            if stats.status:
                raise RuntimeError("Caught handled exception, but response already started.") from exc
            response = await handler(request, exc)
            await response(scope, receive, send)

    def _handler(self, exc: Exception) -> ExceptionHandler | None:
        for cls in type(exc).__mro__:
            handler = self.handlers.get(cls)
            if handler is not None:
                return handler
        return None


def _too_deep(error: ValidationError, body: bytes) -> InvalidRequestError | None:
    """The 400 for a body nested past the JSON parser's limit; None for any other validation error."""
    errors = error.errors(include_url=False, include_context=False, include_input=False)
    if len(errors) != 1 or errors[0].get("type") != "json_invalid" or \
            "recursion limit" not in str(errors[0].get("msg", "")):
        return None
    return deep_body_error(body)


def _status_tracking(send: Send, stats: RequestStats) -> Send:
    """`send`, recording the response's status in `stats` (only where no request context does)."""

    async def tracking_send(message: Message) -> None:
        if message["type"] == "http.response.start":
            stats.status = message["status"]
        await send(message)

    return tracking_send


def _replay(message: Message, receive: Receive) -> Receive:
    """`receive` that first gives `message` back, for the FastAPI stack to read the body again."""
    pending: Message | None = message

    async def replay() -> Message:
        nonlocal pending
        if pending is not None:
            msg, pending = pending, None
            return msg
        return await receive()

    return replay
