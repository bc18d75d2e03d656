"""Process-wide settings (CLI flags and environment), separate from the model config file."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Settings:
    config_file: Path
    api_keys: list[str] = field(default_factory=list)
    host: str = "localhost"
    port: int = 5100
    # Routes that stay reachable without a key; everything else in the route table is guarded.
    open_paths: frozenset[str] = frozenset({"/health", "/health/ready", "/metrics", "/ping"})
