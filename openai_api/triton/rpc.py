"""Triton's inference RPCs over `grpc.aio` directly: the per-request and per-token hot path.

`tritonclient.grpc.aio` builds every request from numpy-backed `InferInput`s, feeds it through an
async request generator and a consumer task, and wraps every response in an `InferResult`; against
a real Triton that costs ~0.3 ms of CPU per request over a bare `grpc.aio` call, on the same core
that relays the tokens. Here a request is one `ModelInferRequest` protobuf built straight from
Python values, and responses are the protobufs themselves. `tritonclient` stays for everything off
the hot path (model configs, health, the encoders' HTTP client).

Wire contract (the KServe v2 gRPC protocol, `inference.GRPCInferenceService`):

* `ModelInfer` (unary): one `ModelInferRequest` -> one `ModelInferResponse`; models that are not
  decoupled.
* `ModelStreamInfer` (bidirectional): exactly one request per stream, then the client half-closes, so
  the stream ends after the model's FINAL response. Each `ModelStreamInferResponse` holds either an
  `error_message` or an `infer_response`. Cancelling the call cancels the request in Triton (the
  only per-request cancellation gRPC offers, which is why requests are never multiplexed on a
  shared stream).
* Tensors travel as `raw_input_contents` / `raw_output_contents`: little-endian values in row-major
  order; BOOL one byte each; BYTES each element a 4-byte little-endian length then the bytes.
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException

from openai_api.errors import GatewayError, InvalidRequestError
from openai_api.triton.client import StallGuard, map_triton_error

_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
_INFER = "/inference.GRPCInferenceService/ModelInfer"

# Triton dtype -> array typecode, for the fixed-width types that need no numpy on the way out.
_TYPECODES = {"INT8": "b", "UINT8": "B", "INT16": "h", "UINT16": "H", "INT32": "i", "UINT32": "I",
              "INT64": "q", "UINT64": "Q", "FP32": "f", "FP64": "d"}
# numpy dtypes for what `array` cannot hold (FP16) and for tensors that arrive as numpy arrays.
_NP_DTYPES: dict[str, Any] = {
    "BOOL": np.bool_, "UINT8": np.uint8, "UINT16": np.uint16, "UINT32": np.uint32, "UINT64": np.uint64,
    "INT8": np.int8, "INT16": np.int16, "INT32": np.int32, "INT64": np.int64, "FP16": np.float16,
    "FP32": np.float32, "FP64": np.float64,
}
_LITTLE = sys.byteorder == "little"


def _raw(dtype: str, values: Sequence[Any]) -> bytes:
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
    code = _TYPECODES.get(dtype)
    if code is None or not _LITTLE:
        return np.asarray(values, dtype=_NP_DTYPES[dtype]).astype(np.dtype(_NP_DTYPES[dtype]).newbyteorder("<"),
                                                                   copy=False).tobytes()
    return array(code, values).tobytes()


class InferRequest:
    """One inference request under construction; `pb` is the `ModelInferRequest` sent as is."""

    __slots__ = ("pb",)

    def __init__(self, model_name: str, model_version: str = "", request_id: str = "") -> None:
        self.pb = service_pb2.ModelInferRequest(model_name=model_name, model_version=model_version, id=request_id)

    def tensor(self, name: str, dtype: str, shape: Iterable[int], values: Sequence[Any]) -> None:
        """Add an input from flat Python values (row-major). A value `dtype` cannot hold (a negative
        seed for UINT64, a float for INT32) is the caller's error, never silently wrapped."""
        try:
            raw = _raw(dtype, values)
        except (OverflowError, TypeError, ValueError) as e:
            raise InvalidRequestError(f"A value for the model input {name!r} does not fit its type {dtype}: {e}",
                                      code="invalid_value") from None
        t = self.pb.inputs.add()
        t.name = name
        t.datatype = dtype
        t.shape.extend(shape)
        self.pb.raw_input_contents.append(raw)

    def numpy(self, name: str, dtype: str, arr: np.ndarray) -> None:
        """Add an input from a numpy array, converted to `dtype`."""
        if dtype == "BYTES" or dtype == "BOOL":
            self.tensor(name, dtype, arr.shape, arr.reshape(-1).tolist())
            return
        data = np.ascontiguousarray(arr, dtype=np.dtype(_NP_DTYPES[dtype]).newbyteorder("<"))
        t = self.pb.inputs.add()
        t.name = name
        t.datatype = dtype
        t.shape.extend(arr.shape)
        self.pb.raw_input_contents.append(data.tobytes())

    def output(self, *names: str) -> None:
        for name in names:
            self.pb.outputs.add().name = name

    def inputs(self) -> dict[str, tuple[str, list[int], bytes]]:
        """name -> (dtype, shape, raw bytes): what is on the wire, for logs and tests."""
        return {t.name: (t.datatype, list(t.shape), raw)
                for t, raw in zip(self.pb.inputs, self.pb.raw_input_contents, strict=True)}


def raw_output(resp: Any, name: str) -> bytes | None:
    """The raw bytes of output `name` of a `ModelInferResponse` (None when it is absent)."""
    for i, out in enumerate(resp.outputs):
        if out.name == name:
            return resp.raw_output_contents[i]  # type: ignore[no-any-return]
    return None


class ResponseError(InferenceServerException):
    """An error Triton sent as a stream response (`error_message`) rather than as the RPC status."""

    def __init__(self, message: str) -> None:
        super().__init__(msg=message)


class TritonRPC:
    """The inference RPCs of one Triton (one `grpc.aio` channel, shared by every request)."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        serialize = service_pb2.ModelInferRequest.SerializeToString
        self._stream = channel.stream_stream(_STREAM, request_serializer=serialize,
                                             response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        self._infer = channel.unary_unary(_INFER, request_serializer=serialize,
                                          response_deserializer=service_pb2.ModelInferResponse.FromString)

    async def infer(self, request: InferRequest, timeout_s: float | None) -> InferResult:
        """One unary `ModelInfer`; transport errors are raised as grpc.aio.AioRpcError."""
        return InferResult(await self._infer(request.pb, timeout=timeout_s))

    def stream(self, request: InferRequest, timeout_s: float | None) -> Any:
        """Start a `ModelStreamInfer` call carrying just `request` and half-closed after it. The call
        is an async iterable of `ModelStreamInferResponse`s; `cancel()` it to end the request early.
        `timeout_s` is the deadline of the whole stream."""
        return self._stream((request.pb,), timeout=timeout_s)

    async def close(self) -> None:
        await self.channel.close()


async def stream_one_request(rpc: TritonRPC, request: InferRequest, *, model: str, timeout_s: float | None,
                             idle_s: float | None) -> AsyncIterator[InferResult]:
    """Send one request on its own gRPC stream and yield each response as Triton sends it.

    A response carrying an error, a transport failure, a deadline (`timeout_s`, the whole stream) or a
    stall (no response for `idle_s`) is raised as a GatewayError. Closing this iterator early cancels
    the stream, which stops the model's work.
    """
    call = rpc.stream(request, timeout_s)
    try:
        async with StallGuard(idle_s, model) as guard:
            async for resp in call:
                guard.hold()
                if resp.error_message:
                    raise map_triton_error(ResponseError(resp.error_message), model)
                yield InferResult(resp.infer_response)
                guard.touch()
    except GatewayError:
        raise
    except Exception as e:  # noqa: BLE001
        raise map_triton_error(e, model) from None
    finally:
        # Cancelling a finished stream is a no-op; cancelling a live one stops the model's work.
        call.cancel()
