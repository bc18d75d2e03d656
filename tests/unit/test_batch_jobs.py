"""The Batch API's runner beyond one job (http/batch_slots.py, http/batch_runner.py, services/batches.py): fairness
between keys and jobs, expiry of files and jobs on a fake clock, a cancelled job whose file fails its check, and
the priority class its lines carry to the backend. Fixtures and helpers: test_batches.py (the unit tier's fake
backend; the oracle is what the test sent)."""

# ruff: noqa: F811 - the tests take test_batches.py's fixtures (imported below) as their arguments
from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG
from openai_api.quota.keys import api_key_digest
from openai_api.services.backends import InstrumentedLLMBackend
from openai_api.settings import Settings
from tests.unit.fakes import FakeBackend, llm_only_config
from tests.unit.test_batches import (  # noqa: F401 - fixtures
    MODEL,
    A,
    B,
    SlowBackend,
    app,
    backend,
    client,
    jsonl,
    run_until,
    runner,
    upload,
    wait_status,
)
from tests.unit.test_object_stores import redis_url  # noqa: F401 - a real redis-server, as a fixture


async def test_fair_slots_alternate_between_keys_and_jobs() -> None:
    """FairSlots alone: with one slot, waiters of two owners are served A, B, A, B...; one owner's jobs in turn."""
    from openai_api.http.batch_slots import FairSlots

    slots = FairSlots(1)
    await slots.acquire("a")  # held: everything below waits
    order: list[str] = []

    async def take(owner: str, name: str) -> None:
        await slots.acquire(owner)
        order.append(name)

    tasks = [asyncio.create_task(take(o, n)) for o, n in
             [("a", "a1"), ("a", "a2"), ("a", "a3"), ("b", "b1"), ("b", "b2"), ("c", "c1")]]
    await asyncio.sleep(0)
    cancelled = tasks[1]
    cancelled.cancel()  # a waiter that leaves gives up its turn, and no slot is lost
    await asyncio.sleep(0)
    for _ in range(5):
        slots.release()
        await asyncio.sleep(0)
    await asyncio.gather(*(t for t in tasks if t is not cancelled))
    assert order == ["a1", "b1", "c1", "a3", "b2"]
    assert slots.used == 1


def test_claim_order_and_victim_spread_jobs_over_keys() -> None:
    from openai_api.http.batch_slots import claim_order, victim

    waiting = [("j1", "a"), ("j2", "a"), ("j3", "a"), ("j4", "b"), ("j5", "c")]
    assert claim_order(waiting, {}) == ["j1", "j4", "j5", "j2", "j3"]
    assert claim_order(waiting, {"a": 1, "b": 2}) == ["j5", "j1", "j2", "j4", "j3"]
    assert victim({"r1": "a", "r2": "a", "r3": "b"}, [("j5", "c")]) == "r2"  # a's newest
    assert victim({"r1": "a", "r2": "b"}, [("j5", "c")]) is None  # no key runs two
    assert victim({"r1": "a", "r2": "a"}, [("j5", "a")]) is None  # the waiting key runs one already


