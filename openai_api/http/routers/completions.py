from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, CompletionsSvc, Ctx
from openai_api.http.dialects.openai_completions import DIALECT, parse
from openai_api.schemas.openai import CompletionRequest

router = APIRouter()


@router.post("/v1/completions", tags=["completions"])
async def completions(body: CompletionRequest, service: CompletionsSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    call = parse(body)
    await admission.completions(call)
    return await DIALECT.answer(await service.create(call, ctx.request), ctx.flush_interval_s)
