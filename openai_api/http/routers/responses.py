from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, Ctx, ResponsesSvc
from openai_api.http.responses import json_response, service_response
from openai_api.schemas.openai import ResponsesRequest

router = APIRouter()


@router.post("/v1/responses", tags=["responses"])
async def create_response(body: ResponsesRequest, service: ResponsesSvc, admission: AdmissionDep,
                          ctx: Ctx) -> Response:
    """OpenAI's Responses API: a response object, or its typed SSE events when `stream` is set."""
    admission.responses(body)
    return await service_response(await service.create(body, ctx.request_id), ctx.flush_interval_s)


@router.get("/v1/responses/{response_id}", tags=["responses"])
async def get_response(response_id: str, service: ResponsesSvc) -> Response:
    """A stored response (the gateway keeps them only with --responses-store and store: true)."""
    return json_response(service.get(response_id))
