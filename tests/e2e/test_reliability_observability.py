"""Metrics, request ids, the access log, log secrecy and CORS, against the session Triton."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import httpx
import pytest

from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import API_KEY, LLM, GatewayServer, gateway_config

EMBEDDING = "all-minilm-l6-v2"
RERANK = "minilm-rerank"
SECRET_PROMPT = "quokka-marmalade-7731"


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in Prometheus text (labels in any order); 0 when absent."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}")[0])) if "{" in line else {}
        if all(got.get(k) == v for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_metrics_count_requests_latencies_and_tokens(http: httpx.Client) -> None:
    before = http.get("/metrics").text
    with http.stream("POST", "/v1/chat/completions", json={
            "model": LLM, "messages": [{"role": "user", "content": "Name a color."}], "max_tokens": 5,
            "min_tokens": 5, "stream": True}) as r:
        assert r.status_code == 200
        r.read()
    assert http.post("/v1/embeddings", json={"model": EMBEDDING, "input": ["a b c", "d"]}).status_code == 200
    assert http.post("/v1/rerank", json={"model": RERANK, "query": "q", "documents": ["x", "y"]}).status_code == 200
    assert http.post("/v1/embeddings", json={"model": "no-such-model", "input": "a"}).status_code == 404
    r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    after = r.text

    def grew(name: str, by: float = 1, **labels: str) -> None:
        delta = metric(after, name, **labels) - metric(before, name, **labels)
        assert delta >= by, (name, labels, delta)

    grew("openai_api_requests_total", route="/v1/chat/completions", model=LLM, status="200")
    grew("openai_api_requests_total", route="/v1/embeddings", model=EMBEDDING, status="200")
    grew("openai_api_requests_total", route="/v1/rerank", model=RERANK, status="200")
    grew("openai_api_requests_total", route="/v1/embeddings", model="", status="404")  # unknown: no label value
    grew("openai_api_request_duration_seconds_count", route="/v1/chat/completions", model=LLM)
    grew("openai_api_time_to_first_token_seconds_count", model=LLM)
    grew("openai_api_inter_token_latency_seconds_count", by=3, model=LLM)
    grew("openai_api_completion_tokens_total", by=5, model=LLM)
    grew("openai_api_prompt_tokens_total", by=5, model=LLM)
    grew("openai_api_prompt_tokens_total", by=4, model=EMBEDDING)
    grew("openai_api_prompt_tokens_total", by=2, model=RERANK)
    assert "openai_api_requests_in_flight" in after
    assert "no-such-model" not in after  # client-chosen names never become label values


def test_request_id_is_taken_or_made_echoed_and_used_as_the_completion_id(http: httpx.Client) -> None:
    body = {"model": LLM, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    r = http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "trace-abc-123"})
    assert r.status_code == 200
    assert r.headers["x-request-id"] == "trace-abc-123"
    assert r.json()["id"] == "chatcmpl-trace-abc-123"  # the same id goes to Triton as its request id
    r = http.post("/v1/chat/completions", json=body)
    rid = r.headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", rid) and r.json()["id"] == f"chatcmpl-{rid}"
    assert http.get("/v1/models", headers={"X-Request-Id": "x-1"}).headers["x-request-id"] == "x-1"


def test_one_access_log_line_per_request_without_keys_or_prompts(http: httpx.Client,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    body = {"model": LLM, "messages": [{"role": "user", "content": SECRET_PROMPT}], "max_tokens": 2}
    r = http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "log-check-1"})
    assert r.status_code == 200
    with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True},
                     headers={"X-Request-Id": "log-check-2"}) as s:
        s.read()
    http.post("/v1/embeddings", json={"model": EMBEDDING, "input": SECRET_PROMPT}, headers={"X-Request-Id": "log-3"})
    http.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer wrong-key-5150"})
    access = [rec.getMessage() for rec in caplog.records if rec.name == "openai_api.access"]
    line = [a for a in access if "request_id=log-check-1" in a]
    assert len(line) == 1, access
    for field in ("method=POST", "path=/v1/chat/completions", "status=200", "duration_ms=", f"model={LLM}",
                  "prompt_tokens=", "completion_tokens=2"):
        assert field in line[0], line[0]
    assert len([a for a in access if "request_id=log-check-2" in a]) == 1
    assert any("status=401" in a for a in access)
    everything = "\n".join(f"{rec.name} {rec.getMessage()}" for rec in caplog.records)
    for secret in (API_KEY, "wrong-key-5150", SECRET_PROMPT):
        assert secret not in everything, secret


def test_cors_is_off_by_default_and_configurable(http: httpx.Client, triton: EmbeddedTriton) -> None:
    origin = "https://app.example.com"
    r = http.get("/v1/models", headers={"Origin": origin})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    server = GatewayServer(gateway_config(triton), [API_KEY], Settings(
        config_file=Path("."), api_keys=[API_KEY], cors_origins=[origin])).start()
    try:
        with httpx.Client(base_url=server.url, timeout=60) as c:
            pre = c.options("/v1/chat/completions", headers={
                "Origin": origin, "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "authorization,content-type"})
            assert pre.status_code == 200, pre.text  # preflight needs no key
            assert pre.headers["access-control-allow-origin"] == origin
            r = c.get("/v1/models", headers={"Origin": origin, "Authorization": f"Bearer {API_KEY}"})
            assert r.headers["access-control-allow-origin"] == origin
            assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
            other = c.options("/v1/chat/completions", headers={
                "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
            assert other.headers.get("access-control-allow-origin") != "https://evil.example"
    finally:
        server.stop()
