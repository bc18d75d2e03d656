"""EncoderAdapter over HTTP: what it asks of Triton besides the tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from openai_api.triton.encoder import EncoderAdapter


class RecordingHTTPClient:
    def __init__(self) -> None:
        self.headers: list[dict[str, str] | None] = []

    async def get_model_config(self, model: str, version: str) -> dict[str, Any]:
        return {
            "max_batch_size": 64,
            "input": [{"name": "input_ids", "data_type": "TYPE_INT64"},
                      {"name": "attention_mask", "data_type": "TYPE_INT64"}],
            "output": [{"name": "last_hidden_state"}],
        }

    async def infer(self, model: str, inputs: list[Any], *, model_version: str, outputs: list[Any],
                    headers: dict[str, str] | None = None) -> Any:
        self.headers.append(None if headers is None else dict(headers))
        if headers is not None:
            headers["Inference-Header-Content-Length"] = "1"  # tritonclient writes into the dict it gets

        class Result:
            def as_numpy(self, name: str) -> np.ndarray:
                return np.zeros((1, 2, 4), dtype=np.float32)

        return Result()


class Pool:
    def __init__(self) -> None:
        self.client = RecordingHTTPClient()

    def http(self, url: str) -> RecordingHTTPClient:
        return self.client


async def test_http_responses_are_not_compressed() -> None:
    # Triton deflates responses when asked (aiohttp asks by default): ~33 ms of CPU per 1.5 MB of
    # hidden states, for floats that barely compress.
    pool = Pool()
    adapter = EncoderAdapter(pool, transport="http", url="x", model="m", triton_model="m", version="",  # type: ignore[arg-type]
                             input_config={"input_ids": "input_ids", "attention_mask": "attention_mask"},
                             input_dtype="INT64", output_name="last_hidden_state", timeout_s=5.0)
    features = {"input_ids": np.ones((1, 2), np.int64), "attention_mask": np.ones((1, 2), np.int64)}
    for _ in range(2):
        out = await adapter.infer(features)
        assert out.shape == (1, 2, 4)
    assert pool.client.headers == [{"Accept-Encoding": "identity"}] * 2
