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
* `ModelStreamInfer` (bidirectional): one request at a time per stream, sent with
  `triton_enable_empty_final_response` so the last response carries `triton_final_response: true`
  (an empty one if the model flagged FINAL without data). Each `ModelStreamInferResponse` holds
  either an `error_message` (which ends the request) or an `infer_response`. Cancelling the call
  cancels the request in Triton (the only per-request cancellation gRPC offers, which is why a
  stream never carries two requests at once); a stream whose request ended cleanly is reused.
* Tensors travel as `raw_input_contents` / `raw_output_contents`: little-endian values in row-major
  order; BOOL one byte each; BYTES each element a 4-byte little-endian length then the bytes.
"""

from __future__ import annotations

import asyncio
import struct
import sys
from array import array
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import grpc
import numpy as np
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from openai_api.errors import GatewayError, InvalidRequestError
from openai_api.triton.client import StallGuard, map_triton_error

_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"
_INFER = "/inference.GRPCInferenceService/ModelInfer"
_LIVE = "/inference.GRPCInferenceService/ServerLive"

# Triton dtype -> array typecode, for the fixed-width types that need no numpy on the way out.
_TYPECODES = {"INT8": "b", "UINT8": "B", "INT16": "h", "UINT16": "H", "INT32": "i", "UINT32": "I",
              "INT64": "q", "UINT64": "Q", "FP32": "f", "FP64": "d"}
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
    if code is None or not _LITTLE:  # FP16, or a big-endian host: numpy does the conversion
        return np.asarray(values, dtype=_little(dtype)).tobytes()
    return array(code, values).tobytes()


def _little(dtype: str) -> np.dtype[Any]:
    """The little-endian numpy dtype of a fixed-width Triton dtype."""
    return np.dtype(triton_to_np_dtype(dtype)).newbyteorder("<")


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
        self._add(name, dtype, shape, raw)

    def numpy(self, name: str, dtype: str, arr: np.ndarray) -> None:
        """Add an input from a numpy array, converted to `dtype`."""
        if dtype == "BYTES" or dtype == "BOOL":
            self.tensor(name, dtype, arr.shape, arr.reshape(-1).tolist())
            return
        self._add(name, dtype, arr.shape, np.ascontiguousarray(arr, dtype=_little(dtype)).tobytes())

    def _add(self, name: str, dtype: str, shape: Iterable[int], raw: bytes) -> None:
        t = self.pb.inputs.add()
        t.name = name
        t.datatype = dtype
        t.shape.extend(shape)
        self.pb.raw_input_contents.append(raw)

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


class StreamDeadlineError(TimeoutError):
    """A request's deadline passed while it held a stream (mapped to a 504 like any timeout)."""


