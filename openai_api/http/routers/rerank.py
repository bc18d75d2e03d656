from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, RerankSvc
from openai_api.http.responses import json_response
from openai_api.schemas.openai import RerankRequest

router = APIRouter()


@router.post("/v1/rerank", tags=["rerank"])
async def rerank(body: RerankRequest, service: RerankSvc, admission: AdmissionDep) -> Response:
    """Seed-system shape (`data`), plus `results` for Cohere v1 / Jina clients."""
    admission.rerank(body)
    return json_response(await service.create(body))


@router.post("/v2/rerank", tags=["rerank"])
async def rerank_v2(body: RerankRequest, service: RerankSvc, admission: AdmissionDep) -> Response:
    """Cohere v2 shape."""
    admission.rerank(body)
    return json_response(await service.create_v2(body))
