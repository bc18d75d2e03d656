"""What the LLM adapters share on the wire: the model's config as a spec, tensor building, and the
one-request gRPC stream.

`parse_model_config` takes the model-config JSON as Triton serves it (HTTP `/v2/models/{m}/config`,
or gRPC `get_model_config(as_json=True)`, which wraps it in `{"config": ...}` and renders int64 as
strings) and keeps what an adapter needs: input and output names with their dtypes (without the
`TYPE_` prefix; `STRING` is reported as `BYTES`, the name the inference protocol uses), dims without
the batch dim, whether the model is batched (`max_batch_size > 0`: every tensor then carries a
leading batch dim of 1) and whether it is decoupled (streams over gRPC).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpc_aio
from tritonclient.grpc import InferInput, InferResult

from openai_api.errors import GatewayError
from openai_api.triton.client import StallGuard, TritonClientPool, map_triton_error

NP_DTYPES: dict[str, Any] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64, "BYTES": np.object_,
}
INTEGER_DTYPES = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})


@dataclass(frozen=True, slots=True)
class TensorSpec:
    dtype: str
    dims: tuple[int, ...] = ()
    optional: bool = False


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    inputs: Mapping[str, TensorSpec] = field(default_factory=dict)
    outputs: Mapping[str, TensorSpec] = field(default_factory=dict)
    max_batch_size: int = 0
    decoupled: bool = False

    @property
    def batched(self) -> bool:
        return self.max_batch_size > 0

    def describe(self) -> str:
        """One line for error messages: the tensors a mismatch is judged against."""
        ins = ", ".join(f"{n} {t.dtype}" for n, t in self.inputs.items()) or "none"
        outs = ", ".join(f"{n} {t.dtype}" for n, t in self.outputs.items()) or "none"
        return f"inputs: {ins}; outputs: {outs}; decoupled: {str(self.decoupled).lower()}"


def _dtype(value: Any) -> str:
    dtype = str(value or "").removeprefix("TYPE_").upper()
    return "BYTES" if dtype == "STRING" else dtype


def _tensors(entries: Any) -> dict[str, TensorSpec]:
    out: dict[str, TensorSpec] = {}
    for e in entries or []:
        if isinstance(e, Mapping) and e.get("name"):
            dims = tuple(int(d) for d in e.get("dims", []) or [])
            out[str(e["name"])] = TensorSpec(_dtype(e.get("data_type")), dims, bool(e.get("optional", False)))
    return out


def parse_model_config(raw: Mapping[str, Any]) -> ModelSpec:
    cfg = raw.get("config", raw) if isinstance(raw.get("config"), Mapping) else raw
    policy = cfg.get("model_transaction_policy") or {}
    return ModelSpec(
        name=str(cfg.get("name", "")),
        inputs=_tensors(cfg.get("input")),
        outputs=_tensors(cfg.get("output")),
        max_batch_size=int(cfg.get("max_batch_size", 0) or 0),
        decoupled=bool(policy.get("decoupled", False)),
    )


async def fetch_model_spec(pool: TritonClientPool, url: str, triton_model: str, version: str,
                           model: str) -> ModelSpec:
    """Ask Triton (gRPC) for the model's config; transport failures become GatewayErrors."""
    try:
        raw = await pool.grpc(url).get_model_config(triton_model, version, as_json=True)
    except Exception as e:  # noqa: BLE001 - every transport failure maps to one taxonomy
        raise map_triton_error(e, model) from None
    return parse_model_config(raw)


def make_input(spec: ModelSpec, name: str, value: Any) -> InferInput:
    """One input tensor in the dtype the config declares, with the batch dim when the model is batched.
    A scalar becomes [1] ([1, 1] batched); strings are sent UTF-8 encoded."""
    dtype = spec.inputs[name].dtype
    if dtype == "BYTES":
        values = value if isinstance(value, list | tuple) else [value]
        arr = np.asarray([v.encode("utf-8") if isinstance(v, str) else v for v in values], dtype=np.object_)
    else:
        arr = np.asarray(value, dtype=NP_DTYPES.get(dtype, np.int32))
        if arr.ndim == 0:
            arr = arr.reshape(1)
    if spec.batched:
        arr = arr[np.newaxis, ...]
    inp = InferInput(name, list(arr.shape), dtype)
    inp.set_data_from_numpy(arr)
    return inp


async def stream_one_request(client: grpc_aio.InferenceServerClient, payload: dict[str, Any], *, model: str,
                             timeout_s: float | None, idle_s: float | None) -> AsyncIterator[InferResult]:
    """Send one request on its own gRPC stream and yield each response as Triton sends it.

    Ending the request generator half-closes the stream, so the stream itself ends after the model's
    FINAL response (the aio client never sees empty finals). A response carrying an error, a transport
    failure, a deadline (`timeout_s`, the whole stream) or a stall (no response for `idle_s`) is raised
    as a GatewayError. Closing this iterator early cancels the stream, which stops the model's work.
    """

    async def one_request() -> AsyncIterator[dict[str, Any]]:
        yield payload

    stream = client.stream_infer(one_request(), stream_timeout=timeout_s)
    try:
        async with StallGuard(idle_s, model) as guard:
            async for result, error in stream:
                guard.touch()
                if error is not None:
                    raise map_triton_error(error, model)
                yield result
    except GatewayError:
        raise
    except Exception as e:  # noqa: BLE001
        raise map_triton_error(e, model) from None
    finally:
        # Cancelling a finished stream is a no-op; cancelling a live one stops the model's work.
        stream.cancel()
