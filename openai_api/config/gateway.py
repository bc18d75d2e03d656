"""The whole file: `GatewayConfig` (its four arrays, where it was read from and its digest, the embedded Triton's
endpoints once applied) and `naming_problems`, the naming rules across entries (a name used once, an alias that is
no other name, each `model_infos` entry naming an llm entry). Apart from the entries because these rules see every
entry at once; the loader checks them itself, to name each problem's field."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, PrivateAttr, ValidationInfo, model_validator

from openai_api.config.entries import EmbeddingModel, LLMModel, ModelInfo, RerankModel
from openai_api.config.problems import _Strict


class GatewayConfig(_Strict):
    model_infos: list[ModelInfo] = Field(default_factory=list)
    llm: list[LLMModel] = Field(default_factory=list)
    embedding: list[EmbeddingModel] = Field(default_factory=list)
    rerank: list[RerankModel] = Field(default_factory=list)

    source: Path | None = Field(default=None, exclude=True)
    # SHA-256 of the file as `load_config` read it (a reload skips a file whose content is the same), and the
    # embedded Triton's endpoints once `with_triton_endpoint` applied them (a reloaded config gets them too).
    _digest: str | None = PrivateAttr(default=None)
    _triton_endpoint: tuple[str, str] | None = PrivateAttr(default=None)
    # Where each model entry stood in the file, when entries that failed validation were left out (`check_config`).
    _positions: dict[str, list[int]] | None = PrivateAttr(default=None)

    @property
    def digest(self) -> str | None:
        return self._digest

    @property
    def triton_endpoint(self) -> tuple[str, str] | None:
        return self._triton_endpoint

    @model_validator(mode="after")
    def _names_across_entries(self, info: ValidationInfo) -> GatewayConfig:
        # A config built in code is checked here; `load_config` checks a file's itself, naming each field.
        if not (info.context or {}).get("names_checked_by_loader"):
            problems = naming_problems(self)
            if problems:
                raise ValueError(problems[0][1])
        return self

    def all_models(self) -> list[LLMModel | EmbeddingModel | RerankModel]:
        return [*self.llm, *self.embedding, *self.rerank]

    def entries(self) -> list[tuple[str, LLMModel | EmbeddingModel | RerankModel]]:
        """Every model entry with the field it is in the file (`llm[2]`), for messages that name it."""
        out: list[tuple[str, LLMModel | EmbeddingModel | RerankModel]] = []
        for kind in ("llm", "embedding", "rerank"):
            for i, m in enumerate(getattr(self, kind)):
                out.append((f"{kind}[{self._positions[kind][i] if self._positions else i}]", m))
        return out

    def model_info(self, name: str) -> ModelInfo:
        for info in self.model_infos:
            if info.name == name:
                return info
        return ModelInfo(name=name)

    def with_triton_endpoint(self, grpc_url: str, http_url: str) -> GatewayConfig:
        """Point every model at one Triton (the embedded one), keeping each model's transport."""
        for m in self.all_models():
            m.url = grpc_url if m.transport == "grpc" else http_url
        self._triton_endpoint = (grpc_url, http_url)
        return self


def naming_problems(config: GatewayConfig, llm_names: set[str] | None = None) -> list[tuple[str, str]]:
    """(field, reason) of every naming rule across entries a config breaks: a name used twice within a kind
    (the list's own validator reports it first) or across kinds, an alias that is empty or already a name, and a
    `model_infos` entry that names no `llm` entry (`llm_names`: those names, when entries failed validation)."""
    problems: list[tuple[str, str]] = []
    for kind in ("model_infos", "llm", "embedding", "rerank"):
        names = [m.name for m in getattr(config, kind)]
        problems += [(kind, f"duplicate model name {n!r}") for n in sorted({n for n in names if names.count(n) > 1})]
    seen: dict[str, str] = {}
    for kind in ("llm", "embedding", "rerank"):
        for m in getattr(config, kind):
            if m.name in seen and seen[m.name] != kind:
                problems.append(("", f"model name {m.name!r} is used by both {seen[m.name]} and {kind}"))
            seen.setdefault(m.name, kind)
    taken = set(seen)
    for m in config.llm:
        for alias in m.aliases:
            if not alias or alias in taken:
                problems.append(("", f"alias {alias!r} of model {m.name!r} is empty or already names a model or alias"))
            taken.add(alias)
    llms = {m.name for m in config.llm} if llm_names is None else llm_names
    for i, info in enumerate(config.model_infos):
        if info.name not in llms:
            at = config._positions["model_infos"][i] if config._positions else i
            problems.append((f"model_infos[{at}].name", f"{info.name!r} names no llm entry (model_infos hold the "
                                                      f"generation defaults of llm entries: {sorted(llms)})"))
    return problems