async def test_a_huge_job_does_not_starve_another_keys_small_job(app: FastAPI, client: httpx.AsyncClient,
                                                                  backend: SlowBackend) -> None:
    """Two job places and one line slot: key A's two 30-line jobs run; key B's 3-line job made later gets one of
    A's places (A's newest gives it back, unfinished) and every other line slot, so it ends long before A's jobs;
    A's jobs still answer each line once."""
    backend.delay = 0.01
    jobs_a = []
    for _ in range(2):
        file = (await upload(client, jsonl(30))).json()
        jobs_a.append((await client.post("/v1/batches", headers=A, json={
            "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})).json())
    run = runner(app, concurrency=1)
    run.max_jobs = 2
    await run.start()
    try:
        for job in jobs_a:
            await wait_status(client, f"/v1/batches/{job['id']}", lambda b: b["request_counts"]["completed"] >= 1)
        file = (await upload(client, jsonl(3), B)).json()
        small = (await client.post("/v1/batches", headers=B, json={
            "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})).json()
        await wait_status(client, f"/v1/batches/{small['id']}", lambda b: b["status"] == "completed", B)
        answered = [len(await app.state.gateway.batches.store.done(j["id"])) for j in jobs_a]
        assert sum(answered) < 30, answered  # B did not wait for one of A's jobs to end
        for job in jobs_a:
            done = await wait_status(client, f"/v1/batches/{job['id']}", lambda b: b["status"] == "completed")
            assert done["request_counts"] == {"total": 30, "completed": 30, "failed": 0}
    finally:
        await run.close()
    assert backend.completed == 63  # each line once


async def test_files_expire_then_404_and_are_swept(app: FastAPI, client: httpx.AsyncClient,
                                                   openai_schema: Callable[[str, Any], None]) -> None:
    """`expires_after` (the SDK's multipart form) sets `expires_at`; OpenAI's bounds are 400s; past it the file is a
    404 at once, and the sweep deletes it from the store and the disk, a bounded number per call. A fake clock."""
    service = app.state.gateway.batches
    now = [1_700_000_000.0]
    service.clock = lambda: now[0]
    form = {"purpose": "batch", "expires_after[anchor]": "created_at", "expires_after[seconds]": "3600"}
    r = await client.post("/v1/files", headers=A, data=form, files={"file": ("in.jsonl", jsonl(1), "text/plain")})
    assert r.status_code == 200, r.text
    short = r.json()
    openai_schema("OpenAIFile", short)
    assert short["created_at"] == 1_700_000_000 and short["expires_at"] == 1_700_003_600
    default = (await upload(client, jsonl(1))).json()
    assert default["expires_at"] == 1_700_000_000 + 30 * 86400  # OpenAI's default for batch files
    for bad in ({"expires_after[seconds]": "60"}, {"expires_after[seconds]": "2592001"},
                {"expires_after[anchor]": "last_active_at"}, {"expires_after[seconds]": "soon"}):
        r = await client.post("/v1/files", headers=A, data={**form, **bad},
                              files={"file": ("in.jsonl", jsonl(1), "text/plain")})
        assert r.status_code == 400 and r.json()["error"]["param"] == "expires_after", (bad, r.text)
    assert (await client.get(f"/v1/files/{short['id']}", headers=A)).status_code == 200
    now[0] += 3600
    for path in (f"/v1/files/{short['id']}", f"/v1/files/{short['id']}/content"):
        assert (await client.get(path, headers=A)).status_code == 404, path
    assert [f["id"] for f in (await client.get("/v1/files", headers=A)).json()["data"]] == [default["id"]]
    r = await client.post("/v1/batches", headers=A, json={"input_file_id": short["id"], "endpoint":
                          "/v1/chat/completions", "completion_window": "24h"})
    assert r.status_code == 404
    store = service.store
    assert store.path(short["id"]).exists()  # not swept yet
    more = [(await upload(client, jsonl(1))).json()["id"] for _ in range(2)]
    now[0] += 30 * 86400
    assert await service.sweep(3) == 3 and await service.sweep(3) == 1 and await service.sweep(3) == 0
    for file_id in (short["id"], default["id"], *more):
        assert not store.path(file_id).exists() and await store.get_file(
            f"key:api-key:{api_key_digest(b'key-a')}", file_id) is None


async def test_a_batch_past_its_window_expires(app: FastAPI, client: httpx.AsyncClient, backend: SlowBackend,
                                               openai_schema: Callable[[str, Any], None]) -> None:
    """Past `expires_at` no new line starts: the job ends `expired` (`expired_at`), its answered lines in the output
    file, each unrun line `batch_expired` in the error file; `output_expires_after` dates both files."""
    service = app.state.gateway.batches
    now = [1_700_000_000.0]
    service.clock = lambda: now[0]
    file = (await upload(client, jsonl(6))).json()
    r = await client.post("/v1/batches", headers=A, json={
        "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h",
        "output_expires_after": {"anchor": "created_at", "seconds": 7200}})
    batch = r.json()
    assert batch["expires_at"] == 1_700_000_000 + 86400
    backend.gate.clear()
    backend.free = 2
    run = runner(app, concurrency=1)
    await run.start()
    try:
        await wait_status(client, f"/v1/batches/{batch['id']}", lambda b: b["request_counts"]["completed"] >= 2)
        now[0] += 86400  # the window passes with the third line in flight
        backend.gate.set()
        done = await wait_status(client, f"/v1/batches/{batch['id']}", lambda b: b["status"] == "expired")
    finally:
        await run.close()
    openai_schema("Batch", done)
    assert done["expired_at"] == 1_700_000_000 + 86400 and "completed_at" not in done
    assert done["request_counts"] == {"total": 6, "completed": 3, "failed": 3}
    out = (await client.get(f"/v1/files/{done['output_file_id']}/content", headers=A)).content
    assert [json.loads(x)["custom_id"] for x in out.splitlines()] == ["r0", "r1", "r2"]
    errors = [json.loads(x) for x in (await client.get(f"/v1/files/{done['error_file_id']}/content",
                                                       headers=A)).content.splitlines()]
    assert [x["custom_id"] for x in errors] == ["r3", "r4", "r5"]
    assert all(x["response"] is None and x["error"]["code"] == "batch_expired" for x in errors)
    for file_id in (done["output_file_id"], done["error_file_id"]):
        meta = (await client.get(f"/v1/files/{file_id}", headers=A)).json()
        assert meta["purpose"] == "batch_output" and meta["expires_at"] == meta["created_at"] + 7200


async def test_the_class_reaches_the_backend_batch_lines_as_batch(app: FastAPI, client: httpx.AsyncClient,
                                                                  backend: SlowBackend) -> None:
    """What the Triton adapters send as `priority` (`RequestStats.priority_class`, set at admission): a batch line's
    class is `batch` whatever its body asks; an HTTP request's is what it asks (service_tier), else standard."""
    from openai_api.observability import current_stats

    seen: list[str | None] = []
    plain = backend.generate

    def generate(request: Any) -> Any:
        stats = current_stats()
        seen.append(stats.priority_class if stats is not None else None)
        return plain(request)

    backend.generate = generate  # type: ignore[method-assign]
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for extra in ({}, {"service_tier": "priority"}, {"service_tier": "flex"}):
        assert (await client.post("/v1/chat/completions", headers=A, json={**body, **extra})).status_code == 200
    assert seen == ["standard", "interactive", "batch"]
    file = (await upload(client, jsonl(2, service_tier="priority"))).json()
    batch = (await client.post("/v1/batches", headers=A, json={
        "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})).json()
    await run_until(app, client, f"/v1/batches/{batch['id']}", lambda b: b["status"] == "completed")
    assert seen[3:] == ["batch", "batch"]


async def test_a_bad_file_cancelled_before_it_was_checked_still_ends(app: FastAPI, client: httpx.AsyncClient) -> None:
    """Cancelled while `validating`, its file bad: the check still ends it (`failed`), never a job left
    `cancelling` that every runner takes up again."""
    file = (await upload(client, b"not json\n")).json()
    batch = (await client.post("/v1/batches", headers=A, json={"input_file_id": file["id"], "endpoint":
                               "/v1/chat/completions", "completion_window": "24h"})).json()
    assert (await client.post(f"/v1/batches/{batch['id']}/cancel", headers=A)).json()["status"] == "cancelling"
    done = await run_until(app, client, f"/v1/batches/{batch['id']}", lambda b: b["status"] not in (
        "validating", "cancelling"))
    assert done["status"] == "failed" and done["errors"]["data"][0]["code"] == "invalid_json_line"


@pytest.fixture(params=["sqlite", "redis"])
async def either_app(request: pytest.FixtureRequest, tmp_path: Path, backend: SlowBackend) -> AsyncIterator[FastAPI]:
    """test_batches.py's `app`, over the embedded SQLite store or over Redis (a fresh database)."""
    url = None
    if request.param == "redis":
        url = request.getfixturevalue("redis_url")
    settings = Settings(config_file=BUNDLED_CONFIG, api_keys=["key-a", "key-b"], batch_dir=tmp_path / "batches",
                        batch_store_url=url, batch_max_jobs_per_key=3)
    made = create_app(llm_only_config(tmp_path, url="127.0.0.1:1"), settings)
    state = made.state.gateway
    if url is not None:
        await state.batches.store.redis.flushdb()
    state.services.registry.llm(MODEL).backend = InstrumentedLLMBackend(  # type: ignore[arg-type]
        backend, state.metrics, MODEL)
    yield made
    await state.batches.store.close()
    await state.services.registry.pool.close()


async def test_an_input_file_expiring_mid_batch_is_kept_until_the_batch_ends(either_app: FastAPI,
                                                                             backend: SlowBackend) -> None:
    """A batch's input file expires while the gateway is down mid-batch: its owner sees a 404 for it at once, but
    the sweep keeps its bytes (pinned by the unfinished batch, counted per batch: another batch on the same file
    that ended gives its pin back, not this one's) and sweeps other expired files past it; the restarted runner
    resumes and answers every line once; the sweep deletes the file once the batch has ended. A fake clock."""
    app = either_app
    service = app.state.gateway.batches
    store = service.store
    now = [1_700_000_000.0]
    service.clock = lambda: now[0]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        def hour_file(content: bytes) -> Any:
            return client.post("/v1/files", headers=A, files={"file": ("in.jsonl", content, "text/plain")},
                               data={"purpose": "batch", "expires_after[anchor]": "created_at",
                                     "expires_after[seconds]": "3600"})

        pinned = (await hour_file(jsonl(8))).json()
        base = {"input_file_id": pinned["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}
        batch = (await client.post("/v1/batches", headers=A, json=base)).json()
        ended = (await client.post("/v1/batches", headers=A, json=base)).json()
        await store.update(ended["id"], "failed", {"failed_at": int(now[0])})  # ended at once: its pin goes
        now[0] += 1
        loose = (await hour_file(jsonl(1))).json()  # expires after the pinned one: behind it in the sweep's order
        backend.gate.clear()
        backend.free = 3
        first = runner(app, concurrency=1)
        await first.start()
        await wait_status(client, f"/v1/batches/{batch['id']}", lambda b: b["request_counts"]["completed"] >= 3)
        await first.close()  # the gateway stops with the 4th line in flight
        answered = len(await store.done(batch["id"]))
        assert 3 <= answered < 8

        now[0] += 2 * 3600  # down past the input file's expiry, well inside the batch's 24 h window
        assert (await client.get(f"/v1/files/{pinned['id']}", headers=A)).status_code == 404  # expired to its owner
        assert await service.sweep(1) == 1  # the unpinned file, though the pinned one expired first
        assert await store.get_file(_owner(), loose["id"]) is None
        assert await service.sweep(10) == 0 and store.path(pinned["id"]).exists()

        backend.gate.set()
        # The restarted gateway.
        done = await run_until(app, client, f"/v1/batches/{batch['id']}", lambda b: b["status"] == "completed")
        assert done["request_counts"] == {"total": 8, "completed": 8, "failed": 0}
        assert "errors" not in done
        out = (await client.get(f"/v1/files/{done['output_file_id']}/content", headers=A)).content
        assert [json.loads(x)["custom_id"] for x in out.splitlines()] == [f"r{i}" for i in range(8)]
        assert backend.completed == 8  # each line once (the one in flight at the stop never completed)
        await service.sweep(10)  # the batch ended: its input goes (if the runner's own sweep has not taken it)
        assert not store.path(pinned["id"]).exists() and await store.get_file(_owner(), pinned["id"]) is None
        assert (await client.get(f"/v1/files/{done['output_file_id']}", headers=A)).status_code == 200  # 30 days


def _owner() -> str:
    return f"key:api-key:{api_key_digest(b'key-a')}"


async def test_an_input_file_deleted_mid_batch_is_kept_until_the_batch_ends(either_app: FastAPI,
                                                                           backend: SlowBackend) -> None:
    """Its owner deletes a running batch's input file, then the gateway restarts: the file is gone for the owner at
    once (`deleted`, then 404, not listed, not deletable twice), the restarted runner still resumes the batch and
    answers every line once, and the file's bytes go once the batch has ended. A file no batch uses goes at once."""
    app = either_app
    service = app.state.gateway.batches
    store = service.store
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        file = (await upload(client, jsonl(6))).json()
        batch = (await client.post("/v1/batches", headers=A, json={
            "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})).json()
        backend.gate.clear()
        backend.free = 2
        first = runner(app, concurrency=1)
        await first.start()
        await wait_status(client, f"/v1/batches/{batch['id']}", lambda b: b["request_counts"]["completed"] >= 2)
        r = await client.delete(f"/v1/files/{file['id']}", headers=A)
        assert r.status_code == 200 and r.json() == {"id": file["id"], "object": "file", "deleted": True}
        await first.close()  # the restart, after the delete

        assert (await client.get(f"/v1/files/{file['id']}", headers=A)).status_code == 404
        assert (await client.delete(f"/v1/files/{file['id']}", headers=A)).status_code == 404
        assert file["id"] not in [f["id"] for f in (await client.get("/v1/files", headers=A)).json()["data"]]
        assert await service.sweep(10) == 0 and store.path(file["id"]).exists()
        backend.gate.set()
        second = runner(app, concurrency=2)
        await second.start()
        try:
            done = await wait_status(client, f"/v1/batches/{batch['id']}", lambda b: b["status"] == "completed")
        finally:
            await second.close()
        assert done["request_counts"] == {"total": 6, "completed": 6, "failed": 0} and backend.completed == 6
        await service.sweep(10)  # (if the runner's own sweep has not taken it)
        assert not store.path(file["id"]).exists() and await store.get_file(_owner(), file["id"]) is None

        unused = (await upload(client, jsonl(1))).json()
        assert (await client.delete(f"/v1/files/{unused['id']}", headers=A)).status_code == 200
        assert not store.path(unused["id"]).exists() and await store.get_file(_owner(), unused["id"]) is None


@pytest.mark.parametrize("turns", [0, 1, 2])
async def test_closing_the_runner_ends_its_loop_when_a_wake_races_the_cancel(app: FastAPI, turns: int) -> None:
    """close() returns even when the loop's wait for its next poll ends in the same turn as the cancel arrives (a
    job ending wakes the loop just as close() cancels it): Python 3.11's `asyncio.wait_for` then returns what it
    waited for and swallows the cancel, so the loop polled on for ever and close() never returned - a full test run
    hung 25 minutes on it. `turns`: event-loop turns between the wake and the cancel, to meet each interleaving."""
    for _ in range(5):
        run = runner(app, concurrency=0)
        await run.start()
        await asyncio.sleep(0.01)  # the loop has polled and waits for the next poll
        run.wake.set()
        for _ in range(turns):
            await asyncio.sleep(0)
        closing = asyncio.ensure_future(run.close())
        done, _ = await asyncio.wait({closing}, timeout=5)  # (not wait_for: it would return once close() is cancelled)
        assert done, "close() did not return"
        assert run._task is not None and run._task.done(), "the runner's loop outlived close()"


class _SlowUnlink:
    """A file path whose `unlink` takes a while (in the store's thread), so a cancel lands while it runs."""

    def __init__(self, path: Path) -> None:
        self.real = path

    def unlink(self, missing_ok: bool = False) -> None:
        import time

        time.sleep(0.3)
        self.real.unlink(missing_ok=missing_ok)


@pytest.mark.parametrize("either_app", ["redis"], indirect=True)
async def test_a_sweep_cancelled_between_record_and_bytes_still_removes_the_bytes(either_app: FastAPI) -> None:
    """The Redis store drops a file's record, then unlinks its bytes; the runner's close() cancels its sweep at any
    moment. Cancelled in between, the sweep still removes the bytes before the cancel reaches its caller: nothing
    would look for them again (the record is gone). Without that, the close left them on disk for good."""
    service = either_app.state.gateway.batches
    store = service.store
    now = [1_700_000_000.0]
    service.clock = lambda: now[0]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=either_app), base_url="http://gateway") as client:
        r = await client.post("/v1/files", headers=A, files={"file": ("in.jsonl", jsonl(1), "text/plain")},
                              data={"purpose": "batch", "expires_after[anchor]": "created_at",
                                    "expires_after[seconds]": "3600"})
        file_id = r.json()["id"]
    real = store.path(file_id)
    assert real.exists()
    now[0] += 7200
    store.path = lambda fid: _SlowUnlink(real) if fid == file_id else Path(real.parent / fid)
    sweep = asyncio.create_task(service.sweep(1))
    for _ in range(200):  # until the record is gone and the unlink has started
        if await store.get_file(_owner(), file_id) is None:
            break
        await asyncio.sleep(0.005)
    await asyncio.sleep(0.05)
    sweep.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sweep
    assert not real.exists()


class FirstTokenGate(FakeBackend):
    """Each generation waits for its own `release` before its first token (a prompt still being prefilled)."""

    def __init__(self) -> None:
        super().__init__([[7], [8]])
        self.gates: list[asyncio.Event] = []

    async def generate(self, request: Any) -> Any:  # type: ignore[override]
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        async for chunk in super().generate(request):
            yield chunk


@pytest.mark.parametrize("prefills", [0, 1])
async def test_batch_lines_start_one_at_a_time_under_batch_prefills(tmp_path: Path, prefills: int) -> None:
    """--batch-prefills-per-model 1: with three lines allowed in flight, the second line reaches the backend only
    once the first one's first token came back (its prompt's prefill done), and so on; without it, all three at
    once. An interactive request is never held by a starting batch line."""
    gated = FirstTokenGate()
    config = llm_only_config(tmp_path, url="127.0.0.1:1")
    settings = Settings(config_file=BUNDLED_CONFIG, api_keys=["key-a"], batch_dir=tmp_path / "batches",
                        max_queue_per_model=16, batch_slot_share=1.0, batch_prefills_per_model=prefills)
    app = create_app(config, settings)
    state = app.state.gateway
    state.services.registry.llm(MODEL).backend = InstrumentedLLMBackend(gated, state.metrics, MODEL)  # type: ignore[arg-type]

    async def reached(n: int) -> None:
        for _ in range(2000):
            if len(gated.gates) >= n:
                return
            await asyncio.sleep(0.005)
        raise AssertionError(f"{len(gated.gates)} generations reached the backend, waited for {n}")

    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
            file = (await upload(client, jsonl(3))).json()
            batch = (await client.post("/v1/batches", headers=A, json={
                "input_file_id": file["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"})).json()
            run = runner(app, concurrency=3)
            await run.start()
            try:
                if prefills:
                    await reached(1)
                    await asyncio.sleep(0.2)  # time enough for the runner to send its other lines
                    assert len(gated.gates) == 1
                    chat = asyncio.create_task(client.post("/v1/chat/completions", headers=A, json={
                        "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                        "service_tier": "priority"}))
                    await reached(2)  # the interactive request is not held
                    gated.gates[1].set()
                    assert (await chat).status_code == 200
                    for gate, reaching in ((0, 3), (2, 4)):  # the first line's first token, then the second's
                        gated.gates[gate].set()
                        await reached(reaching)
                        await asyncio.sleep(0.2)
                        assert len(gated.gates) == reaching
                    gated.gates[3].set()
                else:
                    await reached(3)
                    for gate in gated.gates:
                        gate.set()
                done = await wait_status(client, f"/v1/batches/{batch['id']}", lambda b: b["status"] == "completed")
            finally:
                await run.close()
        assert done["request_counts"] == {"total": 3, "completed": 3, "failed": 0}
        # Whole answers, yet a line whose first token is waited for asks Triton for per-token responses (one
        # response would come only at its end); the chat, whose first token nobody waits for, does not.
        assert [r.stream_tokens for r in gated.requests] == ([False, True, True, True] if prefills else [False] * 3)
        scheduler = state.limiter.scheduler
        assert not scheduler.batch_starting.get(MODEL) and not scheduler.batch_held.get(MODEL)
    finally:
        await state.batches.store.close()
        await state.services.registry.pool.close()
