from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, Ctx, ResponsesSvc
from openai_api.http.responses import json_response, service_response
from openai_api.schemas.openai import ResponsesRequest
from openai_api.services.response_tools import OMITTED_TOOLS_HEADER, omitted_tools

router = APIRouter()


@router.post("/v1/responses", tags=["responses"])
async def create_response(body: ResponsesRequest, service: ResponsesSvc, admission: AdmissionDep,
                          ctx: Ctx) -> Response:
    """OpenAI's Responses API: a response object, or its typed SSE events when `stream` is set. Tools the
    gateway cannot run (hosted ones) are left out and named in the `x-omitted-tools` header."""
    admission.responses(body)
    response = await service_response(await service.create(body, ctx.request_id), ctx.flush_interval_s)
    if omitted := omitted_tools(body.tools):
        response.headers[OMITTED_TOOLS_HEADER] = ",".join(omitted)
    return response


@router.get("/v1/responses/{response_id}", tags=["responses"])
async def get_response(response_id: str, service: ResponsesSvc) -> Response:
    """A stored response (the gateway keeps them only with --responses-store and store: true)."""
    return json_response(service.get(response_id))
