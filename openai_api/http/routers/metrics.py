from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_api.errors import AuthenticationError
from openai_api.http.deps import CallerDep, MetricsDep, QuotaDep, app_state
from openai_api.http.middleware import AUTHORIZED_KEY
from openai_api.observability import METRICS_CONTENT_TYPE
from openai_api.quota.service import PermissionDeniedError

router = APIRouter()


@router.get("/metrics", tags=["health"], include_in_schema=False)
async def metrics(request: Request, registry: MetricsDep, caller: CallerDep, quota: QuotaDep) -> Response:
    """Prometheus text format. It names every key, team, model and adapter, so with a keys file only keys
    marked `admin: true` or `metrics: true` (a key for Prometheus) may read it (403 for others); with
    `--api-key` keys alone, any of them (they are the operator's). With `--open-vllm-metrics`, a request without
    such a key (the endpoint picker's scrape) gets the vLLM-named families alone, which name no key."""
    keys_set = quota.table is not None or bool(app_state(request).settings.api_keys)
    authorized = request.scope.get("state", {}).get(AUTHORIZED_KEY, True)  # set on an open path only
    full = not keys_set or (authorized and (quota.table is None or caller.policy.reads_metrics))
    if not full:
        if app_state(request).settings.open_vllm_metrics:
            return Response(registry.render(vllm_only=True), media_type=METRICS_CONTENT_TYPE)
        if not authorized:  # reached only when /metrics is an open path
            raise AuthenticationError("Incorrect API key provided.")
        raise PermissionDeniedError("This key may not read /metrics: it names every tenant. Use a key marked "
                                    "`metrics: true` (or `admin: true`) in the keys file.")
    return Response(registry.render(), media_type=METRICS_CONTENT_TYPE)
