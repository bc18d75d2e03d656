from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_api.http.deps import services
from openai_api.http.limits import admit_embeddings
from openai_api.schemas.openai import EmbeddingRequest

router = APIRouter()


@router.post("/v1/embeddings", tags=["embeddings"])
async def embeddings(body: EmbeddingRequest, request: Request) -> Response:
    admit_embeddings(request, body)
    return Response(await services(request).embeddings.create(body), media_type="application/json")
