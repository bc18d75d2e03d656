"""What travels on the wire to Triton, and nothing that moves it: the model's config as a spec, inference
requests built to it, and the tensor encodings the LLM protocols share.

`parse_model_config` takes the model-config JSON as Triton serves it (HTTP `/v2/models/{m}/config`,
or gRPC `get_model_config(as_json=True)`, which wraps it in `{"config": ...}` and renders int64 as
strings) and keeps what an adapter needs: input and output names with their dtypes (without the
`TYPE_` prefix; `STRING` is reported as `BYTES`, the name the inference protocol uses), dims without
the batch dim, whether the model is batched (`max_batch_size > 0`: every tensor then carries a
leading batch dim of 1) and whether it is decoupled (streams over gRPC), and its string `parameters`.

**Priority.** A model whose config has `dynamic_batching { priority_levels: N }` orders the requests waiting in
Triton's queue by the request parameter `priority` (1 = most urgent, N = least; 0 or above N = the model's
`default_priority_level`). `InferRequest(..., priority=priority_for(spec))` sends the request's gateway class
(`RequestStats.priority_class`, set by the HTTP layer's admission) as `int64_param` (Triton's gRPC frontend takes
int64 in every release, uint64 only in recent ones): interactive 1, standard 2, batch N, each capped at N. A model
without priority levels (an ensemble, from which Triton drops a priority anyway, server #7116, or a model without
dynamic batching) gets no parameter.

`InferRequest` is one KServe v2 `ModelInferRequest` built straight from Python values. Tensors travel
as `raw_input_contents`: little-endian values in row-major order; BOOL one byte each; BYTES each
element a 4-byte little-endian length then the bytes (`encode_tensor`).
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray
from tritonclient.grpc import service_pb2
from tritonclient.utils import triton_to_np_dtype

from openai_api.errors import InvalidRequestError
from openai_api.observability import current_stats

INTEGER_DTYPES = frozenset({"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"})
# Triton dtype -> array typecode, for the fixed-width types that need no numpy on the way out.
_TYPECODES = {"INT8": "b", "UINT8": "B", "INT16": "h", "UINT16": "H", "INT32": "i", "UINT32": "I",
              "INT64": "q", "UINT64": "Q", "FP32": "f", "FP64": "d"}
_LITTLE = sys.byteorder == "little"
# Triton's `priority` per class (1 = highest; `priority_for` caps it at the model's levels, batch = the lowest).
CLASS_PRIORITY: dict[str, int] = {"interactive": 1, "standard": 2, "batch": 3}


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
    # The config's `parameters` (key -> string_value), e.g. tensorrt_llm_bls's `accumulate_tokens`.
    parameters: Mapping[str, str] = field(default_factory=dict)
    # `dynamic_batching.priority_levels` (0: none; then no request carries a `priority`).
    priority_levels: int = 0

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


def _parameters(raw: Any) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v.get("string_value", "")) for k, v in raw.items() if isinstance(v, Mapping)}


def parse_model_config(raw: Mapping[str, Any]) -> ModelSpec:
    cfg = raw.get("config", raw) if isinstance(raw.get("config"), Mapping) else raw
    policy = cfg.get("model_transaction_policy") or {}
    return ModelSpec(
        name=str(cfg.get("name", "")),
        inputs=_tensors(cfg.get("input")),
        outputs=_tensors(cfg.get("output")),
        max_batch_size=int(cfg.get("max_batch_size", 0) or 0),
        decoupled=bool(policy.get("decoupled", False)),
        parameters=_parameters(cfg.get("parameters")),
        priority_levels=_int((cfg.get("dynamic_batching") or {}).get("priority_levels")),
    )


def _int(value: Any) -> int:
    try:
        return max(int(str(value or 0)), 0)  # a uint64 may come as a string in Triton's JSON
    except ValueError:
        return 0


def priority_for(spec: ModelSpec) -> int:
    """The `priority` to send `spec`'s model for the current request's class (module docstring); 0: none."""
    stats = current_stats()
    cls = stats.priority_class if stats is not None else ""
    if not spec.priority_levels or cls not in CLASS_PRIORITY:
        return 0
    return spec.priority_levels if cls == "batch" else min(CLASS_PRIORITY[cls], spec.priority_levels)


def encode_tensor(dtype: str, values: Sequence[Any]) -> bytes:
    """Flat Python values as the raw little-endian bytes of a `dtype` tensor."""
    if dtype == "BOOL":
        return bytes(1 if v else 0 for v in values)
    if dtype == "BYTES":
        parts = []
        for v in values:
            b = v.encode("utf-8") if isinstance(v, str) else bytes(v)
            parts.append(struct.pack("<I", len(b)))
            parts.append(b)
        return b"".join(parts)
    if dtype in ("INT32", "UINT32"):
        # Prompt ids from the prompt cache are their int32 bytes (`text.prompt_cache.TokenIds`, read-only): a
        # 100k-token agent turn would otherwise convert every id again (~2.4 ms). Ids are never negative, so
        # the bytes are the same for UINT32.
        ready = getattr(values, "int32_le", None)
        if isinstance(ready, bytes) and len(ready) == 4 * len(values):
            return ready
    code = _TYPECODES.get(dtype)
    if code is None or not _LITTLE:  # FP16, or a big-endian host: numpy does the conversion
        return np.asarray(values, dtype=little_endian(dtype)).tobytes()
    return array(code, values).tobytes()


def little_endian(dtype: str) -> np.dtype[Any]:
    """The little-endian numpy dtype of a fixed-width Triton dtype."""
    return np.dtype(triton_to_np_dtype(dtype)).newbyteorder("<")


def words_tensor(words: list[list[int]]) -> NDArray[Any]:
    """Encode token sequences the TensorRT-LLM / FasterTransformer way (`stop_words_list`,
    `bad_words_list`): row 0 the concatenated ids (0-padded), row 1 the cumulative end offsets
    (-1-padded). [[5,6],[7]] -> [[5,6,7],[2,3,-1]]."""
    flat: list[int] = []
    offsets: list[int] = []
    for w in words:
        flat.extend(w)
        offsets.append(len(flat))
    width = max(len(flat), len(offsets), 1)
    out = np.zeros((2, width), dtype=np.int32)
    out[1, :] = -1
    out[0, : len(flat)] = flat
    out[1, : len(offsets)] = offsets
    return out


# `ModelInferRequest.raw_input_contents` is field 7, length-delimited: its tag byte on the wire.
_RAW_TAG = bytes([7 << 3 | 2])
# Inputs' bytes set aside from the protobuf (`InferRequest`): from the first input at least this big on (a
# short request's inputs all go into the message, which is serialized as before).
_ASIDE_BYTES = 64 * 1024


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class InferRequest:
    """One inference request under construction: `pb` is the whole `ModelInferRequest`; `serialized()` its wire
    bytes, as the streamed RPC sends them.

    The inputs' bytes from the first big one on (`_ASIDE_BYTES`) are kept beside the protobuf until something
    reads `pb` (then moved into it, once), so `serialized()` writes them after the rest of the message itself:
    an agent turn's ~470 KB `input_ids` is copied once into the wire bytes, where `pb.SerializeToString()` of a
    message holding it cost ~0.2 ms (copied into the message, then encoded again). Repeated fields may be written
    in parts, anywhere in the message, so the bytes parse as the same message."""

    __slots__ = ("_pb", "_raw")

    def __init__(self, model_name: str, model_version: str = "", request_id: str = "", priority: int = 0) -> None:
        self._pb = service_pb2.ModelInferRequest(model_name=model_name, model_version=model_version, id=request_id)
        self._raw: list[bytes] | None = []  # the inputs' bytes while not in `_pb` (None once they are)
        if priority > 0:
            self._pb.parameters["priority"].int64_param = priority

    @property
    def pb(self) -> Any:
        """The whole `ModelInferRequest` (`service_pb2` is untyped), inputs' bytes included."""
        if self._raw is not None:
            self._pb.raw_input_contents.extend(self._raw)
            self._raw = None
        return self._pb

    def bool_parameter(self, name: str, value: bool) -> None:
        self._pb.parameters[name].bool_param = value

    def serialized(self) -> bytes:
        """The request's wire bytes (what `pb.SerializeToString()` gives, up to field order)."""
        head: bytes = self._pb.SerializeToString()
        if not self._raw:
            return head
        parts = [head]
        for raw in self._raw:
            parts += (_RAW_TAG, _varint(len(raw)), raw)
        return b"".join(parts)

    def tensor(self, name: str, dtype: str, shape: Iterable[int], values: Sequence[Any]) -> None:
        """Add an input from flat Python values (row-major). A value `dtype` cannot hold (a negative
        seed for UINT64, a float for INT32) is the caller's error, never silently wrapped."""
        try:
            raw = encode_tensor(dtype, values)
        except (OverflowError, TypeError, ValueError) as e:
            raise InvalidRequestError(f"A value for the model input {name!r} does not fit its type {dtype}: {e}",
                                      code="invalid_value") from None
        self._add(name, dtype, shape, raw)

    def numpy(self, name: str, dtype: str, arr: NDArray[Any]) -> None:
        """Add an input from a numpy array, converted to `dtype`."""
        if dtype == "BYTES" or dtype == "BOOL":
            self.tensor(name, dtype, arr.shape, arr.reshape(-1).tolist())
            return
        self._add(name, dtype, arr.shape, np.ascontiguousarray(arr, dtype=little_endian(dtype)).tobytes())

    def add(self, spec: ModelSpec, name: str, value: Any) -> None:
        """Input `name` in the dtype `spec` declares, with the batch dim when the model is batched. A
        scalar or a flat list (any sequence but a string or bytes: prompt ids may be the prompt cache's
        `TokenIds`) becomes [n] ([1, n] batched); a numpy array keeps its shape (plus the batch dim); strings
        are sent UTF-8 encoded."""
        dtype = spec.inputs[name].dtype
        if isinstance(value, np.ndarray):
            self.numpy(name, dtype, value[np.newaxis, ...] if spec.batched else value)
            return
        flat = isinstance(value, list | tuple) or (isinstance(value, Sequence) and not isinstance(value, str | bytes))
        values = value if flat else [value]
        self.tensor(name, dtype, [1, len(values)] if spec.batched else [len(values)], values)

    def _add(self, name: str, dtype: str, shape: Iterable[int], raw: bytes) -> None:
        t = self._pb.inputs.add()
        t.name = name
        t.datatype = dtype
        t.shape.extend(shape)
        if self._raw is None or (not self._raw and len(raw) < _ASIDE_BYTES):
            self._pb.raw_input_contents.append(raw)  # (in order: once one input is set aside, all later ones are)
        else:
            self._raw.append(raw)

    def output(self, *names: str) -> None:
        for name in names:
            self._pb.outputs.add().name = name

    def inputs(self) -> dict[str, tuple[str, list[int], bytes]]:
        """name -> (dtype, shape, raw bytes): what is on the wire, for logs and tests."""
        return {t.name: (t.datatype, list(t.shape), raw)
                for t, raw in zip(self.pb.inputs, self.pb.raw_input_contents, strict=True)}


