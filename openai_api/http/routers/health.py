from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_api.http.deps import HealthSvc
from openai_api.http.middleware import AUTHORIZED_KEY
from openai_api.http.responses import json_response

router = APIRouter()


@router.get("/health", tags=["health"])
async def health() -> Response:
    """The gateway process is alive (liveness); says nothing about Triton."""
    return json_response({"status": "ok"})


@router.get("/health/ready", tags=["health"])
async def ready(request: Request, health: HealthSvc) -> Response:
    """Triton and every configured model are ready (readiness); 503 otherwise. Open to probes without a
    key, but only a request with a valid key (or a gateway without keys) is told the models by name."""
    report = await health.readiness()
    if not request.scope.get("state", {}).get(AUTHORIZED_KEY, True):
        report = {"ready": report["ready"]}
    return json_response(report, status=200 if report["ready"] else 503)
