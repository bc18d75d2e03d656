"""Tenants kept apart, in-process (issue #35 items 1, 2, 4): stored responses belong to the key that made them
(every read, continuation, input-item listing and delete of another key is the 404 of an id never issued, and
so is one of a model the key may no longer use), ids are the gateway's own whatever `X-Request-Id` says,
`/metrics` answers only admin and metrics keys, readiness names only the models a key may use, and
Anthropic's Messages checks the allow-list before it looks at the model. The backend is the unit tier's
scripted fake; `tests/e2e/test_tenancy.py` proves the same through the `openai` client against Triton."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.settings import Settings
from tests.helpers import openai_validator
from tests.image_samples import solid
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config

validate = openai_validator()


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


KEYS = [
    {"name": "team-a", "team": "a", "secret_sha256": sha("sk-a")},
    {"name": "team-b", "team": "b", "secret_sha256": sha("sk-b")},
    {"name": "embed-only", "team": "a", "secret_sha256": sha("sk-embed"), "models": ["all-minilm-*"]},
    {"name": "prometheus", "secret_sha256": sha("sk-prom"), "models": [], "metrics": True},
    {"name": "ops", "secret_sha256": sha("sk-ops"), "admin": True},
]
A, B, EMBED = ({"Authorization": f"Bearer {k}"} for k in ("sk-a", "sk-b", "sk-embed"))


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": KEYS}), encoding="utf-8")
    app = create_app(llm_only_config(tmp_path, url="127.0.0.1:1"),
                     Settings(config_file=tmp_path, keys_file=keys, responses_store=16, api_keys=["plain"]))
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend = FakeBackend([[i] for i in rt.tokenizer.encode("The secret is quokka.")])
    await app.state.gateway.services.parts.start()
    yield app
    await app.state.gateway.process.close()


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c


async def respond(client: httpx.AsyncClient, key: dict[str, str], **body: Any) -> httpx.Response:
    return await client.post("/v1/responses", headers=key, json={"model": MODEL, "max_output_tokens": 8, **body})


async def test_another_keys_stored_response_does_not_exist_for_it(client: httpx.AsyncClient) -> None:
    first = (await respond(client, A, input="Remember: the secret is quokka.", store=True)).json()
    rid = first["id"]
    for key in (B, EMBED):  # another team, and the same team's key narrowed to other models
        for method, path in (("GET", f"/v1/responses/{rid}"), ("GET", f"/v1/responses/{rid}/input_items"),
                             ("DELETE", f"/v1/responses/{rid}")):
            r = await client.request(method, path, headers=key)
            assert r.status_code == 404, (key, method, path, r.text)
            assert r.json()["error"]["code"] == "not_found" and "quokka" not in r.text  # (ids are hex: no "q")
        r = await respond(client, key, input="What is the secret?", previous_response_id=rid)
        assert r.status_code == 404 and r.json()["error"]["code"] in ("previous_response_not_found",
                                                                      "model_not_found")
    plain = await client.get(f"/v1/responses/{rid}", headers={"Authorization": "Bearer plain"})
    assert plain.status_code == 404  # an --api-key key is a tenant of its own too
    assert (await client.get(f"/v1/responses/{rid}", headers=A)).json() == first
    r = await respond(client, A, input="What is the secret?", previous_response_id=rid)
    assert r.status_code == 200 and r.json()["previous_response_id"] == rid


async def test_ids_are_the_gateways_whatever_x_request_id_says(client: httpx.AsyncClient) -> None:
    header = {"X-Request-Id": "same-id"}
    first = await respond(client, {**A, **header}, input="a's turn", store=True)
    second = await respond(client, {**B, **header}, input="b's turn", store=True)
    assert first.headers["x-request-id"] == second.headers["x-request-id"] == "same-id"  # still echoed
    ida, idb = first.json()["id"], second.json()["id"]
    assert ida != idb and "same-id" not in ida and len(ida) == len("resp_") + 48
    kept = (await client.get(f"/v1/responses/{ida}/input_items", headers=A)).json()
    assert kept["data"][0]["content"] == [{"type": "input_text", "text": "a's turn"}]  # never overwritten


async def test_delete_and_input_items_in_openais_shapes(client: httpx.AsyncClient) -> None:
    items = [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"},
             {"role": "user", "content": [{"type": "input_text", "text": "three"}]}]
    rid = (await respond(client, A, input=items, store=True)).json()["id"]
    page = (await client.get(f"/v1/responses/{rid}/input_items", headers=A)).json()
    validate("ResponseItemList", page)
    assert [i["role"] for i in page["data"]] == ["user", "assistant", "user"][::-1]  # OpenAI's default: desc
    asc = (await client.get(f"/v1/responses/{rid}/input_items?order=asc&limit=2", headers=A)).json()
    validate("ResponseItemList", asc)
    assert [i["role"] for i in asc["data"]] == ["user", "assistant"] and asc["has_more"]
    rest = (await client.get(f"/v1/responses/{rid}/input_items?order=asc&after={asc['last_id']}",
                             headers=A)).json()
    assert [i["content"][0]["text"] for i in rest["data"]] == ["three"] and not rest["has_more"]
    assert (await client.get(f"/v1/responses/{rid}/input_items?limit=0", headers=A)).status_code == 400
    r = await client.delete(f"/v1/responses/{rid}", headers=A)
    assert r.status_code == 200 and r.json() == {"id": rid, "object": "response", "deleted": True}
    assert (await client.get(f"/v1/responses/{rid}", headers=A)).status_code == 404
    assert (await client.delete(f"/v1/responses/{rid}", headers=A)).status_code == 404


async def test_metrics_answer_admin_and_metrics_keys_only(client: httpx.AsyncClient) -> None:
    for key in (A, {"Authorization": "Bearer plain"}):
        r = await client.get("/metrics", headers=key)
        assert r.status_code == 403 and "team-a" not in r.text
    for secret in ("sk-prom", "sk-ops"):
        r = await client.get("/metrics", headers={"Authorization": f"Bearer {secret}"})
        assert r.status_code == 200 and "openai_api_requests_total" in r.text
    assert (await client.get("/metrics")).status_code == 401


async def test_readiness_and_models_name_only_what_the_key_may_use(client: httpx.AsyncClient) -> None:
    r = await client.get("/health/ready", headers=EMBED)
    assert r.json() == {"ready": False, "models": {}}  # Triton is down here; the LLM is not this key's
    r = await client.get("/health/ready", headers=A)
    assert r.json() == {"ready": False, "models": {MODEL: "not ready"}}
    assert (await client.get("/v1/models", headers=EMBED)).json()["data"] == []
    r = await client.get("/ping")
    assert r.status_code == 503 and r.json() == {"status": "unhealthy"}


async def test_messages_check_the_allow_list_before_the_model(app: FastAPI, client: httpx.AsyncClient,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An image to a model the key may not use: the 404 of an unknown model, not "this model takes no images"."""
    backend = app.state.gateway.services.registry.llm(MODEL).backend
    monkeypatch.setattr(backend, "supports", lambda param: param != "images")  # a text-only model, as SmolLM2
    png = base64.b64encode(solid(4, 4, "red")).decode()  # inline: nothing is ever fetched
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": [image]}]}
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        denied = await client.post(path, headers=EMBED, json=body)
        unknown = await client.post(path, headers=EMBED, json={**body, "model": "no-such-model"})
        assert denied.status_code == unknown.status_code == 404, denied.text
        assert denied.json()["error"]["type"] == unknown.json()["error"]["type"] == "not_found_error"
        assert (await client.post(path, headers=A, json=body)).status_code == 400  # the key's own model: it says
