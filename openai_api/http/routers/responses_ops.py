"""`POST /v1/responses/input_tokens` and `POST /v1/responses/compact` (`services.response_ops`), and `POST
/v1/responses/{id}/cancel` (`services.response_background`), included by the `/v1/responses` router. Counting and
compaction are admitted as `/v1/responses` is: body bounds, the key's allow-list, an in-flight slot (counting is
tokenizer work; compaction a generation)."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, CallerDep, Ctx, ResponsesSvc
from openai_api.http.dialects.openai_responses import parse
from openai_api.http.responses import json_response
from openai_api.schemas.responses_ops import ResponsesOpRequest
from openai_api.services import response_ops

router = APIRouter()


@router.post("/v1/responses/input_tokens", tags=["responses"])
async def count_input_tokens(body: ResponsesOpRequest, service: ResponsesSvc, admission: AdmissionDep,
                             ctx: Ctx) -> Response:
    """`{"object": "response.input_tokens", "input_tokens": N}`: the `usage.input_tokens` the same body would
    report on `/v1/responses`."""
    await admission.responses(body)
    return json_response(await response_ops.input_tokens(service, body, ctx.request, parse(body)))


@router.post("/v1/responses/compact", tags=["responses"])
async def compact_response(body: ResponsesOpRequest, service: ResponsesSvc, admission: AdmissionDep,
                           ctx: Ctx) -> Response:
    """OpenAI's compacted response (`object: "response.compaction"`): the conversation's user messages and one
    `compaction` item holding the served model's summary, which a following `/v1/responses` takes as input."""
    await admission.responses(body)
    return json_response(await response_ops.compact(service, body, ctx.request))


@router.post("/v1/responses/{response_id}/cancel", tags=["responses"])
async def cancel_response(response_id: str, service: ResponsesSvc, caller: CallerDep) -> Response:
    """Cancel a background response of the caller's key: the response, `cancelled` (or as it ended, when it
    already had); a response made without `background` is a 400; else 404."""
    return json_response(await service.cancel(response_id, caller))
