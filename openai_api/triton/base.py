"""What every config-driven LLM adapter shares: its address, the model's spec read once from Triton,
and the protocol check against it."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import tritonclient.grpc.aio as grpc_aio

from openai_api.triton.client import TritonClientPool
from openai_api.triton.detect import require_protocol
from openai_api.triton.rpc import TritonRPC
from openai_api.triton.wire import ModelSpec, fetch_model_spec


class SpecAdapter:
    """Base of the vLLM and FasterTransformer adapters. `protocol` names the wire protocol that
    `check()` verifies the Triton model against; the spec is fetched once, lazily, under a lock."""

    protocol = ""
    # OpenAI-side parameter -> the Triton input names that carry it, newest release first (an
    # adapter whose protocol takes parameters as tensors sets this; `supports` reads it).
    param_inputs: Mapping[str, tuple[str, ...]] = {}
    # Seconds without a response before a stream is ended with a 504 (None: never).
    stream_idle_timeout_s: float | None = None

    def __init__(self, pool: TritonClientPool, url: str, model: str, triton_model: str, version: str = "",
                 spec: ModelSpec | None = None) -> None:
        self.pool = pool
        self.url = url
        self.model = model
        self.triton_model = triton_model
        self.version = version
        self._spec = spec
        self._lock = asyncio.Lock()

    @property
    def _client(self) -> grpc_aio.InferenceServerClient:
        return self.pool.grpc(self.url)

    @property
    def _rpc(self) -> TritonRPC:
        return self.pool.rpc(self.url)

    def supports(self, param: str) -> bool:
        """Whether the model's Triton config has an input for `param` (True until the config is read:
        requests check again against the spec they were built from)."""
        spec = self._spec
        if spec is None:
            return True
        return any(n in spec.inputs for n in self.param_inputs.get(param, (param,)))

    async def check(self) -> None:
        require_protocol(self.protocol, await self._load_spec(), self.triton_model)

    async def _load_spec(self) -> ModelSpec:
        if self._spec is None:
            async with self._lock:
                if self._spec is None:
                    self._spec = await fetch_model_spec(self.pool, self.url, self.triton_model, self.version,
                                                        self.model)
        return self._spec
