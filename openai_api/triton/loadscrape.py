"""Triton's own load, read from its metrics port (`GET http://host:metrics_port/metrics`, Prometheus text).

Per replica, what `routing.LeastLoad` and `PrefixAffinity`'s balance read (summed over every model the
server runs, since they share its GPU):
- `nv_trt_llm_request_metrics{request_type="waiting"|"active"}` (TensorRT-LLM's in-flight batcher):
  requests queued and requests in the batch; their sum is the replica's in-flight count;
- else `nv_inference_pending_request_count` (every backend): requests Triton holds that no model instance
  has taken yet. It leaves out the ones executing, which is why `Replica.load` never goes below this
  process's own in-flight count;
- `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`: the KV cache's used fraction
  (the largest over the server's models).
A scrape is bounded: one GET with a deadline (connect + read) and at most `MAX_BYTES` of body; any failure
leaves the replica's last figures to age out (`Replica.load` ignores figures older than `STALE_AFTER`
scrape intervals).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import httpx

logger = logging.getLogger(__name__)

MAX_BYTES = 4 << 20  # a Triton with many models writes ~100 KB; anything past this is not a metrics page
PENDING = "nv_inference_pending_request_count"
TRT_REQUESTS = "nv_trt_llm_request_metrics"
TRT_KV = "nv_trt_llm_kv_cache_block_metrics"
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


@dataclass(frozen=True, slots=True)
class TritonLoad:
    """One scrape's figures of one Triton server."""

    pending: float = 0.0
    waiting: float | None = None
    active: float | None = None
    kv_fraction: float | None = None

    @property
    def in_flight(self) -> float:
        """Requests the server holds: TensorRT-LLM's waiting + active where it reports them, else pending."""
        if self.waiting is None and self.active is None:
            return self.pending
        return (self.waiting or 0.0) + (self.active or 0.0)


def parse_sample(line: str) -> tuple[str, dict[str, str], float] | None:
    """`name{a="x",b="y"} value [timestamp]` -> (name, labels, value); None for a line that is not a sample."""
    line = line.strip()
    if not line or line.startswith("#"):
        return None
    brace = line.find("{")
    labels: dict[str, str] = {}
    if brace >= 0:
        end = line.rfind("}")
        if end < brace:
            return None
        name, body, rest = line[:brace], line[brace + 1:end], line[end + 1:]
        pos = 0
        while pos < len(body):
            m = _LABEL.match(body, pos)
            if m is None:
                return None
            labels[m.group(1)] = m.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            pos = m.end()
    else:
        name, _, rest = line.partition(" ")
    fields = rest.split()
    if not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return name.strip(), labels, value


def parse_metrics(text: str) -> TritonLoad:
    """The load figures of one Triton `/metrics` page (absent families stay at their defaults)."""
    pending = 0.0
    waiting: float | None = None
    active: float | None = None
    kv: float | None = None
    for line in text.splitlines():
        if not line.startswith("nv_"):
            continue
        sample = parse_sample(line)
        if sample is None:
            continue
        name, labels, value = sample
        if name == PENDING:
            pending += value
        elif name == TRT_REQUESTS:
            kind = labels.get("request_type")
            if kind == "waiting":
                waiting = (waiting or 0.0) + value
            elif kind == "active":
                active = (active or 0.0) + value
        elif name == TRT_KV and labels.get("kv_cache_block_type") == "fraction":
            kv = value if kv is None else max(kv, value)
    return TritonLoad(pending=pending, waiting=waiting, active=active, kv_fraction=kv)


def metrics_url(replica_url: str, port: int) -> str:
    """The metrics page of the Triton at `replica_url` (host:port, [v6]:port): same host, `port`."""
    host = replica_url.rpartition(":")[0] if ":" in replica_url else replica_url
    return f"http://{host}:{port}/metrics"


async def scrape(client: httpx.AsyncClient, url: str, timeout_s: float) -> TritonLoad | None:
    """One bounded GET of a metrics page; None on any failure (logged at debug: a down replica is routine)."""
    try:
        async with client.stream("GET", url, timeout=httpx.Timeout(timeout_s)) as resp:
            if resp.status_code != 200:
                return None
            body = bytearray()
            async for part in resp.aiter_bytes():
                body += part
                if len(body) > MAX_BYTES:
                    logger.warning("metrics page %s is over %d bytes: not read", url, MAX_BYTES)
                    return None
        return parse_metrics(body.decode("utf-8", "replace"))
    except (httpx.HTTPError, OSError) as e:
        logger.debug("scrape of %s failed: %s", url, e)
        return None
