"""What the status page (`GET /status`) shows, gathered in one place: read-only, and never a secret.

`StatusService.report` answers, at the moment it is asked:
- every model (base models, adapters, embedding and rerank models): its kind, readiness (Triton asked now, as
  `/health/ready` does), requests in flight (admitted, `openai_api_model_requests_in_flight`), and its Triton
  sequences waiting (sent, no output yet) and running (`openai_api_sequences_in_flight`);
- each replicated model's replicas: the probe's answer now (so a replica that died shows within one probe,
  `triton.health.PROBE_TIMEOUT_S` at most), routing's view (healthy or marked down, requests in flight from this
  process, load and KV-cache fill where Triton's metrics are scraped);
- each base model's LoRA adapters;
- recent error rates per model: requests and 4xx / 5xx answers over the last `WINDOW_S` seconds, from the
  request counter (`openai_api_requests_total`) sampled every `SAMPLE_S` seconds (with `--workers`, summed over
  every worker, as /metrics is);
- with a keys file, each key's name, team and usage (`QuotaService.usage`: names and counts, never a secret).

The counters and gauges are read from the same collection /metrics exports, so with `--workers` the page shows the
host's figures whichever worker answers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.metrics_core import Metric

from openai_api.observability import Metrics
from openai_api.quota.service import QuotaService
from openai_api.services.models import HealthService
from openai_api.services.registry import ModelRegistry

WINDOW_S = 300.0  # "recent": the last five minutes
SAMPLE_S = 10.0


@dataclass(slots=True)
class _Counts:
    requests: float = 0.0
    client_errors: float = 0.0
    server_errors: float = 0.0


def _request_counts(families: Iterable[Metric]) -> dict[str, _Counts]:
    """Requests per model (configured models only, as the counter labels them), from `openai_api_requests_total`."""
    out: dict[str, _Counts] = {}
    for f in families:
        if f.name != "openai_api_requests":
            continue
        for s in f.samples:
            if not s.name.endswith("_total") or not s.labels.get("model"):
                continue
            c = out.setdefault(s.labels["model"], _Counts())
            c.requests += s.value
            status = s.labels.get("status", "")
            if status.startswith("5"):
                c.server_errors += s.value
            elif status.startswith("4"):
                c.client_errors += s.value
    return out


def _gauges(families: Iterable[Metric]) -> tuple[dict[str, float], dict[tuple[str, str], float]]:
    """(admitted in flight per model, sequences per (model, phase))."""
    admitted: dict[str, float] = {}
    phases: dict[tuple[str, str], float] = {}
    for f in families:
        if f.name == "openai_api_model_requests_in_flight":
            for s in f.samples:
                admitted[s.labels.get("model", "")] = s.value
        elif f.name == "openai_api_sequences_in_flight":
            for s in f.samples:
                key = (s.labels.get("model", ""), s.labels.get("phase", ""))
                phases[key] = phases.get(key, 0.0) + s.value
    return admitted, phases


@dataclass
class StatusService:
    """The status page's data (see the module docstring); `start` begins sampling the request counter."""

    metrics: Metrics
    window_s: float = WINDOW_S
    sample_s: float = SAMPLE_S
    _history: deque[tuple[float, dict[str, _Counts]]] = field(default_factory=deque)
    _task: asyncio.Task[None] | None = None

    def __post_init__(self) -> None:
        self._history.append((time.monotonic(), {}))  # nothing counted before this process began

    def sample(self, now: float | None = None, families: list[Metric] | None = None) -> dict[str, _Counts]:
        """Record the counter's totals now (oldest samples past the window dropped); returns them."""
        now = time.monotonic() if now is None else now
        counts = _request_counts(families if families is not None else self.metrics.exported.collect())
        self._history.append((now, counts))
        while len(self._history) > 1 and self._history[1][0] <= now - self.window_s:
            self._history.popleft()
        return counts

    def start(self) -> None:
        if self._task is None:
            self._history.clear()  # the baseline: what the counters hold now (a restarted worker's included)
            self.sample()
            self._task = asyncio.create_task(self._every(), name="status-sampler")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _every(self) -> None:
        while True:
            await asyncio.sleep(self.sample_s)
            self.sample()

    def recent(self, now_counts: dict[str, _Counts], now: float) -> tuple[float, dict[str, _Counts]]:
        """(seconds covered, per-model counts over them): now against the oldest sample in the window."""
        then, old = self._history[0] if self._history else (now, {})
        out = {m: _Counts(c.requests - old.get(m, _Counts()).requests,
                          c.client_errors - old.get(m, _Counts()).client_errors,
                          c.server_errors - old.get(m, _Counts()).server_errors) for m, c in now_counts.items()}
        return now - then, out

    async def report(self, registry: ModelRegistry, health: HealthService, quota: QuotaService) -> dict[str, Any]:
        """Everything the page shows (see the module docstring), as plain data."""
        readiness = await health.readiness("any", details=True)
        families = list(self.metrics.exported.collect())
        now = time.monotonic()
        span, recent = self.recent(self.sample(now, families), now)
        admitted, phases = _gauges(families)
        ready: dict[str, str] = readiness.get("models", {})
        models = []
        for name in (*registry.llms, *registry.encoders):
            rt = registry.llms.get(name)
            adapter = rt.adapter if rt is not None else None
            base = adapter.base if adapter is not None else None
            counts = recent.get(name, _Counts())
            models.append({
                "name": name, "kind": registry.kind_of(name), "base": base,
                "ready": ready.get(base or name, "not ready") == "ready",
                "in_flight": admitted.get(name, 0.0), "waiting": phases.get((name, "waiting"), 0.0),
                "running": phases.get((name, "running"), 0.0), "requests": counts.requests,
                "client_errors": counts.client_errors, "server_errors": counts.server_errors})
        probes: dict[str, dict[str, str]] = readiness.get("replicas", {})
        replicas = {model: [{**r, "probe": probes.get(model, {}).get(r["url"], "not ready")} for r in s.states()]
                    for model, s in registry.replicas.items()}
        adapters = {b: sorted(names) for b, names in registry.served().adapters.items()}
        keys = await quota.usage() if quota.table is not None else None
        return {"ready": readiness.get("ready", False), "models": models, "replicas": replicas,
                "adapters": adapters, "window_s": span, "keys": keys, "time": time.time()}
