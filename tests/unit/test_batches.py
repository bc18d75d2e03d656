"""The Batch API in-process (services/batches.py, http/batch_runner.py, stored/batches.py): OpenAI's files and
batches validated against OpenAI's vendored description, Anthropic's message batches, owners, bounds, cancel, and
a runner that stops mid-job and a new one that resumes (each line answered once).

The backend is the unit tier's scripted fake; the oracle for every count is what the test sent."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG, GatewayConfig
from openai_api.http.batch_runner import BatchRunner
from openai_api.quota.keys import api_key_digest
from openai_api.services.backends import InstrumentedLLMBackend
from openai_api.settings import Settings
from tests.helpers import missing_models
from tests.unit.fakes import FakeBackend, llm_only_config
from tests.unit.test_object_stores import redis_url  # noqa: F401 - a real redis-server, as a fixture

MODEL = "smollm2-135m-instruct"
A, B = {"Authorization": "Bearer key-a"}, {"Authorization": "Bearer key-b"}

if reason := missing_models(MODEL):
    pytest.skip(reason, allow_module_level=True)


class SlowBackend(FakeBackend):
    """Past `free` generations, each waits on `gate` first (a test holds lines in flight)."""

    def __init__(self) -> None:
        super().__init__([[7], [8]])
        self.gate = asyncio.Event()
        self.gate.set()
        self.free = 1 << 30
        self.started = 0
        self.delay = 0.0

    async def generate(self, request: Any) -> Any:  # type: ignore[override]
        self.started += 1
        if self.started > self.free:
            await self.gate.wait()
        if self.delay:
            await asyncio.sleep(self.delay)
        async for chunk in super().generate(request):
            yield chunk


@pytest.fixture
def backend() -> SlowBackend:
    return SlowBackend()


@pytest.fixture
async def app(tmp_path: Path, backend: SlowBackend) -> AsyncIterator[FastAPI]:
    config: GatewayConfig = llm_only_config(tmp_path, url="127.0.0.1:1")
    settings = Settings(config_file=BUNDLED_CONFIG, api_keys=["key-a", "key-b"], batch_dir=tmp_path / "batches",
                        batch_max_lines=50, batch_max_jobs_per_key=3, batch_max_file_bytes=20_000)
    app = create_app(config, settings)
    state = app.state.gateway
    rt = state.services.registry.llm(MODEL)
    rt.backend = InstrumentedLLMBackend(backend, state.metrics, MODEL)  # type: ignore[arg-type]
    yield app
    await state.batches.store.close()
    await state.services.registry.pool.close()


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c


def runner(app: FastAPI, concurrency: int = 2) -> BatchRunner:
    state = app.state.gateway
    return BatchRunner(app, state.batches, state.quota, concurrency)


def jsonl(n: int, url: str = "/v1/chat/completions", **extra: Any) -> bytes:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                            **extra}
    return b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": url, "body": body}).encode() + b"\n"
                    for i in range(n))


async def upload(client: httpx.AsyncClient, content: bytes, headers: dict[str, str] = A) -> httpx.Response:
    return await client.post("/v1/files", headers=headers, data={"purpose": "batch"},
                             files={"file": ("in.jsonl", content, "application/jsonl")})


async def wait_status(client: httpx.AsyncClient, path: str, done: Callable[[dict[str, Any]], bool],
                      headers: dict[str, str] = A) -> dict[str, Any]:
    # A deadline in time, not a count of polls: each poll's own time grows with the machine's load (a Redis
    # store's round trips too), and 400 polls were once not enough for a job of 8 lines at load 6-13.
    deadline = time.monotonic() + 30
    while True:
        got: dict[str, Any] = (await client.get(path, headers=headers)).json()
        if done(got):
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} never got there: {got}")
        await asyncio.sleep(0.02)


async def run_until(app: FastAPI, client: httpx.AsyncClient, path: str,
                    done: Callable[[dict[str, Any]], bool], concurrency: int = 2) -> dict[str, Any]:
    """Run the app's batch runner until the object at `path` is `done`; that object."""
    run = runner(app, concurrency)
    await run.start()
    try:
        return await wait_status(client, path, done)
    finally:
        await run.close()


