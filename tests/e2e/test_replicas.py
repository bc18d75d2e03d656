"""Two real tritonserver replicas behind one gateway: load spreads, a killed replica costs no
non-streaming request, and a restarted one takes load again without a gateway restart.

The fleet tests (#22) reuse the same two servers: each also serves `synthetic-fleet` (the synthetic LLM,
paced), fast on the first and slow on the second, behind three models with other routing: least_load
(Triton's metrics scraped), prefix_affinity, and dns:/// discovery through a resolver the test controls
(names resolve to the servers' loopback addresses; nothing leaves the machine)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from openai_api.config import BUNDLED_CONFIG, DiscoveryConfig, LLMModel, RoutingConfig, load_config
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.triton import discovery
from openai_api.triton.loadscrape import PENDING, parse_metrics
from tests.e2e.conftest import API_KEY, LLM, GatewayServer
from tests.helpers import derived_model, stop_now

EMB = "all-minilm-l6-v2"
MODELS = [LLM, EMB]
FLEET = "synthetic-fleet"
# Per-token pause of synthetic-fleet on each server: the first fast, the second slow.
FLEET_DELAY_MS = (5, 60)
DNS_NAME = "fleet.test"


class FakeResolver:
    """The resolver discovery uses in this module: `names[host]` is the replica list right now."""

    def __init__(self) -> None:
        self.names: dict[str, list[str]] = {}

    def __call__(self, host: str, port: int) -> list[str]:
        if host not in self.names:
            raise discovery.NoSuchName(host)
        return list(self.names[host])


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[EmbeddedTriton]]:
    servers = []
    for delay in FLEET_DELAY_MS:
        extra = tmp_path_factory.mktemp("fleet-models")
        derived_model(extra, "synthetic-llm", FLEET, {"delay_ms": str(delay)})
        servers.append(EmbeddedTriton(models=[*MODELS, FLEET], extra_args=[f"--model-repository={extra}"]).start())
    yield servers
    for s in servers:
        stop_now(s)


@pytest.fixture(scope="module")
def resolver() -> Iterator[FakeResolver]:
    fake = FakeResolver()
    discovery.set_resolver(fake)
    yield fake
    discovery.set_resolver(None)


@pytest.fixture(scope="module")
def gateway(replicas: list[EmbeddedTriton], resolver: FakeResolver) -> Iterator[GatewayServer]:
    config = load_config(BUNDLED_CONFIG)
    config.rerank = []
    config.llm = [m for m in config.llm if m.name == LLM]
    for m in config.all_models():
        m.url = [t.grpc_url if m.transport == "grpc" else t.http_url for t in replicas]
    smollm2 = config.llm[0].path  # synthetic-llm speaks SmolLM2's token ids
    grpc = [t.grpc_url for t in replicas]
    resolver.names[DNS_NAME] = [grpc[1]]
    config.llm += [
        LLMModel(name="fleet-least-load", url=grpc, path=smollm2, triton_model=FLEET,
                 routing=RoutingConfig(policy="least_load", scrape_interval_s=0.2,
                                       metrics_port={t.grpc_url: t.metrics_port for t in replicas})),
        LLMModel(name="fleet-prefix", url=grpc, path=smollm2, triton_model=FLEET,
                 routing=RoutingConfig(policy="prefix_affinity", block_tokens=8, imbalance_abs=3)),
        LLMModel(name="fleet-dns", url=f"dns:///{DNS_NAME}:8001", path=smollm2, triton_model=FLEET,
                 discovery=DiscoveryConfig(interval_s=0.2)),
    ]
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


def chat(http: httpx.Client, model: str, messages: list[dict[str, str]], max_tokens: int = 8) -> str:
    r = http.post("/v1/chat/completions", json={"model": model, "max_tokens": max_tokens, "messages": messages})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_triton_metrics_page_parses(replicas: list[EmbeddedTriton]) -> None:
    """The scraper's parser on the live page of a real tritonserver (the unit tests use a recording of it)."""
    text = httpx.get(replicas[0].metrics_url, timeout=10).text
    assert f'{PENDING}{{model="{FLEET}",version="1"}}' in text
    load = parse_metrics(text)
    assert load.in_flight >= 0 and load.waiting is None and load.kv_fraction is None


