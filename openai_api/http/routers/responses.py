from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Query
from starlette.responses import Response

from openai_api.errors import InvalidRequestError
from openai_api.http.deps import AdmissionDep, CallerDep, Ctx, ResponsesSvc
from openai_api.http.dialects.openai_responses import DIALECT, encode_events, parse
from openai_api.http.responses import json_response
from openai_api.http.routers import responses_ops, responses_ws
from openai_api.schemas.openai import ResponsesRequest
from openai_api.services import response_ops
from openai_api.services.response_tools import OMITTED_TOOLS_HEADER, omitted_tools

router = APIRouter()


@router.post("/v1/responses", tags=["responses"])
async def create_response(body: ResponsesRequest, service: ResponsesSvc, admission: AdmissionDep,
                          ctx: Ctx) -> Response:
    """OpenAI's Responses API: a response object, or its typed SSE events when `stream` is set; with `background`
    the stored response, `queued`, at once; with a final `compaction_trigger` input item, a response whose output is
    one `compaction` item (`services.response_ops.compaction_turn`). Tools the gateway cannot run (hosted ones)
    are left out and named in the `x-omitted-tools` header."""
    await admission.responses(body)
    if response_ops.compaction_triggered(body):  # Codex's remote compaction: one `compaction` item, no answer
        if body.background:
            raise InvalidRequestError("A compaction_trigger is not taken with background: true.", param="background")
        turn = await response_ops.compaction_turn(service, body, ctx.request)
        response = await DIALECT.respond(encode_events(turn.events()) if body.stream else turn.response,
                                         ctx.flush_interval_s)
    elif body.background:
        response = json_response(await service.start_background(body, ctx.request, admission.detach))
    else:
        items = parse(body)
        response = await DIALECT.answer(await service.create(body, ctx.request, items=items), ctx.flush_interval_s)
    if omitted := omitted_tools(body.tools):
        response.headers[OMITTED_TOOLS_HEADER] = ",".join(omitted)
    return response


@router.get("/v1/responses/{response_id}", tags=["responses"])
async def get_response(response_id: str, service: ResponsesSvc, caller: CallerDep) -> Response:
    """A stored response of the caller's key (kept only with --responses-store and store: true); else 404."""
    return json_response(await service.get(response_id, caller))


@router.delete("/v1/responses/{response_id}", tags=["responses"])
async def delete_response(response_id: str, service: ResponsesSvc, caller: CallerDep) -> Response:
    """Forget a stored response of the caller's key: `{id, object: "response", deleted: true}`; else 404."""
    return json_response(await service.delete(response_id, caller))


@router.get("/v1/responses/{response_id}/input_items", tags=["responses"])
async def list_input_items(response_id: str, service: ResponsesSvc, caller: CallerDep,
                           after: str | None = None, limit: int = Query(20),
                           order: Literal["asc", "desc"] = "desc") -> Response:
    """The input items of a stored response of the caller's key, OpenAI's list page (`include` is accepted and
    changes nothing: no item here has more to include); else 404."""
    return json_response(await service.input_items(response_id, caller, after, limit, order))


# Counting, compaction and cancelling, and the WebSocket mode: their own modules, under the same paths' router.
router.include_router(responses_ops.router)
router.include_router(responses_ws.router)
