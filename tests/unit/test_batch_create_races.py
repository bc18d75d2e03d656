"""`batches.create` against a file deleted or expiring at the same moment (services/batches.py, stored/batches.py,
stored/batches_redis.py): the job is made with its input pinned, or the create is a clean 404 - never a job whose
input was swept as it was made (it would end `failed`, `file_not_found`). Each test forces one interleaving by
running the other party's step inside the store call that precedes it, on SQLite and on Redis (`either_app`)."""

# ruff: noqa: F811 - the tests take the fixtures imported below as their arguments
from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.unit.test_batch_jobs import either_app  # noqa: F401 - fixture
from tests.unit.test_batches import A, backend, jsonl  # noqa: F401 - fixtures
from tests.unit.test_object_stores import redis_url  # noqa: F401 - a real redis-server, as a fixture

HOUR = 3600
BODY = {"endpoint": "/v1/chat/completions", "completion_window": "24h"}


async def hour_file(client: httpx.AsyncClient) -> dict[str, Any]:
    r = await client.post("/v1/files", headers=A, files={"file": ("in.jsonl", jsonl(3), "text/plain")},
                          data={"purpose": "batch", "expires_after[anchor]": "created_at",
                                "expires_after[seconds]": str(HOUR)})
    assert r.status_code == 200, r.text
    return dict(r.json())


def fake_clock(app: FastAPI) -> list[float]:
    now = [1_700_000_000.0]
    app.state.gateway.batches.clock = lambda: now[0]
    return now


async def no_batches(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/batches", headers=A)).json()["data"] == []


async def test_a_file_deleted_between_the_check_and_the_insert_is_a_404(either_app: FastAPI,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The owner's delete lands after create found the file live and before the job is stored: no job, a 404."""
    store = either_app.state.gateway.batches.store
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=either_app), base_url="http://gateway") as client:
        file = (await client.post("/v1/files", headers=A, data={"purpose": "batch"},
                                  files={"file": ("in.jsonl", jsonl(3), "text/plain")})).json()
        insert = store.create_batch

        async def deleted_first(*args: Any) -> Any:
            assert (await client.delete(f"/v1/files/{file['id']}", headers=A)).status_code == 200
            return await insert(*args)

        monkeypatch.setattr(store, "create_batch", deleted_first)
        r = await client.post("/v1/batches", headers=A, json={"input_file_id": file["id"], **BODY})
        assert r.status_code == 404, r.text
        assert r.json()["error"]["param"] == "input_file_id"
        await no_batches(client)
        assert not store.path(file["id"]).exists()


async def test_a_file_expiring_and_swept_between_the_check_and_the_insert_is_a_404(
        either_app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    """The file is live when create checks it; the clock then passes its expiry and the sweep deletes it before
    the job is stored: no job, a 404."""
    service = either_app.state.gateway.batches
    store = service.store
    now = fake_clock(either_app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=either_app), base_url="http://gateway") as client:
        file = await hour_file(client)
        now[0] += HOUR - 1
        insert = store.create_batch

        async def swept_first(*args: Any) -> Any:
            now[0] += 2
            assert await service.sweep(10) == 1
            return await insert(*args)

        monkeypatch.setattr(store, "create_batch", swept_first)
        r = await client.post("/v1/batches", headers=A, json={"input_file_id": file["id"], **BODY})
        assert r.status_code == 404, r.text
        await no_batches(client)
        assert not store.path(file["id"]).exists()


async def test_a_job_made_after_the_sweep_listed_its_file_keeps_the_file(either_app: FastAPI,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep lists the file as expired (its gateway's clock a little ahead), then another gateway, whose clock
    still has it live, makes a job on it before the sweep deletes it: the sweep leaves it (pinned), and the job
    reads its lines."""
    service = either_app.state.gateway.batches
    store = service.store
    now = fake_clock(either_app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=either_app), base_url="http://gateway") as client:
        file = await hour_file(client)
        listed = store.expired_files
        made: list[dict[str, Any]] = []

        async def then_made(when: int, most: int) -> Any:
            found = await listed(when, most)
            assert [f for f, _ in found] == [file["id"]]
            now[0] -= 5  # the other gateway's clock: the file is live there
            r = await client.post("/v1/batches", headers=A, json={"input_file_id": file["id"], **BODY})
            now[0] += 5
            assert r.status_code == 200, r.text
            made.append(r.json())
            return found

        now[0] += HOUR + 1
        monkeypatch.setattr(store, "expired_files", then_made)
        assert await service.sweep(10) == 0
        monkeypatch.setattr(store, "expired_files", listed)
        assert store.path(file["id"]).exists()
        job = await store.get_batch(None, made[0]["id"])
        lines = await service.validate(job)
        assert lines is not None and len(lines) == 3
