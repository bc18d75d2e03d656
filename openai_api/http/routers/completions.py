from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_api.http.deps import flush_interval, request_id, services
from openai_api.http.limits import admit_completions
from openai_api.http.responses import service_response
from openai_api.schemas.openai import CompletionRequest

router = APIRouter()


@router.post("/v1/completions", tags=["completions"])
async def completions(body: CompletionRequest, request: Request) -> Response:
    admit_completions(request, body)
    return await service_response(await services(request).completions.create(body, request_id(request)),
                                  flush_interval(request))
