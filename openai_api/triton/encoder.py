"""Adapter for BERT-style encoder models (embeddings and cross-encoder rerank) over HTTP or gRPC.

Wire contract: inputs named by the model config's `input_config` (tokenizer output name -> Triton
input name), `[B, L]` in the configured integer dtype, padded with 0 and `attention_mask` 0; one
requested output, `[B, L, H]` (`last_hidden_state`), `[B, H]` (`sentence_embedding`) or `[B, 1]`
(`logits`). The model's Triton config is read once so inputs it does not declare (`token_type_ids`
on XLM-R rerankers) are not sent, and a name or dtype mismatch is reported before the first request.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

import numpy as np
import tritonclient.grpc as grpc_mod
import tritonclient.http as http_mod
from numpy.typing import NDArray

from openai_api.errors import BackendUnavailableError, GatewayError
from openai_api.tracing import current_tracer, end_with, start_triton_span, traceparent_metadata
from openai_api.triton.client import TritonClientPool
from openai_api.triton.errors import map_triton_error

_NP = {"INT64": np.int64, "INT32": np.int32}
# aiohttp sends `Accept-Encoding: gzip, deflate` unless told otherwise, and Triton's HTTP frontend then
# deflates every response: for a [32, L, 384] FP32 `last_hidden_state` (~1.5 MB) that is ~33 ms of
# tritonserver CPU plus ~8 ms to inflate here per request, ~17% on top of the forward pass itself.
# Float tensors barely compress, and the transfer is local. (Copied per call: tritonclient adds its own
# headers to the dict it is given.)
_HTTP_HEADERS = {"Accept-Encoding": "identity"}
# Reading the model's config is one small call: a Triton that takes longer is hung, not busy.
CONFIG_TIMEOUT_S = 10.0


class EncoderBackend(Protocol):
    """What the embeddings and rerank services call: `infer` runs one batch (`features` maps tokenizer
    output names to `[B, L]` arrays) and returns the model's one output; `max_batch_size` is the model's
    own (None until `check` read it, or when it declares none); errors are GatewayErrors."""

    model: str

    @property
    def max_batch_size(self) -> int | None: ...

    async def check(self) -> None: ...

    async def infer(self, features: dict[str, NDArray[Any]]) -> NDArray[Any]: ...


class EncoderAdapter:
    def __init__(self, pool: TritonClientPool, *, transport: str, url: str, model: str, triton_model: str,
                 version: str, input_config: dict[str, str], input_dtype: str, output_name: str,
                 timeout_s: float) -> None:
        self.pool = pool
        self.transport = transport
        self.url = url
        self.model = model
        self.triton_model = triton_model
        self.version = version
        self.input_config = dict(input_config)
        self.input_dtype = input_dtype
        self.output_name = output_name
        self.timeout_s = timeout_s
        self._inputs: dict[str, str] | None = None  # Triton input name -> dtype, once known
        self.max_batch_size: int | None = None
        self._lock = asyncio.Lock()

    async def check(self) -> None:
        if self._inputs is not None:
            return
        async with self._lock:
            if self._inputs is not None:
                return
            try:
                client = self.pool.grpc(self.url) if self.transport == "grpc" else self.pool.http(self.url)
                if self.transport == "grpc":
                    raw = await client.get_model_config(self.triton_model, self.version, as_json=True,
                                                        client_timeout=CONFIG_TIMEOUT_S)
                    cfg = raw.get("config", raw)
                else:
                    async with asyncio.timeout(CONFIG_TIMEOUT_S):
                        cfg = await client.get_model_config(self.triton_model, self.version)
            except Exception as e:  # noqa: BLE001
                raise map_triton_error(e, self.model) from None
            declared = {i["name"]: str(i.get("data_type", "")).removeprefix("TYPE_") for i in cfg.get("input", [])}
            outputs = {o["name"] for o in cfg.get("output", [])}
            problems = [f"input {t!r} (for {k}) is not declared" for k, t in self.input_config.items()
                        if t not in declared and k in ("input_ids", "attention_mask")]
            if self.output_name not in outputs:
                problems.append(f"output {self.output_name!r} is not declared (has {sorted(outputs)})")
            if problems:
                raise BackendUnavailableError(
                    f"Triton model {self.triton_model!r} does not match the config of {self.model!r}: "
                    + "; ".join(problems))
            self.max_batch_size = int(cfg.get("max_batch_size", 0) or 0) or None
            self._inputs = {t: declared[t] for k, t in self.input_config.items() if t in declared}

    async def infer(self, features: dict[str, NDArray[Any]]) -> NDArray[Any]:
        """Run one batch. `features` maps tokenizer output names to `[B, L]` arrays; returns the output."""
        await self.check()
        assert self._inputs is not None
        mod: Any = grpc_mod if self.transport == "grpc" else http_mod
        inputs = []
        for key, name in self.input_config.items():
            if name not in self._inputs or key not in features:
                continue
            dtype = self._inputs[name] or self.input_dtype
            arr = np.ascontiguousarray(features[key], dtype=_NP.get(dtype, np.int64))
            inp = mod.InferInput(name, list(arr.shape), dtype)
            if self.transport == "http":
                inp.set_data_from_numpy(arr, binary_data=True)
            else:
                inp.set_data_from_numpy(arr)
            inputs.append(inp)
        # A traced request (`openai_api.tracing`): the call is a CLIENT span whose traceparent goes with it (gRPC
        # metadata / an HTTP header), so Triton's own spans join the request's trace.
        tracer = current_tracer()
        span = None if tracer is None else start_triton_span(tracer, "ModelInfer", self.triton_model)
        traced = {} if span is None else dict(traceparent_metadata(span))
        error: BaseException | None = None
        try:
            if self.transport == "grpc":
                outputs = [grpc_mod.InferRequestedOutput(self.output_name)]
                result = await self.pool.grpc(self.url).infer(
                    self.triton_model, inputs, model_version=self.version, outputs=outputs,
                    client_timeout=self.timeout_s, headers=traced or None)
            else:
                outputs = [http_mod.InferRequestedOutput(self.output_name, binary_data=True)]
                async with asyncio.timeout(self.timeout_s):
                    result = await self.pool.http(self.url).infer(
                        self.triton_model, inputs, model_version=self.version, outputs=outputs,
                        headers={**_HTTP_HEADERS, **traced})
        except GatewayError as e:
            error = e
            raise
        except Exception as e:  # noqa: BLE001
            error = map_triton_error(e, self.model)
            raise error from None
        finally:
            if span is not None:
                end_with(span, error)
        out: NDArray[Any] | None = result.as_numpy(self.output_name)
        if out is None:
            raise BackendUnavailableError(f"Triton returned no {self.output_name!r} for model {self.model!r}.")
        return out