def test_least_load_shifts_traffic_to_the_fast_replica(http: httpx.Client, replicas: list[EmbeddedTriton]) -> None:
    model = "fleet-least-load"
    fast, slow = (t.grpc_url for t in replicas)
    before = replica_requests(http, model)
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(lambda i: chat(http, model, [{"role": "user", "content": f"load {i}"}], 12), range(36)))
    after = replica_requests(http, model)
    got = {u: after[u] - before[u] for u in after}
    assert got[fast] + got[slow] == 36 and got[fast] >= 27, got  # 60 ms vs 5 ms a token: most go fast
    card = {r["url"]: r for r in http.get(f"/v1/models/{model}").json()["replicas"]}
    assert "triton_in_flight" in card[fast] and "triton_in_flight" in card[slow]  # Triton's page was read
    metrics = http.get("/metrics").text
    assert f'openai_api_replica_load{{model="{model}",replica="{fast}"}}' in metrics
    assert f'openai_api_routing_decisions_total{{model="{model}",policy="least_load",reason="least_load"}}' in metrics


def test_prefix_affinity_keeps_a_conversation_on_one_replica_and_balances_a_hot_one(http: httpx.Client) -> None:
    model = "fleet-prefix"
    served: dict[int, set[str]] = {}
    for conv in range(4):
        messages = [{"role": "system", "content": f"You are assistant number {conv}, be brief."}]
        for turn in range(3):
            messages.append({"role": "user", "content": f"Conversation {conv}, question {turn}: what next?"})
            before = replica_requests(http, model)
            messages.append({"role": "assistant", "content": chat(http, model, messages)})
            after = replica_requests(http, model)
            served.setdefault(conv, set()).update(u for u in after if after[u] > before[u])
    assert all(len(urls) == 1 for urls in served.values()), served
    # Skew: one conversation's next turn sent 16 times at once; the holder takes up to imbalance_abs more
    # than the other replica, then the rest spill over.
    hot = [*messages, {"role": "user", "content": "And again?"}]
    before = replica_requests(http, model)
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda _: chat(http, model, hot, 24), range(16)))
    after = replica_requests(http, model)
    got = sorted(after[u] - before[u] for u in after)
    assert sum(got) == 16 and got[0] >= 3, got
    metrics = http.get("/metrics").text
    for reason in ("prefix", "imbalance"):
        assert f'policy="prefix_affinity",reason="{reason}"' in metrics


async def test_replicas_appear_and_disappear_under_50_streams(
        gateway: GatewayServer, replicas: list[EmbeddedTriton], resolver: FakeResolver) -> None:
    model = "fleet-dns"
    fast, slow = (t.grpc_url for t in replicas)
    headers = {"Authorization": f"Bearer {API_KEY}"}

    async def stream(client: httpx.AsyncClient, i: int, tokens: int = 16) -> tuple[int, str | None, int]:
        body = {"model": model, "max_tokens": tokens, "stream": True,
                "messages": [{"role": "user", "content": f"stream {i}"}]}
        finish, chunks = None, 0
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    chunks += 1
                    choice = json.loads(line[6:])["choices"]
                    finish = (choice[0].get("finish_reason") if choice else None) or finish
        return r.status_code, finish, chunks

    async def urls_now(client: httpx.AsyncClient) -> set[str]:
        return {r["url"] for r in (await client.get(f"/v1/models/{model}")).json()["replicas"]}

    async def until(client: httpx.AsyncClient, want: set[str]) -> None:
        deadline = time.monotonic() + 15
        while await urls_now(client) != want:
            assert time.monotonic() < deadline, await urls_now(client)
            await asyncio.sleep(0.1)

    async with httpx.AsyncClient(base_url=gateway.url, headers=headers, timeout=60) as client:
        await until(client, {slow})
        # ~3 s each on the slow one: still running when the scale-down below is seen, on a loaded box too
        first = [asyncio.create_task(stream(client, i, 48)) for i in range(25)]
        await asyncio.sleep(0.3)
        resolver.names[DNS_NAME] = [slow, fast]  # scale up
        await until(client, {slow, fast})
        second = [asyncio.create_task(stream(client, 25 + i)) for i in range(25)]
        resolver.names[DNS_NAME] = [fast]  # scale down while streams still run on the slow one
        try:
            await until(client, {fast})
            assert not all(t.done() for t in first)  # the retired replica still had streams in flight
            results = await asyncio.gather(*first, *second)
        finally:  # leave the survivor of the next test as the replica, whatever happened here
            resolver.names[DNS_NAME] = [slow]
        await until(client, {slow})
    assert [r for r in results if r[:2] != (200, "length")] == [], results
    assert all(chunks >= 2 for _, _, chunks in results)


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
