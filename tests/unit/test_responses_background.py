"""`background: true` on `/v1/responses` over the real app and a fake backend: stored `queued` and returned at once,
polled to its end, cancelled (the generation closed), owned by its key, capped per key, holding its in-flight slot,
and never left `in_progress` forever by a worker that stopped (SQLite store, as after a restart)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from openai_api.app import create_app
from openai_api.quota.caller import Caller
from openai_api.quota.keys import ANONYMOUS
from openai_api.services.backends import InstrumentedLLMBackend
from openai_api.services.response_background import STOPPED
from openai_api.services.stored_responses import StoredResponse
from openai_api.settings import Settings
from openai_api.triton.llm import GenerationChunk, GenerationRequest
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config


class HeldBackend(FakeBackend):
    """Plays its script only once `go` is set: a generation that is still running when the test looks."""

    def __init__(self, script: list[list[int]]) -> None:
        super().__init__(script)
        self.go = asyncio.Event()
        self.started = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        self.started.set()
        await self.go.wait()
        async for chunk in super().generate(request):
            yield chunk


def make_app(tmp_path: Path, **settings: Any) -> FastAPI:
    return create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path, **{"responses_store": 16,
                                                                                  **settings}))


@pytest.fixture
async def app(tmp_path: Path) -> AsyncIterator[FastAPI]:
    app = make_app(tmp_path, responses_background_max=2)
    await app.state.gateway.services.parts.start()
    yield app
    await app.state.gateway.process.close()


def held(app: FastAPI, text: str = "Background answer.") -> HeldBackend:
    rt = app.state.gateway.services.registry.llm(MODEL)
    fake = HeldBackend([[i] for i in rt.tokenizer.encode(text)])
    rt.backend = fake
    return fake


async def call(app: FastAPI, method: str, path: str, body: dict[str, Any] | None = None,
               key: str | None = None) -> httpx.Response:
    headers = {"authorization": f"Bearer {key}"} if key else {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        return await c.request(method, path, json=body, headers=headers)


async def start(app: FastAPI, key: str | None = None, **body: Any) -> httpx.Response:
    return await call(app, "POST", "/v1/responses", {"model": MODEL, "input": "Hi", "background": True, **body}, key)


async def poll(app: FastAPI, rid: str, until: tuple[str, ...] = ("completed", "incomplete", "failed", "cancelled"),
               key: str | None = None) -> dict[str, Any]:
    for _ in range(200):
        body: dict[str, Any] = (await call(app, "GET", f"/v1/responses/{rid}", key=key)).json()
        if body["status"] in until:
            return body
        await asyncio.sleep(0.01)
    raise AssertionError(f"{rid} stayed {body['status']}")


async def test_a_background_response_is_queued_at_once_and_polled_to_its_end(app: FastAPI,
                                                                             validate: Callable[..., None]) -> None:
    fake = held(app)
    r = await start(app)
    assert r.status_code == 200, r.text
    queued = r.json()
    validate("Response", queued)
    assert queued["status"] == "queued" and queued["background"] is True and queued["store"] is True
    assert queued["output"] == [] and "usage" not in queued
    await fake.started.wait()
    running = await poll(app, queued["id"], ("in_progress",))
    validate("Response", running)
    limiter = app.state.gateway.limiter
    assert limiter.per_model.get(MODEL) == 1  # its in-flight slot outlived the POST
    fake.go.set()
    done = await poll(app, queued["id"])
    validate("Response", done)
    assert done["status"] == "completed" and done["background"] is True
    assert done["output"][0]["content"][0]["text"] == "Background answer." and done["usage"]["output_tokens"] > 0
    await asyncio.sleep(0)
    assert limiter.per_model.get(MODEL) == 0
    # A finished background response continues a conversation like any stored one.
    script = FakeBackend([[i] for i in app.state.gateway.services.registry.llm(MODEL).tokenizer.encode("Yes.")])
    app.state.gateway.services.registry.llm(MODEL).backend = script
    nxt = await call(app, "POST", "/v1/responses", {"model": MODEL, "input": "Sure?", "previous_response_id":
                                                     done["id"]})
    assert nxt.status_code == 200 and "Background answer." in script.requests[0].prompt_text


async def test_cancel_stops_the_generation_and_is_idempotent(app: FastAPI, validate: Callable[..., None]) -> None:
    fake = held(app)
    rid = (await start(app)).json()["id"]
    await fake.started.wait()
    r = await call(app, "POST", f"/v1/responses/{rid}/cancel")
    assert r.status_code == 200, r.text
    validate("Response", r.json())
    assert r.json()["status"] == "cancelled"
    assert (await call(app, "GET", f"/v1/responses/{rid}")).json()["status"] == "cancelled"
    assert (await call(app, "POST", f"/v1/responses/{rid}/cancel")).json()["status"] == "cancelled"
    assert fake.completed == 0 and app.state.gateway.limiter.per_model.get(MODEL) == 0
    # A finished one is returned as it ended.
    fake = held(app)
    fake.go.set()
    rid = (await start(app)).json()["id"]
    await poll(app, rid)
    assert (await call(app, "POST", f"/v1/responses/{rid}/cancel")).json()["status"] == "completed"


async def test_what_background_needs_and_refuses(app: FastAPI, tmp_path: Path) -> None:
    fake = held(app)
    fake.go.set()
    plain = (await call(app, "POST", "/v1/responses", {"model": MODEL, "input": "Hi", "store": True})).json()
    r = await call(app, "POST", f"/v1/responses/{plain['id']}/cancel")
    assert r.status_code == 400 and "background" in r.json()["error"]["message"]
    assert (await call(app, "POST", "/v1/responses/resp_nope/cancel")).status_code == 404
    assert (await start(app, store=False)).json()["error"]["param"] == "store"
    assert (await start(app, stream=True)).json()["error"]["param"] == "stream"
    r = await start(app, input=[{"type": "bogus"}])  # a bad request is its 4xx at once, never a failed task
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].type"
    bare = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path))
    try:
        r = await start(bare)
        assert r.status_code == 400 and r.json()["error"]["code"] == "response_store_disabled"
    finally:
        await bare.state.gateway.process.close()


async def test_a_key_runs_at_most_its_cap_at_once(app: FastAPI) -> None:
    fake = held(app)
    first, second = (await start(app)).json(), (await start(app)).json()
    r = await start(app)
    assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_background_responses"
    fake.go.set()
    await poll(app, first["id"])
    await poll(app, second["id"])
    assert (await start(app)).status_code == 200


async def test_another_key_cannot_see_or_cancel_it(tmp_path: Path) -> None:
    app = make_app(tmp_path, api_keys=["sk-1", "sk-2"])
    await app.state.gateway.services.parts.start()
    try:
        fake = held(app)
        rid = (await start(app, key="sk-1")).json()["id"]
        assert (await call(app, "GET", f"/v1/responses/{rid}", key="sk-2")).status_code == 404
        assert (await call(app, "POST", f"/v1/responses/{rid}/cancel", key="sk-2")).status_code == 404
        fake.go.set()
        assert (await poll(app, rid, key="sk-1"))["status"] == "completed"
    finally:
        await app.state.gateway.process.close()


async def test_a_stopped_workers_response_is_failed_not_in_progress_forever(tmp_path: Path,
                                                                           validate: Callable[..., None]) -> None:
    url = f"sqlite://{tmp_path / 'store'}"
    app = make_app(tmp_path, responses_store_url=url)
    await app.state.gateway.services.parts.start()
    held(app)
    rid = (await start(app)).json()["id"]
    await poll(app, rid, ("in_progress",))
    await app.state.gateway.process.close()  # a worker shutting down marks its own at once
    restarted = make_app(tmp_path, responses_store_url=url)
    await restarted.state.gateway.services.parts.start()
    try:
        gone = (await call(restarted, "GET", f"/v1/responses/{rid}")).json()
        validate("Response", gone)
        assert gone["status"] == "failed" and gone["error"]["code"] == "server_error"
        # One whose worker died without a word: in progress in the store, its lease run out.
        store = restarted.state.gateway.services.responses.store
        anon = Caller(ANONYMOUS)  # the caller of a gateway without keys
        stuck = {**gone, "id": "resp_" + "ab" * 24, "status": "in_progress", "error": None}
        await store.put(anon, MODEL, StoredResponse(stuck, [], [], time.time() - 1))
        body = (await call(restarted, "GET", f"/v1/responses/{stuck['id']}")).json()
        assert body["status"] == "failed" and body["error"]["message"] == STOPPED
        alive = {**stuck, "id": "resp_" + "cd" * 24}  # another worker still vouches for this one
        await store.put(anon, MODEL, StoredResponse(alive, [], [], time.time() + 30))
        assert (await call(restarted, "GET", f"/v1/responses/{alive['id']}")).json()["status"] == "in_progress"
        r = await call(restarted, "POST", f"/v1/responses/{alive['id']}/cancel")
        assert r.json()["status"] == "cancelled"
    finally:
        await restarted.state.gateway.process.close()


# --- token quotas: a background response's tokens are settled like a request's --------------------------------
METERED = "sk-metered"


@pytest.fixture
async def metered(tmp_path: Path) -> AsyncIterator[FastAPI]:
    """A key with a token rate and a daily budget (both counted), and the real metrics wrapper over the fake (where
    a generation reserves its tokens)."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "metered", "secret_sha256": hashlib.sha256(METERED.encode())
                                          .hexdigest(), "tokens_per_minute": 100_000, "tokens_per_day": 100_000}]}),
                    encoding="utf-8")
    app = make_app(tmp_path, keys_file=keys, responses_background_max=4)
    await app.state.gateway.services.parts.start()
    yield app
    await app.state.gateway.process.close()


