from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import CallerDep, MetricsDep, QuotaDep
from openai_api.observability import METRICS_CONTENT_TYPE
from openai_api.quota.service import PermissionDeniedError

router = APIRouter()


@router.get("/metrics", tags=["health"], include_in_schema=False)
async def metrics(registry: MetricsDep, caller: CallerDep, quota: QuotaDep) -> Response:
    """Prometheus text format. It names every key, team, model and adapter, so with a keys file only keys
    marked `admin: true` or `metrics: true` (a key for Prometheus) may read it (403 for others); with
    `--api-key` keys alone, any of them (they are the operator's)."""
    if quota.table is not None and not caller.policy.reads_metrics:
        raise PermissionDeniedError("This key may not read /metrics: it names every tenant. Use a key marked "
                                    "`metrics: true` (or `admin: true`) in the keys file.")
    return Response(registry.render(), media_type=METRICS_CONTENT_TYPE)
