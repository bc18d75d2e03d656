"""`/v1/models` cards and the readiness report."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from openai_api.services.registry import ModelRegistry
from openai_api.triton import health


class ModelsService:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry
        self.created = int(time.time())

    def _card(self, name: str) -> dict[str, Any] | None:
        kind = self.registry.kind_of(name)
        if kind is None:
            return None
        card: dict[str, Any] = {"id": name, "object": "model", "created": self.created, "owned_by": "openai_api",
                                "root": name, "parent": None, "kind": kind}
        if kind == "llm":
            card["max_model_len"] = self.registry.llms[name].context_length
        else:
            card["max_model_len"] = self.registry.encoders[name].config.max_tokens
        return card

    def list(self) -> list[dict[str, Any]]:
        names = [*self.registry.llms, *self.registry.encoders]
        return [c for n in names if (c := self._card(n)) is not None]

    def get(self, name: str) -> dict[str, Any] | None:
        return self._card(name)


class HealthService:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    async def readiness(self) -> dict[str, Any]:
        models = self.registry.config.all_models()
        pool = self.registry.pool
        checks = await asyncio.gather(*(health.model_ready(pool, m.transport, m.url, m.triton_name,
                                                           m.triton_version) for m in models))
        report = {m.name: ("ready" if ok else "not ready") for m, ok in zip(models, checks, strict=True)}
        return {"ready": all(checks), "models": report}
