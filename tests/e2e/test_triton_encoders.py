"""End-to-end checks of the encoder reference models against a real tritonserver.

Uses the session's Triton (tests/e2e/conftest.py, which serves ``all-minilm-l6-v2`` and ``minilm-rerank``) and talks to
it with ``tritonclient`` over HTTP and gRPC, feeding ids from the model's own ``tokenizer.json``.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as tritonclient_grpc
import tritonclient.http as tritonclient_http
from tokenizers import Tokenizer
from tritonclient.utils import InferenceServerException

from openai_api.embedded.launcher import EmbeddedTriton
from tests.helpers import PREPARED_MODELS as MODELS_DIR
from tests.helpers import requires_models

logger = logging.getLogger(__name__)

TOKENIZER_PATH = MODELS_DIR / "all-minilm-l6-v2" / "tokenizer.json"
EMBED = "all-minilm-l6-v2"
RERANK = "minilm-rerank"
HIDDEN = 384
TIMEOUT_S = 60.0

QUERY = "What principles does the management of finished oil circulation in Jiangsu Province follow?"
ARTICLES = {
    "1": (
        "Article 1 In order to strengthen the management of finished oil circulation, standardize "
        "finished oil business operations, maintain market order for finished oil, protect the "
        "legitimate rights and interests of finished oil operators and consumers, according to "
        "relevant laws, regulations, and State Council decisions, combined with the actual "
        "conditions of this province, this law is formulated."
    ),
    "12": (
        "Article 12 The market supervision and administration department shall push the information"
        " of enterprises with new registered business scopes involving finished oil wholesale and "
        "storage through the government shared platform to the commerce department. The commerce "
        "department shall promptly push information found during industry regulation that is not "
        "within its regulatory responsibilities to the competent authorities concerned."
    ),
    "3": (
        "Article 3 The management of finished oil circulation follows the principles of legal "
        "management, ensuring supply, safe development, and fair competition."
    ),
    "7": (
        "Article 7 The finished oil industry association shall establish and improve industry "
        "operating self-discipline norms, self-regulation conventions, and professional ethics "
        "standards, regulate member behavior, and play a role in rights protection, dispute "
        "resolution, and industry self-regulation."
    ),
}
# MiniLM bi-encoder cosines (sentence-transformers pooling) of QUERY with each article.
EXPECTED_COSINE = {"1": 0.679, "12": 0.420, "3": 0.593, "7": 0.374}

pytestmark = requires_models(EMBED, root=MODELS_DIR)


@pytest.fixture(scope="module")
def http_client(triton: EmbeddedTriton) -> Iterator[object]:
    client = tritonclient_http.InferenceServerClient(triton.http_url, network_timeout=TIMEOUT_S)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(triton: EmbeddedTriton) -> Iterator[object]:
    client = tritonclient_grpc.InferenceServerClient(triton.grpc_url)
    yield client
    client.close()


_tokenizer_lock = threading.Lock()


@functools.cache
def _tokenizer() -> Tokenizer:
    tokenizer = Tokenizer.from_file(str(TOKENIZER_PATH))
    tokenizer.no_truncation()
    # tokenizer.json pads to a fixed 128; a gateway pads to the longest text of the call.
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    return tokenizer


def tokenize(texts: list[str] | list[tuple[str, str]]) -> dict[str, np.ndarray]:
    """Pad-to-longest BERT inputs, as a gateway would send them."""
    with _tokenizer_lock:
        encodings = _tokenizer().encode_batch(texts)
    return {
        "input_ids": np.array([e.ids for e in encodings], dtype=np.int64),
        "attention_mask": np.array([e.attention_mask for e in encodings], dtype=np.int64),
        "token_type_ids": np.array([e.type_ids for e in encodings], dtype=np.int64),
    }


def http_inputs(arrays: dict[str, np.ndarray]) -> list[object]:
    inputs = []
    for name, array in arrays.items():
        tensor = tritonclient_http.InferInput(name, list(array.shape), _triton_dtype(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def grpc_inputs(arrays: dict[str, np.ndarray]) -> list[object]:
    inputs = []
    for name, array in arrays.items():
        tensor = tritonclient_grpc.InferInput(name, list(array.shape), _triton_dtype(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def _triton_dtype(array: np.ndarray) -> str:
    return {np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}[array.dtype]


def embed_grpc(client: object, texts: list[str]) -> np.ndarray:
    result = client.infer(  # type: ignore[attr-defined]
        EMBED,
        grpc_inputs(tokenize(texts)),
        outputs=[tritonclient_grpc.InferRequestedOutput("sentence_embedding")],
        client_timeout=TIMEOUT_S,
    )
    return result.as_numpy("sentence_embedding")


def rerank_logits(client: object, pairs: list[tuple[str, str]], with_token_types: bool = True) -> np.ndarray:
    arrays = tokenize(pairs)
    if not with_token_types:
        del arrays["token_type_ids"]
    result = client.infer(RERANK, grpc_inputs(arrays), client_timeout=TIMEOUT_S)  # type: ignore[attr-defined]
    return result.as_numpy("logits")


def test_model_configs_declare_the_wire_contract(http_client: object) -> None:
    embed = http_client.get_model_config(EMBED)  # type: ignore[attr-defined]
    rerank = http_client.get_model_config(RERANK)  # type: ignore[attr-defined]
    for config in (embed, rerank):
        assert config["max_batch_size"] == 64
        assert {i["name"]: i["data_type"] for i in config["input"]} == {
            "input_ids": "TYPE_INT64",
            "attention_mask": "TYPE_INT64",
            "token_type_ids": "TYPE_INT64",
        }
    assert {o["name"]: (o["data_type"], o["dims"]) for o in embed["output"]} == {
        "last_hidden_state": ("TYPE_FP32", [-1, HIDDEN]),
        "sentence_embedding": ("TYPE_FP32", [HIDDEN]),
    }
    assert [(o["name"], o["data_type"], o["dims"]) for o in rerank["output"]] == [
        ("logits", "TYPE_FP32", [1])
    ]


def test_embeddings_are_normalised_and_match_pooled_hidden_state(http_client: object) -> None:
    arrays = tokenize(["The cat sits on the mat.", "Finished oil circulation is regulated by the province."])
    del arrays["token_type_ids"]  # optional input
    result = http_client.infer(EMBED, http_inputs(arrays))  # type: ignore[attr-defined]
    pooled = result.as_numpy("sentence_embedding")
    hidden = result.as_numpy("last_hidden_state")
    batch, length = arrays["input_ids"].shape
    assert pooled.shape == (batch, HIDDEN) and pooled.dtype == np.float32
    assert hidden.shape == (batch, length, HIDDEN) and hidden.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(pooled, axis=1), 1.0, atol=1e-5)
    mask = arrays["attention_mask"][:, :, None].astype(np.float32)
    mean = (hidden * mask).sum(axis=1) / mask.sum(axis=1)
    mean /= np.linalg.norm(mean, axis=1, keepdims=True)
    np.testing.assert_allclose(mean, pooled, atol=1e-5)
    # Padding positions are zeroed so the tensor does not depend on batch composition.
    assert not hidden[arrays["attention_mask"] == 0].any()


def test_only_requested_output_is_returned(http_client: object) -> None:
    result = http_client.infer(  # type: ignore[attr-defined]
        EMBED,
        http_inputs(tokenize(["just the hidden states"])),
        outputs=[tritonclient_http.InferRequestedOutput("last_hidden_state")],
    )
    names = [o["name"] for o in result.get_response()["outputs"]]
    assert names == ["last_hidden_state"]


def test_paraphrase_is_closer_than_unrelated_text(grpc_client: object) -> None:
    vectors = embed_grpc(
        grpc_client,
        [
            "How do I reset my password?",
            "What are the steps to change my account password?",
            "The recipe needs two cups of flour and an egg.",
        ],
    )
    paraphrase = float(vectors[0] @ vectors[1])
    unrelated = float(vectors[0] @ vectors[2])
    assert paraphrase > unrelated + 0.3, (paraphrase, unrelated)


def test_same_text_alone_and_in_mixed_length_batch(grpc_client: object, http_client: object) -> None:
    text = "Dynamic batching must not change the embedding of a sentence."
    others = [
        "short",
        "a somewhat longer sentence with quite a few more words than the first one",
        "mid length text",
    ]
    alone = embed_grpc(grpc_client, [text])[0]
    batched = embed_grpc(grpc_client, [others[0], text, *others[1:]])[1]
    np.testing.assert_allclose(alone, batched, atol=1e-5)
    # Separate requests of different lengths merged by the dynamic batcher give the same answer too.
    with ThreadPoolExecutor(4) as pool:
        merged = list(pool.map(lambda t: embed_grpc(grpc_client, [t])[0], [text, *others]))
    np.testing.assert_allclose(alone, merged[0], atol=1e-5)
    hidden_alone = http_client.infer(  # type: ignore[attr-defined]
        EMBED,
        http_inputs(tokenize([text])),
        outputs=[tritonclient_http.InferRequestedOutput("last_hidden_state")],
    ).as_numpy("last_hidden_state")[0]
    hidden_batched = http_client.infer(  # type: ignore[attr-defined]
        EMBED,
        http_inputs(tokenize([others[1], text])),
        outputs=[tritonclient_http.InferRequestedOutput("last_hidden_state")],
    ).as_numpy("last_hidden_state")[1]
    np.testing.assert_allclose(hidden_alone, hidden_batched[: hidden_alone.shape[0]], atol=1e-4)


def test_concurrent_single_text_requests_are_batched(triton: EmbeddedTriton, http_client: object) -> None:
    def stats() -> tuple[int, int]:
        model = http_client.get_inference_statistics(EMBED)["model_stats"][0]  # type: ignore[attr-defined]
        return int(model["inference_count"]), int(model["execution_count"])

    def settled_stats(minimum_inferences: int = 0) -> tuple[int, int]:
        # Triton records statistics after the response has gone out (earlier tests' too), so wait
        # until the counters stop moving.
        deadline = time.monotonic() + 10.0
        current = stats()
        while time.monotonic() < deadline:
            time.sleep(0.2)
            latest = stats()
            if latest == current and latest[0] >= minimum_inferences:
                break
            current = latest
        return current

    local = threading.local()

    def one(index: int) -> np.ndarray:
        if not hasattr(local, "client"):
            local.client = tritonclient_grpc.InferenceServerClient(triton.grpc_url)
        return embed_grpc(local.client, [f"concurrent request number {index} " + "word " * (index % 7)])

    inferences_before, executions_before = settled_stats()
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(one, range(64)))
    assert all(r.shape == (1, HIDDEN) for r in results)
    inferences, executions = settled_stats(inferences_before + 64)
    assert inferences - inferences_before == 64
    logger.info("64 single-text requests ran in %d executions", executions - executions_before)
    assert executions - executions_before < 64


def test_rerank_orders_jiangsu_articles(grpc_client: object) -> None:
    keys = list(ARTICLES)
    logits = rerank_logits(grpc_client, [(QUERY, ARTICLES[k]) for k in keys])
    assert logits.shape == (len(keys), 1) and logits.dtype == np.float32
    scores = dict(zip(keys, 1.0 / (1.0 + np.exp(-logits[:, 0].astype(np.float64))), strict=True))
    assert all(0.0 < s < 1.0 for s in scores.values())
    assert min(scores["1"], scores["3"]) > max(scores["12"], scores["7"]), scores
    # logit = 10 * (cosine - 0.5) reproduces the bi-encoder cosines.
    cosines = dict(zip(keys, logits[:, 0] / 10.0 + 0.5, strict=True))
    for key, expected in EXPECTED_COSINE.items():
        assert abs(cosines[key] - expected) < 0.02, (key, cosines[key])
    # Without token_type_ids the row is split at the first [SEP]: same answer.
    np.testing.assert_allclose(
        rerank_logits(grpc_client, [(QUERY, ARTICLES[k]) for k in keys], False), logits, atol=1e-4
    )


def test_rerank_score_equals_embedding_cosine(grpc_client: object) -> None:
    vectors = embed_grpc(grpc_client, [QUERY, ARTICLES["3"]])
    logit = rerank_logits(grpc_client, [(QUERY, ARTICLES["3"])])[0, 0]
    assert abs((logit / 10.0 + 0.5) - float(vectors[0] @ vectors[1])) < 1e-4


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_missing_attention_mask_is_an_error(protocol: str, http_client: object, grpc_client: object) -> None:
    arrays = tokenize(["no mask here"])
    del arrays["attention_mask"]
    with pytest.raises(InferenceServerException, match="attention_mask"):
        if protocol == "http":
            http_client.infer(EMBED, http_inputs(arrays))  # type: ignore[attr-defined]
        else:
            grpc_client.infer(EMBED, grpc_inputs(arrays), client_timeout=TIMEOUT_S)  # type: ignore[attr-defined]


def test_wrong_dtype_is_an_error(grpc_client: object) -> None:
    arrays = {k: v.astype(np.int32) for k, v in tokenize(["wrong dtype"]).items()}
    with pytest.raises(InferenceServerException):
        grpc_client.infer(EMBED, grpc_inputs(arrays), client_timeout=TIMEOUT_S)  # type: ignore[attr-defined]


def test_model_side_validation_errors(grpc_client: object) -> None:
    good = tokenize(["valid text", "another valid text"])
    mismatched = dict(good, attention_mask=good["attention_mask"][:, :-1].copy())
    with pytest.raises(InferenceServerException, match="shape"):
        grpc_client.infer(EMBED, grpc_inputs(mismatched), client_timeout=TIMEOUT_S)  # type: ignore[attr-defined]
    out_of_vocab = dict(good, input_ids=good["input_ids"] + 100_000)
    with pytest.raises(InferenceServerException, match="input_ids"):
        grpc_client.infer(RERANK, grpc_inputs(out_of_vocab), client_timeout=TIMEOUT_S)  # type: ignore[attr-defined]
    no_separator = {k: v[:, :2].copy() for k, v in tokenize(["a", "b"]).items() if k != "token_type_ids"}
    with pytest.raises(InferenceServerException, match="SEP"):
        grpc_client.infer(RERANK, grpc_inputs(no_separator), client_timeout=TIMEOUT_S)  # type: ignore[attr-defined]
    # The stub survived: good requests still succeed.
    assert embed_grpc(grpc_client, ["still alive"]).shape == (1, HIDDEN)


def test_bad_request_does_not_fail_its_batch_mates(triton: EmbeddedTriton) -> None:
    def send(bad: bool) -> bool:
        client = tritonclient_grpc.InferenceServerClient(triton.grpc_url)
        arrays = tokenize(["batch mate text"])
        if bad:
            arrays["input_ids"] = arrays["input_ids"] - 1_000
        try:
            client.infer(EMBED, grpc_inputs(arrays), client_timeout=TIMEOUT_S)
            return True
        except InferenceServerException:
            return False
        finally:
            client.close()

    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(send, [i % 2 == 0 for i in range(16)]))
    assert outcomes == [i % 2 == 1 for i in range(16)]
