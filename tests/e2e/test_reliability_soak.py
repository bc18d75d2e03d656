"""A small run of scripts/soak.py against the session Triton: the gateway CLI as its own process, mixed
concurrent traffic, zero errors, bounded memory, and a clean exit afterwards."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from openai_api.embedded.launcher import EmbeddedTriton

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "soak.py"


def load_soak() -> ModuleType:
    spec = importlib.util.spec_from_file_location("soak_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_soak_small_run_has_no_errors_and_bounded_memory(triton: EmbeddedTriton) -> None:
    soak = load_soak()
    gateway = soak.Gateway(triton.grpc_url, triton.http_url, "soak-key")
    try:
        gateway.wait_ready()
        report = soak.soak(gateway.url, gateway.proc.pid, "soak-key", count=96, concurrency=32, max_growth_mib=48)
    finally:
        code = gateway.stop()
    assert report["errors"] == 0, report
    assert report["soak"]["by_kind"] == {"chat": 24, "stream": 24, "embeddings": 24, "rerank": 24}
    assert report["rss"]["growth_mib"] < 48, report["rss"]
    assert report["passed"], report
    assert code == 0
