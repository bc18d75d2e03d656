from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, CompletionsSvc, Ctx
from openai_api.http.responses import service_response
from openai_api.schemas.openai import CompletionRequest

router = APIRouter()


@router.post("/v1/completions", tags=["completions"])
async def completions(body: CompletionRequest, service: CompletionsSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    await admission.completions(body)
    return await service_response(await service.create(body, ctx.request_id), ctx.flush_interval_s)
