"""What the OpenAPI schema says about errors: every route may answer OpenAI's error object with these
statuses, so schema-driven clients (and the schemathesis fuzz run) know the whole contract."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorDetail


_DESCRIPTIONS = {
    400: "Invalid request (names `param`)",
    401: "Missing or wrong API key",
    404: "Unknown model or route",
    405: "Method not allowed",
    413: "Request body too large",
    429: "Too many requests in flight (see `Retry-After`)",
    500: "Internal error",
    502: "Triton refused the request",
    503: "Triton or the model is unavailable, or the gateway is shutting down",
    504: "Deadline exceeded or the stream stalled",
}

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorResponse, "description": text} for status, text in _DESCRIPTIONS.items()
}


class ReadinessReport(BaseModel):
    ready: bool
    # Only for a request with a valid API key (or when the gateway has no keys).
    models: dict[str, str] | None = None


# Readiness answers 503 with the same report as its 200 (which models are not ready), not an error object.
HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    **{k: v for k, v in ERROR_RESPONSES.items() if k != 503},
    503: {"model": ReadinessReport, "description": "Triton or a model is not ready, or the gateway is draining"},
}


class PingReport(BaseModel):
    status: str  # healthy | unhealthy


# /ping (SageMaker's readiness) answers 503 with `{"status": "unhealthy"}`.
PING_RESPONSES: dict[int | str, dict[str, Any]] = {
    503: {"model": PingReport, "description": "Not ready (as /health/ready), or the gateway is draining"},
}
