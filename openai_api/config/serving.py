"""Where a model entry is served and how a request reaches it: `_Served` (what every llm, embedding and rerank
entry shares: its name, its Triton url or urls, its tokenizer folder, its deadline), `RoutingConfig` (which replica
a request picks) and `DiscoveryConfig` (how `dns:///` urls are re-resolved). Apart from the entry models: this is
the part of an entry the Triton side reads (`triton.routing`, `triton.replicas`, `triton.discovery`), the same for
the three kinds."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from openai_api.config.problems import _Strict

RoutingPolicy = Literal["least_outstanding", "round_robin", "least_load", "prefix_affinity"]
DNS_SCHEME = "dns:///"


class RoutingConfig(_Strict):
    """How a request picks one replica of a model (`openai_api.triton.routing`). Every policy skips replicas
    marked down and fails over as before; they differ in which healthy replica comes first:
    - `least_outstanding` (default): fewest requests in flight from this gateway process.
    - `round_robin`: in turn.
    - `least_load`: lowest load score = requests in flight (Triton's own count from its metrics port, plus what
      this process started since the last scrape; never less than this process's own count) + `kv_weight` x the
      replica's KV-cache fill fraction (TensorRT-LLM only). Without a `metrics_port` it is least_outstanding.
    - `prefix_affinity`: the replica that most recently served the longest run of this prompt's leading
      `block_tokens`-token blocks (chained block hashes), so its KV cache likely holds that prefix; least load
      when no replica holds at least `min_match_blocks`, when the holder is down, or when the replicas are
      imbalanced (max load - min load > `imbalance_abs` and max load > `imbalance_rel` x min load). With a
      session key (`session_header`'s value; with `agent_sessions`, on by default, OpenAI's `prompt_cache_key`
      or the session header Claude Code and Codex send; the request's `user` when `session_user`) the
      session's last replica is preferred the same way, so an agent's turns reach the KV cache of its prefix.
    """

    policy: RoutingPolicy = "least_outstanding"
    # Triton's metrics port on every replica (its /metrics in Prometheus text); the host is the replica's. Or
    # a map replica url -> port, for several Tritons on one host (a replica it does not name is not scraped).
    metrics_port: int | dict[str, int] | None = None
    scrape_interval_s: float = Field(default=1.0, gt=0, description="seconds between two scrapes of a replica")
    scrape_timeout_s: float = Field(default=0.5, gt=0, description="deadline of one scrape (connect + read)")
    kv_weight: float = Field(default=4.0, ge=0, description="load added by a full KV cache (fraction 1.0)")
    block_tokens: int = Field(default=16, ge=1, le=4096, description="tokens per hashed prefix block")
    max_blocks: int = Field(default=65536, ge=1, description="block hashes remembered (oldest forgotten first)")
    min_match_blocks: int = Field(default=1, ge=1, description="shortest cached prefix worth following")
    imbalance_abs: float = Field(default=8.0, ge=0)
    imbalance_rel: float = Field(default=1.5, ge=1.0)
    session_header: str | None = Field(default=None, min_length=1, description="request header naming a session")
    agent_sessions: bool = Field(default=True, description=(
        "OpenAI's prompt_cache_key and the coding agents' session headers (Claude Code's X-Claude-Code-Session-Id, "
        "Codex's session_id) name a session"))
    session_user: bool = Field(default=False, description="the request's `user` names a session")
    max_sessions: int = Field(default=65536, ge=1, description="sessions remembered (oldest forgotten first)")

    @field_validator("metrics_port")
    @classmethod
    def _ports(cls, v: int | dict[str, int] | None) -> int | dict[str, int] | None:
        for port in ([] if v is None else [v] if isinstance(v, int) else v.values()):
            if not 0 < port < 65536:
                raise ValueError(f"{port} is not a TCP port")
        return v

    def metrics_port_of(self, replica_url: str) -> int | None:
        """The metrics port of the Triton at `replica_url` (None: not scraped)."""
        port = self.metrics_port
        return port.get(replica_url) if isinstance(port, dict) else port


class DiscoveryConfig(_Strict):
    """Re-resolution of `dns:///host:port` urls: every A/AAAA record of `host` is a replica."""

    interval_s: float = Field(default=5.0, gt=0, description="seconds between two resolutions")
    resolve_timeout_s: float = Field(default=2.0, gt=0, description="deadline of one resolution")
    # A new address serves only after Triton answers that the model is ready there.
    ready_timeout_s: float = Field(default=2.0, gt=0, description="deadline of one readiness check")


def _check_url(u: str) -> None:
    if u.startswith(DNS_SCHEME):
        host, sep, port = u[len(DNS_SCHEME):].rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536 or "/" in host:
            raise ValueError(f"{u!r}: a DNS url is dns:///host:port")
    elif u.startswith("dns:"):
        raise ValueError(f"{u!r}: a DNS url is dns:///host:port (three slashes: no DNS server named)")


class _Served(_Strict):
    name: str = Field(min_length=1)
    # One "host:port", or a list of them for several Triton replicas serving the same model. A
    # "dns:///host:port" entry stands for every address `host` resolves to, re-resolved every
    # `discovery.interval_s` (a Kubernetes headless Service: one address per ready pod).
    url: str | list[str] = Field(description="host:port of the Triton endpoint(s) for `transport`")
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    discovery: DiscoveryConfig = Field(default_factory=DiscoveryConfig)
    path: Path = Field(description="folder with tokenizer.json (and the model's own configs)")
    triton_model: str | None = Field(default=None, description="Triton's model name, if not `name`")
    triton_version: str = ""
    timeout_s: float = Field(default=600.0, gt=0, description="per-request deadline")

    @property
    def triton_name(self) -> str:
        return self.triton_model or self.name

    @property
    def urls(self) -> list[str]:
        return [self.url] if isinstance(self.url, str) else list(self.url)

    @field_validator("url")
    @classmethod
    def _urls_not_empty(cls, v: str | list[str]) -> str | list[str]:
        items = [v] if isinstance(v, str) else v
        if not items or any(not u.strip() for u in items):
            raise ValueError("must be a non-empty host:port, or a non-empty list of them")
        if len(set(items)) != len(items):
            raise ValueError("lists the same replica twice")
        for u in items:
            _check_url(u)
        return v

    @model_validator(mode="after")
    def _prefix_for_llms(self) -> _Served:
        if self.routing.policy == "prefix_affinity" and getattr(self, "kind", "llm") != "llm":
            raise ValueError("routing.policy prefix_affinity is for llm models (an encoder keeps no KV cache)")
        return self

    @property
    def discovered(self) -> bool:
        """Whether any url is a `dns:///` name (its replicas change at run time)."""
        return any(u.startswith(DNS_SCHEME) for u in self.urls)
