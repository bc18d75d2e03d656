from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_api.observability import METRICS_CONTENT_TYPE

router = APIRouter()


@router.get("/metrics", tags=["health"], include_in_schema=False)
async def metrics(request: Request) -> Response:
    """Prometheus text format (needs the API key when keys are set)."""
    return Response(request.app.state.metrics.render(), media_type=METRICS_CONTENT_TYPE)
