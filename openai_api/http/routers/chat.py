from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, ChatSvc, Ctx
from openai_api.http.responses import service_response
from openai_api.schemas.openai import ChatCompletionRequest

router = APIRouter()


@router.post("/v1/chat/completions", tags=["chat"])
async def chat_completions(body: ChatCompletionRequest, chat: ChatSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    await admission.chat(body)
    return await service_response(await chat.create(body, ctx.request_id), ctx.flush_interval_s)