async def test_openai_batch_end_to_end(app: FastAPI, client: httpx.AsyncClient,
                                       openai_schema: Callable[[str, Any], None]) -> None:
    r = await upload(client, jsonl(5))
    assert r.status_code == 200, r.text
    file = r.json()
    openai_schema("OpenAIFile", file)
    assert file["purpose"] == "batch" and file["bytes"] == len(jsonl(5))
    r = await client.post("/v1/batches", headers=A, json={"input_file_id": file["id"], "endpoint":
                          "/v1/chat/completions", "completion_window": "24h", "metadata": {"run": "1"}})
    assert r.status_code == 200, r.text
    batch = r.json()
    openai_schema("Batch", batch)
    assert batch["status"] == "validating" and batch["request_counts"]["total"] == 5
    done = await run_until(app, client, f"/v1/batches/{batch['id']}", lambda b: b["status"] == "completed")
    openai_schema("Batch", done)
    assert done["request_counts"] == {"total": 5, "completed": 5, "failed": 0}
    assert "error_file_id" not in done
    out = (await client.get(f"/v1/files/{done['output_file_id']}/content", headers=A)).content
    lines = [json.loads(x) for x in out.splitlines()]
    assert [x["custom_id"] for x in lines] == [f"r{i}" for i in range(5)]
    for x in lines:
        assert set(x) == {"id", "custom_id", "response", "error"} and x["error"] is None  # no schema in the spec
        assert x["response"]["status_code"] == 200
        openai_schema("CreateChatCompletionResponse", x["response"]["body"])
    listing = (await client.get("/v1/batches", headers=A)).json()
    openai_schema("ListBatchesResponse", listing)
    assert [b["id"] for b in listing["data"]] == [batch["id"]]
    files = (await client.get("/v1/files", headers=A)).json()
    openai_schema("ListFilesResponse", files)
    assert {f["purpose"] for f in files["data"]} == {"batch", "batch_output"}
    gone = (await client.delete(f"/v1/files/{file['id']}", headers=A)).json()
    openai_schema("DeleteFileResponse", gone)
    assert (await client.get(f"/v1/files/{file['id']}", headers=A)).status_code == 404


async def test_another_key_sees_nothing(client: httpx.AsyncClient) -> None:
    file = (await upload(client, jsonl(1))).json()
    batch = (await client.post("/v1/batches", headers=A, json={"input_file_id": file["id"], "endpoint":
                               "/v1/chat/completions", "completion_window": "24h"})).json()
    for path in (f"/v1/files/{file['id']}", f"/v1/files/{file['id']}/content", f"/v1/batches/{batch['id']}"):
        r = await client.get(path, headers=B)
        assert r.status_code == 404 and r.json()["error"]["type"] == "invalid_request_error", path
    assert (await client.post(f"/v1/batches/{batch['id']}/cancel", headers=B)).status_code == 404
    assert (await client.delete(f"/v1/files/{file['id']}", headers=B)).status_code == 404
    r = await client.post("/v1/batches", headers=B, json={"input_file_id": file["id"], "endpoint":
                          "/v1/chat/completions", "completion_window": "24h"})
    assert r.status_code == 404
    assert (await client.get("/v1/batches", headers=B)).json()["data"] == []
    assert (await client.get("/v1/files", headers=B)).json()["data"] == []


