from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, Ctx, RerankSvc
from openai_api.http.responses import json_response
from openai_api.schemas.dialects import RankingRequest, RootRerankRequest
from openai_api.schemas.openai import RerankRequest

router = APIRouter()


@router.post("/v1/rerank", tags=["rerank"])
async def rerank(body: RerankRequest, service: RerankSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    """Seed-system shape (`data`), plus `results` for Cohere v1 / Jina clients."""
    await admission.rerank(body)
    return json_response(await service.create(body, ctx.request))


@router.post("/v2/rerank", tags=["rerank"])
async def rerank_v2(body: RerankRequest, service: RerankSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    """Cohere v2 shape."""
    await admission.rerank(body)
    return json_response(await service.create_v2(body, ctx.request))


@router.post("/v1/ranking", tags=["rerank"])
async def ranking(body: RankingRequest, service: RerankSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    """NVIDIA NIM's shape: `{model, query: {text}, passages: [{text}], truncate?}` -> `{rankings: [{index, logit}]}`."""
    await admission.ranking(body)
    return json_response(await service.ranking(body, ctx.request))


@router.post("/rerank", tags=["rerank"])
async def rerank_root(body: RootRerankRequest, service: RerankSvc, admission: AdmissionDep, ctx: Ctx) -> Response:
    """Hugging Face TEI (`texts` -> `[{index, score, text?}]`) or Infinity (`documents` -> `{results: [{index,
    relevance_score, document?}]}` with `document` a string), told apart by the body."""
    await admission.root_rerank(body, service.model_name(body.model))
    return json_response(await service.rerank_root(body, ctx.request))
