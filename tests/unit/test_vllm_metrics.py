"""vLLM's metric names beside ours (`openai_api.vllm_metrics`): checked against vLLM's own definitions (names,
types, buckets), with the same meanings measured at the gateway (phases, reasons, adapters under their base,
KV use), exact views of our histograms, summed over workers, off by a setting, and readable by the inference
extension's endpoint picker (tests/epp.py) without a key when asked to be."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import values
from prometheus_client.parser import text_string_to_metric_families

from openai_api.app import create_app
from openai_api.errors import BackendError
from openai_api.observability import MULTIPROC_ENV, Metrics, RequestStats, bind_stats, unbind_stats
from openai_api.services.backends import InstrumentedEncoder, InstrumentedLLMBackend
from openai_api.settings import Settings
from openai_api.triton.llm import GenerationChunk, GenerationRequest
from openai_api.vllm_metrics import Served
from tests.epp import read_pod
from tests.unit.fakes import MODEL, FakeBackend, llm_only_config

# vLLM's definitions (vllm/v1/metrics/loggers.py, PrometheusStatLogger; docs "Production Metrics"): family -> (type,
# histogram buckets). Written out here from vLLM's source, not imported from the code under test.
VLLM = {
    "vllm:num_requests_running": ("gauge", None),
    "vllm:num_requests_waiting": ("gauge", None),
    "vllm:kv_cache_usage_perc": ("gauge", None),
    "vllm:gpu_cache_usage_perc": ("gauge", None),
    "vllm:prompt_tokens": ("counter", None),
    "vllm:generation_tokens": ("counter", None),
    "vllm:request_success": ("counter", None),
    "vllm:time_to_first_token_seconds": ("histogram", [
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0,
        80.0, 160.0, 640.0, 2560.0]),
    "vllm:inter_token_latency_seconds": ("histogram", [
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0]),
    "vllm:e2e_request_latency_seconds": ("histogram", [
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
        960.0, 1920.0, 7680.0]),
    # build_1_2_5_buckets(max_model_len): 1, 2, 5, 10, 20, 50, ... (here up to a million for every model)
    "vllm:request_prompt_tokens": ("histogram", [m * 10 ** e for e in range(7) for m in (1, 2, 5)
                                                 if m * 10 ** e <= 1_000_000]),
    "vllm:request_generation_tokens": ("histogram", [m * 10 ** e for e in range(7) for m in (1, 2, 5)
                                                     if m * 10 ** e <= 1_000_000]),
    "vllm:lora_requests_info": ("gauge", None),
}
# vLLM's FinishReason strings (vllm/v1/engine/__init__.py) the gateway can produce.
REASONS = {"stop", "length", "abort", "error"}


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def value(text: str, name: str, **labels: str) -> float | None:
    """The one sample `name` with exactly these labels (None when absent)."""
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


class Gate:
    """An `LLMBackend` whose first chunk waits for `first`, the rest for `rest`; it ends after `tokens` tokens, or
    raises `error` after its first chunk."""

    protocol = "tensorrt_llm"
    guide_kinds = None

    def __init__(self, tokens: int = 3, error: Exception | None = None) -> None:
        self.first, self.rest = asyncio.Event(), asyncio.Event()
        self.tokens, self.error = tokens, error

    def supports(self, param: str) -> bool:
        return True

    async def check(self) -> None:
        return None

    async def generate(self, request: GenerationRequest) -> AsyncIterator[GenerationChunk]:
        await self.first.wait()
        yield GenerationChunk([1])
        await self.rest.wait()
        if self.error is not None:
            raise self.error
        for i in range(self.tokens - 1):
            yield GenerationChunk([2 + i])


async def drain(gen: AsyncIterator[GenerationChunk]) -> int:
    return sum([len(c.token_ids) async for c in gen])


def catalog(metrics: Metrics, models: tuple[str, ...] = ("base",), adapters: dict[str, tuple[str, ...]] | None = None
            ) -> None:
    adapters = adapters or {}
    base_of = {a: b for b, names in adapters.items() for a in names}
    metrics.catalog = lambda: Served(models, adapters, base_of)


async def test_names_types_and_buckets_are_vllms() -> None:
    m = Metrics()
    catalog(m)
    backend = InstrumentedLLMBackend(Gate(), m, "base")
    gate = backend.inner
    assert isinstance(gate, Gate)
    gate.first.set()
    gate.rest.set()
    assert await drain(backend.generate(GenerationRequest(prompt_ids=[1, 2, 3], max_tokens=10))) == 3
    m.replica_load("base", "127.0.0.1:1", 1.0, 0, 1.0, 0.5)
    got = families(m.render().decode())
    for name, (kind, buckets) in VLLM.items():
        assert name in got, name
        assert got[name].type == kind, name
        if buckets is not None:
            les = [s.labels["le"] for s in got[name].samples if s.name.endswith("_bucket")]
            assert [float(le) for le in les if le != "+Inf"] == [float(b) for b in buckets], name
            assert les[-1] == "+Inf"
        for s in got[name].samples:
            assert s.labels.get("model_name") == "base", (name, s)
    assert {s.labels["finished_reason"] for s in got["vllm:request_success"].samples} == REASONS


async def test_waiting_then_running_then_stop_with_the_same_counts_as_ours() -> None:
    m = Metrics()
    catalog(m)
    gate = Gate(tokens=4)
    backend = InstrumentedLLMBackend(gate, m, "base")
    stats = RequestStats(0.0)
    token = bind_stats(stats)
    task = asyncio.create_task(drain(backend.generate(GenerationRequest(prompt_ids=[5] * 7, max_tokens=10))))
    unbind_stats(token)
    await asyncio.sleep(0.01)
    text = m.render().decode()
    assert value(text, "vllm:num_requests_waiting", model_name="base") == 1.0
    assert value(text, "vllm:num_requests_running", model_name="base") == 0.0
    gate.first.set()
    await asyncio.sleep(0.01)
    text = m.render().decode()
    assert value(text, "vllm:num_requests_waiting", model_name="base") == 0.0
    assert value(text, "vllm:num_requests_running", model_name="base") == 1.0
    gate.rest.set()
    assert await task == 4
    text = m.render().decode()
    for phase in ("waiting", "running"):
        assert value(text, f"vllm:num_requests_{phase}", model_name="base") == 0.0
    assert value(text, "vllm:request_success_total", model_name="base", finished_reason="stop") == 1.0
    assert value(text, "vllm:prompt_tokens_total", model_name="base") == \
        value(text, "openai_api_prompt_tokens_total", model="base") == 7.0
    assert value(text, "vllm:generation_tokens_total", model_name="base") == \
        value(text, "openai_api_completion_tokens_total", model="base") == 4.0
    assert value(text, "vllm:request_generation_tokens_sum", model_name="base") == 4.0
    assert value(text, "vllm:request_prompt_tokens_bucket", model_name="base", le="10.0") == 1.0
    assert value(text, "vllm:e2e_request_latency_seconds_count", model_name="base") == 1.0
    assert value(text, "vllm:inter_token_latency_seconds_count", model_name="base") == \
        value(text, "openai_api_inter_token_latency_seconds_count", model="base") == 3.0
    assert stats.ttft > 0  # the access log's time to first token


async def test_finished_reasons_length_error_abort_and_a_closed_stream() -> None:
    m = Metrics()
    catalog(m)

    def run(gate: Gate, max_tokens: int = 10) -> Any:
        gate.first.set()
        gate.rest.set()
        request = GenerationRequest(prompt_ids=[1], max_tokens=max_tokens)
        return InstrumentedLLMBackend(gate, m, "base").generate(request)

    assert await drain(run(Gate(tokens=3), max_tokens=3)) == 3  # length
    with pytest.raises(BackendError):
        await drain(run(Gate(error=BackendError("Triton failed."))))  # error
    gen = run(Gate(tokens=5))
    await gen.__anext__()
    await gen.aclose()  # the service matched a stop string: stop
    stalled = Gate()
    stalled.first.set()
    task = asyncio.create_task(drain(InstrumentedLLMBackend(stalled, m, "base").generate(
        GenerationRequest(prompt_ids=[1], max_tokens=10))))
    await asyncio.sleep(0.01)
    task.cancel()  # the client left: the guard cancels the request's task
    with pytest.raises(asyncio.CancelledError):
        await task
    text = m.render().decode()
    counts = {r: value(text, "vllm:request_success_total", model_name="base", finished_reason=r) for r in REASONS}
    assert counts == {"length": 1.0, "error": 1.0, "stop": 1.0, "abort": 1.0}
    assert value(text, "vllm:num_requests_running", model_name="base") == 0.0


async def test_adapters_count_under_their_base_and_in_lora_requests_info() -> None:
    m = Metrics()
    catalog(m, ("base", "embedder"), {"base": ("sql", "chat", "idle")})
    gates = {name: Gate() for name in ("base", "sql", "chat")}
    tasks = [asyncio.create_task(drain(InstrumentedLLMBackend(g, m, name).generate(
        GenerationRequest(prompt_ids=[1], max_tokens=10)))) for name, g in gates.items()]
    await asyncio.sleep(0.01)
    gates["sql"].first.set()  # sql runs, chat and the base wait
    await asyncio.sleep(0.01)
    text = m.render().decode()
    assert value(text, "vllm:num_requests_waiting", model_name="base") == 2.0
    assert value(text, "vllm:num_requests_running", model_name="base") == 1.0
    assert value(text, "vllm:num_requests_waiting", model_name="embedder") == 0.0  # served: its series read 0
    assert value(text, "vllm:num_requests_running", model_name="sql") is None  # never a model_name of its own
    info = [s for s in families(text)["vllm:lora_requests_info"].samples]
    assert len(info) == 1 and info[0].labels == {"model_name": "base", "max_lora": "3",
                                                 "running_lora_adapters": "sql", "waiting_lora_adapters": "chat"}
    pod = read_pod(text, queued="vllm:num_requests_waiting{model_name=base}",
                   running="vllm:num_requests_running{model_name=base}", kv="vllm:kv_cache_usage_perc")
    assert (pod.waiting_queue_size, pod.running_requests_size) == (2, 1)
    assert (pod.active_models, pod.waiting_models, pod.max_active_models) == ({"sql"}, {"chat"}, 3)
    assert pod.kv_cache_usage_percent is None and pod.errors == ["metric family 'vllm:kv_cache_usage_perc' not "
                                                                 "found"]  # no replica reports KV use here
    for g in gates.values():
        g.first.set()
        g.rest.set()
    await asyncio.gather(*tasks)
    text = m.render().decode()
    assert value(text, "vllm:generation_tokens_total", model_name="base") == 9.0
    assert value(text, "openai_api_completion_tokens_total", model="sql") == 3.0  # ours keep the adapter's name
    info = families(text)["vllm:lora_requests_info"].samples
    assert [(s.labels["running_lora_adapters"], s.labels["waiting_lora_adapters"]) for s in info] == [("", "")]
    assert read_pod(text).active_models == set()  # nothing in flight: no LoRA data, as vLLM's empty series


async def test_an_encoder_call_is_a_running_sequence() -> None:
    import numpy as np

    m = Metrics()
    catalog(m, ("embedder",))
    release = asyncio.Event()

    class Encoder:
        max_batch_size = None

        async def check(self) -> None:
            return None

        async def infer(self, features: Any) -> Any:
            await release.wait()
            return np.zeros((1, 4))

    enc = InstrumentedEncoder(Encoder(), m, "embedder")
    task = asyncio.create_task(enc.infer({"attention_mask": np.ones((1, 6), dtype=np.int64)}))
    await asyncio.sleep(0.01)
    assert value(m.render().decode(), "vllm:num_requests_running", model_name="embedder") == 1.0
    release.set()
    await task
    text = m.render().decode()
    assert value(text, "vllm:num_requests_running", model_name="embedder") == 0.0
    assert value(text, "vllm:prompt_tokens_total", model_name="embedder") == 6.0
    assert value(text, "vllm:request_success_total", model_name="embedder", finished_reason="stop") == 1.0


def test_histogram_views_are_exact_and_kv_is_the_replicas_mean() -> None:
    m = Metrics()
    catalog(m)
    observed = [0.0007, 0.003, 0.01, 0.03, 0.07, 0.11, 0.3, 0.9, 2.0, 6.0, 30.0, 200.0, 3000.0]
    for v in observed:
        m.ttft.labels("base").observe(v)
    m.replica_load("base", "a:1", 1.0, 0, 1.0, 0.5)
    m.replica_load("base", "b:1", 1.0, 0, 1.0, 0.25)
    text = m.render().decode()
    for le in VLLM["vllm:time_to_first_token_seconds"][1] or []:
        assert value(text, "vllm:time_to_first_token_seconds_bucket", model_name="base", le=str(float(le))) == \
            sum(1 for v in observed if v <= le), le
    assert value(text, "vllm:time_to_first_token_seconds_bucket", model_name="base", le="+Inf") == len(observed)
    assert value(text, "vllm:time_to_first_token_seconds_sum", model_name="base") == pytest.approx(sum(observed))
    # ours keep their own bounds (with vLLM's added)
    assert value(text, "openai_api_time_to_first_token_seconds_bucket", model="base", le="30.0") == 11.0
    assert value(text, "vllm:kv_cache_usage_perc", model_name="base") == \
        value(text, "vllm:gpu_cache_usage_perc", model_name="base") == 0.375


def test_off_by_the_setting() -> None:
    m = Metrics(vllm_names=False)
    m.ttft.labels("base").observe(0.1)
    text = m.render().decode()
    assert "vllm:" not in text and "openai_api_time_to_first_token_seconds_count" in text
    with pytest.raises(ValueError, match="--no-vllm-metrics"):
        Settings(vllm_metrics=False, open_vllm_metrics=True)


def test_several_workers_add_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    workers = []
    for pid in (201, 202):
        monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda pid=pid: pid))
        m = Metrics()
        catalog(m, ("base",), {"base": ("sql",)})
        seq = m.sequence_metrics("sql")
        seq.running.inc()
        m.sequence_metrics("base").waiting.inc(pid - 200)
        m.itl.labels("base").observe(0.02)
        workers.append(m)
    from openai_api.observability import write_processes
    write_processes(tmp_path, {"0": os.getpid()})
    text = workers[0].render().decode()
    assert value(text, "vllm:num_requests_running", model_name="base") == 2.0
    assert value(text, "vllm:num_requests_waiting", model_name="base") == 3.0
    assert value(text, "vllm:inter_token_latency_seconds_bucket", model_name="base", le="0.025") == 2.0
    [info] = families(text)["vllm:lora_requests_info"].samples
    assert info.labels["running_lora_adapters"] == "sql"


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@pytest.fixture
async def open_app(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [{"name": "team-a", "secret_sha256": sha("sk-a")},
                                         {"name": "prometheus", "secret_sha256": sha("sk-prom"), "models": [],
                                          "metrics": True}]}), encoding="utf-8")
    app = create_app(llm_only_config(tmp_path, url="127.0.0.1:1"),
                     Settings(config_file=tmp_path, keys_file=keys, open_vllm_metrics=True))
    rt = app.state.gateway.services.registry.llm(MODEL)
    rt.backend.inner = FakeBackend([[i] for i in rt.tokenizer.encode("Hello there")])  # under the metrics wrapper
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as c:
        yield c
    await app.state.gateway.process.close()


async def test_open_vllm_metrics_name_no_key(open_app: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
    r = await open_app.post("/v1/chat/completions", json=body, headers={"Authorization": "Bearer sk-a"})
    assert r.status_code == 200
    for headers in ({}, {"Authorization": "Bearer sk-a"}, {"Authorization": "Bearer wrong"}):
        r = await open_app.get("/metrics", headers=headers)
        assert r.status_code == 200, headers
        names = set(families(r.text))
        assert names and all(n.startswith("vllm:") for n in names), names
        assert "team-a" not in r.text and "prometheus" not in r.text
        assert value(r.text, "vllm:request_success_total", model_name=MODEL, finished_reason="stop") == 1.0
        pod = read_pod(r.text, queued=f"vllm:num_requests_waiting{{model_name={MODEL}}}")
        assert pod.waiting_queue_size == 0 and pod.running_requests_size == 0
    r = await open_app.get("/metrics", headers={"Authorization": "Bearer sk-prom"})
    assert 'openai_api_key_requests_total{key="team-a",status="200"} 1.0' in r.text and "vllm:" in r.text
