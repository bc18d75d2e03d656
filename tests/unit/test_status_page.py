"""The status page and the API docs in-process: who may read /status (admin keys, basic auth for browsers),
what it shows (models, in flight, recent errors, keys by name) and never (a secret, anything from outside the
page); /docs and /redoc with their assets from the gateway, off by a setting. The real browser's view, with a
replica going down, is tests/e2e/test_status_page.py."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from openai_api.app import create_app
from openai_api.errors import BackendError
from openai_api.settings import Settings
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config

ENV_SECRET = "sk-from-env-0123456789"
SECRETS = ("sk-ops", "sk-a", ENV_SECRET)


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def basic(password: str, user: str = "admin") -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


OPS = {"Authorization": "Bearer sk-ops"}


@pytest.fixture
async def client(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("STATUS_TEST_KEY", ENV_SECRET)
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "ops", "secret_sha256": sha("sk-ops"), "admin": True},
        {"name": "team-a", "team": "alpha", "secret_sha256": sha("sk-a"), "requests_per_minute": 100},
        {"name": "from-env", "secret_env": "STATUS_TEST_KEY"}]}), encoding="utf-8")
    app = create_app(llm_only_config(tmp_path, url="127.0.0.1:1"), Settings(config_file=tmp_path, keys_file=keys))
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend.inner = FakeBackend([[i] for i in rt.tokenizer.encode("Hello there")], fail_at=1,
                                   error=BackendError("Triton failed."))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c
    await app.state.gateway.process.close()


async def test_only_admin_keys_read_it_and_a_browser_is_asked_for_basic_auth(client: httpx.AsyncClient) -> None:
    r = await client.get("/status")
    assert r.status_code == 401
    assert 'Basic realm="openai-api"' in r.headers.get_list("www-authenticate")[-1]
    assert (await client.get("/status", headers=basic("wrong"))).status_code == 401
    assert (await client.get("/status", headers={"Authorization": "Bearer sk-a"})).status_code == 403
    assert (await client.get("/status", headers=basic("sk-a"))).status_code == 403
    for headers in (OPS, basic("sk-ops"), basic("sk-ops", user="")):
        r = await client.get("/status", headers=headers)
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html"), headers
    # basic auth is for the browser pages only: an API route still wants the bearer key
    assert (await client.get("/v1/models", headers=basic("sk-ops"))).status_code == 401
    assert "Basic" not in " ".join((await client.get("/v1/models")).headers.get_list("www-authenticate"))


async def test_it_shows_models_errors_and_keys_and_nothing_secret_or_external(client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    r = await client.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-a"})
    assert r.status_code == 502 or r.status_code >= 500
    r = await client.get("/status?refresh=0", headers=OPS)
    page = r.text
    assert "default-src 'none'" in r.headers["content-security-policy"] and r.headers["cache-control"] == "no-store"
    row = re.search(rf'<tr data-model="{re.escape(MODEL)}">(.*?)</tr>', page)
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert "not ready" in cells[2]  # Triton is down here
    assert cells[6] == "1" and cells[8] == "100.0%"  # one request, a 5xx
    for name in ("ops", "team-a", "from-env"):
        assert f'data-key="{name}"' in page
    assert "alpha" in page
    for secret in (*SECRETS, *(sha(s) for s in SECRETS), "STATUS_TEST_KEY"):
        assert secret not in page, secret
    assert "<script" not in page and not re.search(r"""(src|href)\s*=|url\(|@import|//""", page.replace(
        "<!doctype html>", ""))
    assert 'http-equiv="refresh"' not in page  # refresh=0
    assert '<meta http-equiv="refresh" content="5">' in (await client.get("/status", headers=OPS)).text
    assert (await client.get("/status?refresh=-1", headers=OPS)).status_code == 400


async def test_docs_come_with_their_assets_and_redoc_without_web_fonts(client: httpx.AsyncClient) -> None:
    page = (await client.get("/docs", headers=basic("sk-a"))).text
    assert "/docs/static/swagger-ui-bundle.js" in page and "/docs/static/swagger-ui.css" in page
    assert "cdn." not in page and "https://" not in page and '"validatorUrl": null' in page
    js = await client.get("/docs/static/swagger-ui-bundle.js", headers=basic("sk-a"))
    assert js.status_code == 200 and len(js.content) > 100_000
    redoc = (await client.get("/redoc", headers=OPS)).text
    assert "/docs/static/redoc.standalone.js" in redoc and "fonts.googleapis" not in redoc
    assert (await client.get("/openapi.json", headers=basic("sk-a"))).status_code == 200


async def test_settings_turn_the_page_and_the_docs_off(tmp_path: Path) -> None:
    app = create_app(llm_only_config(tmp_path, url="127.0.0.1:1"),
                     Settings(config_file=tmp_path, status_page=False, docs=False))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        for path in ("/status", "/docs", "/redoc", "/docs/static/swagger-ui.css"):
            assert (await c.get(path)).status_code == 404, path
        assert (await c.get("/openapi.json")).status_code == 200
    await app.state.gateway.process.close()
