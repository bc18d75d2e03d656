from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_api.http.deps import flush_interval, request_id, services
from openai_api.http.limits import admit_chat
from openai_api.http.responses import service_response
from openai_api.schemas.openai import ChatCompletionRequest

router = APIRouter()


@router.post("/v1/chat/completions", tags=["chat"])
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    admit_chat(request, body)
    return await service_response(await services(request).chat.create(body, request_id(request)),
                                  flush_interval(request))