def instrumented(app: FastAPI, fake: FakeBackend) -> FakeBackend:
    state = app.state.gateway
    state.services.registry.llm(MODEL).backend = InstrumentedLLMBackend(fake, state.metrics, MODEL)
    return fake


async def key_usage(app: FastAPI) -> dict[str, Any]:
    quota = app.state.gateway.quota
    caller = quota.identify(METERED.encode())
    used: dict[str, Any] = await quota.store.usage(caller.name, quota.limits(caller))
    return used


async def test_background_responses_settle_their_tokens_to_their_usage(metered: FastAPI) -> None:
    """Each reserves prompt + max_output_tokens while it runs; once it is shown completed, the key has used exactly
    what the responses' `usage` says (the oracle: their usage, summed here), not the reservations."""
    rt = metered.state.gateway.services.registry.llm(MODEL)
    fake = instrumented(metered, HeldBackend([[i] for i in rt.tokenizer.encode("Background answer.")]))
    first = await start(metered, METERED, max_output_tokens=500)
    assert first.status_code == 200, first.text
    await fake.started.wait()
    running = await key_usage(metered)
    fake.go.set()
    done = [await poll(metered, first.json()["id"], key=METERED)]
    for _ in range(2):
        r = await start(metered, METERED, max_output_tokens=500)
        done.append(await poll(metered, r.json()["id"], key=METERED))
    assert [d["status"] for d in done] == ["completed"] * 3
    # While the first ran, its prompt and all 500 output tokens were held.
    assert running["tokens_today"] == done[0]["usage"]["input_tokens"] + 500
    used = await key_usage(metered)
    spent = sum(d["usage"]["total_tokens"] for d in done)
    assert 0 < spent < 500 and used["tokens_today"] == spent and used["tokens_in_window"] == spent
    assert used["concurrent"] == 0


