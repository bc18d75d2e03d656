"""Turning service results into HTTP responses, and errors into the shape of the dialect a route speaks."""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from openai_api.errors import (
    INTERNAL_ERROR_MESSAGE,
    GatewayError,
    InternalError,
    InvalidRequestError,
    NotFoundError,
)
from openai_api.http.dialects.table import dialect_for
from openai_api.services.bounds import MAX_JSON_DEPTH, deep_body_error

logger = logging.getLogger(__name__)

def json_response(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(payload), status_code=status, media_type="application/json", headers=headers)


def error_response(err: GatewayError, request: Request) -> Response:
    """`err` written once, by the dialect of the request's path (`http.dialects`)."""
    status, body = dialect_for(request.url.path).error(err, request.scope.get("state", {}).get("request_id"))
    return Response(body, status_code=status, media_type="application/json", headers=err.headers or None)


# Pydantic puts union-branch and validator tags into error locations ("str", "list[int]",
# "function-after[...]", model class names); they are not parameter names, so the path stops there.
_TYPE_TAG = re.compile(r"^(str|int|float|bool|none|[a-z_-]+\[.*\]|function-.*|lax-.*|strict-.*|[A-Z]\w*)$")


def _param_from_loc(loc: tuple[Any, ...]) -> str | None:
    out = ""
    for p in loc[1:] if loc and loc[0] in ("body", "query", "path") else loc:
        if isinstance(p, int):
            out += f"[{p}]"
        elif _TYPE_TAG.match(str(p)):
            break
        else:
            out += ("." if out else "") + str(p)
    return out or None


def validation_error(exc: RequestValidationError) -> InvalidRequestError:
    errors = exc.errors()
    if not errors:
        return InvalidRequestError("Invalid request body.")
    err = errors[0]
    if err.get("type") == "json_invalid":
        return InvalidRequestError("The request body is not valid JSON.", code="invalid_json")
    loc = tuple(err.get("loc", ()))
    param = _param_from_loc(loc)
    if err.get("type") == "missing":
        msg = f"'{param}' is a required property" if param else "A required property is missing."
    elif param is None and err.get("type") in ("model_attributes_type", "dict_type"):
        msg = "The request body must be a JSON object."
    else:
        msg = f"Invalid value for '{param}': {err.get('msg')}" if param else str(err.get("msg"))
    return InvalidRequestError(msg, param=param)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(GatewayError)
    async def _gateway(request: Request, exc: GatewayError) -> Response:
        return error_response(exc, request)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        return error_response(validation_error(exc), request)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404:
            return error_response(NotFoundError("Not found.", code="not_found"), request)
        if exc.status_code == 405:
            # RFC 9110 15.5.6: a 405 must carry Allow; Starlette puts it in the exception's headers.
            err: GatewayError = InvalidRequestError("Method not allowed.", code="method_not_allowed",
                                                    headers=dict(exc.headers or {}))
            err.status = 405
            return error_response(err, request)
        if isinstance(exc.__cause__, RecursionError):  # FastAPI's own parser, on a body nested past its reach
            return error_response(deep_body_error(await request.body()) or InvalidRequestError(
                f"The request body is nested too deeply to read; the gateway's limit is {MAX_JSON_DEPTH} levels "
                "of JSON nesting in a request body.", code="too_deeply_nested"), request)
        err = InvalidRequestError(str(exc.detail))
        err.status = exc.status_code
        return error_response(err, request)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error", exc_info=exc)
        return error_response(InternalError(INTERNAL_ERROR_MESSAGE), request)
