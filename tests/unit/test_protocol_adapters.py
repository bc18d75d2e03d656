"""The vLLM and FasterTransformer adapters and protocol detection, against fake Triton clients and the
model configs real deployments serve (no server needed)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferResult, service_pb2
from tritonclient.utils import deserialize_bytes_tensor, np_to_triton_dtype, serialize_byte_tensor, triton_to_np_dtype

from openai_api.errors import BackendUnavailableError, InvalidRequestError
from openai_api.triton.auto import AutoLLMBackend
from openai_api.triton.detect import detect_protocol, protocol_mismatches, require_protocol
from openai_api.triton.fastertransformer import CumulativeDiff, FasterTransformerAdapter
from openai_api.triton.llm import GenerationRequest
from openai_api.triton.rpc import InferRequest
from openai_api.triton.tensorrt_llm import TensorRTLLMAdapter
from openai_api.triton.vllm import VLLMAdapter, parse_logprobs, sampling_parameters
from openai_api.triton.wire import parse_model_config


def tensor(name: str, dtype: str, dims: list[int], optional: bool = False) -> dict[str, Any]:
    # gRPC get_model_config(as_json=True) renders int64 dims as strings.
    return {"name": name, "data_type": f"TYPE_{dtype}", "dims": [str(d) for d in dims], "optional": optional}


TRTLLM_CONFIG = {"config": {
    "name": "tensorrt_llm", "backend": "tensorrtllm", "max_batch_size": 8,
    "model_transaction_policy": {"decoupled": True},
    "input": [tensor("input_ids", "INT32", [-1]), tensor("input_lengths", "INT32", [1]),
              tensor("request_output_len", "INT32", [1]), tensor("end_id", "INT32", [1], True),
              tensor("pad_id", "INT32", [1], True), tensor("runtime_top_k", "INT32", [1], True),
              tensor("temperature", "FP32", [1], True), tensor("presence_penalty", "FP32", [1], True),
              tensor("seed", "UINT64", [1], True), tensor("streaming", "BOOL", [1], True),
              tensor("return_log_probs", "BOOL", [1], True), tensor("stop_words_list", "INT32", [2, -1], True)],
    "output": [tensor("output_ids", "INT32", [-1, -1]), tensor("sequence_length", "INT32", [-1])],
}}

# TensorRT-LLM releases before Nov 2023: UINT32 scalars, random_seed, min_length. Still tensorrt_llm.
OLD_TRTLLM_CONFIG = {"config": {
    "name": "tensorrt_llm", "max_batch_size": 128, "model_transaction_policy": {"decoupled": False},
    "input": [tensor("input_ids", "UINT32", [-1]), tensor("input_lengths", "UINT32", [1]),
              tensor("request_output_len", "UINT32", [-1]), tensor("end_id", "UINT32", [1], True),
              tensor("pad_id", "UINT32", [1], True), tensor("beam_width", "UINT32", [1], True),
              tensor("runtime_top_k", "UINT32", [1], True), tensor("runtime_top_p", "FP32", [1], True),
              tensor("min_length", "UINT32", [1], True), tensor("random_seed", "UINT64", [1], True),
              tensor("return_log_probs", "BOOL", [1], True), tensor("streaming", "BOOL", [1], True)],
    "output": [tensor("output_ids", "INT32", [-1, -1])],
}}

VLLM_CONFIG = {"config": {
    "name": "vllm_model", "backend": "vllm", "max_batch_size": 0,
    "model_transaction_policy": {"decoupled": True},
    "input": [tensor("text_input", "STRING", [1]), tensor("stream", "BOOL", [1], True),
              tensor("sampling_parameters", "STRING", [1], True),
              tensor("exclude_input_in_output", "BOOL", [1], True),
              tensor("return_finish_reason", "BOOL", [1], True),
              tensor("return_logprobs", "BOOL", [1], True),
              tensor("return_num_output_tokens", "BOOL", [1], True)],
    "output": [tensor("text_output", "STRING", [-1]), tensor("finish_reason", "STRING", [-1]),
               tensor("logprobs", "STRING", [-1]), tensor("num_output_tokens", "UINT32", [-1])],
}}

FT_CONFIG = {"config": {
    "name": "fastertransformer", "backend": "fastertransformer", "max_batch_size": 1024,
    "model_transaction_policy": {"decoupled": True},
    "input": [tensor("input_ids", "UINT32", [-1]), tensor("start_id", "UINT32", [1], True),
              tensor("end_id", "UINT32", [1], True), tensor("input_lengths", "UINT32", [1]),
              tensor("request_output_len", "UINT32", [-1]), tensor("runtime_top_k", "UINT32", [1], True),
              tensor("runtime_top_p", "FP32", [1], True), tensor("temperature", "FP32", [1], True),
              tensor("len_penalty", "FP32", [1], True), tensor("repetition_penalty", "FP32", [1], True),
              tensor("random_seed", "UINT64", [1], True), tensor("is_return_log_probs", "BOOL", [1], True),
              tensor("beam_width", "UINT32", [1], True), tensor("stop_words_list", "INT32", [2, -1], True),
              tensor("bad_words_list", "INT32", [2, -1], True)],
    "output": [tensor("output_ids", "UINT32", [-1, -1]), tensor("sequence_length", "UINT32", [-1]),
               tensor("output_log_probs", "FP32", [-1, -1])],
}}

# The TensorRT-LLM ensemble's text interface: text in, no sampling_parameters (`tensorrt_llm_text`; more
# in test_text_protocols.py).
ENSEMBLE_CONFIG = {"name": "ensemble", "platform": "ensemble", "max_batch_size": 64,
                   "input": [tensor("text_input", "STRING", [1]), tensor("max_tokens", "INT32", [1])],
                   "output": [tensor("text_output", "STRING", [-1])]}


# ------------------------------------------------------------------ fakes
def pb_result(**arrays: Any) -> InferResult:
    """A real `ModelInferResponse` carrying `arrays` as raw outputs, as Triton would send it."""
    resp = service_pb2.ModelInferResponse()
    for name, arr in arrays.items():
        out = resp.outputs.add()
        out.name = name
        out.datatype = np_to_triton_dtype(arr.dtype)
        out.shape.extend(arr.shape)
        raw = serialize_byte_tensor(arr).item() if arr.dtype == np.object_ else arr.tobytes()
        resp.raw_output_contents.append(raw)
    return InferResult(resp)


class FakeStream:
    """What `TritonRPC.stream` returns: an async iterator of `InferResult`s; `cancelled` records that it
    was closed (which cancels the request on a real stream)."""

    def __init__(self, results: list[InferResult]) -> None:
        self.pending = list(results)
        self.cancelled = False

    def __aiter__(self) -> FakeStream:
        return self

    async def __anext__(self) -> Any:
        if not self.pending:
            raise StopAsyncIteration
        return self.pending.pop(0)

    async def aclose(self) -> None:
        self.cancelled = True


class FakeClient:
    """Both faces of one Triton: tritonclient's (model config) and the inference RPCs (`TritonRPC`)."""

    def __init__(self, config: dict[str, Any], responses: list[InferResult] | None = None) -> None:
        self.config = config
        self.responses = responses or []
        self.requests: list[InferRequest] = []
        self.streams: list[FakeStream] = []
        self.config_reads = 0

    async def get_model_config(self, name: str, version: str = "", as_json: bool = False) -> dict[str, Any]:
        self.config_reads += 1
        return self.config

    def stream(self, request: InferRequest, *, model: str, timeout_s: float | None = None,
               idle_s: float | None = None) -> FakeStream:
        self.requests.append(request)
        stream = FakeStream(self.responses)
        self.streams.append(stream)
        return stream

    async def infer(self, request: InferRequest, *, model: str, timeout_s: float | None) -> InferResult:
        self.requests.append(request)
        return self.responses[-1]

    async def live(self, timeout_s: float) -> bool:
        return True