class TritonRPC:
    """The inference RPCs of one Triton (one `grpc.aio` channel, shared by every request).

    Streams are pooled: a request borrows an idle `ModelStreamInfer` stream, has it to itself until
    its final response, then hands it back. Setting up and tearing down a gRPC call costs ~0.5 ms of
    CPU per request here (half of all the gateway's work on a short request); writing one more
    request on an open stream costs a fraction of that. Cancelling a borrowed stream still cancels
    exactly one request, so a stream is only returned to the pool after Triton flagged the request's
    final response (`triton_enable_empty_final_response`), and is cancelled (never reused) when its
    request ends any other way: client gone, stop string matched, stall, deadline, error.
    """

    # Idle streams kept per Triton: beyond this a finished stream is closed instead.
    max_idle = 256

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        serialize = service_pb2.ModelInferRequest.SerializeToString
        self._stream = channel.stream_stream(_STREAM, request_serializer=serialize,
                                             response_deserializer=service_pb2.ModelStreamInferResponse.FromString)
        self._infer = channel.unary_unary(_INFER, request_serializer=serialize,
                                          response_deserializer=service_pb2.ModelInferResponse.FromString)
        self._live = channel.unary_unary(_LIVE, request_serializer=service_pb2.ServerLiveRequest.SerializeToString,
                                         response_deserializer=service_pb2.ServerLiveResponse.FromString)
        self._idle: list[Any] = []

    async def live(self, timeout_s: float) -> bool:
        """Whether Triton answers `ServerLive` within `timeout_s` (on the inference channel, so the answer
        says the server that holds the request is responsive; a frozen or wedged process does not answer)."""
        try:
            return bool((await self._live(service_pb2.ServerLiveRequest(), timeout=timeout_s)).live)
        except Exception:  # noqa: BLE001 - any failure means "not answering"
            return False

    async def infer(self, request: InferRequest, timeout_s: float | None) -> InferResult:
        """One unary `ModelInfer`; transport errors are raised as grpc.aio.AioRpcError."""
        return InferResult(await self._infer(request.pb, timeout=timeout_s))

    def _borrow(self) -> tuple[Any, bool]:
        while self._idle:
            call = self._idle.pop()
            if not call.done():  # a stream Triton ended (restart, GOAWAY) is skipped
                return call, True
        return self._stream(), False

    async def stream(self, request: InferRequest, timeout_s: float | None) -> AsyncIterator[Any]:
        """Send `request` on a stream of its own and yield Triton's `ModelStreamInferResponse`s up to
        and including the final one (or one carrying `error_message`, which ends the request too).

        Closing this iterator early cancels the stream, and so the request in Triton. A transport
        failure is raised as grpc.aio.AioRpcError; `timeout_s` passing first as StreamDeadlineError.
        A pooled stream that turns out dead before any response is replaced once, transparently.
        """
        request.pb.parameters["triton_enable_empty_final_response"].bool_param = True
        loop = asyncio.get_running_loop()
        call, pooled = self._borrow()
        expired = False
        reusable = False

        def expire() -> None:
            nonlocal expired
            expired = True
            call.cancel()

        timer = loop.call_later(timeout_s, expire) if timeout_s else None
        try:
            while True:
                try:
                    await call.write(request.pb)
                    resp = await call.read()
                    if resp is grpc.aio.EOF:
                        raise grpc.aio.UsageError("Triton closed the stream")
                    break
                except (grpc.aio.AioRpcError, grpc.aio.UsageError, grpc.aio.AbortError):
                    if not pooled or expired:
                        raise
                    call.cancel()
                    call, pooled = self._stream(), False
            while True:
                if resp.error_message:
                    yield resp
                    return
                params = resp.infer_response.parameters
                if "triton_final_response" in params and params["triton_final_response"].bool_param:
                    reusable = True
                    yield resp
                    return
                yield resp
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    raise grpc.aio.UsageError("Triton closed the stream before the final response")
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            # Cancelling the call at the deadline surfaces as either, depending on where the read was.
            if expired:
                raise StreamDeadlineError(f"no final response within {timeout_s:g} s") from None
            raise
        finally:
            if timer is not None:
                timer.cancel()
            if reusable and not expired and len(self._idle) < self.max_idle:
                self._idle.append(call)
            else:
                call.cancel()

    async def close(self) -> None:
        for call in self._idle:
            call.cancel()
        self._idle.clear()
        await self.channel.close()


async def stream_one_request(rpc: TritonRPC, request: InferRequest, *, model: str, timeout_s: float | None,
                             idle_s: float | None) -> AsyncIterator[InferResult]:
    """Send one request on its own gRPC stream and yield each response as Triton sends it.

    A response carrying an error, a transport failure, a deadline (`timeout_s`, the whole stream) or a
    stall is raised as a GatewayError. A stall is `idle_s` without a response once the request has had
    one; before its first response (queued, prefilling, or a single-response request still generating)
    it is `idle_s` of silence while Triton also fails to answer a liveness probe (see `StallGuard`).
    Closing this iterator early cancels the stream, which stops the model's work.
    """
    responses = rpc.stream(request, timeout_s)
    try:
        async with StallGuard(idle_s, model, probe=rpc.live) as guard:
            async for resp in responses:
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
        # Closing before the final response cancels the stream, and with it the model's work.
        await responses.aclose()  # type: ignore[attr-defined]
