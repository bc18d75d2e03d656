"""Two real tritonserver replicas behind one gateway: load spreads, a killed replica costs no
non-streaming request, and a restarted one takes load again without a gateway restart."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from openai_api.config import BUNDLED_CONFIG, load_config
from openai_api.embedded.launcher import EmbeddedTriton
from tests.e2e.conftest import API_KEY, LLM, GatewayServer

EMB = "all-minilm-l6-v2"
MODELS = [LLM, EMB]


@pytest.fixture(scope="module")
def replicas() -> Iterator[list[EmbeddedTriton]]:
    servers = [EmbeddedTriton(models=MODELS).start(), EmbeddedTriton(models=MODELS).start()]
    yield servers
    for s in servers:
        s.stop()


@pytest.fixture(scope="module")
def gateway(replicas: list[EmbeddedTriton]) -> Iterator[GatewayServer]:
    config = load_config(BUNDLED_CONFIG)
    config.rerank = []
    config.llm = [m for m in config.llm if m.name == LLM]
    for m in config.all_models():
        m.url = [t.grpc_url if m.transport == "grpc" else t.http_url for t in replicas]
    server = GatewayServer(config, [API_KEY]).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def http(gateway: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=60) as c:
        yield c


def replica_requests(http: httpx.Client, model: str) -> dict[str, int]:
    card = http.get(f"/v1/models/{model}").json()
    return {r["url"]: r["requests"] for r in card["replicas"]}


def embed(http: httpx.Client, i: int) -> int:
    return http.post("/v1/embeddings", json={"model": EMB, "input": f"replica test sentence {i}"}).status_code


def test_load_spreads_across_both_replicas(http: httpx.Client, replicas: list[EmbeddedTriton]) -> None:
    before = replica_requests(http, EMB)
    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(lambda i: embed(http, i), range(40))) == {200}
    after = replica_requests(http, EMB)
    spread = [after[t.http_url] - before[t.http_url] for t in replicas]
    assert all(n >= 5 for n in spread), spread
    ready = http.get("/health/ready").json()
    assert ready["ready"] is True and set(ready["replicas"][EMB].values()) == {"ready"}


def test_killing_a_replica_mid_run_fails_no_request_and_restart_takes_load(
        http: httpx.Client, replicas: list[EmbeddedTriton]) -> None:
    victim, survivor = replicas
    ports = {"grpc_port": int(victim.grpc_url.rsplit(":", 1)[1]), "http_port": int(victim.http_url.rsplit(":", 1)[1])}
    statuses: list[int] = []
    stop = threading.Event()

    def load() -> None:
        i = 0
        while not stop.is_set():
            statuses.append(embed(http, i))
            i += 1

    workers = [threading.Thread(target=load) for _ in range(4)]
    for w in workers:
        w.start()
    time.sleep(1.0)
    assert victim.pid is not None
    os.killpg(os.getpgid(victim.pid), signal.SIGKILL)  # a crash, not a graceful stop
    time.sleep(3.0)
    chat = http.post("/v1/chat/completions", json={"model": LLM, "max_tokens": 4,
                                                   "messages": [{"role": "user", "content": "Hi"}]})
    stop.set()
    for w in workers:
        w.join()
    victim.stop()
    assert statuses and set(statuses) == {200}, f"{len(statuses)} requests, statuses {set(statuses)}"
    assert chat.status_code == 200, chat.text
    card = http.get(f"/v1/models/{EMB}").json()
    assert {r["url"]: r["healthy"] for r in card["replicas"]}[victim.http_url] is False
    ready = http.get("/health/ready").json()
    assert ready["ready"] is True  # one replica per model is enough

    restarted = EmbeddedTriton(models=MODELS, **ports).start()
    replicas[0] = restarted
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        states = {r["url"]: r["healthy"] for r in http.get(f"/v1/models/{EMB}").json()["replicas"]}
        if states[restarted.http_url]:
            break
        time.sleep(0.5)
    before = replica_requests(http, EMB)
    with ThreadPoolExecutor(8) as pool:
        assert set(pool.map(lambda i: embed(http, i), range(40))) == {200}
    after = replica_requests(http, EMB)
    assert after[restarted.http_url] - before[restarted.http_url] >= 5
    assert survivor.is_running()
