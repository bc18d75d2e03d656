"""Routing over replicas (#22): the config blocks, each policy on fake replicas, the metrics parser on
recorded Triton pages, and discovery's add / retire on a fake resolver."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pydantic
import pytest

from openai_api.config import EmbeddingModel, LLMModel, RoutingConfig
from openai_api.errors import BackendUnavailableError
from openai_api.observability import Metrics
from openai_api.triton import discovery
from openai_api.triton.llm import GenerationChunk, GenerationRequest
from openai_api.triton.loadscrape import TritonLoad, metrics_url, parse_metrics, parse_sample
from openai_api.triton.replicas import Replica, ReplicaSet, ReplicatedLLMBackend
from openai_api.triton.routing import (
    LeastLoad,
    LeastOutstanding,
    PrefixAffinity,
    RoundRobin,
    block_hashes,
    make_policy,
)
from tests.helpers import REPO

PAGES = REPO / "tests" / "data" / "triton_metrics"


@dataclass(eq=False)
class Fake:
    url: str
    outstanding: int = 0
    load_: float = 0.0

    def load(self) -> float:
        return self.load_


@dataclass
class Req:
    prompt_ids: list[int]
    session: str | None = None


def urls(rs: list[Fake]) -> list[str]:
    return [r.url for r in rs]


# --- config -------------------------------------------------------------------------------------------------

def test_routing_defaults_keep_todays_behaviour() -> None:
    m = LLMModel(name="m", url=["a:1", "b:1"], path=Path("."))
    assert m.routing.policy == "least_outstanding" and m.routing.metrics_port is None and not m.discovered
    assert isinstance(make_policy(m.routing), LeastOutstanding)


@pytest.mark.parametrize("url", ["dns:///host", "dns:///host:0", "dns:///h:99999", "dns://server/h:1", "dns:h:1"])
def test_a_malformed_dns_url_is_refused(url: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="dns:///host:port"):
        LLMModel(name="m", url=url, path=Path("."))


def test_dns_urls_mix_with_static_ones() -> None:
    m = LLMModel(name="m", url=["dns:///triton-headless.ns.svc.cluster.local:8001", "127.0.0.9:8001"],
                 path=Path("."), discovery={"interval_s": 2})
    assert m.discovered and m.discovery.interval_s == 2


def test_prefix_affinity_is_for_llms_and_bad_knobs_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match="prefix_affinity is for llm"):
        EmbeddingModel(name="e", url="a:1", path=Path("."), routing={"policy": "prefix_affinity"})
    for bad in ({"policy": "fastest"}, {"block_tokens": 0}, {"imbalance_rel": 0.5}, {"metrics_port": 70000},
                {"metrics_port": {"a:1": 0}}, {"typo": 1}):
        with pytest.raises(pydantic.ValidationError):
            RoutingConfig.model_validate(bad)


def test_metrics_port_per_replica() -> None:
    cfg = RoutingConfig(metrics_port={"127.0.0.1:8001": 8002})
    assert cfg.metrics_port_of("127.0.0.1:8001") == 8002 and cfg.metrics_port_of("127.0.0.1:9001") is None
    assert RoutingConfig(metrics_port=8002).metrics_port_of("x:1") == 8002
    assert metrics_url("127.1.2.3:8001", 8002) == "http://127.1.2.3:8002/metrics"
    assert metrics_url("[::1]:8001", 8002) == "http://[::1]:8002/metrics"


# --- the simple policies ------------------------------------------------------------------------------------

def test_round_robin_takes_turns_whatever_the_load() -> None:
    a, b, c = Fake("a", outstanding=9), Fake("b"), Fake("c")
    p = RoundRobin()
    firsts = [p.order([a, b, c], None)[0][0].url for _ in range(6)]
    assert firsts == ["a", "b", "c", "a", "b", "c"]


def test_least_outstanding_picks_the_fewest_and_rotates_ties() -> None:
    a, b, c = Fake("a", outstanding=2), Fake("b"), Fake("c")
    p = LeastOutstanding()
    orders = [urls(p.order([a, b, c], None)[0]) for _ in range(3)]
    assert {o[0] for o in orders} == {"b", "c"} and all(o[-1] == "a" for o in orders)


def test_least_load_reads_the_load_score_not_the_own_count() -> None:
    a, b = Fake("a", outstanding=0, load_=5.0), Fake("b", outstanding=3, load_=1.0)
    ordered, reason = LeastLoad().order([a, b], None)
    assert urls(ordered) == ["b", "a"] and reason == "least_load"


# --- prefix affinity ----------------------------------------------------------------------------------------

def test_block_hashes_are_chained_and_cover_full_blocks_only() -> None:
    x = block_hashes(list(range(40)), 16)
    assert len(x) == 2  # 8 trailing tokens make no block
    y = block_hashes([*range(32), 99, 98], 16)
    assert y == x  # same first 32 tokens
    z = block_hashes([1000, *range(1, 40)], 16)
    assert z[0] != x[0] and z[1] != x[1]  # block 1 is equal but its chain differs
    assert block_hashes(list(range(15)), 16) == []


def conversation(turns: int, seed: int = 0) -> list[list[int]]:
    """Each turn's prompt extends the previous one (a chat's history), 20 tokens a turn."""
    out, ids = [], [seed * 1000 + i for i in range(24)]
    for t in range(turns):
        ids = ids + [seed * 1000 + 500 + t * 20 + i for i in range(20)]
        out.append(list(ids))
    return out


def test_turns_of_one_conversation_follow_its_prefix() -> None:
    cfg = RoutingConfig(policy="prefix_affinity", block_tokens=8)
    p = PrefixAffinity(cfg)
    reps = [Fake("a"), Fake("b"), Fake("c")]
    first: Fake | None = None
    reasons = []
    for prompt in conversation(5):
        req = Req(prompt)
        ordered, reason = p.order(reps, req)
        p.routed(ordered[0], req)
        first = first or ordered[0]
        assert ordered[0] is first
        reasons.append(reason)
        for r in reps:  # other traffic makes the holder the busiest, yet within the imbalance thresholds
            r.load_ = 3.0 if r is first else 0.0
    assert reasons == ["no_match"] + ["prefix"] * 4


def test_a_new_conversation_goes_to_the_least_loaded() -> None:
    p = PrefixAffinity(RoutingConfig(policy="prefix_affinity", block_tokens=8))
    a, b = Fake("a", load_=4.0), Fake("b", load_=1.0)
    ordered, reason = p.order([a, b], Req(list(range(64))))
    assert ordered[0] is b and reason == "no_match"


def test_the_longest_prefix_wins() -> None:
    p = PrefixAffinity(RoutingConfig(policy="prefix_affinity", block_tokens=4))
    a, b = Fake("a"), Fake("b")
    p.routed(a, Req(list(range(8))))  # a holds 2 blocks
    p.routed(b, Req(list(range(16))))  # b holds the same 2 and 2 more (now the holder of all 4)
    p.routed(a, Req(list(range(8))))  # a again holds the first 2
    ordered, reason = p.order([a, b], Req(list(range(20))))
    assert ordered[0] is b and reason == "prefix"
    ordered, _ = p.order([a, b], Req([*range(8), 77, 77, 77, 77]))
    assert ordered[0] is a


def test_min_match_blocks_ignores_a_short_shared_prefix() -> None:
    p = PrefixAffinity(RoutingConfig(policy="prefix_affinity", block_tokens=4, min_match_blocks=3))
    a, b = Fake("a", load_=2.0), Fake("b")
    p.routed(a, Req(list(range(8))))  # a system prompt of 2 blocks that every request shares
    assert p.order([a, b], Req([*range(8), 5, 5, 5, 5]))[1] == "no_match"


def test_imbalance_hands_a_hot_prefix_to_the_least_loaded() -> None:
    cfg = RoutingConfig(policy="prefix_affinity", block_tokens=4, imbalance_abs=4, imbalance_rel=1.5)
    p = PrefixAffinity(cfg)
    a, b = Fake("a"), Fake("b")
    hot = Req(list(range(32)))
    p.routed(a, hot)
    a.load_, b.load_ = 4.0, 0.0  # 4 - 0 is not > 4: stays
    assert p.order([a, b], hot)[0][0] is a
    a.load_ = 5.0  # 5 - 0 > 4 and 5 > 1.5 x 0: spills
    ordered, reason = p.order([a, b], hot)
    assert ordered[0] is b and reason == "imbalance"
    a.load_, b.load_ = 12.0, 8.0  # far apart in absolute terms, but 12 < 1.5 x 8: stays
    assert p.order([a, b], hot)[0][0] is a


def test_a_holder_that_is_down_is_skipped_for_a_shorter_match_elsewhere() -> None:
    p = PrefixAffinity(RoutingConfig(policy="prefix_affinity", block_tokens=4))
    a, b, c = Fake("a"), Fake("b"), Fake("c", load_=1.0)
    p.routed(b, Req(list(range(8))))
    p.routed(a, Req(list(range(16))))
    ordered, reason = p.order([b, c], Req(list(range(16))))  # a is not among the healthy
    assert ordered[0] is b and reason == "prefix"


def test_session_affinity_wins_over_the_prefix() -> None:
    p = PrefixAffinity(RoutingConfig(policy="prefix_affinity", block_tokens=4, session_user=True))
    a, b = Fake("a"), Fake("b")
    p.routed(a, Req(list(range(16))))
    p.routed(b, Req([9, 9, 9, 9], session="u:alice"))
    ordered, reason = p.order([a, b], Req(list(range(16)), session="u:alice"))
    assert ordered[0] is b and reason == "session"


def test_the_maps_are_bounded_and_forget_a_retired_replica() -> None:
    p = PrefixAffinity(RoutingConfig(policy="prefix_affinity", block_tokens=2, max_blocks=5, max_sessions=2))
    a, b = Fake("a"), Fake("b")
    p.routed(a, Req(list(range(8)), session="s1"))  # 4 blocks
    p.routed(b, Req([50, 51, 52, 53], session="s2"))  # 2 more: the oldest (a's first block) goes
    p.routed(b, Req([60, 61], session="s3"))
    assert len(p.blocks) == 5 and list(p.sessions) == ["s2", "s3"]
    p.forget("b")
    assert set(p.blocks.values()) == {("a",)} and not p.sessions


def test_a_block_remembers_several_holders_most_recent_first() -> None:
    p = PrefixAffinity(RoutingConfig(policy="prefix_affinity", block_tokens=2))
    a, b = Fake("a"), Fake("b")
    p.routed(a, Req([0, 1, 2, 3]))
    p.routed(b, Req([0, 1, 2, 3]))
    assert p.blocks[block_hashes([0, 1, 2, 3], 2)[1]] == ("b", "a")
    p.forget("b")
    assert p.blocks[block_hashes([0, 1, 2, 3], 2)[1]] == ("a",)


def test_session_key_from_header_or_user() -> None:
    from openai_api.triton.routing import session_key

    cfg = RoutingConfig(session_header="X-Session-Id", session_user=True)
    assert session_key(cfg, "bob") == "u:bob"
    headers = [(b"x-session-id", b"abc")]
    assert session_key(cfg, "bob", None, headers) == "h:abc"
    assert session_key(RoutingConfig(), "bob", None, headers) is None


def test_agents_name_their_sessions_by_default() -> None:
    """Claude Code's X-Claude-Code-Session-Id, Codex's session_id (or session-id) header and OpenAI's
    prompt_cache_key name the session without any routing setting; an explicit session_header wins, and
    agent_sessions: false turns the defaults off."""
    from openai_api.triton.routing import session_key

    for header in (b"x-claude-code-session-id", b"session_id", b"session-id"):
        headers = [(b"user-agent", b"agent/1"), (header, b"s-42")]
        assert session_key(RoutingConfig(), None, None, headers) == "h:s-42"
        assert session_key(RoutingConfig(), None, "cache-7", headers) == "k:cache-7"  # the body's key first
        assert session_key(RoutingConfig(agent_sessions=False), None, None, headers) is None
        headers.append((b"x-team-session", b"t-1"))
        assert session_key(RoutingConfig(session_header="X-Team-Session"), None, "cache-7", headers) == "h:t-1"
    assert session_key(RoutingConfig(), None, "cache-7") == "k:cache-7"  # no request headers at all
    long = session_key(RoutingConfig(), None, "x" * 10_000)
    assert long is not None and len(long) < 40 and long == session_key(RoutingConfig(), None, "x" * 10_000)


# --- the load scrape ----------------------------------------------------------------------------------------

def test_parse_a_recorded_triton_page() -> None:
    text = (PAGES / "synthetic-llm.txt").read_text()
    assert parse_metrics(text) == TritonLoad(pending=0.0)
    busy = text.replace('nv_inference_pending_request_count{model="synthetic-llm",version="1"} 0',
                        'nv_inference_pending_request_count{model="synthetic-llm",version="1"} 3')
    assert busy != text and parse_metrics(busy).in_flight == 3.0


def test_parse_the_tensorrt_llm_families() -> None:
    load = parse_metrics((PAGES / "tensorrt_llm.txt").read_text())
    assert (load.waiting, load.active, load.kv_fraction, load.pending) == (5.0, 7.0, 0.75, 2.0)
    assert load.in_flight == 12.0  # waiting + active; pending is Triton's queue in front of it


def test_parse_sample_edge_cases() -> None:
    assert parse_sample('a{b="x\\"y",c="z"} 1.5 1700000000') == ("a", {"b": 'x"y', "c": "z"}, 1.5)
    assert parse_sample("nv_cpu_utilization 0") == ("nv_cpu_utilization", {}, 0.0)
    assert parse_sample('bad{b="x"') is None and parse_sample("a{} notanumber") is None
    assert parse_sample("# HELP x y") is None and parse_sample("") is None


def test_replica_load_combines_triton_and_own_counts() -> None:
    r: Replica[None] = Replica("a:1", None, kv_weight=4.0, max_age_s=1e9)
    r.outstanding = 2
    assert r.load() == 2.0  # nothing scraped yet
    import time
    r.triton, r.scraped_at, r.outstanding_at_scrape = TritonLoad(waiting=5, active=3, kv_fraction=0.5), \
        time.monotonic(), 2
    assert r.load() == 8.0 + 2.0  # Triton's 8 (ours included) + 4 x 0.5
    r.outstanding = 5  # we started 3 more since
    assert r.load() == 11.0 + 2.0
    r.triton = TritonLoad(pending=0)  # a backend whose count leaves out running requests
    assert r.load() == 5.0
    r.max_age_s = -1.0  # stale figures are ignored
    r.triton = TritonLoad(waiting=50)
    assert r.load() == 5.0


# --- replica sets: order, discovery -------------------------------------------------------------------------

class FakeBackend:
    protocol = "tensorrt_llm"
    guide_kinds = None

    def __init__(self, url: str) -> None:
        self.url = url
        self.gate = asyncio.Event()
        self.calls = 0

    def supports(self, param: str) -> bool:
        return True

    async def check(self) -> None:
        pass

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        self.calls += 1
        yield GenerationChunk([1])
        await self.gate.wait()
        yield GenerationChunk([2])


@dataclass
class FakeDNS:
    names: dict[str, list[str]] = field(default_factory=dict)
    fail: bool = False

    def __call__(self, host: str, port: int) -> list[str]:
        if self.fail:
            raise OSError("resolver down")
        if host not in self.names:
            raise discovery.NoSuchName(host)
        return list(self.names[host])


@pytest.fixture
def dns() -> Iterator[FakeDNS]:
    fake = FakeDNS()
    discovery.set_resolver(fake)
    yield fake
    discovery.set_resolver(None)


def backend(ready: set[str] | None = None, **kw: Any) -> tuple[ReplicatedLLMBackend, dict[str, FakeBackend]]:
    made: dict[str, FakeBackend] = {}

    def factory(url: str) -> Any:
        made[url] = FakeBackend(url)
        return made[url]

    async def is_ready(url: str) -> bool:
        return ready is None or url in ready

    b = ReplicatedLLMBackend("m", "grpc", [], sources=["dns:///triton:8001"], factory=factory, ready=is_ready,
                             metrics=Metrics(), **kw)
    return b, made


async def test_discovery_adds_ready_replicas_and_retires_vanished_ones_without_failing_their_streams(
        dns: FakeDNS) -> None:
    dns.names["triton"] = ["127.0.0.1:8001", "127.0.0.2:8001"]
    b, made = backend(ready={"127.0.0.1:8001", "127.0.0.2:8001"})
    await b.check()  # the first resolution happens here
    assert [r.url for r in b.set.replicas] == ["127.0.0.1:8001", "127.0.0.2:8001"]
    # a stream starts on the replica that is about to vanish
    stream = b.generate(GenerationRequest(prompt_ids=[1, 2], max_tokens=2))
    assert (await anext(stream)).token_ids == [1]
    victim = next(u for u, fb in made.items() if fb.calls)
    dns.names["triton"] = [u for u in ["127.0.0.1:8001", "127.0.0.2:8001", "127.0.0.3:8001"] if u != victim]
    await b.set.refresh()  # 127.0.0.3 is not ready yet: not added; the victim is retired
    assert victim not in [r.url for r in b.set.replicas] and "127.0.0.3:8001" not in made
    made[victim].gate.set()
    assert [c.token_ids async for c in stream] == [[2]]  # the stream on the retired replica finished
    survivor = next(r for r in b.set.replicas)
    assert survivor.outstanding == 0


async def test_a_retired_replicas_triton_clients_close_after_its_last_request_unless_another_model_uses_it(
        dns: FakeDNS) -> None:
    """Pods come and go in a fleet: the gRPC channels of a vanished pod's address are closed once its streams
    ended, but not while another model (on the same Triton) still has a replica there."""
    from openai_api.config import GatewayConfig
    from openai_api.reload import ConfigReloader
    from openai_api.settings import Settings
    from openai_api.triton.client import TritonClientPool

    pool = TritonClientPool()
    dns.names["triton"] = ["127.0.0.1:8001", "127.0.0.2:8001"]
    dns.names["other"] = ["127.0.0.2:8001"]
    made: dict[str, FakeBackend] = {}

    def factory(url: str) -> Any:
        pool.rpc(url)  # as the real adapters do: a channel per address, from the process's pool
        made[url] = made.get(url) or FakeBackend(url)
        return made[url]

    def replicated(name: str, source: str) -> ReplicatedLLMBackend:
        return ReplicatedLLMBackend(name, "grpc", [], sources=[source], factory=factory, metrics=Metrics())

    a, b = replicated("a", "dns:///triton:8001"), replicated("b", "dns:///other:8001")
    await a.set.refresh()
    await b.set.refresh()
    services: Any = SimpleNamespace(registry=SimpleNamespace(pool=pool, replicas={"a": a.set, "b": b.set}))
    reloader = ConfigReloader(GatewayConfig(), services, Settings(), Metrics())
    assert pool.urls() == {"127.0.0.1:8001", "127.0.0.2:8001"}
    stream = a.generate(GenerationRequest(prompt_ids=[1], max_tokens=2))
    assert (await anext(stream)).token_ids == [1]
    busy = next(u for u, fb in made.items() if fb.calls)
    dns.names["triton"] = []  # both of a's replicas vanish; the busy one has a stream in flight
    await a.set.refresh()
    await reloader.release_retired()
    if busy == "127.0.0.1:8001":  # still streaming; 127.0.0.2 is idle but b's replica too: nothing closes yet
        assert pool.urls() == {"127.0.0.1:8001", "127.0.0.2:8001"}
    else:  # 127.0.0.1 is idle and only a's: closed; 127.0.0.2 is still streaming (and b's)
        assert pool.urls() == {"127.0.0.2:8001"}
    made[busy].gate.set()
    assert [c.token_ids async for c in stream] == [[2]]
    await reloader.release_retired()
    assert pool.urls() == {"127.0.0.2:8001"}  # b's replica keeps its channel
    dns.names["other"] = []
    await b.set.refresh()
    await reloader.release_retired()
    assert pool.urls() == set()
    await pool.close()


class FullCacheBackend(FakeBackend):
    """A replica whose LoRA adapter cache has no room (TensorRT-LLM's words, mapped as every adapter maps them)."""

    async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
        from openai_api.triton.errors import map_triton_error
        from openai_api.triton.rpc import ResponseError

        self.calls += 1
        raise map_triton_error(ResponseError("PEFT Cache is full. Could not store taskId=3"), "m")
        yield GenerationChunk([0])


async def test_a_full_adapter_cache_sends_the_request_to_the_next_replica_and_marks_nothing_down() -> None:
    from openai_api.errors import AdapterCacheFullError

    full, fine = FullCacheBackend("127.0.0.1:8001"), FakeBackend("127.0.0.2:8001")
    fine.gate.set()
    b = ReplicatedLLMBackend("m", "grpc", [(full.url, full), (fine.url, fine)], metrics=Metrics())
    chunks = [c.token_ids async for c in b.generate(GenerationRequest(prompt_ids=[1], max_tokens=2))]
    assert chunks == [[1], [2]] and full.calls == 1 and fine.calls == 1
    assert all(r.healthy and r.outstanding == 0 for r in b.set.replicas)
    only_full = ReplicatedLLMBackend("m", "grpc", [(full.url, full), ("127.0.0.3:8001", FullCacheBackend("x"))],
                                     metrics=Metrics())
    with pytest.raises(AdapterCacheFullError):  # every replica full: the client's retryable 503
        [c async for c in only_full.generate(GenerationRequest(prompt_ids=[1], max_tokens=2))]
    assert all(r.healthy for r in only_full.set.replicas)


async def test_discovery_waits_for_readiness_and_survives_resolver_failures(dns: FakeDNS) -> None:
    dns.names["triton"] = ["127.0.0.1:8001"]
    ready = {"127.0.0.1:8001"}
    b, _ = backend(ready=ready)
    await b.set.refresh()
    dns.names["triton"] = ["127.0.0.1:8001", "127.0.0.2:8001"]
    await b.set.refresh()
    assert [r.url for r in b.set.replicas] == ["127.0.0.1:8001"]  # 127.0.0.2 not ready
    ready.add("127.0.0.2:8001")
    await b.set.refresh()
    assert [r.url for r in b.set.replicas] == ["127.0.0.1:8001", "127.0.0.2:8001"]
    dns.fail = True
    await b.set.refresh()  # a failed resolution keeps what the name had
    assert len(b.set.replicas) == 2
    dns.fail = False
    del dns.names["triton"]
    await b.set.refresh()  # the name is gone: so are its replicas
    assert b.set.replicas == []
    with pytest.raises(BackendUnavailableError, match="none found"):
        await b.check()


async def test_a_replica_set_routes_with_its_policy_and_counts_decisions(dns: FakeDNS) -> None:
    dns.names["triton"] = ["127.0.0.1:8001", "127.0.0.2:8001"]
    b, made = backend(routing=RoutingConfig(policy="prefix_affinity", block_tokens=4))
    await b.set.refresh()
    prompt = list(range(32))
    for fb in made.values():
        fb.gate.set()
    for _ in range(4):
        chunks = [c async for c in b.generate(GenerationRequest(prompt_ids=prompt, max_tokens=2))]
        assert len(chunks) == 2
    assert sorted(fb.calls for fb in made.values()) == [0, 4]
    assert b.set.metrics is not None
    text = b.set.metrics.render().decode()
    assert 'openai_api_routing_decisions_total{model="m",policy="prefix_affinity",reason="prefix"} 3.0' in text


def test_replica_set_order_puts_down_replicas_last() -> None:
    rs: ReplicaSet[None] = ReplicaSet("m", "grpc", [Replica("a", None), Replica("b", None)],
                                      routing=RoutingConfig(policy="round_robin"))
    rs.failed(rs.replicas[0])
    assert [r.url for r in rs.order()] == ["b", "a"]
    assert [r.url for r in rs.order()] == ["b", "a"]


def test_a_prefix_every_conversation_shares_does_not_herd_them() -> None:
    p = PrefixAffinity(RoutingConfig(policy="prefix_affinity", block_tokens=4))
    a, b = Fake("a"), Fake("b")
    system = list(range(12))  # 3 blocks every conversation starts with
    p.routed(a, Req([*system, 100, 101, 102, 103]))
    p.routed(b, Req([*system, 200, 201, 202, 203]))  # both now hold the system prompt
    a.load_ = 2.0
    ordered, reason = p.order([a, b], Req([*system, 300, 301, 302, 303]))
    assert ordered[0] is b and reason == "prefix"  # the least loaded of the holders
    b.load_ = 3.0
    ordered, _ = p.order([a, b], Req([*system, 100, 101, 102, 103, 9]))
    assert ordered[0] is a  # a conversation's own longer prefix still wins over load


# --- workers: the shared prefix table -----------------------------------------------------------------------

def test_the_shared_table_is_one_map_for_every_process_that_maps_the_file(tmp_path: Path) -> None:
    from openai_api.triton.sharedmap import SharedTable, stable_id

    one, two = SharedTable(tmp_path / "t.bin", 64), SharedTable(tmp_path / "t.bin", 64)
    one.put(12345, 7)
    two.put(12345, 8)
    assert one.get(12345) == (8, 7) and two.get(99) == ()
    for h in range(10_000):  # a table far smaller than what goes in: entries are overwritten, never an error
        one.put(h * 7919, 1)
    assert len(one.get(9_999 * 7919)) == 1
    assert stable_id("127.0.0.1:8001") == stable_id("127.0.0.1:8001") != 0
    one.close()
    two.close()


def affinity_across_workers(tmp_path: Path | None, workers: int = 2, replicas: int = 4,
                            conversations: int = 200, turns: int = 4) -> float:
    """The share of follow-up turns that reach the replica of the conversation's previous turn, when each
    turn lands on a worker at random (as new connections do), each worker with its own PrefixAffinity:
    sharing one table (`tmp_path` given) or each its own map."""
    import random

    from openai_api.triton.sharedmap import SharedTable

    cfg = RoutingConfig(policy="prefix_affinity", block_tokens=8)
    table = (lambda: SharedTable(tmp_path / "prefix.bin", cfg.max_blocks)) if tmp_path else (lambda: None)
    policies = [PrefixAffinity(cfg, table()) for _ in range(workers)]
    reps = [Fake(f"127.0.0.{i}:8001") for i in range(replicas)]
    rng = random.Random(7)
    last: dict[int, Fake] = {}
    same = follow_ups = 0
    convs = {c: conversation(turns, seed=c + 1) for c in range(conversations)}
    for turn in range(turns):
        for c in rng.sample(range(conversations), conversations):
            p = policies[rng.randrange(workers)]
            req = Req(convs[c][turn])
            chosen = p.order(reps, req)[0][0]
            p.routed(chosen, req)
            chosen.load_ += 0.01  # a little load so that new conversations spread
            if c in last:
                follow_ups += 1
                same += last[c] is chosen
            last[c] = chosen
    return same / follow_ups


def test_workers_sharing_the_table_keep_every_conversation_on_its_replica(tmp_path: Path) -> None:
    assert affinity_across_workers(tmp_path) == 1.0
    # Without it, a turn that reaches a worker that never saw the conversation goes by load.
    assert affinity_across_workers(None) < 0.8
