"""Test doubles shared by the unit tier: a scripted LLM backend and a one-model config."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from openai_api.config import BUNDLED_CONFIG, GatewayConfig, load_config
from openai_api.errors import BackendError, GatewayError
from openai_api.triton.llm import GUIDE_KINDS, GenerationChunk, GenerationRequest, GuideKind

MODEL = "smollm2-135m-instruct"


class FakeBackend:
    """An `LLMBackend` that plays a script of chunks, records every request and how each stream ended.

    `fail_at=k` raises `error` instead of yielding chunk k (k == len(script): after the last chunk).
    `cached`: what every chunk says of the prompt tokens read from the KV cache (`GenerationChunk.cached_tokens`),
    or a function of the request giving it (None: nothing, as a backend that cannot say).
    """

    model = MODEL
    protocol = "tensorrt_llm"
    guide_kinds: frozenset[GuideKind] | None = GUIDE_KINDS

    def __init__(self, script: list[list[int]], *, fail_at: int | None = None,
                 error: GatewayError | None = None,
                 cached: int | Callable[[GenerationRequest], int | None] | None = None) -> None:
        self.script = script
        self.cached = cached
        self.fail_at = fail_at
        self.error = error or BackendError("Triton failed the request.")
        self.requests: list[GenerationRequest] = []
        self.closed_early = 0
        self.completed = 0
        self.yielded = 0

    def supports(self, param: str) -> bool:
        return True

    async def check(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.requests.append(request)
        cached = self.cached(request) if callable(self.cached) else self.cached
        try:
            for k, ids in enumerate(self.script):
                if k == self.fail_at:
                    raise self.error
                self.yielded += 1
                yield GenerationChunk(token_ids=list(ids), cached_tokens=cached)
            if self.fail_at == len(self.script):
                raise self.error
            self.completed += 1
        except GeneratorExit:
            self.closed_early += 1  # the consumer closed us: the Triton request would be cancelled
            raise


def llm_only_config(folder: Path, url: str | None = None) -> GatewayConfig:
    """The bundled config's entry for MODEL alone (its paths made absolute), so the other bundled models'
    folders need not exist here; `url` repoints it (e.g. at a port where no Triton listens)."""
    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    entry = next((dict(e) for e in data.get("llm", []) if e.get("name") == MODEL), None)
    if entry is None:
        pytest.skip(f"{BUNDLED_CONFIG} has no llm entry named {MODEL!r}")
    entry["path"] = str((BUNDLED_CONFIG.parent / entry["path"]).resolve())
    template = entry.get("chat_template")
    if template and (BUNDLED_CONFIG.parent / template).is_file():
        entry["chat_template"] = str((BUNDLED_CONFIG.parent / template).resolve())
    if url is not None:
        entry["url"] = url
    infos = [i for i in data.get("model_infos", []) if i.get("name") == MODEL]
    path = folder / "model_config.json"
    path.write_text(json.dumps({"model_infos": infos, "llm": [entry]}), encoding="utf-8")
    return load_config(path)


def script(app: Any, text: str) -> FakeBackend:
    """Make the app's one model (`MODEL`) answer `text`, a token a chunk, with its own tokenizer's ids; the fake
    (its `requests` are what the gateway sent)."""
    rt = app.state.gateway.services.registry.llm(MODEL)
    fake = FakeBackend([[i] for i in rt.tokenizer.encode(text)])
    rt.backend = fake
    return fake
