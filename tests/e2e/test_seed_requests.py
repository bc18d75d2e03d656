"""Every request the seed system's manual shows (shared/seeds/002, section 4: models, completions streamed with
`"stream": "true"`, chat, embeddings, rerank), sent exactly as the manual writes it, to a gateway serving the
manual's example config against the real tritonserver (tests/e2e/conftest.py `seed_shaped_config`).

The bodies are the manual's own curl `-d` texts, byte for byte but for the PDF's line wraps inside the rerank
documents (joined with one space: a JSON string cannot hold a raw line break). No model name is translated: the
config serves the manual's names (`baichuan2-13b` and `llama2-7b`, `bge_large_zh_v1_5`, `bge-reranker`) with
`triton_model` pointing each at a reference model. No API key is sent, as the manual's curl sends none.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from openai_api.config import load_config
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import GatewayServer, seed_shaped_config
from tests.helpers import requires_models

pytestmark = requires_models("smollm2-135m-instruct", "all-minilm-l6-v2")

JSON = {"Content-Type": "application/json"}

MODELS_REQUEST = "GET http://localhost:5100/v1/models"

COMPLETIONS = '''{

    "model": "baichuan2-13b",

    "stream": "true",

    "prompt": "Once upon a time",

    "max_tokens": 41,

    "temperature": 0.5

  }'''

CHAT = '''{

    "model": "%s", "stream":false,

    "messages": [

        {"role": "system", "content": "You are a helpful assistant."},

        {"role": "user", "content": "Who won the world series in 2020?"}

        ]

    }'''

EMBEDDINGS = '''{

    "input": "The food was delicious and the waiter...",

    "model": "bge_large_zh_v1_5",

    "encoding_format": "float"

  }'''

RERANK = '''{

    "query": "What principles does the management of finished oil circulation in Jiangsu Province follow?",

    "documents": [

        "Article 1 In order to strengthen the management of finished oil circulation, standardize finished oil \
business operations, maintain market order for finished oil, protect the legitimate rights and interests of finished \
oil operators and consumers, according to relevant laws, regulations, and State Council decisions, combined with the \
actual conditions of this province, this law is formulated.",

        "Article 12 The market supervision and administration department shall push the information of enterprises \
with new registered business scopes involving finished oil wholesale and storage through the government shared \
platform to the commerce department. The commerce department shall promptly push information found during industry \
regulation that is not within its regulatory responsibilities to the competent authorities concerned.",

        "Article 3 The management of finished oil circulation follows the principles of legal management, ensuring \
supply, safe development, and fair competition.",

        "Article 7 The finished oil industry association shall establish and improve industry operating \
self-discipline norms, self-regulation conventions, and professional ethics standards, regulate member behavior, \
and play a role in rights protection, dispute resolution, and industry self-regulation."

    ],

    "model": "bge-reranker",

    "encoding_format": "float",

    "return_documents": true,

    "top_n": 3

}'''

# The manual's chat example asks twice (sections 4 and 4.3), once per model name it shows.
CHAT_MODELS = ("llama2-7b", "baichuan2-13b")


@pytest.fixture(scope="module")
def seed_gateway(triton: EmbeddedTriton, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayServer]:
    data = seed_shaped_config(triton, {"llm": CHAT_MODELS[1], "embedding": "bge_large_zh_v1_5",
                                       "rerank": "bge-reranker"})
    second = {**data["llm"][0], "name": CHAT_MODELS[0]}
    data["llm"].append(second)
    # The manual's chat request sets no max_tokens: on CPU an operator's default budget (a model_infos key of
    # this gateway) keeps its temperature-1 answer short; the request itself is the manual's.
    info = {**data["model_infos"][0], "max_tokens": 48}
    data["model_infos"] = [info, {**info, "name": CHAT_MODELS[0]}]
    path = tmp_path_factory.mktemp("seed-config") / "model_config.json"
    path.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    server = GatewayServer(load_config(path), [], Settings(config_file=path)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(seed_gateway: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=seed_gateway.url, timeout=120) as c:
        yield c


def _events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.splitlines() if line.startswith("data: ")]


def test_models(http: httpx.Client, openai_schema: Callable[[str, Any], None]) -> None:
    method, url = MODELS_REQUEST.split()
    r = http.request(method, url.removeprefix("http://localhost:5100"))
    assert r.status_code == 200, r.text
    body = r.json()
    openai_schema("ListModelsResponse", body)
    cards = {m["id"]: m for m in body["data"]}
    assert set(cards) == {*CHAT_MODELS, "bge_large_zh_v1_5", "bge-reranker"}
    assert all((m["object"], m["owned_by"], m["root"], m["parent"]) == ("model", "openai_api", name, None)
               for name, m in cards.items())


def test_completions_streamed_with_the_string_true(http: httpx.Client,
                                                   openai_schema: Callable[[str, Any], None]) -> None:
    r = http.post("/v1/completions", content=COMPLETIONS.encode(), headers=JSON)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    events = _events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all((c["object"], c["model"]) == ("text_completion", "baichuan2-13b") for c in chunks)
    # OpenAI's spec has no schema for completion stream chunks (the ones before the last carry finish_reason
    # null): the finishing chunk is a valid completion object.
    openai_schema("CreateCompletionResponse", chunks[-1])
    assert len({c["id"] for c in chunks}) == 1 and len(chunks) > 1  # streamed, one id
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text.strip() and chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


@pytest.mark.parametrize("model", CHAT_MODELS)
def test_chat(http: httpx.Client, openai_schema: Callable[[str, Any], None], model: str) -> None:
    r = http.post("/v1/chat/completions", content=(CHAT % model).encode(), headers=JSON)
    assert r.status_code == 200, r.text
    body = r.json()
    openai_schema("CreateChatCompletionResponse", body)
    assert (body["object"], body["model"]) == ("chat.completion", model)
    (choice,) = body["choices"]
    # The manual shows role "user" here, a slip of its own: the answer is the assistant's (OpenAI's shape).
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"].strip()
    assert choice["finish_reason"] in ("stop", "length")
    usage = body["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] and usage["prompt_tokens"] > 0


def test_embeddings(http: httpx.Client, openai_schema: Callable[[str, Any], None]) -> None:
    r = http.post("/v1/embeddings", content=EMBEDDINGS.encode(), headers=JSON)
    assert r.status_code == 200, r.text
    body = r.json()
    openai_schema("CreateEmbeddingResponse", body)
    assert (body["object"], body["model"]) == ("list", "bge_large_zh_v1_5")
    (item,) = body["data"]
    assert (item["object"], item["index"]) == ("embedding", 0)
    assert len(item["embedding"]) == 384 and all(isinstance(x, float) for x in item["embedding"])
    assert sum(x * x for x in item["embedding"]) == pytest.approx(1.0, abs=1e-4)  # normalized, as bge's are


def test_rerank(http: httpx.Client) -> None:
    r = http.post("/v1/rerank", content=RERANK.encode(), headers=JSON)
    assert r.status_code == 200, r.text
    body = r.json()
    documents = json.loads(RERANK)["documents"]
    assert (body["object"], body["model"]) == ("list", "bge-reranker")
    data = body["data"]
    assert len(data) == 3 and all(d["object"] == "rerank" for d in data)
    scores = [d["relevance_score"] for d in data]
    assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
    assert all(d["document"]["text"] == documents[d["index"]] for d in data)
    # The order is the model's: the manual's bge-reranker put Article 3 first; the reference reranker here (a
    # MiniLM bi-encoder's cosine, triton_models/minilm-rerank) need not agree, so no index is asserted.
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] == 0

