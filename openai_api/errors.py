"""The one error taxonomy of the gateway and its one mapping to HTTP status + OpenAI error body.

Every layer raises a subclass of `GatewayError`; only `error_body`/`error_response_bytes` turn
one into bytes, so the status code and shape of an error are decided in exactly one place.
"""

from __future__ import annotations

from typing import Any

import orjson


class GatewayError(Exception):
    """Base error: `status` and `type` come from the subclass, `param`/`code` from the raise site."""

    status: int = 500
    type: str = "server_error"
    default_code: str | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code if code is not None else self.default_code
        self.headers = headers or {}
        # What the gateway knows beyond `message` (Triton's own words): for logs and for the layer that
        # raised it to act on, never sent to a client.
        self.detail = detail


class InvalidRequestError(GatewayError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceededError(InvalidRequestError):
    default_code = "context_length_exceeded"


class AuthenticationError(GatewayError):
    status = 401
    type = "invalid_request_error"
    default_code = "invalid_api_key"


class NotFoundError(GatewayError):
    status = 404
    type = "invalid_request_error"
    default_code = "not_found"


class ModelNotFoundError(NotFoundError):
    default_code = "model_not_found"


class PayloadTooLargeError(GatewayError):
    status = 413
    type = "invalid_request_error"
    default_code = "payload_too_large"


class RequestTimeoutError(GatewayError):
    """The request's body did not arrive in time (`http.connections`' body deadline)."""

    status = 408
    type = "invalid_request_error"
    default_code = "request_timeout"


class HeadersTooLargeError(GatewayError):
    """The request line and headers are larger than the gateway takes (`http.connections`)."""

    status = 431
    type = "invalid_request_error"
    default_code = "request_header_fields_too_large"


class OverloadedError(GatewayError):
    status = 429
    type = "rate_limit_error"
    default_code = "overloaded"


class InternalError(GatewayError):
    status = 500
    type = "server_error"
    default_code = "internal_error"


class BackendError(GatewayError):
    """Triton answered with an error for a request that was valid from the gateway's side."""

    status = 502
    type = "server_error"
    default_code = "backend_error"


class BackendUnavailableError(GatewayError):
    """Triton is unreachable, or the model is not loaded/ready."""

    status = 503
    type = "server_error"
    default_code = "backend_unavailable"


class AdapterCacheFullError(GatewayError):
    """The backend's LoRA adapter cache has no room for this request's adapter: every adapter it holds is in use
    by running requests (TensorRT-LLM's "PEFT Cache is full"). Transient, and not the replica's failure: a 503
    with `Retry-After` (which the OpenAI SDKs retry; Anthropic's 529 overloaded_error), never a 429 (which
    would read as the caller's own rate limit) and never a 400 (the request is valid)."""

    status = 503
    type = "server_error"
    default_code = "lora_cache_full"


class BackendTimeoutError(GatewayError):
    status = 504
    type = "server_error"
    default_code = "timeout"


def error_body(err: GatewayError) -> dict[str, Any]:
    return {"error": {"message": err.message, "type": err.type, "param": err.param, "code": err.code}}


def error_response_bytes(err: GatewayError) -> bytes:
    return orjson.dumps(error_body(err))


# The same errors in Anthropic's Messages API shape (https://docs.anthropic.com/en/api/errors): the gateway's
# status -> Anthropic's status and error type. Triton unavailable or the gateway draining (503) is Anthropic's
# 529 overloaded_error, which its SDKs retry; a Triton failure (502) is an api_error 500; any other 4xx keeps its
# status as invalid_request_error, as Anthropic's reference says.
ANTHROPIC_ERRORS: dict[int, tuple[int, str]] = {
    400: (400, "invalid_request_error"), 401: (401, "authentication_error"), 403: (403, "permission_error"),
    404: (404, "not_found_error"), 413: (413, "request_too_large"), 429: (429, "rate_limit_error"),
    500: (500, "api_error"), 502: (500, "api_error"), 503: (529, "overloaded_error"), 504: (504, "timeout_error")}


def anthropic_error(status: int, message: str) -> tuple[int, dict[str, Any]]:
    """An error of the gateway's `status` as Anthropic's status and body `{type: "error", error: {type, message}}`."""
    new_status, kind = ANTHROPIC_ERRORS.get(status, (status, "invalid_request_error" if status < 500 else "api_error"))
    return new_status, {"type": "error", "error": {"type": kind, "message": message}}


def anthropic_error_body(err: GatewayError) -> dict[str, Any]:
    return anthropic_error(err.status, err.message)[1]


INTERNAL_ERROR_MESSAGE = "The server had an error while processing your request."


class ShuttingDownError(GatewayError):
    """The gateway is draining after SIGTERM: requests in flight finish, new ones are refused."""

    status = 503
    type = "server_error"
    default_code = "shutting_down"
