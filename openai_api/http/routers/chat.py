from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, ChatSvc, Ctx
from openai_api.http.dialects.openai_chat import DIALECT, parse
from openai_api.schemas.openai import ChatCompletionRequest

router = APIRouter()


@router.post("/v1/chat/completions", tags=["chat"])
async def chat_completions(body: ChatCompletionRequest, chat: ChatSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    await admission.chat(body)  # its depth check reads the body as sent, before `parse` types its parts
    call = parse(body)
    return await DIALECT.answer(await chat.create(call, ctx.request), ctx.flush_interval_s)
