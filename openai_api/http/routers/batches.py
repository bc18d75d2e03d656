"""OpenAI's Batch API (`services.batches`): create, retrieve, list and cancel jobs over an uploaded input file; the
runner (`http.batch_runner`) answers their lines in the batch priority class."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict
from starlette.responses import Response

from openai_api.http.deps import BatchesSvc, CallerDep
from openai_api.http.responses import json_response
from openai_api.quota.caller import Caller

router = APIRouter()


class CreateBatchRequest(BaseModel):
    """OpenAI's `CreateBatchRequest`; other fields are accepted and not used."""

    model_config = ConfigDict(extra="allow", strict=True)

    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, Any] | None = None
    output_expires_after: dict[str, Any] | None = None  # {anchor: "created_at", seconds}: the output files' expiry


def who(caller: Caller) -> dict[str, str]:
    """What the runner needs to act as `caller` later (never a secret)."""
    return {"name": caller.name, "digest": caller.key_digest}


@router.post("/v1/batches", tags=["batches"])
async def create_batch(body: CreateBatchRequest, service: BatchesSvc, caller: CallerDep) -> Response:
    """A `batch` object in status `validating` (then `failed`, with `errors`, when its input file has a bad line);
    400 for a bad endpoint, window or metadata, an input file of another purpose, or too many unfinished jobs of
    this key; 404 for an input file that is not the caller's."""
    return json_response(await service.create(caller.owner, body.input_file_id, body.endpoint,
                                              body.completion_window, body.metadata, who(caller),
                                              body.output_expires_after))


@router.get("/v1/batches", tags=["batches"])
async def list_batches(service: BatchesSvc, caller: CallerDep, after: str | None = None,
                       limit: Annotated[int, Query(ge=1, le=100)] = 20) -> Response:
    return json_response(await service.list_batches(caller.owner, "openai", limit, after))


@router.get("/v1/batches/{batch_id}", tags=["batches"])
async def retrieve_batch(batch_id: str, service: BatchesSvc, caller: CallerDep) -> Response:
    return json_response(await service.batch_object(await service.job(caller.owner, batch_id, "openai")))


@router.post("/v1/batches/{batch_id}/cancel", tags=["batches"])
async def cancel_batch(batch_id: str, service: BatchesSvc, caller: CallerDep) -> Response:
    """Status `cancelling` (lines in flight finish), then `cancelled` with the answers so far in its files."""
    return json_response(await service.batch_object(await service.cancel(caller.owner, batch_id, "openai")))
