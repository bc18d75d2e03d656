"""The rerank dialects through the clients that speak them, against the real Triton rerank model:
NVIDIA NIM's `/v1/ranking` (LangChain's NVIDIARerank), Infinity's `/rerank` (litellm's `infinity/`
provider), TEI's `/rerank` (its documented JSON: no TEI rerank client is installable here), and the
request id as every rerank response's `id`."""

from __future__ import annotations

import math
import warnings
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import API_KEY, GatewayServer
from tests.e2e.test_rerank import DOCS, QUERY, RERANK

# A document far past the model's 512 tokens whose start and end are about different things.
LONG_DOC = ("Finished oil circulation follows the principles of legal management. " * 3 +
            " ".join(f"filler{i} text" for i in range(400)) + " The weather in Lisbon is sunny today.")


def rerank_v1(http: httpx.Client, docs: list[str] = DOCS) -> dict[int, float]:
    r = http.post("/v1/rerank", json={"model": RERANK, "query": QUERY, "documents": docs})
    assert r.status_code == 200, r.text
    return {d["index"]: d["relevance_score"] for d in r.json()["results"]}


def logit(p: float) -> float:
    return math.log(p / (1 - p))


# --- NIM /v1/ranking -------------------------------------------------------------------------------------------


def test_nvidia_rerank_orders_documents_by_the_gateways_logits(gateway: GatewayServer, http: httpx.Client) -> None:
    from langchain_core.documents import Document
    from langchain_nvidia_ai_endpoints import NVIDIARerank

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "model unknown" to the client's own table: expected for a local model
        ranker = NVIDIARerank(model=RERANK, base_url=f"{gateway.url}/v1", api_key=API_KEY, top_n=4,
                              usage_telemetry_enabled=False)
    out = ranker.compress_documents(query=QUERY, documents=[Document(page_content=d) for d in DOCS])
    assert {d.page_content for d in out[:2]} == {DOCS[0], DOCS[2]}
    scores = [d.metadata["relevance_score"] for d in out]
    assert scores == sorted(scores, reverse=True)
    # NIM's `logit` is the raw score: the model's normalized relevance is its sigmoid.
    relevance = rerank_v1(http)
    for d in out:
        assert d.metadata["relevance_score"] == pytest.approx(logit(relevance[DOCS.index(d.page_content)]), abs=1e-6)
    top = ranker.model_copy(update={"top_n": 1}).compress_documents(query=QUERY,
                                                                    documents=[Document(page_content=d) for d in DOCS])
    assert len(top) == 1 and top[0].page_content == out[0].page_content


