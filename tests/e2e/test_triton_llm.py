"""End-to-end checks of the SmolLM2 reference LLM (TensorRT-LLM tensor interface) on a real tritonserver.

Uses the session's ``EmbeddedTriton`` (tests/e2e/conftest.py; it serves the model) and talks to it with
``tritonclient.grpc.aio`` the way any client would, and the gateway's own RPCs do: one request per
``ModelStreamInfer`` stream, half-closed after it, and the end of the stream means the request is done.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc.aio as grpc_aio
from tokenizers import Tokenizer
from tritonclient.grpc import InferInput

from openai_api.embedded.launcher import EmbeddedTriton
from tests.helpers import PREPARED_MODELS as MODELS_DIR

MODEL = "smollm2-135m-instruct"
EOS = 2  # <|im_end|>
TIMEOUT_S = 120.0
PARIS_PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
POEM_PROMPT = "<|im_start|>user\nWrite a short poem about the sea.<|im_end|>\n<|im_start|>assistant\n"

_NP = {"INT32": np.int32, "FP32": np.float32, "BOOL": np.bool_, "UINT64": np.uint64}


@dataclass
class Result:
    """What one streamed request produced."""

    chunks: list[list[int]] = field(default_factory=list)
    finals: list[bool] = field(default_factory=list)
    seq_lens: list[int] = field(default_factory=list)
    log_probs: list[list[float]] = field(default_factory=list)
    cum_log_probs: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return [t for chunk in self.chunks for t in chunk]


@pytest.fixture(scope="module")
def stats_dir(ref_stats_dir: Path) -> Path:
    """The session Triton's reference-model counters (tests compare before/after, never absolutes)."""
    return ref_stats_dir


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(MODELS_DIR / MODEL / "tokenizer.json"))


@pytest.fixture
async def client(triton: EmbeddedTriton) -> AsyncIterator[grpc_aio.InferenceServerClient]:
    c = grpc_aio.InferenceServerClient(triton.grpc_url)
    yield c
    await c.close()


def _input(name: str, value: Any, dtype: str) -> InferInput:
    arr = np.asarray(value, dtype=_NP[dtype])
    tensor = InferInput(name, list(arr.shape), dtype)
    tensor.set_data_from_numpy(arr)
    return tensor


def words_list(words: list[list[int]]) -> np.ndarray:
    """TensorRT-LLM words list with the batch dim: [1, 2, N] (ids, cumulative end offsets)."""
    ids = [t for w in words for t in w]
    offsets = list(np.cumsum([len(w) for w in words]))
    return np.array([[ids, offsets + [-1] * (len(ids) - len(offsets))]], dtype=np.int32)


def build_request(
    prompt_ids: list[int],
    max_tokens: int,
    *,
    streaming: bool = True,
    end_id: int = EOS,
    temperature: float | None = 0.0,
    **extra: tuple[Any, str],
) -> dict[str, Any]:
    inputs = [
        _input("input_ids", [prompt_ids], "INT32"),
        _input("input_lengths", [[len(prompt_ids)]], "INT32"),
        _input("request_output_len", [[max_tokens]], "INT32"),
        _input("end_id", [[end_id]], "INT32"),
        _input("pad_id", [[EOS]], "INT32"),
        _input("streaming", [[streaming]], "BOOL"),
    ]
    if temperature is not None:
        inputs.append(_input("temperature", [[temperature]], "FP32"))
    for name, (value, dtype) in extra.items():
        arr = value if isinstance(value, np.ndarray) else [[value]]
        inputs.append(_input(name, arr, dtype))
    return {"model_name": MODEL, "inputs": inputs}


