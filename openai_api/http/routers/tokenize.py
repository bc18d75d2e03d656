from __future__ import annotations

from fastapi import APIRouter
from starlette.responses import Response

from openai_api.http.deps import AdmissionDep, TokenizeSvc
from openai_api.http.responses import json_response
from openai_api.schemas.dialects import DetokenizeRequest, TokenizeRequest

router = APIRouter()


@router.post("/tokenize", tags=["tokenize"])
async def tokenize(body: TokenizeRequest, service: TokenizeSvc, admission: AdmissionDep) -> Response:
    """vLLM's shape: `{model, prompt}` or `{model, messages, ...}` -> `{count, max_model_len, tokens, token_strs}`."""
    await admission.tokenize(service.model_name(body.model), len(body.messages or ()), body)
    return json_response(await service.tokenize(body))


@router.post("/detokenize", tags=["tokenize"])
async def detokenize(body: DetokenizeRequest, service: TokenizeSvc, admission: AdmissionDep) -> Response:
    """vLLM's shape: `{model, tokens}` -> `{prompt}`."""
    await admission.tokenize(service.model_name(body.model))
    return json_response(await service.detokenize(body))