class FakePool:
    def __init__(self, client: FakeClient) -> None:
        self.client = client

    def grpc(self, url: str) -> FakeClient:
        return self.client

    def rpc(self, url: str) -> FakeClient:
        return self.client


def make(cls: type[Any], client: FakeClient, triton_model: str) -> Any:
    """An adapter as AutoLLMBackend builds it: over `client`'s RPCs, with the spec of its config."""
    return cls(client, parse_model_config(client.config), model="m", triton_model=triton_model)


def sent(request: InferRequest) -> dict[str, np.ndarray]:
    """name -> the array an input carries (decoded back from its raw bytes)."""
    out = {}
    for name, (dtype, shape, raw) in request.inputs().items():
        if dtype == "BYTES":
            out[name] = deserialize_bytes_tensor(raw).reshape(shape)
        else:
            out[name] = np.frombuffer(raw, dtype=triton_to_np_dtype(dtype)).reshape(shape)
    return out


def request(**kw: Any) -> GenerationRequest:
    base: dict[str, Any] = {"prompt_ids": [5, 6, 7], "prompt_text": "Hi there", "max_tokens": 8, "end_id": 2}
    return GenerationRequest(**{**base, **kw})


def ft_result(ids: list[int], seq_len: int | None = None, log_probs: list[float] | None = None) -> InferResult:
    arrays: dict[str, Any] = {"output_ids": np.asarray(ids, dtype=np.uint32).reshape(1, 1, -1)}
    arrays["sequence_length"] = np.asarray([[len(ids) if seq_len is None else seq_len]], dtype=np.uint32)
    if log_probs is not None:
        arrays["output_log_probs"] = np.asarray(log_probs, dtype=np.float32).reshape(1, 1, -1)
    return pb_result(**arrays)


