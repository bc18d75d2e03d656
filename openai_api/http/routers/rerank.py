from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_api.http.deps import services
from openai_api.http.limits import admit_rerank
from openai_api.http.responses import json_response
from openai_api.schemas.openai import RerankRequest

router = APIRouter()


@router.post("/v1/rerank", tags=["rerank"])
async def rerank(body: RerankRequest, request: Request) -> Response:
    """Seed-system shape (`data`), plus `results` for Cohere v1 / Jina clients."""
    admit_rerank(request, body)
    return json_response(await services(request).rerank.create(body))


@router.post("/v2/rerank", tags=["rerank"])
async def rerank_v2(body: RerankRequest, request: Request) -> Response:
    """Cohere v2 shape."""
    admit_rerank(request, body)
    return json_response(await services(request).rerank.create_v2(body))
