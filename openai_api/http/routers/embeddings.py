from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, Ctx, EmbeddingsSvc
from openai_api.schemas.dialects import TEIEmbedRequest
from openai_api.schemas.openai import EmbeddingRequest

router = APIRouter()


@router.post("/v1/embeddings", tags=["embeddings"])
async def embeddings(body: EmbeddingRequest, service: EmbeddingsSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    """OpenAI's shape; NIM's `input_type` / `truncate` (and `-query` / `-passage` model names) too."""
    body = service.resolve(body)
    await admission.embeddings(body)
    return Response(await service.create(body, ctx.request), media_type="application/json")


@router.post("/embed", tags=["embeddings"])
async def embed_tei(body: TEIEmbedRequest, service: EmbeddingsSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    """Hugging Face TEI's shape: `{inputs, normalize?, truncate?, truncation_direction?}` -> a list of vectors."""
    model = service.model_name(body.model)
    await admission.tei_embed(body, model)
    return Response(await service.create_tei(body, ctx.request), media_type="application/json")
