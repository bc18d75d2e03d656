"""The synthetic LLM (triton_models/synthetic-llm) that bench/ measures the gateway with: a real
tritonserver, called directly with tritonclient.grpc.aio, the way the bench's old baseline
(`bench/limit.py --client tritonclient`) does."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
from tritonclient.grpc import InferInput, InferRequestedOutput

from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.errors import BackendError, BackendTimeoutError

MODEL = "synthetic-llm"
# " The quick brown fox ..." as the model emits it.
FIRST_TOKENS = [378, 2365, 6354, 16438]


@pytest.fixture(scope="module")
def synthetic(triton: EmbeddedTriton, ref_stats_dir: Path) -> tuple[EmbeddedTriton, Any]:
    """The session's Triton (it serves the synthetic model) and the model's own counters file."""
    return triton, ref_stats_dir / f"{MODEL}.json"


def _inputs(prompt: list[int], output_len: int, *, streaming: bool = True) -> list[InferInput]:
    def tensor(name: str, value: Any, dtype: str) -> InferInput:
        arr = np.asarray(value, dtype={"INT32": np.int32, "BOOL": np.bool_}[dtype])[np.newaxis, ...]
        inp = InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        return inp

    return [tensor("input_ids", prompt, "INT32"), tensor("input_lengths", [len(prompt)], "INT32"),
            tensor("request_output_len", [output_len], "INT32"), tensor("end_id", [2], "INT32"),
            tensor("streaming", [streaming], "BOOL")]


async def _one(payload: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield payload


def _payload(prompt: list[int], output_len: int, **kw: Any) -> dict[str, Any]:
    return {"model_name": MODEL, "inputs": _inputs(prompt, output_len, **kw),
            "outputs": [InferRequestedOutput("output_ids"), InferRequestedOutput("sequence_length")]}


async def test_streams_one_token_per_response(synthetic: tuple[EmbeddedTriton, Any]) -> None:
    server, _ = synthetic
    n = 200
    client = grpc_aio.InferenceServerClient(server.grpc_url)
    try:
        responses: list[list[int]] = []
        lengths: list[int] = []
        async for result, error in client.stream_infer(_one(_payload([1, 2, 3], n))):
            assert error is None, error
            responses.append(result.as_numpy("output_ids").reshape(-1).tolist())
            lengths.append(int(result.as_numpy("sequence_length").reshape(-1)[0]))
        assert len(responses) == n
        assert all(len(r) == 1 for r in responses)
        assert [r[0] for r in responses[:4]] == FIRST_TOKENS
        assert lengths == [3 + i + 1 for i in range(n)]  # running total, prompt included
    finally:
        await client.close()


async def test_non_streaming_returns_prompt_and_generation(synthetic: tuple[EmbeddedTriton, Any]) -> None:
    server, _ = synthetic
    client = grpc_aio.InferenceServerClient(server.grpc_url)
    try:
        results = [r async for r in client.stream_infer(_one(_payload([7, 8], 4, streaming=False)))]
        assert len(results) == 1 and results[0][1] is None
        assert results[0][0].as_numpy("output_ids").reshape(-1).tolist() == [7, 8, *FIRST_TOKENS]
    finally:
        await client.close()


async def test_bad_request_gets_an_error_response(synthetic: tuple[EmbeddedTriton, Any]) -> None:
    server, _ = synthetic
    client = grpc_aio.InferenceServerClient(server.grpc_url)
    try:
        results = [r async for r in client.stream_infer(_one(_payload([1], 10**7)))]
        assert len(results) == 1 and results[0][1] is not None
        assert "exceeds the maximum sequence length" in str(results[0][1])
    finally:
        await client.close()


async def test_cancel_stops_generation(synthetic: tuple[EmbeddedTriton, Any]) -> None:
    server, stats_path = synthetic
    client = grpc_aio.InferenceServerClient(server.grpc_url)
    try:
        before = json.loads(stats_path.read_text())["cancelled"]
        # A paced request (10 ms/token, 100k tokens) would run for ~17 minutes if cancel failed.
        payload = {**_payload([1, 2, 3], 100_000), "parameters": {"delay_ms": 10}}
        stream = client.stream_infer(_one(payload))
        got = 0
        async for _result, error in stream:
            assert error is None, error
            got += 1
            if got == 5:
                stream.cancel()
                break
        deadline = time.monotonic() + 5
        while True:
            stats = json.loads(stats_path.read_text())
            if stats["cancelled"] > before:
                break
            assert time.monotonic() < deadline, f"model did not stop the cancelled request: {stats}"
            await asyncio.sleep(0.05)
        assert stats["active"] == 0
    finally:
        await client.close()


# --- the gateway's own RPCs (openai_api.triton.rpc): pooled streams against the real server ---------------


def _rpc_request(prompt: list[int], output_len: int, delay_ms: int = 0) -> Any:
    from openai_api.triton.wire import InferRequest

    r = InferRequest(MODEL)
    r.tensor("input_ids", "INT32", [1, len(prompt)], prompt)
    r.tensor("input_lengths", "INT32", [1, 1], [len(prompt)])
    r.tensor("request_output_len", "INT32", [1, 1], [output_len])
    r.tensor("streaming", "BOOL", [1, 1], [True])
    r.output("output_ids")
    if delay_ms:
        r.pb.parameters["delay_ms"].int64_param = delay_ms
    return r


async def _cancelled_count_rises(stats_path: Any, before: int) -> None:
    deadline = time.monotonic() + 5
    while json.loads(stats_path.read_text())["cancelled"] <= before:
        assert time.monotonic() < deadline, "the model did not see the request cancelled"
        await asyncio.sleep(0.05)


async def test_a_stream_is_reused_only_after_its_final_response(synthetic: tuple[EmbeddedTriton, Any]) -> None:
    import grpc

    from openai_api.triton.rpc import TritonRPC

    server, stats_path = synthetic
    rpc = TritonRPC(grpc.aio.insecure_channel(server.grpc_url))
    try:
        first = [r async for r in rpc.stream(_rpc_request([1, 2, 3], 7), model=MODEL, timeout_s=30)]
        assert len(first) == 7
        assert first[-1].get_response().parameters["triton_final_response"].bool_param
        assert len(rpc._idle) == 1
        pooled = rpc._idle[0]
        second = [r async for r in rpc.stream(_rpc_request([4, 5], 3), model=MODEL, timeout_s=30)]
        assert len(second) == 3 and rpc._idle == [pooled]  # the same stream carried the second request

        # Closed early (the client left): the stream is cancelled, so the model stops, and not reused.
        before = json.loads(stats_path.read_text())["cancelled"]
        stream = rpc.stream(_rpc_request([1], 100_000, delay_ms=10), model=MODEL, timeout_s=30)
        for _ in range(3):
            await anext(stream)
        await stream.aclose()
        await _cancelled_count_rises(stats_path, before)
        assert rpc._idle == []

        # An error response ends the request (a GatewayError naming the model, Triton's text only logged);
        # its stream is not reused either.
        with pytest.raises(BackendError) as e:
            [r async for r in rpc.stream(_rpc_request([1], 10**7), model=MODEL, timeout_s=30)]
        assert MODEL in e.value.message and rpc._idle == []
    finally:
        await rpc.close()


async def test_a_request_past_its_deadline_is_cancelled_in_triton(synthetic: tuple[EmbeddedTriton, Any]) -> None:
    import grpc

    from openai_api.triton.rpc import TritonRPC

    server, stats_path = synthetic
    rpc = TritonRPC(grpc.aio.insecure_channel(server.grpc_url))
    try:
        [r async for r in rpc.stream(_rpc_request([1], 2), model=MODEL, timeout_s=30)]  # leaves a pooled stream
        before = json.loads(stats_path.read_text())["cancelled"]
        got = 0
        t0 = time.monotonic()
        with pytest.raises(BackendTimeoutError) as e:
            async for _ in rpc.stream(_rpc_request([1], 1000, delay_ms=50), model=MODEL, timeout_s=0.4):
                got += 1
        assert e.value.code == "timeout"
        assert 0.3 < time.monotonic() - t0 < 3 and 0 < got < 20
        await _cancelled_count_rises(stats_path, before)
        assert rpc._idle == []
    finally:
        await rpc.close()
