from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, Ctx, MessagesSvc
from openai_api.http.dialects.anthropic_messages import DIALECT, parse
from openai_api.http.responses import json_response
from openai_api.schemas.anthropic import CountTokensRequest, MessagesRequest

router = APIRouter()


@router.post("/v1/messages", tags=["anthropic"])
async def create_message(body: MessagesRequest, service: MessagesSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    """Anthropic's Messages API: a `message` object, or its SSE events when `stream` is set. Errors are in
    Anthropic's shape (`http.dialects.anthropic_messages`); `anthropic-version` and `anthropic-beta` headers are
    accepted."""
    admission.allowed(service.model(body.model))  # before anything looks at the model (its image support)
    call = parse(body, service)
    await admission.chat(call.chat)
    return await DIALECT.answer(await service.create(call, ctx.request), ctx.flush_interval_s)


@router.post("/v1/messages/count_tokens", tags=["anthropic"])
async def count_tokens(body: CountTokensRequest, service: MessagesSvc, admission: AdmissionDep) -> Response:
    """`{input_tokens}`: the prompt `/v1/messages` would send, through the model's template and tokenizer."""
    admission.allowed(service.model(body.model))
    call = parse(body, service)
    await admission.tokenize(call.chat.model, len(call.chat.messages), call.chat)
    return json_response(await service.count_tokens(call))
