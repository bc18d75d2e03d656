from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import MetricsDep
from openai_api.observability import METRICS_CONTENT_TYPE

router = APIRouter()


@router.get("/metrics", tags=["health"], include_in_schema=False)
async def metrics(registry: MetricsDep) -> Response:
    """Prometheus text format (needs the API key when keys are set)."""
    return Response(registry.render(), media_type=METRICS_CONTENT_TYPE)