@pytest.mark.parametrize(("content", "errors"), [
    (b"not json\n", [("invalid_json_line", None, 1)]),
    (jsonl(1) + b"[1]\n", [("invalid_json_line", None, 2)]),
    (jsonl(3).replace(b'"r1"', b'"r0"'), [("duplicate_custom_id", "custom_id", 2)]),
    (jsonl(1) + jsonl(1, url="/v1/embeddings").replace(b'"r0"', b'"e0"'), [("url_mismatch", "url", 2)]),
    (jsonl(2).replace(b'"method": "POST", ', b""), [("missing_required_parameter", "method", 1),
                                                   ("missing_required_parameter", "method", 2)]),
    (jsonl(1).replace(b'"POST"', b'"GET"'), [("invalid_value", "method", 1)]),
    (b'{"custom_id": "x", "method": "POST", "url": "/v1/chat/completions", "body": []}\n',
     [("invalid_value", "body", 1)]),
    (b'{"method": "POST", "url": "/v1/chat/completions", "body": {}}\n',
     [("missing_required_parameter", "custom_id", 1)]),
    (jsonl(51), [("too_many_tasks", None, None)]),
    (b"\n\n", [("empty_batch", None, None)]),
])
async def test_bad_input_files_fail_the_batch(app: FastAPI, client: httpx.AsyncClient,
                                              openai_schema: Callable[[str, Any], None], content: bytes,
                                              errors: list[tuple[str, str | None, int | None]]) -> None:
    """As OpenAI: the upload is taken, the batch is made (`validating`), then `failed` with `errors` naming each
    bad line (1-based); no line of the file runs."""
    r = await upload(client, content)
    assert r.status_code == 200, r.text
    r = await client.post("/v1/batches", headers=A, json={"input_file_id": r.json()["id"], "endpoint":
                          "/v1/chat/completions", "completion_window": "24h"})
    assert r.status_code == 200 and r.json()["status"] == "validating", r.text
    done = await run_until(app, client, f"/v1/batches/{r.json()['id']}", lambda b: b["status"] == "failed")
    openai_schema("Batch", done)
    assert done["failed_at"] >= done["created_at"] and done["errors"]["object"] == "list"
    assert [(e["code"], e["param"], e["line"]) for e in done["errors"]["data"]] == errors
    assert all(e["message"] for e in done["errors"]["data"])
    assert done["request_counts"]["completed"] == 0 and "output_file_id" not in done


async def test_too_large_uploads_are_400s(client: httpx.AsyncClient) -> None:
    r = await upload(client, jsonl(200))
    assert r.status_code == 400 and "takes at most 20000" in r.json()["error"]["message"]


