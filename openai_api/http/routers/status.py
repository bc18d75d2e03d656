from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from openai_api.errors import NotFoundError
from openai_api.http.deps import CallerDep, HealthSvc, QuotaDep, app_state, services
from openai_api.http.status_page import CSP, render
from openai_api.quota.service import PermissionDeniedError

router = APIRouter()


@router.get("/status", tags=["health"], include_in_schema=False)
async def status(request: Request, caller: CallerDep, quota: QuotaDep, health: HealthSvc,
                 refresh: Annotated[int, Query(ge=0, le=3600)] = 5) -> Response:
    """The status page (HTML, read-only; `http.status_page`): with a keys file only keys marked `admin: true` (403
    for others), with `--api-key` keys any of them, open without keys. A browser may send the key as the password
    of HTTP basic auth (the 401 asks for it). `refresh`: seconds between the page's own reloads (0: none)."""
    state = app_state(request)
    if state.status is None:
        raise NotFoundError("Not found.", code="not_found")
    if quota.table is not None and not caller.policy.admin:
        raise PermissionDeniedError("This key may not read the status page (it is not an admin key).")
    report = await state.status.report(services(request).registry, health, quota)
    return Response(render(report, refresh), media_type="text/html; charset=utf-8",
                    headers={"Content-Security-Policy": CSP, "Cache-Control": "no-store",
                             "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer"})
