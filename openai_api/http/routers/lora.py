"""vLLM's runtime LoRA routes: `POST /v1/load_lora_adapter` and `POST /v1/unload_lora_adapter`.

Bodies as vLLM takes them: `{"lora_name", "lora_path"}` and `{"lora_name"}` (plus `base_model`, this gateway's:
the LLM to load onto when more than one model's `adapters_dir` could hold the path). Answers as vLLM's: 200
with a plain-text success line; errors in OpenAI's shape (400 for an adapter that cannot be served, 404 for
unloading one that is not loaded). Served only with `--allow-runtime-lora` (else 404, as vLLM without
VLLM_ALLOW_RUNTIME_LORA_UPDATING); with a keys file only for `admin: true` keys (403 for others).
"""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from openai_api.errors import NotFoundError
from openai_api.http.deps import CallerDep, QuotaDep, app_state, services
from openai_api.quota.service import PermissionDeniedError
from openai_api.services.lora import LoraService

router = APIRouter()


class LoadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")  # vLLM's `load_inplace` and the like are accepted, not used

    lora_name: str
    lora_path: str
    base_model: str | None = None


class UnloadLoraAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")

    lora_name: str


def _service(request: Request, caller: CallerDep, quota: QuotaDep) -> LoraService:
    state = app_state(request)
    if not state.settings.allow_runtime_lora:
        raise NotFoundError("Not found: runtime LoRA loading is off (start the gateway with --allow-runtime-lora).",
                            code="not_found")
    if quota.table is not None and not caller.policy.admin:
        raise PermissionDeniedError("This key may not load or unload LoRA adapters (it is not an admin key).")
    return LoraService(services(request).registry)


@router.post("/v1/load_lora_adapter", tags=["lora"])
async def load_lora_adapter(body: LoadLoraAdapter, request: Request, caller: CallerDep, quota: QuotaDep) -> Response:
    """Serve the adapter at `lora_path` (inside a model's adapters_dir) as model `lora_name`, once checked."""
    await _service(request, caller, quota).load(body.lora_name, body.lora_path, body.base_model)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")


@router.post("/v1/unload_lora_adapter", tags=["lora"])
async def unload_lora_adapter(body: UnloadLoraAdapter, request: Request, caller: CallerDep,
                              quota: QuotaDep) -> Response:
    """Stop serving adapter `lora_name`; requests already running on it finish."""
    _service(request, caller, quota).unload(body.lora_name)
    return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")
