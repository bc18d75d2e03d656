"""Anthropic's Message Batches (`services.batches`, the same engine as OpenAI's Batch API): create with
`requests: [{custom_id, params}]`, retrieve, list, cancel, delete once ended, and the results as JSONL. Errors come
in Anthropic's shape (`http.dialects.table`: every path under /v1/messages)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from openai_api.http.deps import BatchesSvc, CallerDep
from openai_api.http.responses import json_response
from openai_api.http.routers.batches import who

router = APIRouter()


class CreateMessageBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    requests: list[Any]


def _base(request: Request) -> str:
    return str(request.base_url).rstrip("/")


@router.post("/v1/messages/batches", tags=["messages"])
async def create_message_batch(body: CreateMessageBatch, request: Request, service: BatchesSvc,
                               caller: CallerDep) -> Response:
    """A `message_batch` in `in_progress`; each request's `params` is a Messages request, run as `batch` class."""
    made = await service.create_messages(caller.owner, body.requests, who(caller))
    return json_response(made)


@router.get("/v1/messages/batches", tags=["messages"])
async def list_message_batches(request: Request, service: BatchesSvc, caller: CallerDep,
                               after_id: str | None = None,
                               limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> Response:
    page = await service.list_batches(caller.owner, "anthropic", limit, after_id)
    page.pop("object", None)
    return json_response(page)


@router.get("/v1/messages/batches/{batch_id}", tags=["messages"])
async def retrieve_message_batch(batch_id: str, request: Request, service: BatchesSvc,
                                 caller: CallerDep) -> Response:
    rec = await service.job(caller.owner, batch_id, "anthropic")
    return json_response(await service.message_batch_object(rec, _base(request)))


@router.post("/v1/messages/batches/{batch_id}/cancel", tags=["messages"])
async def cancel_message_batch(batch_id: str, request: Request, service: BatchesSvc, caller: CallerDep) -> Response:
    rec = await service.cancel(caller.owner, batch_id, "anthropic")
    return json_response(await service.message_batch_object(rec, _base(request)))


@router.delete("/v1/messages/batches/{batch_id}", tags=["messages"])
async def delete_message_batch(batch_id: str, service: BatchesSvc, caller: CallerDep) -> Response:
    """`{id, type: "message_batch_deleted"}` for an ended batch; a 400 while it is processing."""
    return json_response(await service.delete_message_batch(caller.owner, batch_id))


@router.get("/v1/messages/batches/{batch_id}/results", tags=["messages"])
async def message_batch_results(batch_id: str, service: BatchesSvc, caller: CallerDep) -> Response:
    """One JSON line per request, `{custom_id, result}`, once the batch has ended (a 400 before)."""
    return Response(await service.message_results(caller.owner, batch_id), media_type="application/x-jsonl")