def vllm_result(text: str, n: int | None = None, finish: str = "None", logprobs: str | None = None) -> InferResult:
    arrays: dict[str, Any] = {"text_output": np.asarray([text.encode()], dtype=np.object_),
                              "finish_reason": np.asarray([finish.encode()], dtype=np.object_)}
    if n is not None:
        arrays["num_output_tokens"] = np.asarray([n], dtype=np.uint32)
    if logprobs is not None:
        arrays["logprobs"] = np.asarray([logprobs.encode()], dtype=np.object_)
    return pb_result(**arrays)


async def collect(it: AsyncIterator[Any]) -> list[Any]:
    return [c async for c in it]


# ------------------------------------------------------------------ FasterTransformer: cumulative diffing
def test_ft_cumulative_responses_become_new_tokens_only() -> None:
    diff = CumulativeDiff([5, 6, 7], end_id=2)
    assert diff.push([5, 6, 7, 10]) == (0, [10])
    assert diff.push([5, 6, 7, 10, 11, 12]) == (1, [11, 12])  # two steps in one response
    assert diff.push([5, 6, 7, 10, 11, 12]) == (3, [])  # a repeated final response adds nothing
    assert diff.push([5, 6, 7, 10, 11, 12, 2, 2, 2], seq_len=9) == (3, [])  # end_id padding is not a token


def test_ft_sequence_length_trims_padding_and_pad_values_are_dropped() -> None:
    diff = CumulativeDiff([5, 6], end_id=None)
    assert diff.push([5, 6, 9, 0, 0, 0], seq_len=3) == (0, [9])
    assert diff.push([5, 6, 9, 8, 4294967295, 4294967295]) == (1, [8])


def test_ft_output_without_the_prompt_is_taken_as_generation() -> None:
    diff = CumulativeDiff([5, 6, 7], end_id=2)
    assert diff.push([10]) == (0, [10])
    assert diff.push([10, 5]) == (1, [5])


def test_ft_chunk_carries_log_probs_of_the_new_tokens() -> None:
    diff = CumulativeDiff([5, 6, 7], end_id=2)
    first = FasterTransformerAdapter.chunk_from(ft_result([5, 6, 7, 10], log_probs=[-0.5]), diff, True)
    second = FasterTransformerAdapter.chunk_from(ft_result([5, 6, 7, 10, 11], log_probs=[-0.5, -0.25]), diff, True)
    assert first is not None and first.token_ids == [10] and first.logprobs == [-0.5]
    assert second is not None and second.token_ids == [11] and second.logprobs == [-0.25]
    assert FasterTransformerAdapter.chunk_from(ft_result([5, 6, 7, 10, 11]), diff, False) is None


