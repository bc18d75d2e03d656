"""The embeddings dialects through the clients that speak them, against the real Triton MiniLM model:
NVIDIA NIM's retrieval fields (LangChain's NVIDIAEmbeddings), TEI's `/embed` (huggingface_hub's
InferenceClient), and token-id input, which LangChain's OpenAIEmbeddings sends by default in OpenAI's
cl100k vocabulary: decoded back to the text (the default), or the model's own ids where its config says so."""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.text.tokenizer import TextTokenizer
from tests.e2e.conftest import API_KEY, GatewayServer, gateway_config
from tests.helpers import MODELS

EMB = "all-minilm-l6-v2"
QUERY, PASSAGE = "query: ", "passage: "
# A text of ~600 distinct word pieces, well past the model's 256 tokens.
LONG = " ".join(f"topic{i} is about {['rivers', 'engines', 'violins', 'orbits'][i % 4]}" for i in range(150))


@pytest.fixture(scope="module")
def retrieval_gateway(triton: EmbeddedTriton) -> Iterator[GatewayServer]:
    """The same Triton, with the MiniLM entry configured as an e5-style retrieval model that takes its own ids."""
    config = gateway_config(triton)
    emb = config.embedding[0]
    emb.query_prefix, emb.passage_prefix, emb.accept_token_ids = QUERY, PASSAGE, True
    server = GatewayServer(config, [API_KEY]).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tok() -> TextTokenizer:
    return TextTokenizer.from_folder(MODELS / EMB)


def embed(url: str, **body: object) -> np.ndarray:
    r = httpx.post(f"{url}/v1/embeddings", json={"model": EMB, "encoding_format": "float", **body},
                   headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60)
    assert r.status_code == 200, r.text
    return np.asarray([d["embedding"] for d in r.json()["data"]], dtype=np.float32)


# --- NIM: input_type, prefixes, truncate ---------------------------------------------------------------------


def test_nvidia_embeddings_prepend_the_configured_prefixes(retrieval_gateway: GatewayServer) -> None:
    from langchain_nvidia_ai_endpoints import NVIDIAEmbeddings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "model unknown" to the client's own table: expected for a local model
        client = NVIDIAEmbeddings(model=EMB, base_url=f"{retrieval_gateway.url}/v1", api_key=API_KEY,
                                  usage_telemetry_enabled=False)
    query = np.asarray(client.embed_query("How do rivers form?"), dtype=np.float32)
    docs = np.asarray(client.embed_documents(["Rivers form where rain collects.", "Violins have four strings."]),
                      dtype=np.float32)
    url = retrieval_gateway.url
    np.testing.assert_allclose(query, embed(url, input=QUERY + "How do rivers form?")[0], atol=1e-5)
    np.testing.assert_allclose(docs, embed(url, input=[PASSAGE + "Rivers form where rain collects.",
                                                       PASSAGE + "Violins have four strings."]), atol=1e-5)
    assert not np.allclose(query, embed(url, input="How do rivers form?")[0], atol=1e-3)  # the prefix mattered
    assert float(query @ docs[0]) > float(query @ docs[1])


