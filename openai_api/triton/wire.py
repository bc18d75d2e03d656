"""What the LLM adapters share on the wire: the model's config as a spec, and input tensors built
to it.

`parse_model_config` takes the model-config JSON as Triton serves it (HTTP `/v2/models/{m}/config`,
or gRPC `get_model_config(as_json=True)`, which wraps it in `{"config": ...}` and renders int64 as
strings) and keeps what an adapter needs: input and output names with their dtypes (without the
`TYPE_` prefix; `STRING` is reported as `BYTES`, the name the inference protocol uses), dims without
the batch dim, whether the model is batched (`max_batch_size > 0`: every tensor then carries a
leading batch dim of 1) and whether it is decoupled (streams over gRPC).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from openai_api.triton.client import TritonClientPool, map_triton_error
from openai_api.triton.rpc import InferRequest

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


def add_input(request: InferRequest, spec: ModelSpec, name: str, value: Any) -> None:
    """One input tensor in the dtype the config declares, with the batch dim when the model is batched.
    A scalar or a flat list becomes [n] ([1, n] batched); a numpy array keeps its shape (plus the batch
    dim); strings are sent UTF-8 encoded."""
    dtype = spec.inputs[name].dtype
    if isinstance(value, np.ndarray):
        request.numpy(name, dtype, value[np.newaxis, ...] if spec.batched else value)
        return
    values = value if isinstance(value, list | tuple) else [value]
    shape = [1, len(values)] if spec.batched else [len(values)]
    request.tensor(name, dtype, shape, values)
