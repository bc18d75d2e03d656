"""Embeddings through the gateway and the real Triton MiniLM model, with the official client."""

from __future__ import annotations

import base64
from collections.abc import Callable

import httpx
import numpy as np
import openai
import pytest

from tests.e2e.conftest import API_KEY, LLM, GatewayServer

EMB = "all-minilm-l6-v2"


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def cos(a: list[float] | np.ndarray, b: list[float] | np.ndarray) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_default_base64_and_float_decode_to_the_same_unit_vectors(client: openai.OpenAI, http: httpx.Client) -> None:
    texts = ["The cat sits on the mat.", "A feline is resting on a rug."]
    default = client.embeddings.create(model=EMB, input=texts)  # the client asks for base64 when numpy is present
    floats = client.embeddings.create(model=EMB, input=texts, encoding_format="float")
    raw = http.post("/v1/embeddings", json={"model": EMB, "input": texts, "encoding_format": "base64"}).json()
    for i in range(2):
        a = np.asarray(default.data[i].embedding, dtype=np.float32)
        b = np.asarray(floats.data[i].embedding, dtype=np.float32)
        c = np.frombuffer(base64.b64decode(raw["data"][i]["embedding"]), dtype="<f4")
        assert a.shape == (384,)
        np.testing.assert_allclose(a, b, atol=1e-6)
        np.testing.assert_array_equal(a, c)
        assert abs(np.linalg.norm(b) - 1) < 1e-5
    assert floats.usage.prompt_tokens > 0


def test_schema(http: httpx.Client, openai_schema: Callable[..., None]) -> None:
    r = http.post("/v1/embeddings", json={"model": EMB, "input": "hello", "encoding_format": "float"})
    assert r.status_code == 200
    openai_schema("CreateEmbeddingResponse", r.json())


def test_paraphrase_is_closer_than_unrelated(client: openai.OpenAI) -> None:
    texts = ["How do I reset my password?", "I forgot my password, how can I change it?",
             "The weather in Lisbon is sunny today."]
    v = [d.embedding for d in client.embeddings.create(model=EMB, input=texts, encoding_format="float").data]
    assert cos(v[0], v[1]) > cos(v[0], v[2]) + 0.3


def test_same_vector_alone_and_inside_a_batch_of_50(client: openai.OpenAI) -> None:
    texts = [f"Sentence number {i} talks about {'apples' if i % 2 else 'the ocean and its many waves'}."
             for i in range(50)]
    batch = client.embeddings.create(model=EMB, input=texts, encoding_format="float").data
    assert [d.index for d in batch] == list(range(50))
    for i in (0, 17, 49):
        alone = client.embeddings.create(model=EMB, input=texts[i], encoding_format="float").data[0].embedding
        np.testing.assert_allclose(alone, batch[i].embedding, atol=1e-5)


def test_dimensions_truncates_and_renormalises(client: openai.OpenAI) -> None:
    full = client.embeddings.create(model=EMB, input="dimension test", encoding_format="float").data[0].embedding
    r = client.embeddings.create(model=EMB, input="dimension test", dimensions=64, encoding_format="float")
    v = np.asarray(r.data[0].embedding)
    assert v.shape == (64,) and abs(np.linalg.norm(v) - 1) < 1e-5
    np.testing.assert_allclose(v, np.asarray(full[:64]) / np.linalg.norm(full[:64]), atol=1e-5)


def test_token_ids_are_read_as_openai_cl100k_ids_by_default(client: openai.OpenAI) -> None:
    # OpenAI's API defines token arrays in OpenAI's tokenizer (LangChain's default sends them): the model's
    # default token_ids: cl100k_base decodes them to their text. [9906, 1917] is "Hello world" in cl100k_base
    # (OpenAI's tokenizer documentation); tests/e2e/test_retrieval_embeddings.py goes through LangChain.
    text = client.embeddings.create(model=EMB, input="Hello world", encoding_format="float").data[0].embedding
    for ids in ([9906, 1917], [[9906, 1917]]):
        got = client.embeddings.create(model=EMB, input=ids, encoding_format="float").data[0].embedding
        np.testing.assert_allclose(got, text, atol=1e-5)


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"input": ""}, 400, "input"),
    ({"input": []}, 400, "input"),
    ({"input": ["ok", ""]}, 400, "input"),
    ({"input": [[]]}, 400, "input"),
    ({"input": [[1, 2], "mixed"]}, 400, "input"),
    ({"input": "x", "dimensions": 1000}, 400, "dimensions"),
    ({"input": "x", "dimensions": 0}, 400, "dimensions"),
    ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ({"input": "word " * 400}, 400, "input"),
    ({"input": [[10**9]]}, 400, "input"),
    ({}, 400, "input"),
    ({"input": "x", "model": "nope"}, 404, "model"),
    ({"input": "x", "model": LLM}, 400, "model"),
    ({"input": "x", "model": "minilm-rerank"}, 400, "model"),
])
def test_bad_inputs_get_clear_errors(http: httpx.Client, openai_schema: Callable[..., None], body: dict, status: int,
                                     param: str) -> None:
    r = http.post("/v1/embeddings", json={"model": EMB, **body})
    assert r.status_code == status, r.text
    openai_schema("ErrorResponse", r.json())
    assert r.json()["error"]["param"] == param


def test_over_long_input_error_names_the_index(http: httpx.Client) -> None:
    r = http.post("/v1/embeddings", json={"model": EMB, "input": ["short", "word " * 400]})
    assert r.status_code == 400 and "input[1]" in r.json()["error"]["message"]
