from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from openai_api.errors import ModelNotFoundError
from openai_api.http.deps import services
from openai_api.http.responses import json_response

router = APIRouter()


@router.get("/v1/models", tags=["models"])
async def list_models(request: Request) -> Response:
    return json_response({"object": "list", "data": services(request).models.list()})


@router.get("/v1/models/{model_id:path}", tags=["models"])
async def get_model(model_id: str, request: Request) -> Response:
    card = services(request).models.get(model_id)
    if card is None:
        raise ModelNotFoundError(f"The model {model_id!r} does not exist.", param="model")
    return json_response(card)
