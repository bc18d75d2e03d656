"""The direct dispatch of hot JSON routes: served without FastAPI's body handling when the body is valid
JSON of the route's model, and answered exactly as FastAPI answers everything else."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import APIRouter, FastAPI, Request
from pydantic import BaseModel, Field
from starlette.responses import Response, StreamingResponse

from openai_api.errors import GatewayError, InvalidRequestError
from openai_api.http.fastpath import JSONRouteMiddleware
from openai_api.http.guard import GuardMiddleware
from openai_api.http.inflight import InFlightLimiter
from openai_api.http.lifecycle import Lifecycle
from openai_api.http.middleware import RequestContextMiddleware
from openai_api.http.responses import install_error_handlers, json_response
from openai_api.observability import Metrics


class Body(BaseModel):
    model: str = Field(min_length=1)
    n: int = Field(default=1, ge=1)
    mode: str = "ok"


router = APIRouter()


@router.post("/v1/thing")
async def thing(body: Body, request: Request) -> Response:
    if body.mode == "gateway_error":
        raise InvalidRequestError("refused by the service", param="mode")
    if body.mode == "crash":
        raise RuntimeError("a bug")
    if body.mode == "stream":
        async def events() -> AsyncIterator[bytes]:
            for i in range(body.n):
                yield b"data: %d\n\n" % i

        return StreamingResponse(events(), media_type="text/event-stream")
    # Only FastAPI's own dispatch opens its exit stacks: their absence shows which path served this.
    direct = "fastapi_inner_astack" not in request.scope
    return json_response({"model": body.model, "n": body.n, "direct": direct})


def make_app(fast: bool) -> FastAPI:
    """The gateway's stack around one route: the request context outermost, the guard (which buffers
    the body the direct dispatch needs) innermost, and the dispatch inside it when `fast`."""
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(router)
    if fast:
        app.add_middleware(JSONRouteMiddleware, paths=["/v1/thing"], routes=router.routes,
                           handlers=app.exception_handlers)
    app.add_middleware(GuardMiddleware, max_body_bytes=1 << 20, limiter=InFlightLimiter(10, 10, 1, set()),
                       lifecycle=Lifecycle())
    app.add_middleware(RequestContextMiddleware, metrics=Metrics(), access_log=False)
    return app


async def post(app: FastAPI, content: bytes | None, headers: dict[str, str] | None = None,
               method: str = "POST", path: str = "/v1/thing") -> httpx.Response:
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        return await c.request(method, path, content=content,
                               headers=headers if headers is not None else {"content-type": "application/json"})


async def test_a_valid_json_body_is_served_directly() -> None:
    r = await post(make_app(True), b'{"model": "m", "n": "3"}')
    assert r.status_code == 200
    assert r.json() == {"model": "m", "n": 3, "direct": True}
    assert r.headers["x-request-id"]


async def test_the_route_template_labels_the_request_metrics() -> None:
    app = make_app(True)
    await post(app, b'{"model": "m"}')
    metrics: Metrics = app.user_middleware[0].kwargs["metrics"]  # the request context's
    assert 'openai_api_requests_total{model="",route="/v1/thing",status="200"} 1.0' in metrics.render().decode()


@pytest.mark.parametrize(("content", "headers", "method", "path"), [
    (b'{"n": 2}', None, "POST", "/v1/thing"),                                    # missing field
    (b'{"model": "", "n": 0}', None, "POST", "/v1/thing"),                       # constraints
    (b'{"model": "m", "n": 1.5}', None, "POST", "/v1/thing"),
    (b"[1, 2]", None, "POST", "/v1/thing"),                                       # not an object
    (b"null", None, "POST", "/v1/thing"),
    (b"{not json", None, "POST", "/v1/thing"),
    (b"", None, "POST", "/v1/thing"),                                             # no body
    (b'\xef\xbb\xbf{"model": "m"}', None, "POST", "/v1/thing"),                   # BOM: json.loads takes it
    (b'{"model": "\\ud800"}', None, "POST", "/v1/thing"),                         # lone surrogate
    (b'{"model": "m"}', {}, "POST", "/v1/thing"),                                 # no content type
    (b'{"model": "m"}', {"content-type": "text/plain"}, "POST", "/v1/thing"),
    (b'{"model": "m"}', {"content-type": "application/x+json"}, "POST", "/v1/thing"),
    (b'{"model": "m"}', None, "PUT", "/v1/thing"),                                # 405 with Allow
    (b'{"model": "m"}', None, "POST", "/v1/thing/"),                              # redirect
    (b'{"model": "m", "mode": "gateway_error"}', None, "POST", "/v1/thing"),
    (b'{"model": "m", "mode": "crash"}', None, "POST", "/v1/thing"),
    (b'{"model": "m", "mode": "stream", "n": 3}', None, "POST", "/v1/thing"),
])
async def test_every_answer_but_the_dispatch_is_what_fastapi_gives(content: bytes, headers: dict[str, str] | None,
                                                                   method: str, path: str) -> None:
    fast = await post(make_app(True), content, headers, method, path)
    slow = await post(make_app(False), content, headers, method, path)
    assert fast.status_code == slow.status_code
    assert fast.content.replace(b'"direct":true', b'"direct":false') == slow.content
    drop = {"x-request-id", "content-length"}
    assert ({k: v for k, v in fast.headers.items() if k not in drop}
            == {k: v for k, v in slow.headers.items() if k not in drop})


async def test_a_handled_error_becomes_its_openai_error_and_a_crash_a_500() -> None:
    app = make_app(True)
    r = await post(app, b'{"model": "m", "mode": "gateway_error"}')
    assert r.status_code == 400
    assert r.json()["error"] == {"message": "refused by the service", "type": "invalid_request_error",
                                 "param": "mode", "code": None}
    r = await post(app, b'{"model": "m", "mode": "crash"}')
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "internal_error"


def test_a_path_without_a_pydantic_post_route_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="no POST route"):
        JSONRouteMiddleware(FastAPI(), paths=["/v1/other"], routes=router.routes, handlers={})


def test_gateway_errors_are_mapped_by_the_apps_handler() -> None:
    app = make_app(True)
    mw = JSONRouteMiddleware(app, paths=["/v1/thing"], routes=router.routes, handlers=app.exception_handlers)
    handler: Any = mw._handler(InvalidRequestError("x"))
    assert handler is app.exception_handlers[GatewayError]
    assert mw._handler(RuntimeError("x")) is None  # left to the server-error middleware (500)
