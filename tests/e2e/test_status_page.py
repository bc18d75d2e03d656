"""The status page and the API docs in a real headless browser (Debian's chromium, tests/browser.py), against
the session Triton and a second tritonserver serving the embedding model as its other replica:

- /status loads with nothing from outside the gateway (every request the browser made is recorded), shows the
  models, both replicas up, the keys by name and never a secret; when the second replica is killed, the page
  (reloading itself every second) shows it down, and the time that took is printed;
- a browser that cannot send a bearer header opens /status with basic auth, which the gateway asks for;
- /docs (Swagger UI) and /redoc render the API from the gateway's own assets, offline."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from openai import OpenAI

from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.browser import Browser
from tests.e2e.conftest import LLM, GatewayServer, gateway_config

EMB = "all-minilm-l6-v2"
ADMIN, USER, ENV_SECRET = "sk-ops-status-e2e", "sk-app-status-e2e", "sk-from-env-status-e2e"
SECRETS = (ADMIN, USER, ENV_SECRET)


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@pytest.fixture(scope="module")
def victim() -> Iterator[EmbeddedTriton]:
    server = EmbeddedTriton(models=[EMB]).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(triton: EmbeddedTriton, victim: EmbeddedTriton, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[GatewayServer]:
    os.environ["STATUS_E2E_KEY"] = ENV_SECRET
    folder = tmp_path_factory.mktemp("status")
    keys = folder / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "ops", "secret_sha256": sha(ADMIN), "admin": True},
        {"name": "app", "team": "search", "secret_sha256": sha(USER), "requests_per_minute": 1000},
        {"name": "env-key", "secret_env": "STATUS_E2E_KEY"}]}), encoding="utf-8")
    config = gateway_config(triton)
    config.llm = [m for m in config.llm if m.name == LLM]
    config.rerank = []
    config.embedding = [m for m in config.embedding if m.name == EMB]
    config.embedding[0].url = [triton.http_url, victim.http_url]
    server = GatewayServer(config, [], settings=Settings(config_file=folder, keys_file=keys)).start()
    yield server
    server.stop()
    os.environ.pop("STATUS_E2E_KEY", None)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    b = Browser(tmp_path_factory.mktemp("chromium"))
    yield b
    b.close()


def only_the_gateway(urls: list[str], gateway: GatewayServer) -> None:
    """Every request the page made went to the gateway (data: and blob: URLs are the page's own)."""
    origin = urlsplit(gateway.url).netloc
    outside = [u for u in urls if urlsplit(u).scheme not in ("data", "blob") and urlsplit(u).netloc != origin]
    assert urls and not outside, outside


def replica_state(url: str) -> str:
    return f"document.querySelector('tr[data-replica=\"{url}\"]')?.dataset.state"


def test_the_status_page_shows_a_replica_going_down(browser: Browser, gateway: GatewayServer,
                                                    victim: EmbeddedTriton, triton: EmbeddedTriton) -> None:
    client = OpenAI(base_url=f"{gateway.url}/v1", api_key=USER, timeout=120, max_retries=0)
    for i in range(4):
        assert client.embeddings.create(model=EMB, input=f"status page sentence {i}").data
    client.chat.completions.create(model=LLM, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    page = browser.new_page({"Authorization": f"Bearer {ADMIN}"})
    page.send("Page.navigate", url=f"{gateway.url}/status?refresh=1")
    assert page.wait_for(replica_state(victim.http_url)) == "up"
    assert page.evaluate(replica_state(triton.http_url)) == "up"
    html = page.wait_for("document.documentElement.outerHTML")
    for name in ("ops", "app", "env-key"):
        assert f'data-key="{name}"' in html
    assert f'data-model="{LLM}"' in html and f'data-model="{EMB}"' in html
    for secret in (*SECRETS, *(sha(s) for s in SECRETS), "STATUS_E2E_KEY"):
        assert secret not in html, secret
    emb_requests = page.evaluate(f"document.querySelector('tr[data-model=\"{EMB}\"] td:nth-child(7)').textContent")
    assert emb_requests == "4"

    os.killpg(os.getpgid(victim.pid), signal.SIGKILL)  # a crash, not a graceful stop
    killed = time.monotonic()
    assert page.wait_for(f"{replica_state(victim.http_url)} === 'down'", timeout_s=60)
    print(f"\nstatus page: replica shown down {time.monotonic() - killed:.1f} s after it was killed")
    assert page.evaluate(replica_state(triton.http_url)) == "up"
    text = page.evaluate("document.body.innerText")
    assert "serving" in text  # the gateway still serves: the other replica and the LLM are up
    only_the_gateway(page.requested, gateway)
    page.close()


def test_a_browser_without_a_bearer_header_uses_basic_auth(browser: Browser, gateway: GatewayServer) -> None:
    r = httpx.get(f"{gateway.url}/status")
    assert r.status_code == 401 and any(v.startswith("Basic") for v in r.headers.get_list("www-authenticate"))
    page = browser.new_page()
    page.send("Fetch.enable", handleAuthRequests=True)  # what a person types into the browser's prompt
    browser.post("Page.navigate", {"url": f"{gateway.url}/status?refresh=0"}, page.session)  # answers once let go
    asked = False
    while True:  # answer the browser's credentials prompt (Fetch.authRequired), let requests go on, until loaded
        event = browser.wait_event(page.session, {"Fetch.requestPaused", "Fetch.authRequired",
                                                  "Page.loadEventFired"})
        if event["method"] == "Fetch.requestPaused":
            page.send("Fetch.continueRequest", requestId=event["params"]["requestId"])
        elif event["method"] == "Fetch.authRequired":
            asked = True
            assert event["params"]["authChallenge"]["scheme"].lower() == "basic"
            page.send("Fetch.continueWithAuth", requestId=event["params"]["requestId"],
                      authChallengeResponse={"response": "ProvideCredentials", "username": "ops",
                                             "password": ADMIN})
        else:
            break
    page.send("Fetch.disable")
    assert asked
    assert "Gateway status" in page.wait_for("document.title")


def test_docs_and_redoc_render_offline(browser: Browser, gateway: GatewayServer) -> None:
    page = browser.new_page({"Authorization": f"Bearer {USER}"})
    page.send("Page.navigate", url=f"{gateway.url}/docs")
    assert page.wait_for("document.querySelectorAll('.opblock').length") > 10  # Swagger UI drew the operations
    assert "/v1/chat/completions" in page.evaluate("document.body.innerText")
    only_the_gateway(page.requested, gateway)
    redoc = browser.new_page({"Authorization": f"Bearer {USER}"})
    redoc.send("Page.navigate", url=f"{gateway.url}/redoc")
    assert redoc.wait_for("document.body.innerText.includes('/v1/chat/completions')")
    only_the_gateway(redoc.requested, gateway)
