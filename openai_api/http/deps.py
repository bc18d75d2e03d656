"""Request-scoped accessors shared by the routers."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

from fastapi import Request

if TYPE_CHECKING:
    from openai_api.app import Services


def services(request: Request) -> Services:
    return request.app.state.services  # type: ignore[no-any-return]


def request_id(request: Request) -> str:
    rid = request.scope.get("state", {}).get("request_id")
    return rid if isinstance(rid, str) else uuid.uuid4().hex


def flush_interval(request: Request) -> float:
    """The SSE write-coalescing interval (`Settings.stream_flush_interval_s`); 0 without settings."""
    return float(getattr(getattr(request.app.state, "settings", None), "stream_flush_interval_s", 0.0))
