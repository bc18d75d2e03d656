"""The gateway in the platform people already run, end to end against the session Triton:

- a real Prometheus (Debian's `prometheus`, installed by scripts/setup_tests.sh) scrapes the gateway on loopback
  with a key marked `metrics: true`, and the vLLM Grafana dashboard's own PromQL (tests/data/vllm_dashboard, from
  vLLM's repository) evaluated through Prometheus's HTTP API returns data for the models served, after traffic
  sent with the `openai` client (plain and streamed chat, LoRA adapters);
- the inference extension's endpoint picker's scrape (tests/epp.py, its Model Server Protocol) reads this
  gateway as a pod, without a key (`--open-vllm-metrics`), while streams run: queue and running counts, the KV
  use of a model whose Triton reports it, and the LoRA adapters in flight.

TensorRT-LLM does not run here, so the KV-cache fill comes from its metrics page as Triton writes it
(`nv_trt_llm_kv_cache_block_metrics`), served on loopback where the model's `routing.metrics_port` points:
the gateway's scrape, its routing figures and the vLLM view over them are the real ones."""

from __future__ import annotations

import hashlib
import http.server
import json
import math
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from openai import OpenAI

from openai_api.config import RoutingConfig
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.settings import Settings
from tests.e2e.conftest import LLM, GatewayServer, gateway_config
from tests.epp import read_pod
from tests.helpers import REPO, free_port

VLLM_BASE = "smollm2-135m-instruct-vllm"
ADAPTERS = ("lora-codeword-vllm", "lora-upper-vllm")
KV_FRACTION = 0.25
PROM_KEY, USER_KEY = "sk-prometheus-e2e", "sk-user-e2e"
DASHBOARD = json.loads((REPO / "tests/data/vllm_dashboard/queries.json").read_text(encoding="utf-8"))
# A TensorRT-LLM Triton's metrics page (the families tensorrtllm_backend's metrics reporter writes).
TRTLLM_PAGE = f"""# HELP nv_trt_llm_request_metrics TRT LLM request metrics
# TYPE nv_trt_llm_request_metrics gauge
nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="waiting",version="1"}} 0
nv_trt_llm_request_metrics{{model="tensorrt_llm",request_type="active",version="1"}} 1
# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics
# TYPE nv_trt_llm_kv_cache_block_metrics gauge
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"}} {KV_FRACTION}
nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="max",model="tensorrt_llm",version="1"}} 4096
""".encode()


def sha(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@pytest.fixture(scope="module")
def kv_page() -> Iterator[int]:
    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(TRTLLM_PAGE)))
            self.end_headers()
            self.wfile.write(TRTLLM_PAGE)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


@pytest.fixture(scope="module")
def gateway(triton: EmbeddedTriton, kv_page: int, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[GatewayServer]:
    folder = tmp_path_factory.mktemp("platform")
    keys = folder / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "prometheus", "secret_sha256": sha(PROM_KEY), "models": [], "metrics": True},
        {"name": "app", "secret_sha256": sha(USER_KEY)}]}), encoding="utf-8")
    config = gateway_config(triton)
    config.embedding, config.rerank = [], []
    llm = next(m for m in config.llm if m.name == LLM)
    llm.routing = RoutingConfig(metrics_port={triton.grpc_url: kv_page}, scrape_interval_s=0.2)
    settings = Settings(config_file=folder, keys_file=keys, open_vllm_metrics=True)
    server = GatewayServer(config, [], settings=settings).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(gateway: GatewayServer) -> OpenAI:
    return OpenAI(base_url=f"{gateway.url}/v1", api_key=USER_KEY, timeout=300, max_retries=0)


