from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, EmbeddingsSvc
from openai_api.schemas.openai import EmbeddingRequest

router = APIRouter()


@router.post("/v1/embeddings", tags=["embeddings"])
async def embeddings(body: EmbeddingRequest, service: EmbeddingsSvc, admission: AdmissionDep) -> Response:
    admission.embeddings(body)
    return Response(await service.create(body), media_type="application/json")