async def test_ft_stream_yields_deltas_and_sends_uint32_with_batch_dim() -> None:
    client = FakeClient(FT_CONFIG, [ft_result([5, 6, 7, 10]), ft_result([5, 6, 7, 10, 11]),
                                    ft_result([5, 6, 7, 10, 11, 12]), ft_result([5, 6, 7, 10, 11, 12])])
    adapter = make(FasterTransformerAdapter, client, "ft")
    chunks = await collect(adapter.generate(request(temperature=0.0, top_p=0.9, seed=7, stop_words=[[4, 5]])))
    assert [c.token_ids for c in chunks] == [[10], [11], [12]]
    t = sent(client.requests[0])
    assert t["input_ids"].dtype == np.uint32 and t["input_ids"].tolist() == [[5, 6, 7]]
    assert t["input_lengths"].tolist() == [[3]] and t["request_output_len"].tolist() == [[8]]
    assert t["end_id"].tolist() == [[2]] and t["random_seed"].dtype == np.uint64
    # No greedy temperature in FasterTransformer: temperature 0 becomes top-k 1.
    assert "temperature" not in t and t["runtime_top_k"].tolist() == [[1]]
    assert t["stop_words_list"].tolist() == [[[4, 5], [2, -1]]]
    assert "streaming" not in t


async def test_ft_unary_strips_prompt_and_trims_by_sequence_length() -> None:
    cfg = json.loads(json.dumps(FT_CONFIG))
    cfg["config"]["model_transaction_policy"]["decoupled"] = False
    client = FakeClient(cfg, [ft_result([5, 6, 7, 10, 11, 2, 2], seq_len=5)])
    adapter = make(FasterTransformerAdapter, client, "ft")
    chunks = await collect(adapter.generate(request(temperature=0.7)))
    assert [c.token_ids for c in chunks] == [[10, 11]]
    assert sent(client.requests[0])["temperature"].tolist() == [[pytest.approx(0.7)]]


async def test_ft_refuses_a_parameter_its_config_lacks_naming_it() -> None:
    adapter = make(FasterTransformerAdapter, FakeClient(FT_CONFIG), "ft")
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(presence_penalty=0.5)))
    assert e.value.param == "presence_penalty" and e.value.code == "unsupported_parameter"
    assert not adapter.supports("presence_penalty") and adapter.supports("seed") and adapter.supports("top_k")


@pytest.mark.parametrize("neutral", [{"presence_penalty": 0.0}, {"frequency_penalty": 0}, {"presence_penalty": 0,
                                     "frequency_penalty": 0.0}])
async def test_ft_takes_a_neutral_value_of_a_parameter_its_config_lacks(neutral: dict[str, float]) -> None:
    # Chat UIs send presence_penalty 0 / frequency_penalty 0 with every request: no input, nothing to refuse.
    client = FakeClient(FT_CONFIG, [ft_result([5, 6, 7, 10])])
    adapter = make(FasterTransformerAdapter, client, "ft")
    chunks = await collect(adapter.generate(request(temperature=0.7, **neutral)))
    assert [c.token_ids for c in chunks] == [[10]]
    t = sent(client.requests[0])
    assert "presence_penalty" not in t and "frequency_penalty" not in t


async def test_neutral_values_are_still_sent_where_the_model_has_the_input() -> None:
    client = FakeClient(TRTLLM_CONFIG, [])
    adapter = make(TensorRTLLMAdapter, client, "trt")
    t = sent(adapter._request(request(presence_penalty=0.0, top_k=0), streaming=False))
    assert t["presence_penalty"].tolist() == [[0.0]] and t["runtime_top_k"].tolist() == [[0]]


@pytest.mark.parametrize(("param", "value"), [("presence_penalty", 0.1), ("frequency_penalty", -0.5),
                                              ("min_tokens", 1), ("repetition_penalty", 1.05)])
def test_a_value_that_would_change_the_output_is_still_refused(param: str, value: float) -> None:
    adapter = make(TensorRTLLMAdapter, FakeClient(OLD_TRTLLM_CONFIG), "trt")  # no penalty inputs at all
    if param == "min_tokens":
        adapter = make(TensorRTLLMAdapter, FakeClient(TRTLLM_CONFIG), "trt")  # min_tokens undeclared here
    with pytest.raises(InvalidRequestError) as e:
        adapter._request(request(**{param: value}), streaming=False)
    assert e.value.param == param and e.value.code == "unsupported_parameter"


def test_neutral_values_pass_every_adapter_that_lacks_their_input() -> None:
    neutral = {"presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0, "top_p": 1.0,
               "min_tokens": 0}
    old = make(TensorRTLLMAdapter, FakeClient(OLD_TRTLLM_CONFIG), "trt")
    t = sent(old._request(request(**neutral), streaming=False))
    assert not {"presence_penalty", "frequency_penalty", "repetition_penalty"} & set(t)
    assert t["runtime_top_p"].tolist() == [[1.0]]  # declared: sent as is


