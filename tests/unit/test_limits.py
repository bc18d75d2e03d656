"""The guard middleware, the stall guard and the metrics in-process (no Triton): raw ASGI where the
exact bytes matter (a malformed Content-Length, a chunked body), the real app over a fake backend
elsewhere."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from openai_api.errors import BackendTimeoutError
from openai_api.http.guard import GuardMiddleware
from openai_api.http.inflight import InFlightLimiter
from openai_api.http.lifecycle import Lifecycle
from openai_api.observability import Metrics
from openai_api.triton.errors import map_triton_error
from openai_api.triton.rpc import StallGuard


def guard(app: Any, max_body: int = 100, max_total: int = 10) -> GuardMiddleware:
    return GuardMiddleware(app, max_body_bytes=max_body, limiter=InFlightLimiter(max_total, 10, 3, set()),
                           lifecycle=Lifecycle(), metrics=Metrics())


def scope(headers: list[tuple[bytes, bytes]] | None = None, method: str = "POST") -> dict[str, Any]:
    return {"type": "http", "method": method, "path": "/v1/embeddings", "headers": headers or [], "state": {}}


async def call(app: Any, sc: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[int, dict[str, str], bytes]:
    queue = list(messages)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if queue:
            return queue.pop(0)
        await asyncio.sleep(3600)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await asyncio.wait_for(app(sc, receive, send), 10)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, body


async def echo(scope: Any, receive: Any, send: Any) -> None:
    msg = await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": msg["body"]})


@pytest.mark.parametrize("value", [b"abc", b"-1", b"1e3", b"12 34", b""])
async def test_malformed_content_length_is_400_in_openai_shape(value: bytes) -> None:
    status, _, body = await call(guard(echo), scope([(b"content-length", value)]),
                                 [{"type": "http.request", "body": b"{}"}])
    assert status == 400
    assert json.loads(body)["error"]["code"] == "invalid_content_length"


async def test_declared_content_length_over_the_limit_is_413_before_reading() -> None:
    status, headers, body = await call(guard(echo), scope([(b"content-length", b"101")]), [])
    assert status == 413
    assert headers["connection"] == "close"
    assert json.loads(body)["error"]["type"] == "invalid_request_error"


async def test_chunked_body_is_counted_exact_limit_passes_one_more_byte_is_413() -> None:
    parts = [{"type": "http.request", "body": b"x" * 50, "more_body": True},
             {"type": "http.request", "body": b"y" * 50, "more_body": False}]
    status, _, body = await call(guard(echo), scope(), parts)
    assert (status, body) == (200, b"x" * 50 + b"y" * 50)
    parts[1]["body"] = b"y" * 51
    status, _, body = await call(guard(echo), scope(), parts)
    assert status == 413
    assert json.loads(body)["error"]["code"] == "payload_too_large"


async def test_the_route_admits_once_and_the_guard_gives_the_slots_back() -> None:
    """Admission is the route's one call (`request_ticket(scope).admit`), global and per model at once; the
    guard middleware returns the slots when the response is done, a stream's only after its last byte."""
    from openai_api.errors import GatewayError
    from openai_api.http.inflight import request_ticket
    from openai_api.http.middleware import send_error

    release = asyncio.Event()

    async def slow(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        ticket = request_ticket(scope)
        assert ticket is not None
        try:
            await ticket.acquire("m")
        except GatewayError as e:
            await send_error(scope, send, e)
            return
        await release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    app = GuardMiddleware(slow, max_body_bytes=100, limiter=InFlightLimiter(2, 10, 3, {"m"}), lifecycle=Lifecycle(),
                          metrics=Metrics())
    first = [asyncio.create_task(call(app, scope(), [{"type": "http.request", "body": b""}])) for _ in range(2)]
    await asyncio.sleep(0.05)
    assert app.limiter.total == 2 and app.limiter.per_model["m"] == 2
    status, headers, body = await call(app, scope(), [{"type": "http.request", "body": b""}])
    assert status == 429
    assert headers["retry-after"] == "3"
    assert json.loads(body)["error"]["type"] == "rate_limit_error"
    release.set()
    assert [(await t)[0] for t in first] == [200, 200]
    assert app.limiter.total == 0 and app.limiter.per_model["m"] == 0
    # A request that takes no slot (a read) is never limited.
    status, _, _ = await call(guard(echo, max_total=0), scope(method="GET"), [{"type": "http.request", "body": b""}])
    assert status == 200


async def test_client_disconnect_cancels_a_non_streaming_handler() -> None:
    cancelled = asyncio.Event()

    async def forever(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    app = guard(forever)
    messages = [{"type": "http.request", "body": b"{}"}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop(0)
        await asyncio.sleep(0.1)
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        raise AssertionError("nothing is sent to a client that left")

    await asyncio.wait_for(app(scope(), receive, send), 5)  # returns normally: the cancellation is its own
    assert cancelled.is_set()
    assert app.limiter.total == 0


async def test_draining_answers_503_except_liveness() -> None:
    app = guard(echo)
    app.lifecycle.draining = True
    status, headers, body = await call(app, scope(), [{"type": "http.request", "body": b""}])
    assert status == 503 and headers["connection"] == "close"
    assert json.loads(body)["error"]["code"] == "shutting_down"
    live = {**scope(method="GET"), "path": "/health"}
    assert (await call(app, live, [{"type": "http.request", "body": b"ok"}]))[0] == 200


async def test_stall_guard_ends_a_silent_stream_but_not_a_slow_consumer() -> None:
    async def tokens(gaps: list[float]) -> AsyncIterator[int]:
        for i, gap in enumerate(gaps):
            await asyncio.sleep(gap)
            yield i

    async def consume(gaps: list[float], consumer_delay: float) -> list[int]:
        got = []
        async with StallGuard(0.2, "m") as g:
            async for t in tokens(gaps):
                g.hold()
                got.append(t)
                await asyncio.sleep(consumer_delay)  # a slow client holding the chunk: not a stall
                g.touch()
        return got

    assert await consume([0.01] * 3, consumer_delay=0.5) == [0, 1, 2]
    with pytest.raises(BackendTimeoutError) as e:
        await consume([0.01, 1.0, 0.01], consumer_delay=0)
    assert e.value.status == 504 and e.value.code == "stream_stalled"
    assert await consume([0.01], consumer_delay=0) == [0]  # the task is not left cancelled


async def test_stall_guard_waits_for_a_first_item_while_triton_answers_its_probe() -> None:
    """Before the first item (queued, prefilling, or a one-response answer) silence is judged by asking
    Triton: alive -> keep waiting; no answer -> stalled. After the first item, silence alone is a stall."""
    probes: list[float] = []

    def prober(alive: bool) -> Any:
        async def probe(timeout: float) -> bool:
            probes.append(timeout)
            if not alive:
                await asyncio.sleep(timeout)  # a frozen Triton: the probe times out
            return alive

        return probe

    async def consume(gaps: list[float], alive: bool) -> list[int]:
        got = []
        async with StallGuard(0.1, "m", probe=prober(alive)) as g:
            for i, gap in enumerate(gaps):
                await asyncio.sleep(gap)
                g.hold()
                got.append(i)
                g.touch()
        return got

    assert await consume([0.55, 0.01], alive=True) == [0, 1]  # five idle periods before the one response
    assert len(probes) >= 3 and all(t == 0.1 for t in probes)
    with pytest.raises(BackendTimeoutError) as e:
        await consume([0.55], alive=False)
    assert e.value.code == "stream_stalled"
    probes.clear()
    with pytest.raises(BackendTimeoutError):
        await consume([0.01, 0.5], alive=True)  # progress was shown, then none: a stall, whatever the probe says
    assert probes == []


def test_grpc_and_http_transport_errors_map_to_503_and_504() -> None:
    class RpcError(Exception):
        def __init__(self, code: str, details: str) -> None:
            self._code, self._details = code, details

        def code(self) -> Any:
            return type("Code", (), {"name": self._code})()

        def details(self) -> str:
            return self._details

    assert map_triton_error(RpcError("UNAVAILABLE", "Socket closed"), "m").status == 503
    assert map_triton_error(RpcError("DEADLINE_EXCEEDED", "Deadline Exceeded"), "m").status == 504
    assert map_triton_error(ConnectionResetError("reset"), "m").status == 503
    err = map_triton_error(Exception("Request for unknown model: 'm' has no available versions"), "m")
    assert err.status == 503 and "'m'" in err.message
    assert map_triton_error(Exception("input_ids: bad shape"), "m").status == 502


async def test_metrics_and_access_log_over_the_fake_backend(caplog: pytest.LogCaptureFixture) -> None:
    import tempfile
    from pathlib import Path

    from openai_api.app import create_app
    from openai_api.settings import Settings
    from tests.unit.test_http_layer import FakeBackend, llm_only_config  # needs the prepared tokenizer

    with tempfile.TemporaryDirectory() as folder:
        config = llm_only_config(Path(folder))
    app = create_app(config, Settings(config_file=Path("x"), api_keys=["secret-key-123"]))
    rt = app.state.gateway.services.registry.llm("smollm2-135m-instruct")
    fake = FakeBackend([[i] for i in rt.tokenizer.encode("Hello there, friend")])
    rt.backend.inner = fake  # keep the metrics wrapper, replace the adapter
    auth = {"Authorization": "Bearer secret-key-123", "X-Request-Id": "rid-42"}
    caplog.set_level("INFO")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        body = {"model": "smollm2-135m-instruct", "messages": [{"role": "user", "content": "zebra-prompt-77"}]}
        r = await c.post("/v1/chat/completions", json={**body, "stream": True}, headers=auth)
        assert r.status_code == 200 and r.headers["x-request-id"] == "rid-42"
        assert fake.requests[0].request_id == "rid-42"  # the id Triton gets
        assert (await c.get("/metrics")).status_code == 401
        text = (await c.get("/metrics", headers=auth)).text
    await app.state.gateway.services.registry.pool.close()
    assert 'openai_api_requests_total{model="smollm2-135m-instruct",route="/v1/chat/completions",status="200"} 1.0' \
        in text
    assert 'openai_api_time_to_first_token_seconds_count{model="smollm2-135m-instruct"} 1.0' in text
    assert 'openai_api_completion_tokens_total{model="smollm2-135m-instruct"}' in text
    for process_metric in ("process_resident_memory_bytes ", "process_cpu_seconds_total ", "process_open_fds ",
                           "process_max_fds "):
        assert process_metric in text, process_metric
    lines = [r.getMessage() for r in caplog.records if r.name == "openai_api.access"]
    chat_line = next(line for line in lines if "path=/v1/chat/completions" in line)
    for field in ("method=POST", "status=200", "request_id=rid-42", "model=smollm2-135m-instruct",
                  "duration_ms=", "completion_tokens="):
        assert field in chat_line, chat_line
    everything = "\n".join(r.getMessage() for r in caplog.records)
    assert "secret-key-123" not in everything and "zebra-prompt-77" not in everything


def test_stream_idle_timeout_reaches_every_llm_adapter(tmp_path: Any) -> None:
    from openai_api.app import create_app
    from openai_api.settings import Settings
    from tests.unit.test_http_layer import llm_only_config

    app = create_app(llm_only_config(tmp_path), Settings(config_file=tmp_path, stream_idle_timeout_s=7.5))
    for rt in app.state.gateway.services.registry.llms.values():
        inner = rt.backend.inner  # under the metrics wrapper
        assert inner.stream_idle_timeout_s == 7.5


def test_fan_out_takes_a_slot_per_sequence_from_both_limits() -> None:
    from openai_api.errors import InvalidRequestError, OverloadedError
    from openai_api.http.inflight import Ticket

    lim = InFlightLimiter(max_total=5, max_per_model=4, retry_after_s=1, models={"m", "x"})
    t = Ticket(lim)
    asyncio.run(t.acquire("m", 3))
    assert (lim.total, lim.per_model["m"]) == (3, 3)
    other = Ticket(lim)
    with pytest.raises(OverloadedError):
        asyncio.run(other.acquire("m", 2))  # 3 + 2 > 4 for the model
    with pytest.raises(InvalidRequestError) as e:
        asyncio.run(other.acquire("m", 5, "prompt"))  # more than any limit could grant
    assert e.value.param == "prompt" and e.value.code == "too_many_sequences"
    assert (lim.total, lim.per_model["m"]) == (3, 3)  # a refused request takes nothing
    with pytest.raises(OverloadedError) as o:
        asyncio.run(other.acquire("x", 3))  # the model has room, the server does not: 3 + 3 > 5
    assert "server" in o.value.message and lim.total == 3
    t.release()
    assert (lim.total, lim.per_model["m"]) == (0, 0)