async def test_bad_batches_are_400s(client: httpx.AsyncClient) -> None:
    file = (await upload(client, jsonl(1))).json()
    base = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
    for change, param in [({"endpoint": "/v1/images"}, "endpoint"), ({"completion_window": "1h"},
                          "completion_window"), ({"metadata": {str(i): "x" for i in range(17)}}, "metadata"),
                          ({"output_expires_after": {"anchor": "created_at", "seconds": 59}}, "output_expires_after"),
                          ({"output_expires_after": {"anchor": "now", "seconds": 3600}}, "output_expires_after")]:
        r = await client.post("/v1/batches", headers=A, json={**base, **change})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, (change, r.text)
    r = await client.post("/v1/files", headers=A, data={"purpose": "fine-tune"},
                          files={"file": ("in.jsonl", jsonl(1), "application/jsonl")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
    for _ in range(3):
        assert (await client.post("/v1/batches", headers=A, json=base)).status_code == 200
    r = await client.post("/v1/batches", headers=A, json=base)
    assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_batches"


async def test_restart_resumes_and_answers_each_line_once(app: FastAPI, client: httpx.AsyncClient,
                                                          backend: SlowBackend) -> None:
    file = (await upload(client, jsonl(12))).json()
    batch = (await client.post("/v1/batches", headers=A, json={"input_file_id": file["id"], "endpoint":
                               "/v1/chat/completions", "completion_window": "24h"})).json()
    store = app.state.gateway.batches.store
    backend.gate.clear()
    backend.free = 5  # the 6th and later lines hang in the backend: the "process" stops with them in flight
    first = runner(app, concurrency=2)
    await first.start()
    await wait_status(client, f"/v1/batches/{batch['id']}", lambda b: b["request_counts"]["completed"] >= 5)
    await asyncio.sleep(0.05)
    await first.close()
    assert len(await store.done(batch["id"])) == 5
    backend.gate.set()
    # A new gateway process on the same store.
    done = await run_until(app, client, f"/v1/batches/{batch['id']}", lambda b: b["status"] == "completed", 3)
    assert done["request_counts"] == {"total": 12, "completed": 12, "failed": 0}
    out = (await client.get(f"/v1/files/{done['output_file_id']}/content", headers=A)).content
    assert [json.loads(x)["custom_id"] for x in out.splitlines()] == [f"r{i}" for i in range(12)]


async def test_cancel_half_way(app: FastAPI, client: httpx.AsyncClient, backend: SlowBackend) -> None:
    file = (await upload(client, jsonl(10))).json()
    batch = (await client.post("/v1/batches", headers=A, json={"input_file_id": file["id"], "endpoint":
                               "/v1/chat/completions", "completion_window": "24h"})).json()
    backend.gate.clear()
    backend.free = 3
    run = runner(app, concurrency=1)
    await run.start()
    try:
        await wait_status(client, f"/v1/batches/{batch['id']}", lambda b: b["request_counts"]["completed"] >= 3)
        r = await client.post(f"/v1/batches/{batch['id']}/cancel", headers=A)
        assert r.json()["status"] == "cancelling" and r.json()["cancelling_at"]
        backend.gate.set()
        done = await wait_status(client, f"/v1/batches/{batch['id']}", lambda b: b["status"] == "cancelled")
    finally:
        await run.close()
    completed = done["request_counts"]["completed"]
    assert completed == 4 and done["cancelled_at"]  # 3, and the one in flight when the cancel came
    out = (await client.get(f"/v1/files/{done['output_file_id']}/content", headers=A)).content
    assert len(out.splitlines()) == completed


async def test_errors_go_to_the_error_file(app: FastAPI, client: httpx.AsyncClient) -> None:
    bad = json.dumps({"custom_id": "nope", "method": "POST", "url": "/v1/chat/completions",
                      "body": {"model": "no-such-model", "messages": [{"role": "user", "content": "x"}]}}).encode()
    file = (await upload(client, jsonl(1) + bad + b"\n")).json()
    batch = (await client.post("/v1/batches", headers=A, json={"input_file_id": file["id"], "endpoint":
                               "/v1/chat/completions", "completion_window": "24h"})).json()
    done = await run_until(app, client, f"/v1/batches/{batch['id']}", lambda b: b["status"] == "completed")
    assert done["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    err = json.loads((await client.get(f"/v1/files/{done['error_file_id']}/content", headers=A)).content)
    assert err["custom_id"] == "nope" and err["response"]["status_code"] == 404
    assert err["response"]["body"]["error"]["code"] == "model_not_found"


async def test_anthropic_message_batch(app: FastAPI, client: httpx.AsyncClient) -> None:
    params = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    bad = {k: v for k, v in params.items() if k != "max_tokens"}  # as Anthropic: params are checked as each runs
    r = await client.post("/v1/messages/batches", headers=A, json={"requests": [
        {"custom_id": f"m{i}", "params": params} for i in range(3)] + [{"custom_id": "bad", "params": bad}]})
    assert r.status_code == 200, r.text
    made = r.json()
    assert made["type"] == "message_batch" and made["processing_status"] == "in_progress"
    assert made["request_counts"]["processing"] == 4 and made["results_url"] is None
    r = await client.get(f"/v1/messages/batches/{made['id']}/results", headers=A)
    assert r.status_code == 400 and r.json()["type"] == "error"  # Anthropic's shape
    done = await run_until(app, client, f"/v1/messages/batches/{made['id']}",
                           lambda b: b["processing_status"] == "ended")
    assert done["request_counts"] == {"processing": 0, "succeeded": 3, "errored": 1, "canceled": 0, "expired": 0}
    assert done["results_url"].endswith(f"/v1/messages/batches/{made['id']}/results")
    results = [json.loads(x) for x in (await client.get(done["results_url"], headers=A)).content.splitlines()]
    assert [x["custom_id"] for x in results] == ["m0", "m1", "m2", "bad"]
    assert all(x["result"]["type"] == "succeeded" and x["result"]["message"]["type"] == "message"
               for x in results[:3])
    error = results[3]["result"]
    assert error["type"] == "errored" and error["error"]["type"] == "error"
    assert error["error"]["error"]["type"] == "invalid_request_error" and "max_tokens" in error["error"]["error"][
        "message"]
    assert (await client.get(f"/v1/messages/batches/{made['id']}", headers=B)).status_code == 404
    assert [b["id"] for b in (await client.get("/v1/messages/batches", headers=A)).json()["data"]] == [made["id"]]
    assert (await client.get("/v1/files", headers=A)).json()["data"] == []  # its input is no /v1/files file
    assert (await client.delete(f"/v1/messages/batches/{made['id']}", headers=B)).status_code == 404
    gone = (await client.delete(f"/v1/messages/batches/{made['id']}", headers=A)).json()
    assert gone == {"id": made["id"], "type": "message_batch_deleted"}
    assert (await client.get(f"/v1/messages/batches/{made['id']}", headers=A)).status_code == 404
    for bad in ({"requests": []}, {"requests": [{"custom_id": "bad id!", "params": params}]},
                {"requests": [{"custom_id": "x", "params": params}, {"custom_id": "x", "params": params}]}):
        r = await client.post("/v1/messages/batches", headers=A, json=bad)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", bad


async def test_two_gateways_share_one_redis_store(tmp_path: Path, redis_url: str) -> None:  # noqa: F811
    """Two apps ("gateways") over one Redis and one files folder: a job made through one runs on both runners,
    each line answered once; the other app honours the owner check and the per-key bound."""
    apps, backends = [], []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        config: GatewayConfig = llm_only_config(tmp_path / name, url="127.0.0.1:1")
        settings = Settings(config_file=BUNDLED_CONFIG, api_keys=["key-a", "key-b"], batch_dir=tmp_path / "shared",
                            batch_store_url=redis_url, batch_max_jobs_per_key=2)
        app = create_app(config, settings)
        state = app.state.gateway
        backend = SlowBackend()
        state.services.registry.llm(MODEL).backend = InstrumentedLLMBackend(  # type: ignore[arg-type]
            backend, state.metrics, MODEL)
        apps.append(app)
        backends.append(backend)
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=a), base_url="http://gateway") for a in apps]
    runners = [runner(a, concurrency=2) for a in apps]
    for r_ in runners:
        r_.max_jobs = 1  # one job each at a time: the two jobs go to the two gateways
    try:
        file = (await upload(clients[0], jsonl(16))).json()
        assert (await clients[1].get(f"/v1/files/{file['id']}", headers=A)).json()["id"] == file["id"]
        assert (await clients[1].get(f"/v1/files/{file['id']}", headers=B)).status_code == 404
        base = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        batch = (await clients[0].post("/v1/batches", headers=A, json=base)).json()
        other = (await clients[1].post("/v1/batches", headers=A, json=base)).json()  # made through the other one
        r = await clients[1].post("/v1/batches", headers=A, json=base)
        assert r.status_code == 400 and r.json()["error"]["code"] == "too_many_batches"  # the bound is shared
        for r_ in runners:
            await r_.start()
        for job in (batch, other):
            done = await wait_status(clients[1], f"/v1/batches/{job['id']}", lambda b: b["status"] == "completed")
            assert done["request_counts"] == {"total": 16, "completed": 16, "failed": 0}
            out = (await clients[0].get(f"/v1/files/{done['output_file_id']}/content", headers=A)).content
            assert [json.loads(x)["custom_id"] for x in out.splitlines()] == [f"r{i}" for i in range(16)]
        assert backends[0].completed > 0 and backends[1].completed > 0  # both gateways ran lines
        assert backends[0].completed + backends[1].completed == 32  # and no line twice
        assert (await clients[1].get(f"/v1/batches/{batch['id']}", headers=B)).status_code == 404
        store = apps[0].state.gateway.batches.store
        owner = f"key:api-key:{api_key_digest(b'key-a')}"
        assert not await store.delete_batch("key:someone-else", batch["id"])
        assert await store.delete_batch(owner, batch["id"])
        assert await store.get_batch(None, batch["id"]) is None and await store.done(batch["id"]) == set()
        # Expiry on the shared store: the other gateway's sweep deletes a file made through this one.
        made = (await clients[0].post("/v1/files", headers=A, files={"file": ("x.jsonl", jsonl(1), "text/plain")},
                                      data={"purpose": "batch", "expires_after[anchor]": "created_at",
                                            "expires_after[seconds]": "3600"})).json()
        other_service = apps[1].state.gateway.batches
        other_service.clock = lambda: made["expires_at"] + 1.0
        assert await other_service.sweep(100) >= 1
        assert (await clients[0].get(f"/v1/files/{made['id']}", headers=A)).status_code == 404
        assert await store.get_file(owner, made["id"]) is None and not store.path(made["id"]).exists()
    finally:
        for r_ in runners:
            await r_.close()
        for c in clients:
            await c.aclose()
        for a in apps:
            await a.state.gateway.batches.store.close()
            await a.state.gateway.services.registry.pool.close()