# ------------------------------------------------------------------ vLLM
def test_vllm_sampling_parameters_always_carry_max_tokens() -> None:
    assert sampling_parameters(request(end_id=None)) == {"max_tokens": 8}
    params = sampling_parameters(request(temperature=0.0, top_p=0.9, top_k=0, seed=3, repetition_penalty=1.1,
                                         presence_penalty=0.5, frequency_penalty=0.25, min_tokens=2,
                                         stop_words=[[9], [4, 5]], return_logprobs=True))
    assert params == {"max_tokens": 8, "temperature": 0.0, "top_p": 0.9, "top_k": -1, "seed": 3,
                      "repetition_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": 0.25,
                      "min_tokens": 2, "stop_token_ids": [2, 9], "logprobs": 0}


async def test_vllm_stream_yields_text_deltas_with_token_counts() -> None:
    client = FakeClient(VLLM_CONFIG, [vllm_result("The", 1), vllm_result(" capital", 1), vllm_result("", 1),
                                      vllm_result("", 0, "stop")])
    adapter = make(VLLMAdapter, client, "vllm")
    chunks = await collect(adapter.generate(request(temperature=0.0)))
    assert [(c.text, c.num_tokens, c.token_ids) for c in chunks] == [("The", 1, []), (" capital", 1, []), ("", 1, [])]
    t = sent(client.requests[0])
    assert t["text_input"].tolist() == [b"Hi there"]  # no batch dim: max_batch_size 0
    assert t["stream"].tolist() == [True] and t["exclude_input_in_output"].tolist() == [True]
    assert json.loads(t["sampling_parameters"][0]) == {"max_tokens": 8, "temperature": 0.0, "stop_token_ids": [2]}
    assert t["return_num_output_tokens"].tolist() == [True] and "return_logprobs" not in t
    assert client.streams[0].cancelled  # closed (a no-op once finished) so a live request never lingers


async def test_vllm_sends_only_the_inputs_its_config_declares() -> None:
    cfg = json.loads(json.dumps(VLLM_CONFIG))
    cfg["config"]["input"] = [i for i in cfg["config"]["input"] if not i["name"].startswith(("return_", "exclude"))]
    cfg["config"]["output"] = [o for o in cfg["config"]["output"] if o["name"] == "text_output"]
    client = FakeClient(cfg, [vllm_result("Paris")])
    adapter = make(VLLMAdapter, client, "vllm")
    chunks = await collect(adapter.generate(request()))
    assert [(c.text, c.num_tokens) for c in chunks] == [("Paris", None)]  # None: the gateway counts
    assert set(sent(client.requests[0])) == {"text_input", "stream", "sampling_parameters"}
    assert not adapter.supports("return_logprobs") and adapter.supports("presence_penalty")
    assert not adapter.supports("bad_words")


async def test_vllm_logprobs_give_token_ids_and_log_probs() -> None:
    result = vllm_result(" Paris", 1, logprobs=json.dumps([{"7": {"logprob": -0.25, "rank": 1}}]))
    client = FakeClient(VLLM_CONFIG, [result])
    adapter = make(VLLMAdapter, client, "vllm")
    [chunk] = await collect(adapter.generate(request(return_logprobs=True)))
    assert chunk.token_ids == [7] and chunk.logprobs == [-0.25] and chunk.text == " Paris"
    assert sent(client.requests[0])["return_logprobs"].tolist() == [True]
    assert parse_logprobs(b"null") is None


async def test_vllm_alternatives_are_asked_for_and_ranked() -> None:
    # As vllm_backend sends them: the sampled token first (here ranked 3rd, below the two asked for), then
    # the most likely; a second token whose sampled id is the most likely appears once.
    payload = [{"9": {"logprob": -2.5, "rank": 3, "decoded_token": "x"},
                "7": {"logprob": -0.25, "rank": 1, "decoded_token": " Paris"},
                "8": {"logprob": -1.5, "rank": 2, "decoded_token": " Lyon"}},
               {"4": {"logprob": -0.125, "rank": 1, "decoded_token": "."},
                "5": {"logprob": -float("inf"), "rank": 2, "decoded_token": "!"}}]
    client = FakeClient(VLLM_CONFIG, [vllm_result(" x.", 2, logprobs=json.dumps(payload))])
    adapter = make(VLLMAdapter, client, "vllm")
    assert adapter.supports("top_logprobs")
    [chunk] = await collect(adapter.generate(request(return_logprobs=True, top_logprobs=2)))
    assert chunk.token_ids == [9, 4] and chunk.logprobs == [-2.5, -0.125]
    assert chunk.top_logprobs == [[(7, -0.25), (8, -1.5)], [(4, -0.125), (5, -9999.0)]]
    assert json.loads(sent(client.requests[0])["sampling_parameters"][0])["logprobs"] == 2


