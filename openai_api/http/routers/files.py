"""OpenAI's Files API for the Batch API (`services.batches`): upload (multipart, purpose `batch`), list, retrieve,
download and delete, each on the caller's own files (another key's file is a 404)."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, File, Form, Query, UploadFile
from starlette.responses import Response

from openai_api.http.deps import BatchesSvc, CallerDep
from openai_api.http.responses import json_response

router = APIRouter()


@router.post("/v1/files", tags=["batches"])
async def upload_file(file: Annotated[UploadFile, File()], purpose: Annotated[str, Form()], service: BatchesSvc,
                      caller: CallerDep,
                      anchor: Annotated[str | None, Form(alias="expires_after[anchor]")] = None,
                      seconds: Annotated[str | None, Form(alias="expires_after[seconds]")] = None) -> Response:
    """Upload a JSONL batch input file (multipart `file` and `purpose: batch`): an OpenAI `file` object; a 400 past
    `--batch-max-file-bytes`. Its lines are checked when a batch is made on it (a bad one fails that batch).
    `expires_after[anchor]=created_at` and `expires_after[seconds]` (3600 to 2592000; default 30 days) set its
    `expires_at`: then it is a 404 and deleted."""
    content = await file.read()
    expires = None if anchor is None and seconds is None else {  # the SDKs' multipart form of {anchor, seconds}
        "anchor": anchor, "seconds": int(seconds) if seconds is not None and seconds.isdigit() else seconds}
    return json_response(await service.upload(caller.owner, file.filename or "", purpose, content, expires))


@router.get("/v1/files", tags=["batches"])
async def list_files(service: BatchesSvc, caller: CallerDep, purpose: str | None = None,
                     limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000, after: str | None = None,
                     order: Literal["asc", "desc"] = "desc") -> Response:
    """The caller's files, newest first (`order=asc`: oldest first), as an OpenAI list page."""
    page = await service.list_files(caller.owner, purpose, limit, after)
    if order == "asc":
        page["data"].reverse()
    return json_response(page)


@router.get("/v1/files/{file_id}", tags=["batches"])
async def retrieve_file(file_id: str, service: BatchesSvc, caller: CallerDep) -> Response:
    return json_response(service.file_object(await service.file(caller.owner, file_id)))


@router.get("/v1/files/{file_id}/content", tags=["batches"])
async def file_content(file_id: str, service: BatchesSvc, caller: CallerDep) -> Response:
    """The file's bytes (an input file as uploaded, or a batch's output or error JSONL)."""
    return Response(await service.content(caller.owner, file_id), media_type="application/octet-stream")


@router.delete("/v1/files/{file_id}", tags=["batches"])
async def delete_file(file_id: str, service: BatchesSvc, caller: CallerDep) -> Response:
    return json_response(await service.delete_file(caller.owner, file_id))