async def test_lines_run_as_the_jobs_key_under_its_budget(tmp_path: Path) -> None:
    """A keys file's key: its lines are counted against its token budget as its HTTP requests would be; once the
    budget is spent the remaining lines are answered with the budget's 429 (recorded, not retried forever)."""
    import hashlib

    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "jobs", "secret_sha256": hashlib.sha256(b"sk-jobs").hexdigest(),
                                          "tokens_per_day": 60, "max_class": "standard"}]}), encoding="utf-8")
    config: GatewayConfig = llm_only_config(tmp_path, url="127.0.0.1:1")
    app = create_app(config, Settings(config_file=BUNDLED_CONFIG, keys_file=keys, batch_dir=tmp_path / "batches"))
    state = app.state.gateway
    state.services.registry.llm(MODEL).backend = InstrumentedLLMBackend(  # type: ignore[arg-type]
        SlowBackend(), state.metrics, MODEL)
    jobs = {"Authorization": "Bearer sk-jobs"}
    run = runner(app, concurrency=1)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        try:
            file = (await upload(client, jsonl(8), jobs)).json()
            batch = (await client.post("/v1/batches", headers=jobs, json={
                "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})).json()
            await run.start()
            done = await wait_status(client, f"/v1/batches/{batch['id']}", lambda b: b["status"] == "completed",
                                     jobs)
            counts = done["request_counts"]
            assert counts["total"] == 8 and counts["completed"] >= 1 and counts["failed"] >= 1
            assert counts["completed"] + counts["failed"] == 8
            errors = (await client.get(f"/v1/files/{done['error_file_id']}/content", headers=jobs)).content
            assert {json.loads(x)["response"]["body"]["error"]["code"] for x in errors.splitlines()} == {
                "insufficient_quota"}
        finally:
            await run.close()
            await state.batches.store.close()
            await state.services.registry.pool.close()


async def test_anthropic_cancel_and_expiry_answer_every_line(app: FastAPI, client: httpx.AsyncClient,
                                                             backend: SlowBackend) -> None:
    """A cancelled message batch: the lines it ran are results, each other line a `canceled` result; a job past
    its window ends `expired`, its unrun lines `expired`."""
    params = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    made = (await client.post("/v1/messages/batches", headers=A, json={"requests": [
        {"custom_id": f"m{i}", "params": params} for i in range(6)]})).json()
    backend.gate.clear()
    backend.free = 2
    run = runner(app, concurrency=1)
    await run.start()
    try:
        await wait_status(client, f"/v1/messages/batches/{made['id']}",
                          lambda b: b["request_counts"]["succeeded"] >= 2)
        r = await client.post(f"/v1/messages/batches/{made['id']}/cancel", headers=A)
        assert r.json()["processing_status"] == "canceling" and r.json()["cancel_initiated_at"]
        backend.gate.set()
        done = await wait_status(client, f"/v1/messages/batches/{made['id']}",
                                 lambda b: b["processing_status"] == "ended")
    finally:
        await run.close()
    counts = done["request_counts"]
    assert counts["succeeded"] == 3 and counts["canceled"] == 3 and counts["processing"] == 0  # 2 + the one in flight
    results = [json.loads(x) for x in (await client.get(done["results_url"], headers=A)).content.splitlines()]
    assert [x["custom_id"] for x in results] == [f"m{i}" for i in range(6)]
    assert [x["result"]["type"] for x in results] == ["succeeded"] * 3 + ["canceled"] * 3

    store = app.state.gateway.batches.store
    late = (await client.post("/v1/messages/batches", headers=A, json={"requests": [
        {"custom_id": "x", "params": params}]})).json()
    await store.update(late["id"], fields={"expires_at": 0})
    done = await run_until(app, client, f"/v1/messages/batches/{late['id']}",
                           lambda b: b["processing_status"] == "ended")
    assert done["request_counts"]["expired"] == 1
    results = [json.loads(x) for x in (await client.get(done["results_url"], headers=A)).content.splitlines()]
    assert results == [{"custom_id": "x", "result": {"type": "expired"}}]