async def test_vllm_alternatives_without_ranks_go_by_log_prob() -> None:
    ids, lps, top = parse_logprobs(json.dumps([{"3": {"logprob": -1.0}, "1": {"logprob": -0.5},
                                                 "2": {"logprob": -0.75}}]), 5) or ([], [], None)
    assert (ids, lps, top) == ([3], [-1.0], [[(1, -0.5), (2, -0.75), (3, -1.0)]])


@pytest.mark.parametrize(("cls", "config", "name"), [(TensorRTLLMAdapter, TRTLLM_CONFIG, "tensorrt_llm"),
                                                     (FasterTransformerAdapter, FT_CONFIG, "fastertransformer")])
async def test_only_the_vllm_interface_returns_alternatives(cls: type[Any], config: dict[str, Any], name: str) -> None:
    adapter = make(cls, FakeClient(config), name)
    assert adapter.supports("return_logprobs") and not adapter.supports("top_logprobs")


async def test_vllm_refuses_token_id_bad_words() -> None:
    adapter = make(VLLMAdapter, FakeClient(VLLM_CONFIG), "vllm")
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(bad_words=[[3]])))
    assert e.value.param == "bad_words"


# ------------------------------------------------------------------ ignore_eos, per protocol
def test_vllm_takes_ignore_eos_and_no_longer_sends_the_end_id_as_a_stop() -> None:
    # vLLM stops at explicit stop_token_ids even with ignore_eos: the end id must not be one of them.
    assert sampling_parameters(request(ignore_eos=True, stop_words=[[9]])) == \
        {"max_tokens": 8, "ignore_eos": True, "stop_token_ids": [9]}
    assert sampling_parameters(request(ignore_eos=True)) == {"max_tokens": 8, "ignore_eos": True}
    client = FakeClient(VLLM_CONFIG, [])
    adapter = make(VLLMAdapter, client, "vllm")
    assert adapter.supports("ignore_eos")
    params = json.loads(sent(adapter.build_request(request(ignore_eos=True), False))["sampling_parameters"][0])
    assert params["ignore_eos"] is True and "min_tokens" not in params


def test_vllm_without_sampling_parameters_refuses_ignore_eos() -> None:
    cfg = json.loads(json.dumps(VLLM_CONFIG))
    cfg["config"]["input"] = [i for i in cfg["config"]["input"] if i["name"] != "sampling_parameters"]
    adapter = make(VLLMAdapter, FakeClient(cfg), "vllm")
    assert not adapter.supports("ignore_eos")
    with pytest.raises(InvalidRequestError) as e:
        adapter.build_request(request(ignore_eos=True), False)
    assert (e.value.param, e.value.code) == ("ignore_eos", "unsupported_parameter")


def _with(config: dict[str, Any], *inputs: dict[str, Any]) -> dict[str, Any]:
    out = json.loads(json.dumps(config))
    out["config"]["input"] += list(inputs)
    return out


@pytest.mark.parametrize(("cls", "config", "name"), [
    (TensorRTLLMAdapter, _with(TRTLLM_CONFIG, tensor("min_tokens", "INT32", [1], True)), "min_tokens"),
    (TensorRTLLMAdapter, OLD_TRTLLM_CONFIG, "min_length"),
    (FasterTransformerAdapter, _with(FT_CONFIG, tensor("min_length", "UINT32", [1], True)), "min_length"),
], ids=["tensorrt_llm", "tensorrt_llm-old", "fastertransformer"])
def test_token_protocols_hold_the_end_token_back_for_the_whole_budget(cls: type[Any], config: dict[str, Any],
                                                                       name: str) -> None:
    # TensorRT-LLM has no ignore_eos: a minimum length of max_tokens masks the end token until then.
    adapter = make(cls, FakeClient(config), "m")
    greq = request(ignore_eos=True, min_tokens=3)
    built = adapter._request(greq, streaming=False) if cls is TensorRTLLMAdapter else adapter.build_request(greq)
    t = sent(built)
    assert t[name].reshape(-1).tolist() == [8] and t["end_id"].reshape(-1).tolist() == [2]
    assert greq.min_tokens == 3  # the request itself is left as it was


