"""A test-side reader of a model server's metrics page that follows the Gateway API Inference Extension's Model
Server Protocol as its endpoint picker (EPP) reads it: our own code, written from the protocol
(kubernetes-sigs/gateway-api-inference-extension, docs/proposals/003-model-server-protocol) and the scrape it
describes (llm-d/llm-d-inference-scheduler, pkg/epp/backend/metrics/metrics.go, `promToPodMetrics`), both
Apache-2.0; nothing of theirs is copied but the metric and label names.

How the EPP reads one pod (one GET of its metrics page, parsed as Prometheus text):
- each metric is a spec `name` or `name{label=value,...}`; the vLLM engine's defaults are
  `vllm:num_requests_waiting` (TotalQueuedRequests), `vllm:num_requests_running` (TotalRunningRequests),
  `vllm:kv_cache_usage_perc` (KVCacheUtilization) and `vllm:lora_requests_info` (LoRA);
- for a spec, of the family's series whose labels include the spec's, the one with the newest timestamp (none
  has one here: the first in the page) is read as a gauge: a family of another type reads 0; queue and running
  are truncated to integers; a missing family is an error for that metric alone;
- LoRA: of `vllm:lora_requests_info`'s series with a non-empty `running_lora_adapters` or
  `waiting_lora_adapters`, the one with the largest value (a timestamp); its comma-separated adapters are the
  pod's active and waiting models, `max_lora` (an integer) its MaxActiveModels. None such: no LoRA data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from prometheus_client.parser import text_string_to_metric_families

_SPEC = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$")


@dataclass
class PodMetrics:
    """What the EPP keeps of one pod after a scrape (`MetricsState`'s fields it fills)."""

    waiting_queue_size: int | None = None
    running_requests_size: int | None = None
    kv_cache_usage_percent: float | None = None
    active_models: set[str] = field(default_factory=set)
    waiting_models: set[str] = field(default_factory=set)
    max_active_models: int | None = None
    errors: list[str] = field(default_factory=list)


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """`name{a=b,c=d}` (values quoted or not) -> (name, labels)."""
    m = _SPEC.match(spec)
    if m is None:
        raise ValueError(f"not a metric spec: {spec!r}")
    labels: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in (m.group(2) or "").split(","))):
        k, _, v = part.partition("=")
        labels[k.strip()] = v.strip().strip('"')
    return m.group(1), labels


def read_pod(text: str, queued: str = "vllm:num_requests_waiting", running: str = "vllm:num_requests_running",
             kv: str = "vllm:kv_cache_usage_perc", lora: str = "vllm:lora_requests_info") -> PodMetrics:
    """One scrape of one pod, read as the EPP reads it (see the module docstring)."""
    families = {f.name: f for f in text_string_to_metric_families(text)}
    out = PodMetrics()

    def gauge(spec: str) -> float | None:
        name, want = parse_spec(spec)
        family = families.get(name)
        if family is None or not family.samples:
            out.errors.append(f"metric family {name!r} not found")
            return None
        for s in family.samples:
            if all(s.labels.get(k) == v for k, v in want.items()):
                return s.value if family.type == "gauge" else 0.0
        out.errors.append(f"no matching metric found for {spec!r}")
        return None

    if (q := gauge(queued)) is not None:
        out.waiting_queue_size = int(q)
    if (r := gauge(running)) is not None:
        out.running_requests_size = int(r)
    out.kv_cache_usage_percent = gauge(kv)
    family = families.get(parse_spec(lora)[0])
    if family is None:
        out.errors.append(f"metric family {lora!r} not found")
        return out
    latest = None
    for s in family.samples:
        if not (s.labels.get("running_lora_adapters") or s.labels.get("waiting_lora_adapters")):
            continue
        if latest is None or s.value > latest.value:
            latest = s
    if latest is not None:
        out.active_models = {a for a in latest.labels.get("running_lora_adapters", "").split(",") if a}
        out.waiting_models = {a for a in latest.labels.get("waiting_lora_adapters", "").split(",") if a}
        if latest.labels.get("max_lora"):
            out.max_active_models = int(latest.labels["max_lora"])
    return out
