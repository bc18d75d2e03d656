"""The runtime LoRA routes in-process (no Triton: loading only reads and checks files): off without
--allow-runtime-lora, admin keys only with a keys file, vLLM's answers, and the loaded adapter as a model."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG
from openai_api.settings import Settings
from tests.helpers import MODELS, missing_models
from tests.unit.fakes import llm_only_config

MODEL = "smollm2-135m-instruct"
ADAPTER = MODELS / "adapters" / "lora-upper"

if reason := missing_models(MODEL) or missing_models("adapters/lora-upper", files=("adapter_config.json",)):
    pytest.skip(reason, allow_module_level=True)


async def client_for(tmp_path: Path, **settings: object) -> AsyncIterator[httpx.AsyncClient]:
    config = llm_only_config(tmp_path, url="127.0.0.1:1")
    root = tmp_path / "adapters"
    shutil.copytree(ADAPTER, root / "upper")
    config.llm[0].adapters_dir = root
    app = create_app(config, Settings(config_file=BUNDLED_CONFIG, **settings))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c
    await app.state.gateway.services.registry.pool.close()


@pytest.fixture
async def plain(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async for c in client_for(tmp_path, api_keys=["k1"], allow_runtime_lora=True):
        yield c


@pytest.fixture
async def off(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    async for c in client_for(tmp_path, api_keys=["k1"]):
        yield c


@pytest.fixture
async def with_keys_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[httpx.AsyncClient]:
    monkeypatch.setenv("LORA_TEST_ADMIN", "sk-admin")
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "user", "secret_sha256": hashlib.sha256(b"sk-user").hexdigest()},
        {"name": "admin", "secret_env": "LORA_TEST_ADMIN", "admin": True}]}))
    async for c in client_for(tmp_path, keys_file=keys, allow_runtime_lora=True):
        yield c


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


BODY = {"lora_name": "upper-at-runtime", "lora_path": "upper"}  # relative: inside the adapters_dir


async def test_off_without_the_flag(off: httpx.AsyncClient) -> None:
    r = await off.post("/v1/load_lora_adapter", json=BODY, headers=auth("k1"))
    assert r.status_code == 404 and "--allow-runtime-lora" in r.json()["error"]["message"]


async def test_load_then_unload_in_vllm_shapes(plain: httpx.AsyncClient) -> None:
    r = await plain.post("/v1/load_lora_adapter", json=BODY, headers=auth("k1"))
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'upper-at-runtime' added successfully."
    card = (await plain.get("/v1/models/upper-at-runtime", headers=auth("k1"))).json()
    assert card["parent"] == MODEL and card["root"].endswith("/adapters/upper")
    base = (await plain.get(f"/v1/models/{MODEL}", headers=auth("k1"))).json()
    assert base["adapters"] == ["upper-at-runtime"]
    again = await plain.post("/v1/load_lora_adapter", json=BODY, headers=auth("k1"))
    assert again.status_code == 400 and again.json()["error"]["code"] == "name_collision"
    r = await plain.post("/v1/unload_lora_adapter", json={"lora_name": "upper-at-runtime"}, headers=auth("k1"))
    assert r.status_code == 200
    assert (await plain.get("/v1/models/upper-at-runtime", headers=auth("k1"))).status_code == 404
    r = await plain.post("/v1/unload_lora_adapter", json={"lora_name": MODEL}, headers=auth("k1"))
    assert r.status_code == 400 and "base model" in r.json()["error"]["message"]
    r = await plain.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": "/etc"}, headers=auth("k1"))
    assert r.status_code == 400 and r.json()["error"]["code"] == "lora_path_not_allowed"


async def test_only_admin_keys_with_a_keys_file(with_keys_file: httpx.AsyncClient) -> None:
    r = await with_keys_file.post("/v1/load_lora_adapter", json=BODY, headers=auth("sk-user"))
    assert r.status_code == 403 and r.json()["error"]["code"] == "permission_denied"
    r = await with_keys_file.post("/v1/load_lora_adapter", json=BODY, headers=auth("sk-admin"))
    assert r.status_code == 200, r.text


async def test_runtime_loads_and_unloads_survive_a_restart_with_persist_adapters(tmp_path: Path) -> None:
    """persist_adapters: a load and an unload are recorded in adapters_dir, and a gateway started afterwards from the
    same config serves the loaded adapter and not the unloaded (scanned) one, until it is loaded again."""
    from openai_api.config import ConfigError, load_config
    from openai_api.lora import RUNTIME_STATE
    from tests.unit.test_lora import config_with

    root = tmp_path / "adapters"
    shutil.copytree(ADAPTER, root / "upper")
    path = config_with(tmp_path, {"adapters_dir": str(root), "persist_adapters": True})

    async def served(*calls: tuple[str, dict[str, str]]) -> list[str]:
        """Start a gateway from the config (a restart), make `calls` (each a 200), and list the models after."""
        app = create_app(load_config(path), Settings(config_file=path, api_keys=["k1"], allow_runtime_lora=True))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
            for route, body in calls:
                r = await c.post(route, json=body, headers=auth("k1"))
                assert r.status_code == 200, r.text
            ids = [m["id"] for m in (await c.get("/v1/models", headers=auth("k1"))).json()["data"]]
        await app.state.gateway.services.registry.pool.close()
        return ids

    assert "upper" in await served()  # found by the start-up scan
    ids = await served(("/v1/load_lora_adapter", BODY), ("/v1/unload_lora_adapter", {"lora_name": "upper"}))
    assert "upper-at-runtime" in ids and "upper" not in ids
    assert json.loads((root / RUNTIME_STATE).read_text()) == {"loaded": {"upper-at-runtime": "upper"},
                                                              "unloaded": ["upper"]}
    ids = await served()  # restarted
    assert "upper-at-runtime" in ids and "upper" not in ids
    await served(("/v1/unload_lora_adapter", {"lora_name": "upper-at-runtime"}),
                 ("/v1/load_lora_adapter", {"lora_name": "upper", "lora_path": "upper"}))
    ids = await served()
    assert "upper" in ids and "upper-at-runtime" not in ids
    # A recorded adapter whose folder is gone is skipped at start-up (a warning), never a failed start.
    (root / RUNTIME_STATE).write_text(json.dumps({"loaded": {"gone": "nowhere"}, "unloaded": []}))
    assert "gone" not in await served()
    with pytest.raises(ConfigError, match=r"persist_adapters.*needs adapters_dir"):
        load_config(config_with(tmp_path, {"adapters_dir": None, "persist_adapters": True}))


async def test_every_worker_follows_another_workers_runtime_loads_with_persist_adapters(tmp_path: Path) -> None:
    """Two gateway apps from one config (two `--workers` processes): with persist_adapters, a load and an unload
    answered by one are served and dropped by the other at its next poll of the record (`_sync_adapters`)."""
    from openai_api.config import load_config
    from tests.unit.test_lora import config_with

    root = tmp_path / "adapters"
    root.mkdir()
    shutil.copytree(ADAPTER, root / "upper")
    path = config_with(tmp_path, {"adapters_dir": str(root), "persist_adapters": True})
    settings = Settings(config_file=path, api_keys=["k1"], allow_runtime_lora=True)
    a, b = (create_app(load_config(path), settings) for _ in range(2))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://a") as ca, \
            httpx.AsyncClient(transport=httpx.ASGITransport(app=b), base_url="http://b") as cb:

        async def models(c: httpx.AsyncClient) -> list[str]:
            return [m["id"] for m in (await c.get("/v1/models", headers=auth("k1"))).json()["data"]]

        assert (await ca.post("/v1/load_lora_adapter", json=BODY, headers=auth("k1"))).status_code == 200
        assert "upper-at-runtime" not in await models(cb)  # b has not polled yet
        await b.state.gateway.reloader._sync_adapters()
        assert "upper-at-runtime" in await models(cb)
        card = (await cb.get("/v1/models/upper-at-runtime", headers=auth("k1"))).json()
        assert card["parent"] == load_config(path).llm[0].name  # served as an adapter of its base
        await b.state.gateway.reloader._sync_adapters()  # nothing changed: nothing happens
        assert (await models(cb)).count("upper-at-runtime") == 1
        r = await ca.post("/v1/unload_lora_adapter", json={"lora_name": "upper-at-runtime"}, headers=auth("k1"))
        assert r.status_code == 200
        await b.state.gateway.reloader._sync_adapters()
        assert "upper-at-runtime" not in await models(cb)
        # b's own unload of the scanned adapter reaches a (the record works both ways).
        assert (await cb.post("/v1/unload_lora_adapter", json={"lora_name": "upper"}, headers=auth("k1"))).is_success
        await a.state.gateway.reloader._sync_adapters()
        assert "upper" not in await models(ca)
    for app in (a, b):
        await app.state.gateway.services.registry.pool.close()


async def test_a_newline_in_lora_name_forges_no_log_line(plain: httpx.AsyncClient,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    """Client text reaches the LoRA service's log lines; a newline in it stays inside its own line."""
    forged = "evil\n2026-01-01 00:00:00,000 INFO openai_api.access: method=GET path=/v1/admin status=200"
    formatter = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    with caplog.at_level(logging.INFO):
        r = await plain.post("/v1/load_lora_adapter", json={**BODY, "lora_name": forged}, headers=auth("k1"))
        assert r.status_code in (200, 400), r.text
        await plain.post("/v1/unload_lora_adapter", json={"lora_name": forged}, headers=auth("k1"))
    written = "\n".join(formatter.format(record) for record in caplog.records)
    assert "evil" in written, "the adapter's name reached no log line: nothing was tested"
    assert not any(line.startswith("2026-01-01") for line in written.splitlines()), written
