from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.errors import NotFoundError
from openai_api.http.deps import CallerDep, QuotaDep
from openai_api.http.responses import json_response
from openai_api.quota.service import PermissionDeniedError

router = APIRouter()


@router.get("/v1/admin/usage", tags=["keys"])
async def usage(caller: CallerDep, quota: QuotaDep) -> Response:
    """Every key of the keys file: its team, limits, what it used (requests and tokens in the current
    window, requests in flight, tokens today and this month, UTC) and what remains. Only for keys marked
    `admin: true` (403 for others); 404 without a keys file."""
    if quota.table is None:
        raise NotFoundError("Not found.", code="not_found")
    if not caller.policy.admin:
        raise PermissionDeniedError("This key may not read the usage of keys (it is not an admin key).")
    return json_response({"object": "list", "data": await quota.usage()})