@pytest.mark.parametrize(("cls", "config"), [(TensorRTLLMAdapter, TRTLLM_CONFIG),
                                             (FasterTransformerAdapter, FT_CONFIG)], ids=["tensorrt_llm", "ft"])
async def test_a_model_without_a_minimum_length_input_refuses_ignore_eos(cls: type[Any],
                                                                         config: dict[str, Any]) -> None:
    adapter = make(cls, FakeClient(config), "m")
    with pytest.raises(InvalidRequestError) as e:
        await collect(adapter.generate(request(ignore_eos=True)))
    assert (e.value.param, e.value.code) == ("ignore_eos", "unsupported_parameter")
    assert "min_tokens or min_length" in e.value.message


# ------------------------------------------------------------------ detection and mismatches
@pytest.mark.parametrize(("config", "protocol"), [
    (TRTLLM_CONFIG, "tensorrt_llm"),
    (OLD_TRTLLM_CONFIG, "tensorrt_llm"),
    (VLLM_CONFIG, "vllm"),
    (FT_CONFIG, "fastertransformer"),
    (ENSEMBLE_CONFIG, "tensorrt_llm_text"),
])
def test_detect_protocol_from_model_config(config: dict[str, Any], protocol: str) -> None:
    assert detect_protocol(parse_model_config(config)) == protocol


def test_model_config_parsing_handles_the_grpc_json_shape() -> None:
    spec = parse_model_config(VLLM_CONFIG)
    assert spec.inputs["text_input"].dtype == "BYTES" and spec.inputs["text_input"].dims == (1,)
    assert spec.decoupled and not spec.batched
    ft = parse_model_config(FT_CONFIG["config"])  # HTTP shape: no wrapper
    assert ft.batched and ft.inputs["stop_words_list"].dims == (2, -1) and ft.inputs["random_seed"].optional


def test_each_protocol_fits_its_own_config() -> None:
    for config, protocol in ((TRTLLM_CONFIG, "tensorrt_llm"), (OLD_TRTLLM_CONFIG, "tensorrt_llm"),
                             (VLLM_CONFIG, "vllm"), (FT_CONFIG, "fastertransformer")):
        assert protocol_mismatches(protocol, parse_model_config(config)) == []


def test_mismatch_names_the_missing_tensors_and_wrong_dtypes() -> None:
    problems = protocol_mismatches("vllm", parse_model_config(TRTLLM_CONFIG))
    assert problems == ["no input 'text_input' (BYTES)", "no output 'text_output' (BYTES)"]
    cfg = json.loads(json.dumps(VLLM_CONFIG))
    cfg["config"]["input"][0]["data_type"] = "TYPE_FP32"
    assert protocol_mismatches("vllm", parse_model_config(cfg)) == ["input 'text_input' is FP32, expected BYTES"]
    ft = protocol_mismatches("fastertransformer", parse_model_config(VLLM_CONFIG))
    assert "no input 'input_ids' (an integer type)" in ft and "no output 'output_ids' (an integer type)" in ft
    ensemble = protocol_mismatches("tensorrt_llm", parse_model_config(ENSEMBLE_CONFIG))
    assert any("ensemble" in p and "tensorrt_llm_text" in p for p in ensemble)
    with pytest.raises(BackendUnavailableError) as e:
        require_protocol("vllm", parse_model_config(TRTLLM_CONFIG), "tensorrt_llm")
    assert "text_input" in e.value.message and "configured protocol 'vllm'" in e.value.message


async def test_auto_backend_picks_the_adapter_and_delegates() -> None:
    for config, kind in ((VLLM_CONFIG, VLLMAdapter), (FT_CONFIG, FasterTransformerAdapter),
                         (TRTLLM_CONFIG, TensorRTLLMAdapter)):
        client = FakeClient(config)
        auto = AutoLLMBackend(FakePool(client), "u", "m", "t")  # type: ignore[arg-type]
        assert auto.supports("presence_penalty")  # unknown before Triton answered
        await auto.check()
        assert isinstance(auto.adapter, kind) and auto.protocol == kind.protocol
        assert auto.generate(request()) is not None and isinstance(auto.adapter, kind)
        await auto.check()
        assert client.config_reads == 1  # read once, by the auto backend only: adapters get the spec
    ft = AutoLLMBackend(FakePool(FakeClient(FT_CONFIG)), "u", "m", "t")  # type: ignore[arg-type]
    await ft.check()
    assert not ft.supports("presence_penalty") and ft.supports("seed")