def raw_output(resp: Any, name: str) -> bytes | None:
    """The raw bytes of output `name` of a `ModelInferResponse` (None when it is absent)."""
    for i, out in enumerate(resp.outputs):
        if out.name == name:
            raw: bytes = resp.raw_output_contents[i]
            return raw
    return None


def output_int(resp: Any, name: str) -> int | None:
    """The first element of output `name` of a `ModelInferResponse` as an int, in the dtype the response says
    it has: a fixed-width number from its little-endian bytes, or BYTES holding a number as text (TensorRT-LLM's
    LLM-API model sends its perf metrics as strings whatever its config declares). None when the output is
    absent, empty or not a number."""
    for i, out in enumerate(resp.outputs):
        if out.name != name:
            continue
        raw: bytes = resp.raw_output_contents[i] if i < len(resp.raw_output_contents) else b""
        if out.datatype == "BYTES":
            size = int.from_bytes(raw[:4], "little") if len(raw) >= 4 else 0
            try:
                return int(float(raw[4: 4 + size].decode("ascii")))
            except (UnicodeDecodeError, ValueError, OverflowError):
                return None
        code = _TYPECODES.get(out.datatype)
        if code is None or len(raw) < struct.calcsize(code):
            return None
        value = struct.unpack_from("<" + code, raw)[0]
        return int(value) if value == value and abs(value) != float("inf") else None  # NaN / inf: no count
    return None


def cached_prompt_tokens(reused_blocks: int | None, tokens_per_block: int, prompt_tokens: int) -> int | None:
    """Prompt tokens a backend read from its KV cache, from the KV blocks it reports reusing: blocks x the
    engine's tokens per block, never more than the prompt (an engine that also reuses a partly matching block
    counts it whole). None stays None (the backend said nothing)."""
    if reused_blocks is None:
        return None
    return max(0, min(reused_blocks * tokens_per_block, prompt_tokens))
