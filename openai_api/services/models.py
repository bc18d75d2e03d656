"""`/v1/models` cards and the readiness report."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from typing import Any

from openai_api.services.registry import ModelRegistry
from openai_api.triton import health
from openai_api.triton.llm import keeps_marker_tokens

# (served model, Anthropic model object) pairs (`ModelsService.anthropic_models`).
AnthropicModels = list[tuple[str, dict[str, Any]]]


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
            rt = self.registry.llms[name]
            if rt.adapter is not None:  # a LoRA adapter: vLLM's card shape (root = its source, parent = the base)
                card["root"], card["parent"] = rt.adapter.root, rt.adapter.base
            else:
                card["adapters"] = [a.name for a in self.registry.adapters(name)]
            card["max_model_len"] = rt.context_length
            kinds = rt.backend.guide_kinds  # None until Triton's config was read
            card["capabilities"] = {
                "tools": True, "tool_parser": rt.tool_parser, "reasoning_parser": rt.reasoning_parser,
                # Whether the family's marker tokens reach the parser (the adapter layer knows per protocol).
                "parser_markers": rt.drop_ids is None or keeps_marker_tokens(rt.backend),
                "parallel_tool_calls": True, "forced_tool_calls": None if kinds is None else "json_schema" in kinds,
                "structured_outputs": None if kinds is None else bool(kinds),
                "guided_types": None if kinds is None else sorted(kinds),
                # Log-probs of the sampled tokens, and alternatives beside them (chat `top_logprobs`,
                # completions `logprobs` > 0): only the vLLM interface returns those.
                "logprobs": None if kinds is None else rt.backend.supports("return_logprobs"),
                "top_logprobs": None if kinds is None else rt.backend.supports("top_logprobs"),
                # Image parts in chat: the backend declares an image input (vLLM's `image`).
                "images": None if kinds is None else rt.backend.supports("images")}
        else:
            card["max_model_len"] = self.registry.encoders[name].config.max_tokens
        replicas = self.registry.replicas.get(name)
        if replicas is not None:
            card["replicas"] = replicas.states()
        return card

    def list(self) -> list[dict[str, Any]]:
        names = [*self.registry.llms, *self.registry.encoders]
        return [c for n in names if (c := self._card(n)) is not None]

    def get(self, name: str) -> dict[str, Any] | None:
        return self._card(name)

    def anthropic_models(self) -> AnthropicModels:
        """The LLMs as Anthropic's model objects (`{type: "model", id, display_name, created_at}`), each with the
        served model it names (an alias names its model): what `/v1/messages` accepts as `model`, so what
        Anthropic clients (Claude Code's model picker, `anthropic.models.list()`) may choose from."""
        created = datetime.fromtimestamp(self.created, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        out = []
        for name, rt in self.registry.llms.items():
            out.append((name, {"type": "model", "id": name, "display_name": name, "created_at": created}))
            if rt.adapter is None:
                out += [(name, {"type": "model", "id": alias, "display_name": f"{alias} ({name})",
                                "created_at": created}) for alias in rt.config.aliases]
        return out


class HealthService:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    async def readiness(self, require: str = "any", details: bool = True) -> dict[str, Any]:
        """`{ready, models: {name: "ready" | "not ready"}, replicas?}`. `ready` says whether this process can serve
        (`--ready-models`): `any` = at least one configured model is ready, `all` = every one, `none` = always
        (the process runs, its config loaded: it was built from it). Without `details`, `{ready}` alone, and with
        `none` no model is probed."""
        if require == "none" and not details:
            return {"ready": True}
        models = self.registry.config.all_models()
        pool = self.registry.pool
        # A model is ready while at least one of its replicas is.
        # (a replicated model's current replicas: discovery changes them, and a dns:/// url is not an address)
        sets = self.registry.replicas
        probes = [(m, u) for m in models for u in ([r.url for r in sets[m.name].replicas] if m.name in sets
                                                   else m.urls)]
        results = await asyncio.gather(*(health.model_ready(pool, m.transport, u, m.triton_name, m.triton_version)
                                         for m, u in probes))
        ready: dict[str, bool] = {m.name: False for m in models}
        replicas: dict[str, dict[str, str]] = {}
        for (m, u), ok in zip(probes, results, strict=True):
            ready[m.name] = ready[m.name] or ok
            if m.name in sets:
                replicas.setdefault(m.name, {})[u] = "ready" if ok else "not ready"
        verdict = {"any": any(ready.values()), "all": all(ready.values()), "none": True}[require]
        if not details:
            return {"ready": verdict}
        report: dict[str, Any] = {"ready": verdict,
                                  "models": {n: ("ready" if ok else "not ready") for n, ok in ready.items()}}
        if replicas:
            report["replicas"] = replicas
        return report