async def test_auto_backend_reports_a_configured_protocol_the_model_does_not_speak() -> None:
    auto = AutoLLMBackend(FakePool(FakeClient(TRTLLM_CONFIG)), "u", "m", "trt", protocol="vllm")  # type: ignore[arg-type]
    with pytest.raises(BackendUnavailableError) as e:
        await auto.check()
    assert "'text_input'" in e.value.message and "'trt'" in e.value.message
    assert auto.adapter is None  # not cached: a fixed Triton model is picked up on the next call
    with pytest.raises(BackendUnavailableError):
        await collect(auto.generate(request()))


async def test_auto_backend_closes_the_adapter_stream_when_closed_early() -> None:
    client = FakeClient(FT_CONFIG, [ft_result([5, 6, 7, 10]), ft_result([5, 6, 7, 10, 11])])
    auto = AutoLLMBackend(FakePool(client), "u", "m", "ft")  # type: ignore[arg-type]
    for _ in range(2):  # the first time through the resolving wrapper, then the adapter's own generator
        gen = auto.generate(request())
        first = await gen.__anext__()
        assert first.token_ids == [10]
        await gen.aclose()  # type: ignore[attr-defined]
        assert client.streams[-1].cancelled


async def test_auto_backend_hands_out_the_adapters_own_generator_once_resolved() -> None:
    auto = AutoLLMBackend(FakePool(FakeClient(FT_CONFIG)), "u", "m", "ft")  # type: ignore[arg-type]
    await auto.check()
    gen = auto.generate(request())
    assert gen.ag_code is FasterTransformerAdapter.generate.__code__  # type: ignore[attr-defined]  # no layer between
    await gen.aclose()  # type: ignore[attr-defined]


def _with_levels(config: dict[str, Any], levels: Any) -> dict[str, Any]:
    return {"config": {**config["config"], "dynamic_batching": {"priority_levels": levels}}}


@pytest.mark.parametrize(("cls", "config", "build"), [
    (TensorRTLLMAdapter, TRTLLM_CONFIG, lambda a: a._request(request(), streaming=True)),
    (VLLMAdapter, VLLM_CONFIG, lambda a: a.build_request(request(), True)),
    (FasterTransformerAdapter, FT_CONFIG, lambda a: a.build_request(request())),
])
def test_the_request_class_is_sent_as_triton_priority_to_models_with_levels(cls: type[Any], config: dict[str, Any],
                                                                            build: Any) -> None:
    """`dynamic_batching { priority_levels: N }`: the built ModelInferRequest carries `priority` as int64_param
    (what every Triton release's gRPC frontend takes): interactive 1, standard 2, batch N, capped at N. A model
    without levels, or a request outside the HTTP layer (no class), gets no `priority` parameter."""
    from openai_api.observability import RequestStats, bind_stats, unbind_stats

    def priority(levels: Any, klass: str | None) -> int | None:
        adapter = make(cls, FakeClient(config if levels is None else _with_levels(config, levels)), "m")
        if klass is None:
            return _priority(build(adapter))
        stats = RequestStats(0.0)
        stats.priority_class = klass
        token = bind_stats(stats)
        try:
            return _priority(build(adapter))
        finally:
            unbind_stats(token)

    def _priority(built: InferRequest) -> int | None:
        params = built.pb.parameters
        if "priority" not in params:
            return None
        assert params["priority"].WhichOneof("parameter_choice") == "int64_param"
        return int(params["priority"].int64_param)

    assert [priority("5", k) for k in ("interactive", "standard", "batch")] == [1, 2, 5]  # JSON may quote it
    assert [priority(2, k) for k in ("interactive", "standard", "batch")] == [1, 2, 2]
    assert [priority(1, k) for k in ("interactive", "standard", "batch")] == [1, 1, 1]
    assert [priority(None, k) for k in ("interactive", "standard", "batch")] == [None] * 3
    assert priority(0, "batch") is None and priority(3, None) is None