async def _one(request: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    yield request


async def collect(
    client: grpc_aio.InferenceServerClient, request: dict[str, Any], cancel_after: int | None = None
) -> Result:
    result = Result()

    async def consume() -> None:
        stream = client.stream_infer(_one(request))
        async for res, err in stream:
            result.times.append(time.monotonic())
            if err is not None:
                result.errors.append(str(err))
                continue
            result.chunks.append(res.as_numpy("output_ids").reshape(-1).tolist())
            assert res.as_numpy("output_ids").ndim == 3
            result.finals.append(res.get_response().parameters["triton_final_response"].bool_param)
            result.seq_lens.append(int(res.as_numpy("sequence_length").reshape(-1)[0]))
            result.log_probs.append(res.as_numpy("output_log_probs").reshape(-1).tolist())
            result.cum_log_probs.append(float(res.as_numpy("cum_log_probs").reshape(-1)[0]))
            if cancel_after is not None and len(result.chunks) >= cancel_after:
                stream.cancel()
                return

    await asyncio.wait_for(consume(), TIMEOUT_S)
    return result


def encode(tokenizer: Tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False).ids


async def test_streaming_one_token_per_response(client: grpc_aio.InferenceServerClient, tokenizer: Tokenizer) -> None:
    prompt = encode(tokenizer, PARIS_PROMPT)
    res = await collect(client, build_request(prompt, 40))
    assert not res.errors
    assert all(len(chunk) == 1 for chunk in res.chunks[:-1])
    assert res.finals[-1] and not any(res.finals[:-1])
    # Generation ended on end_id (not emitted): the FINAL response carries no token.
    assert res.chunks[-1] == [] and EOS not in res.tokens
    assert res.seq_lens[-2] == len(prompt) + len(res.tokens)
    text = tokenizer.decode(res.tokens)
    assert "Paris" in text, text


async def test_non_streaming_includes_prompt(client: grpc_aio.InferenceServerClient, tokenizer: Tokenizer) -> None:
    prompt = encode(tokenizer, PARIS_PROMPT)
    streamed = await collect(client, build_request(prompt, 40))
    full = await collect(client, build_request(prompt, 40, streaming=False))
    assert not full.errors and len(full.chunks) == 1 and full.finals == [True]
    assert full.chunks[0] == prompt + streamed.tokens
    assert full.seq_lens == [len(prompt) + len(streamed.tokens)]
    only = await collect(client, build_request(prompt, 40, streaming=False, exclude_input_in_output=(True, "BOOL")))
    assert only.chunks == [streamed.tokens]


async def test_request_output_len(client: grpc_aio.InferenceServerClient, tokenizer: Tokenizer) -> None:
    prompt = encode(tokenizer, POEM_PROMPT)
    res = await collect(client, build_request(prompt, 5, end_id=-1))
    assert res.chunks == [[t] for t in res.tokens] and len(res.tokens) == 5
    assert res.finals == [False] * 4 + [True]
    zero = await collect(client, build_request(prompt, 0))
    assert zero.chunks == [[]] and zero.finals == [True]


async def test_end_id_and_stop_words(client: grpc_aio.InferenceServerClient, tokenizer: Tokenizer) -> None:
    prompt = encode(tokenizer, PARIS_PROMPT)
    full = build_request(prompt, 40, streaming=False, exclude_input_in_output=(True, "BOOL"))
    ref = (await collect(client, full)).tokens
    assert len(ref) >= 5
    stopped = await collect(client, build_request(prompt, 40, end_id=ref[3]))
    assert stopped.tokens == ref[:3]
    stop = words_list([[49151, 49151], [ref[2], ref[3]]])
    res = await collect(client, build_request(prompt, 40, stop_words_list=(stop, "INT32")))
    assert res.tokens == ref[:4], "stop tokens are part of the output, as with TensorRT-LLM"
    assert res.finals[-1] and res.chunks[-1] == [ref[3]]


async def test_bad_words_and_min_tokens(client: grpc_aio.InferenceServerClient, tokenizer: Tokenizer) -> None:
    prompt = encode(tokenizer, PARIS_PROMPT)
    ref = (await collect(client, build_request(prompt, 40))).tokens
    res = await collect(client, build_request(prompt, 40, bad_words_list=(words_list([[ref[0]]]), "INT32")))
    assert res.tokens and res.tokens[0] != ref[0]
    longer = await collect(client, build_request(prompt, len(ref) + 3, min_tokens=(len(ref) + 3, "INT32")))
    assert len(longer.tokens) == len(ref) + 3 and EOS not in longer.tokens


async def test_sampling_seed_and_greedy(client: grpc_aio.InferenceServerClient, tokenizer: Tokenizer) -> None:
    prompt = encode(tokenizer, POEM_PROMPT)

    def sampled(seed: int) -> dict[str, Any]:
        return build_request(prompt, 20, end_id=-1, temperature=1.0, seed=(seed, "UINT64"))

    a, b, c = [await collect(client, sampled(s)) for s in (1234, 1234, 999)]
    assert a.tokens == b.tokens and len(a.tokens) == 20
    assert a.tokens != c.tokens
    g1, g2 = [await collect(client, build_request(prompt, 20, end_id=-1, temperature=0.0)) for _ in range(2)]
    assert g1.tokens == g2.tokens
    k1 = await collect(client, build_request(prompt, 20, end_id=-1, temperature=1.0, runtime_top_k=(1, "INT32")))
    assert k1.tokens == g1.tokens, "runtime_top_k == 1 is greedy"


async def test_log_probs(client: grpc_aio.InferenceServerClient, tokenizer: Tokenizer) -> None:
    prompt = encode(tokenizer, PARIS_PROMPT)
    res = await collect(client, build_request(prompt, 8, end_id=-1, return_log_probs=(True, "BOOL")))
    lps = [lp for chunk in res.log_probs for lp in chunk]
    assert len(lps) == 8 and all(lp <= 0 for lp in lps)
    assert res.cum_log_probs[-1] == pytest.approx(sum(lps), abs=1e-3)


async def test_three_concurrent_streams(client: grpc_aio.InferenceServerClient, tokenizer: Tokenizer) -> None:
    prompts = [encode(tokenizer, p) for p in (PARIS_PROMPT, POEM_PROMPT, "Once upon a time")]
    t0 = time.monotonic()
    results = await asyncio.gather(*[collect(client, build_request(p, 30, end_id=-1)) for p in prompts])
    elapsed = time.monotonic() - t0
    for res in results:
        assert not res.errors and len(res.tokens) == 30 and res.finals[-1]
    # Round-robin decoding: every stream gets its first token before any stream finishes.
    assert max(r.times[0] for r in results) < min(r.times[-1] for r in results)
    print(f"3 concurrent streams: {90 / elapsed:.1f} tokens/s aggregate")


def _stats(stats_dir: Path) -> dict[str, int]:
    try:
        return json.loads((stats_dir / f"{MODEL}.json").read_text())
    except (OSError, ValueError):
        return {}


async def test_cancel_reaches_model(
    client: grpc_aio.InferenceServerClient, tokenizer: Tokenizer, stats_dir: Path
) -> None:
    before = _stats(stats_dir).get("cancelled", 0)
    prompt = encode(tokenizer, POEM_PROMPT)
    res = await collect(client, build_request(prompt, 2000, end_id=-1), cancel_after=3)
    assert len(res.tokens) == 3
    cancelled_at = time.monotonic()
    while time.monotonic() - cancelled_at < 3.0:
        if _stats(stats_dir).get("cancelled", 0) == before + 1:
            break
        await asyncio.sleep(0.02)
    assert _stats(stats_dir).get("cancelled", 0) == before + 1
    print(f"model noticed the cancel after {time.monotonic() - cancelled_at:.3f} s")
    # The model keeps serving after a cancel.
    again = await collect(client, build_request(prompt, 3, end_id=-1))
    assert len(again.tokens) == 3


async def test_bad_requests_error_not_hang(client: grpc_aio.InferenceServerClient, tokenizer: Tokenizer) -> None:
    prompt = encode(tokenizer, PARIS_PROMPT)
    # A consistent batch of two reaches the model, which rejects it.
    batch2 = {
        "model_name": MODEL,
        "inputs": [
            _input("input_ids", [prompt, prompt], "INT32"),
            _input("input_lengths", [[len(prompt)], [len(prompt)]], "INT32"),
            _input("request_output_len", [[4], [4]], "INT32"),
        ],
    }
    res = await collect(client, batch2)
    assert res.errors and "batch size" in res.errors[0] and not res.chunks
    # A mismatched batch is rejected by Triton itself.
    mixed = build_request(prompt, 4)
    mixed["inputs"][0] = _input("input_ids", [prompt, prompt], "INT32")
    res = await collect(client, mixed)
    assert res.errors and not res.chunks
    too_long = await collect(client, build_request(prompt, 100_000))
    assert too_long.errors and "maximum sequence length" in too_long.errors[0]
    ok = await collect(client, build_request(prompt, 2, end_id=-1))
    assert len(ok.tokens) == 2