def test_input_type_as_a_model_name_suffix(retrieval_gateway: GatewayServer) -> None:
    url = retrieval_gateway.url
    np.testing.assert_allclose(embed(url, model=f"{EMB}-query", input="rivers"),
                               embed(url, input="rivers", input_type="query"), atol=1e-6)
    np.testing.assert_allclose(embed(url, model=f"{EMB}-passage", input="rivers"),
                               embed(url, input=PASSAGE + "rivers"), atol=1e-5)
    r = httpx.post(f"{url}/v1/embeddings", json={"model": f"{EMB}-query", "input": "x", "input_type": "passage"},
                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_type"


def test_without_prefixes_input_type_changes_nothing(gateway: GatewayServer) -> None:
    np.testing.assert_allclose(embed(gateway.url, input="rivers", input_type="query"),
                               embed(gateway.url, input="rivers"), atol=1e-6)


def test_truncate_end_keeps_the_start_and_start_keeps_the_end(retrieval_gateway: GatewayServer,
                                                            tok: TextTokenizer) -> None:
    url = retrieval_gateway.url
    ids = tok.encode(LONG)
    room = 256 - 2  # [CLS] ... [SEP]
    assert len(ids) > 2 * room
    np.testing.assert_allclose(embed(url, input=LONG, truncate="END"), embed(url, input=[ids[:room]]), atol=1e-5)
    np.testing.assert_allclose(embed(url, input=LONG, truncate="START"), embed(url, input=[ids[-room:]]), atol=1e-5)
    # With an instruction, truncating the start keeps the instruction and the end of the text.
    head = tok.encode(QUERY)
    np.testing.assert_allclose(embed(url, input=LONG, truncate="START", input_type="query"),
                               embed(url, input=[head + ids[-(room - len(head)):]]), atol=1e-5)
    for truncate in ("NONE", None):  # unset: the model's config (truncate: false)
        r = httpx.post(f"{url}/v1/embeddings", json={"model": EMB, "input": ["ok", LONG], "truncate": truncate},
                       headers={"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        assert "input[1]" in r.json()["error"]["message"]


def test_nvidia_embeddings_truncate_end_through_the_client(gateway: GatewayServer) -> None:
    from langchain_nvidia_ai_endpoints import NVIDIAEmbeddings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = NVIDIAEmbeddings(model=EMB, base_url=f"{gateway.url}/v1", api_key=API_KEY, truncate="END",
                                  usage_telemetry_enabled=False)
        strict = NVIDIAEmbeddings(model=EMB, base_url=f"{gateway.url}/v1", api_key=API_KEY,
                                  usage_telemetry_enabled=False)
    v = np.asarray(client.embed_query(LONG), dtype=np.float32)
    np.testing.assert_allclose(v, embed(gateway.url, input=LONG, truncate="END")[0], atol=1e-5)
    with pytest.raises(Exception, match=r"context_length_exceeded|maximum"):
        strict.embed_query(LONG)  # NIM's default NONE: an over-long input is an error, never cut silently


# --- token ids: LangChain's OpenAIEmbeddings ------------------------------------------------------------------


@pytest.fixture
def cl100k(monkeypatch: pytest.MonkeyPatch) -> None:
    """tiktoken's cl100k_base, offline: litellm ships the file tiktoken would download."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("litellm (which ships tiktoken's cl100k_base file) is not installed")
    folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    if not folder.is_dir():
        pytest.skip(f"no bundled tiktoken files in {folder}")
    monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(folder))


def _cosines(a: Any, b: Any) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.sum(a * b, axis=-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def test_langchain_openai_embeddings_default_equals_the_texts_own_vectors(gateway: GatewayServer,
                                                                          cl100k: None) -> None:
    # Issue #20: OpenAIEmbeddings() sends OpenAI's cl100k_base token ids (check_embedding_ctx_length on);
    # the model config's default token_ids: cl100k_base decodes them back to the text, so the vectors
    # equal those of the same texts sent as strings.
    from langchain_openai import OpenAIEmbeddings

    default = OpenAIEmbeddings(model=EMB, base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0)
    texts = ["How do rivers form?", "Ünïcödé and emoji 🚀 survive the round trip.", "Violins have four strings."]
    assert (_cosines(default.embed_documents(texts), embed(gateway.url, input=texts)) > 0.9999).all()
    assert _cosines(default.embed_query(texts[0]), embed(gateway.url, input=texts[0])[0]) > 0.9999
    # A text longer than the model's window: sent as one chunk (LangChain chunks at 8,191 cl100k tokens),
    # it is over-long exactly as the string is.
    with pytest.raises(openai.BadRequestError) as e:
        default.embed_query(LONG)
    assert e.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    r = httpx.post(f"{gateway.url}/v1/embeddings", json={"model": EMB, "input": LONG},
                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_langchain_chunks_a_long_text_by_cl100k_tokens_and_averages_the_same_vectors(gateway: GatewayServer,
                                                                                     cl100k: None) -> None:
    # With LangChain's own chunk size under the model's window, LangChain splits LONG into cl100k chunks
    # and averages their vectors weighted by chunk length. The oracle does the same from string inputs:
    # each chunk's decoded text embedded as a string.
    import tiktoken
    from langchain_openai import OpenAIEmbeddings

    size = 100
    chunked = OpenAIEmbeddings(model=EMB, base_url=f"{gateway.url}/v1", api_key=API_KEY, max_retries=0,
                               embedding_ctx_length=size)
    got = chunked.embed_query(LONG)
    enc = tiktoken.get_encoding("cl100k_base")
    tokens = enc.encode_ordinary(LONG)
    chunks = [tokens[j:j + size] for j in range(0, len(tokens), size)]
    assert len(chunks) > 2
    vectors = embed(gateway.url, input=[enc.decode(c) for c in chunks])
    want = np.average(vectors, axis=0, weights=[len(c) for c in chunks])
    assert _cosines(got, want / np.linalg.norm(want)) > 0.9999


def test_ids_outside_cl100k_are_a_400(http: httpx.Client) -> None:
    for ids in ([[100261]], [[9906, 100256]], [100300]):
        r = http.post("/v1/embeddings", json={"model": EMB, "input": ids})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "input" and "cl100k_base" in r.json()["error"]["message"]


def test_own_token_ids_are_taken_where_the_config_says_so(retrieval_gateway: GatewayServer,
                                                         tok: TextTokenizer) -> None:
    text = "Token ids and text should agree."
    ids = tok.encode(text)  # without [CLS]/[SEP]: the gateway adds them
    url = retrieval_gateway.url
    np.testing.assert_allclose(embed(url, input=[ids]), embed(url, input=text), atol=1e-5)
    np.testing.assert_allclose(embed(url, input=ids), embed(url, input=text), atol=1e-5)
    r = httpx.post(f"{url}/v1/embeddings", json={"model": EMB, "input": [[10**9]]},
                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400 and "vocabulary" in r.json()["error"]["message"]


# --- TEI /embed: huggingface_hub's InferenceClient ---------------------------------------------------------------


def test_tei_embed_through_huggingface_hub(gateway: GatewayServer) -> None:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=f"{gateway.url}/embed", api_key=API_KEY, timeout=60)
    one = client.feature_extraction("How do rivers form?")
    assert one.shape == (1, 384)
    np.testing.assert_allclose(one[0], embed(gateway.url, input="How do rivers form?")[0], atol=1e-5)
    raw = client.feature_extraction("How do rivers form?", normalize=False)
    assert abs(np.linalg.norm(raw[0]) - 1) > 1e-3
    np.testing.assert_allclose(raw[0] / np.linalg.norm(raw[0]), one[0], atol=1e-5)
    left = client.feature_extraction(LONG, truncate=True, truncation_direction="left")
    right = client.feature_extraction(LONG, truncate=True, truncation_direction="right")
    np.testing.assert_allclose(left[0], embed(gateway.url, input=LONG, truncate="START")[0], atol=1e-5)
    np.testing.assert_allclose(right[0], embed(gateway.url, input=LONG, truncate="END")[0], atol=1e-5)


def test_tei_embed_json_shape_and_errors(http: httpx.Client) -> None:
    r = http.post("/embed", json={"inputs": ["first", "second"]})
    assert r.status_code == 200, r.text
    vectors = r.json()
    assert isinstance(vectors, list) and len(vectors) == 2 and len(vectors[0]) == 384
    r = http.post("/embed", json={"inputs": LONG, "truncate": False})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    for body, param in (({"inputs": []}, "inputs"), ({"inputs": [""]}, "inputs"),
                        ({"inputs": "x", "truncation_direction": "up"}, "truncation_direction"),
                        ({"inputs": "x", "model": "minilm-rerank"}, "model"),
                        ({"inputs": "x", "model": "no"}, "model")):
        r = http.post("/embed", json=body)
        assert r.status_code in (400, 404), r.text
        assert set(r.json()["error"]) == {"message", "type", "param", "code"} and r.json()["error"]["param"] == param