def test_ranking_json_shape_and_truncate(http: httpx.Client) -> None:
    body: dict[str, Any] = {"model": RERANK, "query": {"text": QUERY}, "passages": [{"text": d} for d in DOCS]}
    r = http.post("/v1/ranking", json=body)
    assert r.status_code == 200, r.text
    rankings = r.json()["rankings"]
    assert set(r.json()) == {"rankings"} and [set(x) for x in rankings] == [{"index", "logit"}] * 4
    assert sorted(x["index"] for x in rankings) == [0, 1, 2, 3]
    assert [x["logit"] for x in rankings] == sorted((x["logit"] for x in rankings), reverse=True)
    long = {**body, "passages": [{"text": LONG_DOC}, {"text": DOCS[2]}]}
    def logits(**kw: Any) -> dict[int, float]:
        r = http.post("/v1/ranking", json={**long, **kw})
        assert r.status_code == 200, r.text
        return {x["index"]: x["logit"] for x in r.json()["rankings"]}

    end, start = logits(truncate="END"), logits(truncate="START")
    assert abs(end[0] - start[0]) > 1e-3  # the end of the long passage is another text
    assert logits() == pytest.approx(end, abs=1e-5)  # unset: as END (passages are cut)
    r = http.post("/v1/ranking", json={**long, "truncate": "NONE"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "passages" and "passages[0]" in r.json()["error"]["message"]
    for bad, param in (({"passages": []}, "passages"), ({"query": {"text": " "}}, "query.text"),
                       ({"truncate": "MIDDLE"}, "truncate"), ({"model": "all-minilm-l6-v2"}, "model"),
                       ({"query": "not an object"}, "query")):
        r = http.post("/v1/ranking", json={**body, **bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


# --- Infinity /rerank: litellm's infinity/ provider -----------------------------------------------------------


def test_litellm_infinity_rerank(gateway: GatewayServer, http: httpx.Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no cost-map download
    litellm = pytest.importorskip("litellm")
    r = litellm.rerank(model=f"infinity/{RERANK}", query=QUERY, documents=DOCS, top_n=3, return_documents=True,
                       api_base=gateway.url, api_key=API_KEY, headers={"X-Request-Id": "infinity-trace-1"})
    assert r.id == "infinity-trace-1"
    results = r.results
    assert len(results) == 3 and {results[0]["index"], results[1]["index"]} == {0, 2}
    relevance = rerank_v1(http)
    for x in results:
        assert x["document"]["text"] == DOCS[x["index"]]  # Infinity's plain-string document, as litellm reads it
        assert x["relevance_score"] == pytest.approx(relevance[x["index"]], abs=1e-9)
    assert r.meta["tokens"]["input_tokens"] > 0


def test_infinity_json_shape(http: httpx.Client) -> None:
    body = {"model": RERANK, "query": QUERY, "documents": DOCS, "return_documents": True, "top_n": 2}
    r = http.post("/rerank", json=body, headers={"X-Request-Id": "inf-2"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "rerank" and out["id"] == "inf-2" and out["model"] == RERANK
    assert set(out["usage"]) == {"prompt_tokens", "total_tokens"} and isinstance(out["created"], int)
    assert [set(x) for x in out["results"]] == [{"index", "relevance_score", "document"}] * 2
    assert all(x["document"] == DOCS[x["index"]] for x in out["results"])
    raw = http.post("/rerank", json={**body, "raw_scores": True, "return_documents": False}).json()["results"]
    relevance = rerank_v1(http)
    assert [set(x) for x in raw] == [{"index", "relevance_score"}] * 2
    assert all(x["relevance_score"] == pytest.approx(logit(relevance[x["index"]]), abs=1e-6) for x in raw)


# --- TEI /rerank ----------------------------------------------------------------------------------------------


def test_tei_rerank_json(http: httpx.Client) -> None:
    r = http.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True})
    assert r.status_code == 200, r.text
    out = r.json()
    assert isinstance(out, list) and [set(x) for x in out] == [{"index", "score", "text"}] * 4
    assert {out[0]["index"], out[1]["index"]} == {0, 2}
    assert [x["score"] for x in out] == sorted((x["score"] for x in out), reverse=True)
    relevance = rerank_v1(http)
    assert all(x["score"] == pytest.approx(relevance[x["index"]], abs=1e-9) and x["text"] == DOCS[x["index"]]
               for x in out)
    raw = http.post("/rerank", json={"query": QUERY, "texts": DOCS, "raw_scores": True}).json()
    assert [set(x) for x in raw] == [{"index", "score"}] * 4
    assert all(x["score"] == pytest.approx(logit(relevance[x["index"]]), abs=1e-6) for x in raw)


def test_tei_rerank_truncation(http: httpx.Client) -> None:
    texts = [LONG_DOC, DOCS[2]]

    def score(**kw: Any) -> float:
        r = http.post("/rerank", json={"query": QUERY, "texts": texts, **kw})
        assert r.status_code == 200, r.text
        return float(next(x["score"] for x in r.json() if x["index"] == 0))

    right = score()
    assert score(truncate=True, truncation_direction="Right") == pytest.approx(right, abs=1e-6)
    assert abs(score(truncate=True, truncation_direction="Left") - right) > 1e-4  # its end is another text
    r = http.post("/rerank", json={"query": QUERY, "texts": texts, "truncate": False})
    assert r.status_code == 400 and r.json()["error"]["param"] == "texts"
    assert r.json()["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"query": QUERY}, 400, "texts"),
    ({"query": QUERY, "texts": DOCS, "documents": DOCS}, 400, "texts"),
    ({"query": QUERY, "texts": []}, 400, "texts"),
    ({"query": "", "texts": DOCS}, 400, "query"),
    ({"query": QUERY, "documents": DOCS, "top_n": 0}, 400, "top_n"),
    ({"query": QUERY, "documents": DOCS, "model": "nope"}, 404, "model"),
    ({"query": QUERY, "texts": DOCS, "truncation_direction": "up"}, 400, "truncation_direction"),
    ({"texts": DOCS}, 400, "query"),
])
def test_root_rerank_errors(http: httpx.Client, body: dict[str, Any], status: int, param: str) -> None:
    r = http.post("/rerank", json=body)
    assert r.status_code == status, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"} and r.json()["error"]["param"] == param


# --- ids ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
def test_rerank_id_is_the_request_id(http: httpx.Client, path: str) -> None:
    body = {"model": RERANK, "query": QUERY, "documents": DOCS[:2]}
    r = http.post(path, json=body, headers={"X-Request-Id": "rerank-trace-7"})
    assert r.status_code == 200 and r.json()["id"] == "rerank-trace-7"
    r = http.post(path, json=body)
    assert r.json()["id"] == r.headers["x-request-id"]


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/ranking", {"model": RERANK, "query": {"text": "q"}, "passages": [{"text": "d"}] * 1001}, "passages"),
    ("/rerank", {"query": "q", "texts": ["d"] * 1001}, "texts"),
    ("/rerank", {"model": RERANK, "query": "q", "documents": ["d"] * 1001}, "documents"),
    ("/embed", {"inputs": ["d"] * 2049}, "inputs"),
])
def test_item_limits_apply_to_every_dialect(http: httpx.Client, path: str, body: dict[str, Any], param: str) -> None:
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "too_many_items" and r.json()["error"]["param"] == param
