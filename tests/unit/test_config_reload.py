"""Config reload in-process (openai_api/reload.py): a request pinned to the generation it arrived under finishes
on it even when its model is removed, the old generation closes only after its last request, /v1/models and the
admission limiter follow a swap at once, a bad config is refused (one log line, a metric) with the old one
serving, an unchanged file is no reload unless SIGHUP asks, and a new template renders the next request.
No Triton: every model points at a closed port and the generations' backends are swapped for scripted fakes."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import signal
from collections.abc import AsyncGenerator, AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG, GatewayConfig, load_config
from openai_api.process import GatewayProcess
from openai_api.reload import ConfigReloader, Generation
from openai_api.services.container import Services
from openai_api.settings import Settings
from openai_api.triton.llm import GenerationChunk, GenerationRequest
from tests.helpers import missing_models
from tests.unit.fakes import FakeBackend

MODEL = "smollm2-135m-instruct"
AUTH = {"Authorization": "Bearer k"}
CHAT = "/v1/chat/completions"

if reason := missing_models(MODEL):
    pytest.skip(reason, allow_module_level=True)


def write_config(path: Path, names: list[str], template: Path | None = None) -> Path:
    """One LLM entry per name, all SmolLM2's tokenizer (the bundled entry's paths), at a port where nothing listens."""
    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    entry = next(e for e in data["llm"] if e["name"] == MODEL)
    folder = str((BUNDLED_CONFIG.parent / entry["path"]).resolve())
    llm = []
    for name in names:
        e: dict[str, Any] = {"name": name, "url": "127.0.0.1:1", "path": folder, "triton_model": MODEL}
        if template is not None:
            e["chat_template"] = str(template)
        llm.append(e)
    path.write_text(json.dumps({"llm": llm}), encoding="utf-8")
    return path


class HeldBackend(FakeBackend):
    """A fake that yields its first chunk, then waits for `go` before the rest (a stream held in flight)."""

    def __init__(self, script: list[list[int]]) -> None:
        super().__init__(script)
        self.go = asyncio.Event()
        self.started = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        self.requests.append(request)
        for k, ids in enumerate(self.script):
            if k == 1:
                self.started.set()
                await self.go.wait()
            yield GenerationChunk(token_ids=list(ids))
        self.completed += 1


def fake_all(services: Services) -> None:
    """Every LLM of a generation answers from a script instead of the (absent) Triton."""
    for rt in services.registry.llms.values():
        rt.backend = cast(Any, FakeBackend)([[i] for i in rt.tokenizer.encode(" fresh")])


@pytest.fixture
async def gateway(tmp_path: Path) -> AsyncIterator[tuple[FastAPI, ConfigReloader, Path]]:
    path = write_config(tmp_path / "model_config.json", ["a", "b"])
    app = create_app(load_config(path), Settings(config_file=path, api_keys=["k"]))
    reloader = app.state.gateway.reloader
    assert isinstance(reloader, ConfigReloader) and reloader.path == path
    fake_all(reloader.services)
    yield app, reloader, path
    await app.state.gateway.process.close()


async def model_ids(client: httpx.AsyncClient) -> list[str]:
    r = await client.get("/v1/models", headers=AUTH)
    assert r.status_code == 200, r.text
    return sorted(m["id"] for m in r.json()["data"])


def reloads(app: FastAPI, result: str) -> float:
    value = app.state.gateway.metrics.registry.get_sample_value("openai_api_config_reloads_total", {"result": result})
    return value or 0.0


async def until(check: Any) -> None:
    """Let the event loop run until `check()` (tasks the reloader spawned); no clock involved."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError("never happened")


def test_a_retired_generation_closes_after_its_last_request() -> None:
    services: Any = SimpleNamespace(registry=SimpleNamespace(pool=None, replicas={}))
    gen = Generation(1, GatewayConfig(), services)
    drained: list[Generation] = []
    gen.on_drained = drained.append
    gen.acquire()
    gen.acquire()
    gen.retire()
    assert drained == []  # two requests still on it
    gen.release()
    assert drained == []
    gen.release()
    assert drained == [gen]
    idle = Generation(2, GatewayConfig(), services)
    idle.on_drained = drained.append
    idle.retire()  # nothing in flight: drained at once
    assert drained == [gen, idle]


async def test_a_stream_finishes_on_the_generation_it_started_with_when_its_model_is_removed(
        gateway: tuple[FastAPI, ConfigReloader, Path]) -> None:
    app, reloader, path = gateway
    old = reloader.current
    rt: Any = old.services.registry.llm("a")
    held = HeldBackend([[i] for i in rt.tokenizer.encode(" one two three")])
    rt.backend = held
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        assert await model_ids(client) == ["a", "b"]
        stream = asyncio.create_task(client.post(CHAT, headers=AUTH, json={
            "model": "a", "messages": [{"role": "user", "content": "Hi"}], "stream": True, "max_tokens": 10}))
        await held.started.wait()
        assert old.active == 1

        write_config(path, ["b", "c"])
        assert await reloader.reload("test")
        new = reloader.current
        assert new is not old and new.number == 2
        fake_all(new.services)
        assert app.state.gateway.services is new.services
        assert app.state.gateway.limiter.models == {"b", "c"}
        assert await model_ids(client) == ["b", "c"]  # at once, while the old stream runs
        gone = await client.post(CHAT, headers=AUTH, json={"model": "a", "messages": [{"role": "user",
                                                                                       "content": "Hi"}]})
        assert gone.status_code == 404, gone.text
        added = await client.post(CHAT, headers=AUTH, json={"model": "c", "messages": [{"role": "user",
                                                                                        "content": "Hi"}]})
        assert added.status_code == 200 and added.json()["choices"][0]["message"]["content"] == " fresh"
        assert old.retired and not old.closed  # its stream is still running

        held.go.set()
        r = await stream
        assert r.status_code == 200, r.text
        text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                       for line in r.text.splitlines() if line.startswith("data: {"))
        assert text == " one two three" and held.completed == 1
        await until(lambda: old.closed)
        assert reloader.retired == [] and not new.closed
    assert reloads(app, "ok") == 1 and reloads(app, "refused") == 0


