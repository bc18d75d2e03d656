from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_api.http.deps import CallerDep, HealthSvc, app_state
from openai_api.http.middleware import AUTHORIZED_KEY
from openai_api.http.openapi import PING_RESPONSES
from openai_api.http.responses import json_response
from openai_api.quota.caller import Caller

router = APIRouter()


@router.get("/health", tags=["health"])
async def health() -> Response:
    """The gateway process is alive (liveness); says nothing about Triton."""
    return json_response({"status": "ok"})


@router.get("/health/ready", tags=["health"])
async def ready(request: Request, health: HealthSvc, caller: CallerDep) -> Response:
    """This process can serve (readiness): its config is loaded, it is not draining (a draining gateway answers
    503 before this route), and `--ready-models` holds (default: at least one configured model is ready); 503
    otherwise. Open to probes without a key, but only a request with a valid key (or a gateway without keys) is
    told the models, and only those its key may use."""
    authorized = request.scope.get("state", {}).get(AUTHORIZED_KEY, True)
    report = await health.readiness(app_state(request).settings.ready_models, details=authorized)
    return json_response(_visible(report, caller), status=200 if report["ready"] else 503)


@router.get("/ping", tags=["health"], responses=PING_RESPONSES)
@router.post("/ping", tags=["health"], responses=PING_RESPONSES, include_in_schema=False)  # (one in the docs)
async def ping(request: Request, health: HealthSvc) -> Response:
    """SageMaker's health check (and vLLM's, which serves it for SageMaker): the verdict of /health/ready, 200
    `{"status": "healthy"}` or 503 `{"status": "unhealthy"}`, open without a key and naming no model."""
    report = await health.readiness(app_state(request).settings.ready_models, details=False)
    return json_response({"status": "healthy" if report["ready"] else "unhealthy"},
                         status=200 if report["ready"] else 503)


def _visible(report: dict[str, Any], caller: Caller) -> dict[str, Any]:
    """The report naming only the models `caller` may use."""
    if "models" in report:
        report["models"] = {m: v for m, v in report["models"].items() if caller.allows(m)}
    if "replicas" in report:
        report["replicas"] = {m: v for m, v in report["replicas"].items() if caller.allows(m)}
    return report
