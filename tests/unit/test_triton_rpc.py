"""Requests built straight into protobufs carry the same bytes tritonclient's InferInput would."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferInput

from openai_api.errors import InvalidRequestError
from openai_api.triton.wire import InferRequest, ModelSpec, TensorSpec, raw_output, words_tensor


def tritonclient_bytes(dtype: str, arr: np.ndarray) -> bytes:
    inp = InferInput("x", list(arr.shape), dtype)
    inp.set_data_from_numpy(arr)
    return inp._get_content()  # type: ignore[no-any-return]


@pytest.mark.parametrize(("dtype", "values", "np_dtype"), [
    ("INT32", [5, -6, 2**31 - 1], np.int32),
    ("UINT32", [0, 7, 2**32 - 1], np.uint32),
    ("INT64", [-(2**63), 3], np.int64),
    ("UINT64", [2**64 - 1, 0], np.uint64),
    ("FP32", [0.7, -1.5], np.float32),
    ("FP16", [0.5, 2.0], np.float16),
    ("BOOL", [True, False], np.bool_),
    ("BYTES", ["héllo", "", "x"], np.object_),
])
def test_raw_bytes_match_tritonclient(dtype: str, values: list[Any], np_dtype: Any) -> None:
    r = InferRequest("m", "", "rid")
    r.tensor("x", dtype, [1, len(values)], values)
    name, (sent_dtype, shape, raw) = next(iter(r.inputs().items()))
    if dtype == "BYTES":
        arr = np.asarray([v.encode() for v in values], dtype=np.object_).reshape(1, -1)
    else:
        arr = np.asarray(values, dtype=np_dtype).reshape(1, -1)
    assert (name, sent_dtype, shape) == ("x", dtype, [1, len(values)])
    assert raw == tritonclient_bytes(dtype, arr)
    assert r.pb.model_name == "m" and r.pb.id == "rid"


@pytest.mark.parametrize(("dtype", "value"), [("UINT64", -1), ("INT32", 2**31), ("INT32", 0.5)])
def test_a_value_the_dtype_cannot_hold_is_a_client_error(dtype: str, value: Any) -> None:
    with pytest.raises(InvalidRequestError) as e:
        InferRequest("m").tensor("seed", dtype, [1], [value])
    assert "'seed'" in e.value.message and e.value.status == 400


def test_add_input_follows_the_spec_dtype_and_batch_dim() -> None:
    batched = ModelSpec("m", inputs={"input_ids": TensorSpec("INT32", (-1,)), "streaming": TensorSpec("BOOL", (1,)),
                                     "stop_words_list": TensorSpec("INT32", (2, -1)),
                                     "text_input": TensorSpec("BYTES", (1,))}, max_batch_size=8)
    r = InferRequest("m")
    r.add(batched, "input_ids", [5, 6, 7])
    r.add(batched, "streaming", True)
    r.add(batched, "stop_words_list", words_tensor([[5, 6], [7]]))
    r.add(batched, "text_input", "Hi")
    sent = r.inputs()
    assert sent["input_ids"][:2] == ("INT32", [1, 3])
    assert sent["streaming"] == ("BOOL", [1, 1], b"\x01")
    words = sent["stop_words_list"]
    assert words[:2] == ("INT32", [1, 2, 3])
    assert np.frombuffer(words[2], dtype=np.int32).tolist() == [5, 6, 7, 2, 3, -1]
    assert sent["text_input"] == ("BYTES", [1, 1], b"\x02\x00\x00\x00Hi")

    unbatched = ModelSpec("m", inputs={"input_ids": TensorSpec("UINT32", (-1,))})
    r = InferRequest("m")
    r.add(unbatched, "input_ids", [1, 2])
    assert r.inputs()["input_ids"][:2] == ("UINT32", [2])


def test_outputs_are_requested_by_name_and_read_raw() -> None:
    r = InferRequest("m")
    r.output("output_ids", "sequence_length")
    assert [o.name for o in r.pb.outputs] == ["output_ids", "sequence_length"]
    from tritonclient.grpc import service_pb2

    resp = service_pb2.ModelInferResponse()
    resp.outputs.add().name = "output_ids"
    resp.raw_output_contents.append(b"\x01\x00\x00\x00")
    assert raw_output(resp, "output_ids") == b"\x01\x00\x00\x00"
    assert raw_output(resp, "sequence_length") is None


def test_a_request_s_wire_bytes_parse_as_its_whole_message() -> None:
    """`InferRequest.serialized` writes the inputs' bytes after the rest of the message: the same message as
    `pb.SerializeToString()`, whatever is set before or after, and `pb` still holds every input's bytes."""
    from tritonclient.grpc import service_pb2

    from openai_api.text.prompt_cache import TokenIds, _int32

    ids = TokenIds(_int32(list(range(300_000))))  # a length past two varint bytes
    r = InferRequest("m", request_id="rid", priority=2)
    r.tensor("end_id", "INT32", [1, 1], [2])  # small: into the message
    r.tensor("input_ids", "INT32", [1, len(ids)], ids)  # big: set aside, and so is every later input
    r.tensor("request_output_len", "INT32", [1, 1], [0])  # an empty length-delimited field too
    r.tensor("stop", "BYTES", [1], [b"", b"end"])
    r.output("output_ids")
    r.bool_parameter("triton_enable_empty_final_response", True)
    wire = r.serialized()
    whole = service_pb2.ModelInferRequest.FromString(wire)
    assert whole.raw_input_contents[1] == ids.int32_le and len(whole.raw_input_contents) == 4
    assert [t.name for t in whole.inputs] == ["end_id", "input_ids", "request_output_len", "stop"]
    assert whole == r.pb  # `pb` now holds the inputs' bytes: the same message
    # Once `pb` holds the bytes, the wire bytes are its own serialization (maps serialize in no fixed order).
    assert service_pb2.ModelInferRequest.FromString(r.serialized()) == whole
    r.tensor("late", "INT32", [1], [7])  # added after `pb` was read: goes into it
    assert service_pb2.ModelInferRequest.FromString(r.serialized()) == r.pb and len(r.pb.raw_input_contents) == 5
    small = InferRequest("m")  # a short request: every input in the message, serialized as it is
    small.tensor("input_ids", "INT32", [1, 3], [1, 2, 3])
    assert small.serialized() == small.pb.SerializeToString()
