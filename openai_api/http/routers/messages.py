from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, Ctx, MessagesSvc
from openai_api.http.responses import json_response, service_response
from openai_api.schemas.anthropic import CountTokensRequest, MessagesRequest
from openai_api.services.messages import PING, PING_INTERVAL_S

router = APIRouter()


@router.post("/v1/messages", tags=["anthropic"])
async def create_message(body: MessagesRequest, service: MessagesSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    """Anthropic's Messages API: a `message` object, or its SSE events when `stream` is set. Errors are in
    Anthropic's shape (`http.anthropic`); `anthropic-version` and `anthropic-beta` headers are accepted."""
    admission.allowed(service.model(body.model))  # before anything looks at the model (its image support)
    chat_req = service.chat_request(body)
    await admission.chat(chat_req)
    # A quiet stream gets Anthropic's `ping` from the writer's own timer (no task or queue per event).
    return await service_response(await service.create(body, chat_req, ctx.request_id), ctx.flush_interval_s,
                                  PING, PING_INTERVAL_S)


@router.post("/v1/messages/count_tokens", tags=["anthropic"])
async def count_tokens(body: CountTokensRequest, service: MessagesSvc, admission: AdmissionDep) -> Response:
    """`{input_tokens}`: the prompt `/v1/messages` would send, through the model's template and tokenizer."""
    admission.allowed(service.model(body.model))
    chat_req = service.chat_request(body)
    await admission.tokenize(chat_req.model, len(chat_req.messages), chat_req)
    return json_response(await service.count_tokens(body, chat_req))
