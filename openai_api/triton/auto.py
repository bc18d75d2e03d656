"""`AutoLLMBackend`: reads the Triton model's config once, picks the protocol adapter, then hands requests
to it.

With `protocol: "auto"` the adapter is chosen by `detect.detect_protocol`, except that an entry with a
`text_protocol` block (a `TextWire`) speaks `text`; with an explicit protocol the config is checked
against it. Either way a mismatch (missing tensors, wrong dtypes) is raised by
`check()` at start-up as a `BackendUnavailableError` naming what is missing, instead of failing on the
first request. Until Triton has answered, `supports()` says True (the adapter refuses unsupported
parameters at request time); a failed look-up is retried on the next call, so a Triton that comes up
after the gateway is picked up without a restart. This is the only place a Triton model's config is
fetched for an LLM: adapters receive it at construction.

Once the adapter exists, `generate` returns the adapter's own iterator: no layer of this class runs
per token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import Any

from openai_api.triton.base import SpecAdapter
from openai_api.triton.client import TritonClientPool
from openai_api.triton.detect import PROTOCOLS, Protocol, detect_protocol, require_protocol
from openai_api.triton.errors import map_triton_error
from openai_api.triton.fastertransformer import FasterTransformerAdapter
from openai_api.triton.llm import GenerationChunk, GenerationRequest, GuideKind
from openai_api.triton.tensorrt_llm import TensorRTLLMAdapter
from openai_api.triton.text import TensorRTLLMTextAdapter, TextAdapter, TextWire
from openai_api.triton.vllm import VLLMAdapter
from openai_api.triton.wire import ModelSpec, parse_model_config

logger = logging.getLogger(__name__)

# `text` is built with its wire (the config's text_protocol block), `vllm` with its guide key.
ADAPTERS: dict[Protocol, type[SpecAdapter]] = {
    "tensorrt_llm": TensorRTLLMAdapter, "vllm": VLLMAdapter, "fastertransformer": FasterTransformerAdapter,
    "tensorrt_llm_text": TensorRTLLMTextAdapter, "text": TextAdapter}


def _protocol(name: str) -> Protocol:
    """A configured protocol name (the config validates it: see `config.LLMProtocol`)."""
    for p in PROTOCOLS:
        if p == name:
            return p
    raise ValueError(f"unknown protocol {name!r}")


async def fetch_model_spec(pool: TritonClientPool, url: str, triton_model: str, version: str,
                           model: str) -> ModelSpec:
    """Ask Triton (gRPC) for the model's config; transport failures become GatewayErrors."""
    try:
        raw = await pool.grpc(url).get_model_config(triton_model, version, as_json=True)
    except Exception as e:  # noqa: BLE001 - every transport failure maps to one taxonomy
        raise map_triton_error(e, model) from None
    return parse_model_config(raw)


class AutoLLMBackend:
    """An `LLMBackend` whose wire protocol is decided by the Triton model's own config."""

    def __init__(self, pool: TritonClientPool, url: str, model: str, triton_model: str, version: str = "",
                 protocol: str = "auto", stream_idle_timeout_s: float | None = None,
                 vllm_guide_key: str = "auto", text_wire: TextWire | None = None, tokens_per_block: int = 32) -> None:
        self.pool = pool
        self.url = url
        self.model = model
        self.triton_model = triton_model
        self.version = version
        self.configured_protocol = protocol
        self.stream_idle_timeout_s = stream_idle_timeout_s
        self.vllm_guide_key = vllm_guide_key
        self.text_wire = text_wire
        self.tokens_per_block = tokens_per_block
        self._adapter: SpecAdapter | None = None
        self._lock = asyncio.Lock()

    @property
    def protocol(self) -> str:
        """The protocol in use: the detected or configured one once Triton answered, else the config's."""
        return self._adapter.protocol if self._adapter is not None else self.configured_protocol

    @property
    def adapter(self) -> SpecAdapter | None:
        return self._adapter

    @property
    def guide_kinds(self) -> frozenset[GuideKind] | None:
        return self._adapter.guide_kinds if self._adapter is not None else None

    async def resolve(self) -> SpecAdapter:
        """The adapter for this model, reading Triton's config the first time (and after failures)."""
        if self._adapter is not None:
            return self._adapter
        async with self._lock:
            if self._adapter is not None:
                return self._adapter
            spec = await fetch_model_spec(self.pool, self.url, self.triton_model, self.version, self.model)
            detected = self.configured_protocol == "auto" and self.text_wire is None
            protocol: Protocol = ("text" if self.configured_protocol == "auto" and self.text_wire is not None
                                  else detect_protocol(spec) if detected else _protocol(self.configured_protocol))
            require_protocol(protocol, spec, self.triton_model, detected=detected, wire=self.text_wire)
            rpc = self.pool.rpc(self.url)
            common: dict[str, Any] = {"model": self.model, "triton_model": self.triton_model, "version": self.version,
                                      "stream_idle_timeout_s": self.stream_idle_timeout_s,
                                      "tokens_per_block": self.tokens_per_block}
            adapter: SpecAdapter
            if protocol == "vllm":
                adapter = VLLMAdapter(rpc, spec, guide_key=self.vllm_guide_key, **common)
            elif protocol == "text" and self.text_wire is not None:
                adapter = TextAdapter(rpc, spec, wire=self.text_wire, **common)
            else:
                adapter = ADAPTERS[protocol](rpc, spec, **common)
            if detected:
                logger.info("model %s: Triton model %s speaks %s (detected from its config)", self.model,
                            self.triton_model, protocol)
            self._adapter = adapter
            return adapter

    async def check(self) -> None:
        await self.resolve()

    def supports(self, param: str) -> bool:
        return True if self._adapter is None else self._adapter.supports(param)

    def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        if self._adapter is not None:
            return self._adapter.generate(request)
        return self._generate_first(request)

    async def _generate_first(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        """Until the adapter exists (Triton was down at start-up): resolve, then delegate. The services could
        not tell yet whether the protocol returns log-prob alternatives, so that is checked here."""
        adapter = await self.resolve()
        if request.top_logprobs and not adapter.supports("top_logprobs"):
            raise adapter.refuse("top_logprobs", ": its protocol returns only the sampled token's log-probability")
        if request.images and not adapter.supports("images"):
            raise adapter.refuse(request.images[0].param, ": it takes no images (no image input in its Triton config)")
        chunks = adapter.generate(request)
        try:
            async for chunk in chunks:
                yield chunk
        finally:
            # Closing this iterator (client gone, stop string) must close the adapter's, which cancels
            # the Triton stream; `async for` alone would leave it suspended.
            await chunks.aclose()