async def test_a_cancelled_or_failed_background_response_settles_what_it_used(metered: FastAPI) -> None:
    rt = metered.state.gateway.services.registry.llm(MODEL)
    script_ids = [[i] for i in rt.tokenizer.encode("Background answer.")]
    instrumented(metered, FakeBackend(script_ids))
    whole = await poll(metered, (await start(metered, METERED, max_output_tokens=500)).json()["id"], key=METERED)
    prompt = whole["usage"]["input_tokens"]  # the same input below: the same prompt
    spent = whole["usage"]["total_tokens"]
    held_fake = instrumented(metered, HeldBackend(script_ids))
    r = await start(metered, METERED, max_output_tokens=500)
    await held_fake.started.wait()  # reserved: prompt + 500
    cancelled = await call(metered, "POST", f"/v1/responses/{r.json()['id']}/cancel", key=METERED)
    assert cancelled.json()["status"] == "cancelled"
    spent += prompt  # its prompt was read; nothing was generated
    assert (await key_usage(metered))["tokens_today"] == spent
    instrumented(metered, FakeBackend(script_ids, fail_at=2))
    failed = await poll(metered, (await start(metered, METERED, max_output_tokens=500)).json()["id"], key=METERED)
    assert failed["status"] == "failed"
    spent += prompt + 2  # two tokens made before the backend failed
    assert (await key_usage(metered))["tokens_today"] == spent


class FirstThenHeld(FakeBackend):
    """Its first token at once, the rest once `go` is set."""

    def __init__(self, script: list[list[int]]) -> None:
        super().__init__(script)
        self.go = asyncio.Event()
        self.first = asyncio.Event()

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        first = True
        async for chunk in super().generate(request):
            yield chunk
            if first:
                first = False
                self.first.set()
                await self.go.wait()


async def test_a_batch_class_background_response_stops_counting_as_starting_at_its_first_token(
        tmp_path: Path) -> None:
    """--batch-prefills-per-model: a `service_tier: flex` background response hands its slot to the background
    work, and the first token it waits for comes there: from then the next batch request may start, while the
    response still runs."""
    app = make_app(tmp_path, responses_background_max=2, max_queue_per_model=4, batch_prefills_per_model=1)
    state = app.state.gateway
    await state.services.parts.start()
    try:
        rt = state.services.registry.llm(MODEL)
        fake = FirstThenHeld([[i] for i in rt.tokenizer.encode("Background answer.")])
        rt.backend = InstrumentedLLMBackend(fake, state.metrics, MODEL)  # type: ignore[arg-type]
        r = await start(app, service_tier="flex")
        assert r.status_code == 200, r.text
        await fake.first.wait()
        await asyncio.sleep(0)
        scheduler = state.limiter.scheduler
        assert state.limiter.per_model.get(MODEL) == 1 and scheduler.batch_held.get(MODEL) == 1
        assert scheduler.batch_starting.get(MODEL) == 0
        fake.go.set()
        assert (await poll(app, r.json()["id"]))["status"] == "completed"
        await asyncio.sleep(0)
        assert scheduler.batch_held.get(MODEL) == 0 and scheduler.batch_starting.get(MODEL) == 0
    finally:
        await state.process.close()
