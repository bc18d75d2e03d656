"""`AutoLLMBackend`: reads the Triton model's config once, picks the protocol adapter, then delegates.

With `protocol: "auto"` the adapter is chosen by `detect.detect_protocol`; with an explicit protocol
the config is checked against it. Either way a mismatch (missing tensors, wrong dtypes) is raised by
`check()` at start-up as a `BackendUnavailableError` naming what is missing, instead of failing on the
first request. Until Triton has answered, `supports()` says True (the adapter refuses unsupported
parameters at request time); a failed look-up is retried on the next call, so a Triton that comes up
after the gateway is picked up without a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from openai_api.triton.client import TritonClientPool
from openai_api.triton.detect import Protocol, detect_protocol, require_protocol
from openai_api.triton.fastertransformer import FasterTransformerAdapter
from openai_api.triton.llm import GenerationChunk, GenerationRequest, LLMBackend
from openai_api.triton.tensorrt_llm import TensorRTLLMAdapter
from openai_api.triton.vllm import VLLMAdapter
from openai_api.triton.wire import ModelSpec, fetch_model_spec

logger = logging.getLogger(__name__)


class AutoLLMBackend:
    """An `LLMBackend` whose wire protocol is decided by the Triton model's own config."""

    def __init__(self, pool: TritonClientPool, url: str, model: str, triton_model: str, version: str = "",
                 protocol: str = "auto") -> None:
        self.pool = pool
        self.url = url
        self.model = model
        self.triton_model = triton_model
        self.version = version
        self.configured_protocol = protocol
        self._backend: LLMBackend | None = None
        self._lock = asyncio.Lock()
        self._idle_s: float | None = None

    @property
    def protocol(self) -> str:
        """The protocol in use: the detected or configured one once Triton answered, else the config's."""
        return getattr(self._backend, "protocol", self.configured_protocol)

    @property
    def backend(self) -> LLMBackend | None:
        return self._backend

    @property
    def stream_idle_timeout_s(self) -> float | None:
        return self._idle_s

    @stream_idle_timeout_s.setter
    def stream_idle_timeout_s(self, value: float | None) -> None:
        self._idle_s = value
        if self._backend is not None:
            self._backend.stream_idle_timeout_s = value  # type: ignore[attr-defined]

    def _build(self, protocol: Protocol, spec: ModelSpec) -> LLMBackend:
        args = (self.pool, self.url, self.model, self.triton_model, self.version)
        backend: LLMBackend
        if protocol == "vllm":
            backend = VLLMAdapter(*args, spec=spec)
        elif protocol == "fastertransformer":
            backend = FasterTransformerAdapter(*args, spec=spec)
        else:
            backend = TensorRTLLMAdapter(*args, spec=spec)
        if self._idle_s is not None:
            backend.stream_idle_timeout_s = self._idle_s  # type: ignore[attr-defined]
        return backend

    async def resolve(self) -> LLMBackend:
        """The adapter for this model, reading Triton's config the first time (and after failures)."""
        if self._backend is not None:
            return self._backend
        async with self._lock:
            if self._backend is not None:
                return self._backend
            spec = await fetch_model_spec(self.pool, self.url, self.triton_model, self.version, self.model)
            detected = self.configured_protocol == "auto"
            protocol: Protocol = detect_protocol(spec) if detected else self.configured_protocol  # type: ignore[assignment]
            require_protocol(protocol, spec, self.triton_model, detected=detected)
            backend = self._build(protocol, spec)
            await backend.check()
            if detected:
                logger.info("model %s: Triton model %s speaks %s (detected from its config)", self.model,
                            self.triton_model, protocol)
            self._backend = backend
            return backend

    async def check(self) -> None:
        await self.resolve()

    def supports(self, param: str) -> bool:
        return True if self._backend is None else self._backend.supports(param)

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        backend = await self.resolve()
        chunks = backend.generate(request)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            # Closing this iterator (client gone, stop string) must close the adapter's, which cancels
            # the Triton stream; `async for` alone would leave it suspended.
            await chunks.aclose()  # type: ignore[attr-defined]
