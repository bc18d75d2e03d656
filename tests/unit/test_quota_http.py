"""Keys and quotas over HTTP, in-process (issue #23): a keys file's keys, OpenAI's rate-limit headers and
429s, token reservations settled with the real counts, budgets, the model allow-list on every route and
in /v1/models, the admin usage, `--api-key` keys without limits, and reloads that keep counters.

The backend is the unit tier's scripted fake under the real metrics wrapper (where tokens are reserved);
the oracle for every count is arithmetic on what the test sent, never the gateway's own counters."""

from __future__ import annotations

import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG, GatewayConfig
from openai_api.services.backends import InstrumentedLLMBackend
from openai_api.settings import Settings
from tests.helpers import missing_models
from tests.unit.fakes import FakeBackend, llm_only_config

MODEL = "smollm2-135m-instruct"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
REPLY = [[7], [8], [9], [10], [11]]  # five completion tokens, whatever max_tokens says (>= 5)

if reason := missing_models(MODEL):
    pytest.skip(reason, allow_module_level=True)


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def keys_doc(**overrides: Any) -> dict[str, Any]:
    keys = [
        {"name": "limited", "team": "search", "secret_sha256": sha("sk-limited"), "requests_per_minute": 3},
        {"name": "tokens", "team": "search", "secret_sha256": sha("sk-tokens"), "tokens_per_minute": 1000},
        {"name": "budget", "team": "ads", "secret_sha256": sha("sk-budget"), "tokens_per_day": 300},
        {"name": "other-models", "team": "ads", "secret_sha256": sha("sk-other"), "models": ["not-this-*"]},
        {"name": "globbed", "secret_sha256": sha("sk-glob"), "models": ["smollm2-*"]},
        {"name": "admin", "secret_env": "QUOTA_TEST_ADMIN_KEY", "admin": True},
    ]
    return {"keys": keys, **overrides}


@pytest.fixture
def config(tmp_path: Path) -> GatewayConfig:
    return llm_only_config(tmp_path, url="127.0.0.1:1")


@pytest.fixture
def keys_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QUOTA_TEST_ADMIN_KEY", "sk-admin")
    path = tmp_path / "keys.json"
    path.write_text(json.dumps(keys_doc()), encoding="utf-8")
    return path


@pytest.fixture
async def app(config: GatewayConfig, keys_file: Path) -> AsyncIterator[FastAPI]:
    app = create_app(config, Settings(config_file=BUNDLED_CONFIG, api_keys=["plain-key"], keys_file=keys_file))
    state = app.state.gateway
    rt = state.services.registry.llm(MODEL)
    rt.backend = InstrumentedLLMBackend(FakeBackend(REPLY), state.metrics, MODEL)  # type: ignore[arg-type]
    yield app
    await state.services.registry.pool.close()


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c


