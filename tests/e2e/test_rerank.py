"""Rerank through the gateway and the real Triton rerank model, in the seed, Jina and Cohere shapes."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.conftest import LLM

RERANK = "minilm-rerank"
QUERY = "What principles does the management of finished oil circulation in Jiangsu Province follow?"
DOCS = [
    "Article 1 In order to strengthen the management of finished oil circulation, standardize finished oil business "
    "operations, maintain market order for finished oil, protect the legitimate rights and interests of finished oil "
    "operators and consumers, according to relevant laws, regulations, and State Council decisions, combined with the "
    "actual conditions of this province, this law is formulated.",
    "Article 12 The market supervision and administration department shall push the information of enterprises with "
    "new registered business scopes involving finished oil wholesale and storage through the government shared "
    "platform to the commerce department. The commerce department shall promptly push information found during "
    "industry regulation that is not within its regulatory responsibilities to the competent authorities concerned.",
    "Article 3 The management of finished oil circulation follows the principles of legal management, ensuring "
    "supply, safe development, and fair competition.",
    "Article 7 The finished oil industry association shall establish and improve industry operating self-discipline "
    "norms, self-regulation conventions, and professional ethics standards, regulate member behavior, and play a "
    "role in rights protection, dispute resolution, and industry self-regulation.",
]


def test_seed_example_ranks_articles_1_and_3_above_12_and_7(http: httpx.Client) -> None:
    r = http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": DOCS, "return_documents": True,
                                      "top_n": 4, "encoding_format": "float"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == RERANK
    order = [d["index"] for d in body["data"]]
    assert set(order[:2]) == {0, 2} and set(order[2:]) == {1, 3}
    scores = [d["relevance_score"] for d in body["data"]]
    assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
    assert all(d["object"] == "rerank" and d["document"]["text"] == DOCS[d["index"]] for d in body["data"])
    assert body["results"] == body["data"]
    assert body["usage"]["prompt_tokens"] > 0 and body["usage"]["completion_tokens"] == 0


def test_top_n_and_return_documents(http: httpx.Client) -> None:
    r = http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": DOCS, "top_n": 2}).json()
    assert len(r["data"]) == 2 and all("document" not in d for d in r["data"])
    seed_style = http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": DOCS, "top_n": "3"})
    assert seed_style.status_code == 200 and len(seed_style.json()["data"]) == 3


def test_cohere_and_jina_style_bodies_parse(http: httpx.Client) -> None:
    cohere = http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": [{"text": d} for d in DOCS],
                                           "top_n": 3, "return_documents": True, "max_chunks_per_doc": 10})
    assert cohere.status_code == 200, cohere.text
    res = cohere.json()["results"]
    assert len(res) == 3 and {"index", "relevance_score", "document"} <= set(res[0])
    jina = http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": DOCS, "top_n": 2,
                                         "return_documents": False})
    assert [set(x) >= {"index", "relevance_score"} for x in jina.json()["results"]] == [True, True]
    v2 = http.post("/v2/rerank", json={"model": RERANK, "query": QUERY, "documents": DOCS, "top_n": 2})
    assert v2.status_code == 200
    body = v2.json()
    assert [set(x) for x in body["results"]] == [{"index", "relevance_score"}] * 2
    assert body["meta"]["api_version"]["version"] == "2"


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"documents": []}, 400, "documents"),
    ({"top_n": 0}, 400, "top_n"),
    ({"query": ""}, 400, "query"),
    ({"model": "nope"}, 404, "model"),
    ({"model": "all-minilm-l6-v2"}, 400, "model"),
    ({"model": LLM}, 400, "model"),
    ({"documents": "not a list"}, 400, "documents"),
])
def test_bad_rerank_requests(http: httpx.Client, body: dict, status: int, param: str) -> None:
    r = http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": DOCS, **body})
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