async def test_a_bad_config_is_refused_and_the_old_one_keeps_serving(
        gateway: tuple[FastAPI, ConfigReloader, Path], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app, reloader, path = gateway
    old = reloader.current
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}{{ m['content'] }", encoding="utf-8")
    breakages: dict[str, tuple[str, Any]] = {"unknown field": ("chat_templte", "x.jinja"),
                                             "missing tokenizer": ("path", str(tmp_path / "nowhere")),
                                             "bad template": ("chat_template", str(bad))}
    for n, broken in enumerate(["invalid json", *breakages]):
        write_config(path, ["a", "b", "c"])
        if broken == "invalid json":
            text = path.read_text()[:-5]
        else:
            data = json.loads(path.read_text())
            key, value = breakages[broken]
            data["llm"][2][key] = value
            text = json.dumps(data)
        path.write_text(text, encoding="utf-8")
        caplog.clear()
        with caplog.at_level(logging.ERROR, logger="openai_api.reload"):
            assert not await reloader.reload("test"), broken
        assert reloader.current is old and not old.retired
        refusals = [r for r in caplog.records if "config not reloaded" in r.getMessage()]
        assert len(refusals) == 1 and str(path) in refusals[0].getMessage(), (broken, caplog.text)
        assert reloads(app, "refused") == n + 1 and reloads(app, "ok") == 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        assert await model_ids(client) == ["a", "b"]
        r = await client.post(CHAT, headers=AUTH, json={"model": "a", "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200, r.text


async def test_an_unchanged_file_is_no_reload_but_sighup_rebuilds_and_a_new_template_renders_the_next_request(
        gateway: tuple[FastAPI, ConfigReloader, Path], tmp_path: Path) -> None:
    app, reloader, path = gateway
    first = reloader.current
    path.write_text(path.read_text())  # touched, same bytes
    assert not await reloader.reload("file changed")
    assert reloader.current is first
    assert await reloader.reload("SIGHUP", force=True)  # asked for: rebuilt even so (a template file may have changed)
    assert reloader.current.number == 2

    template = tmp_path / "marked.jinja"
    template.write_text("{% for m in messages %}RELOADED {{ m['content'] }}\n{% endfor %}"
                        "{% if add_generation_prompt %}A:{% endif %}", encoding="utf-8")
    write_config(path, ["a", "b"], template=template)
    assert await reloader.reload("file changed")
    rt: Any = reloader.current.services.registry.llm("a")
    fake = FakeBackend([[i] for i in rt.tokenizer.encode(" ok")])
    rt.backend = fake
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        r = await client.post(CHAT, headers=AUTH, json={"model": "a", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 200, r.text
    assert rt.tokenizer.decode(fake.requests[0].prompt_ids).startswith("RELOADED Hi")
    assert reloads(app, "ok") == 2
    await until(lambda: first.closed)


async def test_a_process_started_from_an_older_load_of_the_file_serves_the_file_as_it_is_now(tmp_path: Path) -> None:
    """A worker restarted after a reload gets the supervisor's start-up config; the file has changed since."""
    path = write_config(tmp_path / "model_config.json", ["a"])
    config = load_config(path)
    write_config(path, ["a", "b"])
    app = create_app(config, Settings(config_file=path, api_keys=["k"]))
    reloader = app.state.gateway.reloader
    assert isinstance(reloader, ConfigReloader)
    await reloader.start()
    try:
        assert reloader.current.number == 2
        assert sorted(app.state.gateway.services.registry.llms) == ["a", "b"]
    finally:
        await app.state.gateway.process.close()


async def test_one_sighup_handler_reloads_the_keys_file_then_the_model_config_and_is_gone_after_close(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The process owns SIGHUP (`openai_api.process`): one handler, installed by `start()`, reloads the keys file and
    the model config (rebuilt although unchanged: only a forced reload does that, never the file poll); after
    `close()` SIGHUP is ignored, not the default kill."""
    path = write_config(tmp_path / "model_config.json", ["a"])
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "first", "secret_sha256": hashlib.sha256(b"sk-1").hexdigest()}]}),
                    encoding="utf-8")
    process = GatewayProcess(load_config(path), Settings(config_file=path, keys_file=keys))
    fake_all(process.services)
    previous = signal.getsignal(signal.SIGHUP)
    caplog.set_level(logging.INFO)
    try:
        await process.start()
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(1200):  # (a hang guard only: the reload loads a tokenizer in a thread)
            if process.reloader.current.number == 2:
                break
            await asyncio.sleep(0.05)
        assert process.reloader.current.number == 2
        assert [r.getMessage() for r in caplog.records if r.name == "openai_api.keys"
                and "reloaded (SIGHUP)" in r.getMessage()]
        await process.close()
        assert signal.getsignal(signal.SIGHUP) == signal.SIG_IGN
    finally:
        await process.close()
        signal.signal(signal.SIGHUP, previous)