def auth(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


def chat(max_tokens: int = 20, **kw: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens, **kw}


def error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    err: dict[str, Any] = r.json()["error"]
    return err


async def test_keys_of_the_file_and_of_api_key_are_accepted_others_get_401(client: httpx.AsyncClient) -> None:
    for secret in ("sk-limited", "sk-tokens", "sk-admin", "plain-key"):
        r = await client.post(CHAT, json=chat(), headers=auth(secret))
        assert r.status_code == 200, (secret, r.text)
    assert error(await client.post(CHAT, json=chat(), headers=auth("sk-nope")), 401)["code"] == "invalid_api_key"
    assert error(await client.post(CHAT, json=chat()), 401)["code"] == "invalid_api_key"
    r = await client.post(CHAT, json=chat(), headers={"x-api-key": "sk-limited"})  # Anthropic's header
    assert r.status_code == 200
    # A key without limits gets no rate-limit headers.
    r = await client.post(CHAT, json=chat(), headers=auth("plain-key"))
    assert "x-ratelimit-limit-requests" not in r.headers


async def test_request_headers_count_down_then_429_rate_limit_exceeded_with_retry_after(
        client: httpx.AsyncClient) -> None:
    remaining = []
    for _ in range(3):
        r = await client.post(CHAT, json=chat(), headers=auth("sk-limited"))
        assert r.status_code == 200, r.text
        assert r.headers["x-ratelimit-limit-requests"] == "3"
        assert r.headers["x-ratelimit-reset-requests"].endswith("s")
        remaining.append(int(r.headers["x-ratelimit-remaining-requests"]))
    assert remaining == [2, 1, 0]
    r = await client.post(CHAT, json=chat(), headers=auth("sk-limited"))
    err = error(r, 429)
    assert err["code"] == "rate_limit_exceeded" and err["type"] == "requests"
    assert 1 <= int(r.headers["retry-after"]) <= 60 and int(r.headers["retry-after-ms"]) > 0
    assert r.headers["x-ratelimit-remaining-requests"] == "0"
    # Another key is not affected.
    assert (await client.post(CHAT, json=chat(), headers=auth("sk-tokens"))).status_code == 200


async def test_tokens_are_reserved_then_settled_to_the_real_count(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=chat(max_tokens=100), headers=auth("sk-tokens"))
    assert r.status_code == 200, r.text
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == len(REPLY)
    # While answering, prompt + max_tokens (100) was held: the header says what was left then.
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == 1000 - usage["prompt_tokens"] - 100
    # Settled: the next request sees only what the first really used.
    r = await client.post(CHAT, json=chat(max_tokens=10), headers=auth("sk-tokens"))
    second = r.json()["usage"]
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == \
        1000 - usage["total_tokens"] - second["prompt_tokens"] - 10
    assert r.headers["x-ratelimit-limit-tokens"] == "1000"
    # Streamed: settled the same way.
    r = await client.post(CHAT, json=chat(max_tokens=50, stream=True), headers=auth("sk-tokens"))
    assert r.status_code == 200 and "[DONE]" in r.text
    # More than the window could ever hold: a 429 the client must not retry.
    r = await client.post(CHAT, json=chat(max_tokens=2000), headers=auth("sk-tokens"))
    assert error(r, 429)["code"] == "rate_limit_exceeded" and r.headers["x-should-retry"] == "false"
    # What is left now is 1000 minus the three answers' real totals.
    used = usage["total_tokens"] + second["total_tokens"] + second["prompt_tokens"] + len(REPLY)
    r = await client.post("/tokenize", json={"model": MODEL, "prompt": "Hi"}, headers=auth("sk-tokens"))
    assert int(r.headers["x-ratelimit-remaining-tokens"]) == 1000 - used


async def test_a_spent_budget_is_429_insufficient_quota(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=chat(max_tokens=100), headers=auth("sk-budget"))
    assert r.status_code == 200
    spent = r.json()["usage"]["total_tokens"]
    # A request that could pass the budget (prompt + max_tokens) is refused, and not to be retried.
    r = await client.post(CHAT, json=chat(max_tokens=300 - spent), headers=auth("sk-budget"))
    err = error(r, 429)
    assert err["code"] == "insufficient_quota" and err["type"] == "insufficient_quota"
    assert r.headers["x-should-retry"] == "false"
    ok = await client.post(CHAT, json=chat(max_tokens=5), headers=auth("sk-budget"))
    assert ok.status_code == 200


async def test_models_the_key_may_not_use_do_not_exist_for_it(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=chat(), headers=auth("sk-other"))
    err = error(r, 404)
    assert err["code"] == "model_not_found"
    unknown = error(await client.post(CHAT, json={**chat(), "model": "no-such"}, headers=auth("sk-other")), 404)
    assert err["message"] == unknown["message"].replace("no-such", MODEL)  # same words as a model that is not there
    r = await client.post(COMPLETIONS, json={"model": MODEL, "prompt": "Hi", "max_tokens": 5}, headers=auth("sk-other"))
    assert error(r, 404)["code"] == "model_not_found"
    r = await client.post("/tokenize", json={"model": MODEL, "prompt": "Hi"}, headers=auth("sk-other"))
    assert error(r, 404)["code"] == "model_not_found"
    r = await client.post("/v1/responses", json={"model": MODEL, "input": "Hi"}, headers=auth("sk-other"))
    assert error(r, 404)["code"] == "model_not_found"
    assert (await client.get("/v1/models", headers=auth("sk-other"))).json()["data"] == []
    assert error(await client.get(f"/v1/models/{MODEL}", headers=auth("sk-other")), 404)["code"] == "model_not_found"
    # A glob that matches: listed and usable.
    assert [m["id"] for m in (await client.get("/v1/models", headers=auth("sk-glob"))).json()["data"]] == [MODEL]
    assert (await client.post(CHAT, json=chat(), headers=auth("sk-glob"))).status_code == 200
    assert (await client.get(f"/v1/models/{MODEL}", headers=auth("sk-glob"))).status_code == 200


async def test_admin_usage_is_for_admin_keys_only(client: httpx.AsyncClient) -> None:
    await client.post(CHAT, json=chat(max_tokens=10), headers=auth("sk-budget"))
    assert error(await client.get("/v1/admin/usage", headers=auth("sk-budget")), 403)["code"] == "permission_denied"
    r = await client.get("/v1/admin/usage", headers=auth("sk-admin"))
    assert r.status_code == 200
    by_name = {k["name"]: k for k in r.json()["data"]}
    assert set(by_name) == {"limited", "tokens", "budget", "other-models", "globbed", "admin"}
    budget = by_name["budget"]
    assert budget["team"] == "ads" and budget["limits"]["tokens_per_day"] == 300
    used = budget["usage"]["tokens_today"]
    assert used > 0 and budget["remaining"]["tokens_today"] == 300 - used
    assert "sk-" not in r.text and sha("sk-budget") not in r.text  # never a secret


async def test_per_key_metrics_are_labelled_by_name(client: httpx.AsyncClient) -> None:
    r = await client.post(CHAT, json=chat(max_tokens=10), headers=auth("sk-tokens"))
    prompt = r.json()["usage"]["prompt_tokens"]
    text = (await client.get("/metrics", headers=auth("sk-admin"))).text
    assert 'openai_api_key_requests_total{key="tokens",status="200"} 1.0' in text
    assert f'openai_api_key_prompt_tokens_total{{key="tokens"}} {float(prompt)}' in text
    assert f'openai_api_key_completion_tokens_total{{key="tokens"}} {float(len(REPLY))}' in text
    assert "sk-tokens" not in text


async def test_reload_keeps_counters_of_keys_that_stay_and_refuses_a_bad_file(
        app: FastAPI, client: httpx.AsyncClient, keys_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    quota = app.state.gateway.quota
    for _ in range(2):
        assert (await client.post(CHAT, json=chat(), headers=auth("sk-limited"))).status_code == 200
    doc = keys_doc()
    doc["keys"] = [k for k in doc["keys"] if k["name"] != "tokens"]  # removed
    doc["keys"].append({"name": "new", "secret_sha256": sha("sk-new")})  # added
    keys_file.write_text(json.dumps(doc), encoding="utf-8")
    assert quota.reload("test")
    r = await client.post(CHAT, json=chat(), headers=auth("sk-limited"))
    assert r.headers["x-ratelimit-remaining-requests"] == "0"  # its two earlier requests still count
    assert error(await client.post(CHAT, json=chat(), headers=auth("sk-tokens")), 401)["code"] == "invalid_api_key"
    assert (await client.post(CHAT, json=chat(), headers=auth("sk-new"))).status_code == 200
    # A limit changed: applies at once.
    doc["keys"][0]["requests_per_minute"] = 10
    keys_file.write_text(json.dumps(doc), encoding="utf-8")
    assert quota.reload("test")
    r = await client.post(CHAT, json=chat(), headers=auth("sk-limited"))
    assert r.status_code == 200 and r.headers["x-ratelimit-remaining-requests"] == "6"
    # A bad file: refused with one line, the keys stay.
    keys_file.write_text("keys: [{name: x}]", encoding="utf-8")
    caplog.clear()
    assert not quota.reload("test")
    lines = [r for r in caplog.records if r.name == "openai_api.keys"]
    assert len(lines) == 1 and "keys[0] ('x')" in lines[0].getMessage()
    assert (await client.post(CHAT, json=chat(), headers=auth("sk-new"))).status_code == 200