def traffic(client: OpenAI, rounds: int) -> None:
    """Plain and streamed chat to the LLM, the vLLM-interface base and its adapters, `rounds` times."""
    for i in range(rounds):
        for model in (LLM, VLLM_BASE, *ADAPTERS):
            msgs: Any = [{"role": "user", "content": f"Count to {i + 3}."}]
            r = client.chat.completions.create(model=model, messages=msgs, max_tokens=8)
            assert r.choices[0].finish_reason in ("stop", "length")
            stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=8, stream=True,
                                                    stream_options={"include_usage": True})
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) is not None


def prom_query(prom: httpx.Client, expr: str) -> list[dict[str, Any]]:
    r = prom.get("/api/v1/query", params={"query": expr})
    assert r.status_code == 200, (expr, r.text)
    body = r.json()
    assert body["status"] == "success", (expr, body)
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.fixture(scope="module")
def prometheus(gateway: GatewayServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[httpx.Client]:
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (scripts/setup_tests.sh installs Debian's package)")
    folder = tmp_path_factory.mktemp("prometheus")
    (folder / "key").write_text(PROM_KEY, encoding="utf-8")
    port = int(gateway.url.rsplit(":", 1)[1])
    (folder / "prometheus.yml").write_text(json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [{"job_name": "openai-api", "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
                            "authorization": {"credentials_file": str(folder / "key")}}]}), encoding="utf-8")
    listen = free_port()
    proc = subprocess.Popen([binary, f"--config.file={folder / 'prometheus.yml'}",
                             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{listen}",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=(folder / "log").open("wb"))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{listen}", timeout=30) as prom:
            deadline = time.monotonic() + 120
            while True:  # ready (a 503 until its storage is open), and the gateway scraped with the key
                try:
                    r = prom.get("/api/v1/query", params={"query": 'up{job="openai-api"}'})
                    up = r.json()["data"]["result"] if r.status_code == 200 else []
                    if up and up[0]["value"][1] == "1":
                        break
                except httpx.HTTPError:
                    pass
                assert proc.poll() is None, (folder / "log").read_text()
                assert time.monotonic() < deadline, (folder / "log").read_text()
                time.sleep(0.5)
            yield prom
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_vllm_dashboards_queries_return_data(prometheus: httpx.Client, client: OpenAI) -> None:
    traffic(client, 2)
    time.sleep(2)  # traffic between two scrapes at least, so every rate() has an increase to show
    traffic(client, 1)
    for model in (LLM, VLLM_BASE):  # the base: adapters' sequences count under it, as in vLLM
        deadline = time.monotonic() + 60
        while True:  # Prometheus has scraped the last request
            got = prom_query(prometheus, f'vllm:request_success_total{{model_name="{model}",finished_reason="length"}}'
                                         f' + ignoring(finished_reason) vllm:request_success_total{{model_name='
                                         f'"{model}",finished_reason="stop"}}')
            if got and float(got[0]["value"][1]) >= (6 if model == LLM else 18):
                break
            assert time.monotonic() < deadline, got
            time.sleep(0.5)
    r = prometheus.get("/api/v1/label/model_name/values")  # the dashboard's variable: label_values(model_name)
    assert {LLM, VLLM_BASE} <= set(r.json()["data"])
    assert not set(ADAPTERS) & set(r.json()["data"])  # adapters are in vllm:lora_requests_info, not model_name
    for model in (LLM, VLLM_BASE):
        for target in DASHBOARD["targets"]:
            if "kv_cache_usage_perc" in target["expr"] and model != LLM:
                continue  # only the LLM's Triton reports KV use here
            expr = target["expr"].replace("$model_name", model).replace("$__rate_interval", "1m")
            result = prom_query(prometheus, expr)
            assert result, (model, target["panel"], expr)
            values = [float(s["value"][1]) for s in result]
            assert all(math.isfinite(v) for v in values), (model, expr, values)
            if "increase(" in expr or ("rate(" in expr and "histogram_quantile" not in expr):
                assert max(values) > 0, (model, expr, values)
    kv = prom_query(prometheus, f'vllm:kv_cache_usage_perc{{model_name="{LLM}"}}')
    assert float(kv[0]["value"][1]) == KV_FRACTION
    reasons = prom_query(prometheus, f'sum by(finished_reason) (vllm:request_success_total{{model_name="{LLM}"}})')
    assert {s["metric"]["finished_reason"] for s in reasons} == {"stop", "length", "abort", "error"}


def test_the_endpoint_pickers_scrape_reads_the_gateway_as_a_pod(gateway: GatewayServer, client: OpenAI) -> None:
    with httpx.Client(base_url=gateway.url, timeout=30) as anonymous:
        assert anonymous.get("/v1/models").status_code == 401  # the API still wants a key
        deadline = time.monotonic() + 30
        while True:  # the gateway's first scrape of Triton's KV figures (every 0.2 s) may not have landed yet
            page = anonymous.get("/metrics")  # the EPP sends none
            if "vllm:kv_cache_usage_perc{" in page.text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert page.status_code == 200 and "openai_api_" not in page.text and "vllm:" in page.text
        idle = read_pod(page.text, queued=f"vllm:num_requests_waiting{{model_name={VLLM_BASE}}}",
                        running=f"vllm:num_requests_running{{model_name={VLLM_BASE}}}",
                        kv=f"vllm:kv_cache_usage_perc{{model_name={LLM}}}")
        assert (idle.waiting_queue_size, idle.running_requests_size) == (0, 0) and not idle.active_models
        assert idle.kv_cache_usage_percent == KV_FRACTION and not idle.errors

        def stream(model: str) -> int:
            s = client.chat.completions.create(model=model, max_tokens=16, stream=True, extra_body={"ignore_eos": True},
                                               messages=[{"role": "user", "content": "Tell me a long story."}])
            return sum(1 for c in s if c.choices and c.choices[0].delta.content)

        seen_adapters: set[str] = set()
        busiest = 0
        with ThreadPoolExecutor(6) as pool:
            runs = [pool.submit(stream, m) for m in (*ADAPTERS, VLLM_BASE, *ADAPTERS, VLLM_BASE)]
            while not all(r.done() for r in runs):
                pod = read_pod(anonymous.get("/metrics").text,
                               queued=f"vllm:num_requests_waiting{{model_name={VLLM_BASE}}}",
                               running=f"vllm:num_requests_running{{model_name={VLLM_BASE}}}",
                               kv=f"vllm:kv_cache_usage_perc{{model_name={LLM}}}")
                assert not pod.errors, pod.errors
                busiest = max(busiest, (pod.waiting_queue_size or 0) + (pod.running_requests_size or 0))
                seen_adapters |= pod.active_models | pod.waiting_models
                if pod.active_models or pod.waiting_models:
                    assert pod.max_active_models == len(ADAPTERS)
                time.sleep(0.1)
            assert all(r.result() > 0 for r in runs)
        assert busiest >= 2, busiest  # six streams were in flight on the base and its adapters
        assert seen_adapters == set(ADAPTERS)
        after = read_pod(anonymous.get("/metrics").text, queued=f"vllm:num_requests_waiting{{model_name={VLLM_BASE}}}",
                         running=f"vllm:num_requests_running{{model_name={VLLM_BASE}}}")
        assert (after.waiting_queue_size, after.running_requests_size) == (0, 0) and not after.active_models


def test_our_dashboards_queries_run_on_the_same_prometheus(prometheus: httpx.Client) -> None:
    """deploy/kubernetes/platform/grafana-dashboard.json: every query is valid PromQL on this Prometheus, and each
    returns data after the traffic above, except those that only show errors (none were made)."""
    dash = json.loads((REPO / "deploy/kubernetes/platform/grafana-dashboard.json").read_text(encoding="utf-8"))
    only_on_errors = {"Server error rate", "Refused before a model"}
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$model_name", ".*").replace("$__rate_interval", "1m")
            result = prom_query(prometheus, expr)
            assert result or panel["title"] in only_on_errors, (panel["title"], expr)
