"""The keys file (`--keys-file`, YAML or JSON): per key a name, team, secret, allowed models and limits.

```yaml
window_seconds: 60                       # optional: the rate window; per-minute limits scale to it
priority_shares: {high: 1.0, normal: 0.9, low: 0.7}   # optional: share of --max-in-flight per priority
keys:
  - name: search-prod                    # unique; the label in /metrics and the admin usage (never the secret)
    team: search
    secret_sha256: 9f86d081...           # hex SHA-256 of the key, or:
    # secret_env: SEARCH_PROD_KEY        # the key itself, read from this environment variable
    models: ["smollm2-*", all-minilm-l6-v2]   # names or globs; default every model
    requests_per_minute: 600
    tokens_per_minute: 200000            # prompt + completion
    max_concurrent: 16
    tokens_per_day: 5000000
    tokens_per_month: 100000000
    priority: normal                     # high | normal | low
    max_class: interactive               # most urgent scheduler class it may ask for: interactive|standard|batch
    default_class: standard              # the class of its requests that ask for none (docs/guides/batches.md)
    admin: false                         # may read GET /v1/admin/usage (and /metrics)
    metrics: false                       # may read /metrics (a key for Prometheus: give it `models: []`)
```

Secrets are never logged, not even a wrong one: `load_keys` errors name the key entry and the field.
A presented key is looked up by its SHA-256 (a dict lookup on a hash of the secret reveals nothing
by its timing about any stored secret).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from openai_api.quota.caller import RANKS, Caller, Policy, Priority, PriorityClass

PositiveInt = Annotated[int, Field(gt=0)]


class KeyEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:@/+-]+$")]
    team: str = ""
    secret_sha256: Annotated[str | None, Field(pattern=r"^[0-9a-fA-F]{64}$")] = None
    secret_env: str | None = None
    models: list[str] = Field(default_factory=lambda: ["*"])
    requests_per_minute: PositiveInt | None = None
    tokens_per_minute: PositiveInt | None = None
    max_concurrent: PositiveInt | None = None
    tokens_per_day: PositiveInt | None = None
    tokens_per_month: PositiveInt | None = None
    priority: Priority = "normal"
    admin: bool = False
    metrics: bool = False
    max_class: PriorityClass = "interactive"
    default_class: PriorityClass = "standard"

    @model_validator(mode="after")
    def _one_secret(self) -> KeyEntry:
        if (self.secret_sha256 is None) == (self.secret_env is None):
            raise ValueError("give exactly one of secret_sha256 and secret_env")
        if RANKS[self.default_class] < RANKS[self.max_class]:
            raise ValueError(f"default_class {self.default_class!r} is more urgent than max_class {self.max_class!r}")
        return self


class KeysFileModel(BaseModel):
    model_config = ConfigDict(extra="forbid")

    window_seconds: Annotated[float, Field(gt=0, le=3600)] = 60.0
    priority_shares: dict[Priority, Annotated[float, Field(gt=0, le=1)]] = Field(default_factory=dict)
    keys: list[KeyEntry]

    @field_validator("keys")
    @classmethod
    def _unique(cls, keys: list[KeyEntry]) -> list[KeyEntry]:
        seen: set[str] = set()
        for k in keys:
            if k.name in seen:
                raise ValueError(f"the key name {k.name!r} appears twice")
            seen.add(k.name)
        return keys


DEFAULT_SHARES: dict[str, float] = {"high": 1.0, "normal": 0.9, "low": 0.7}
API_KEY_NAME = "api-key"  # the callers of --api-key keys: no limits, every model
ANONYMOUS = "anonymous"  # a gateway without keys


class KeysFileError(ValueError):
    """A keys file that cannot be used; the message names the file and the entry, never a secret."""


@dataclass(frozen=True)
class KeyTable:
    """The keys as loaded: SHA-256 digest -> the key's caller template, and the rate window."""

    by_digest: Mapping[bytes, tuple[str, str, Policy]]
    window_s: float
    shares: Mapping[str, float]
    names: tuple[str, ...]
    teams: Mapping[str, str]
    policies: Mapping[str, Policy]

    def caller(self, secret: bytes) -> Caller | None:
        found = self.by_digest.get(hashlib.sha256(secret).digest())
        if found is None:
            return None
        name, team, policy = found
        return Caller(name, team, policy, self.shares.get(policy.priority, 1.0))


def api_key_digest(secret: bytes) -> str:
    """Which `--api-key` key a caller presented, as its stored objects' owner names it (`Caller.key_digest`):
    the first 24 hex digits of its SHA-256, never the key."""
    return hashlib.sha256(secret).hexdigest()[:24]


def sha256_hex(secret: str) -> str:
    """What to write as `secret_sha256` for a key (as `printf %s KEY | sha256sum` prints it)."""
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_keys(data: Any, source: str, environ: Mapping[str, str] | None = None) -> KeyTable:
    env = os.environ if environ is None else environ
    try:
        model = KeysFileModel.model_validate(data)
    except ValidationError as e:
        err = e.errors(include_url=False, include_input=False)[0]
        where = _where(data, err["loc"])
        raise KeysFileError(f"{source}: {where}: {err['msg']}") from None
    by_digest: dict[bytes, tuple[str, str, Policy]] = {}
    policies: dict[str, Policy] = {}
    for k in model.keys:
        if k.secret_env is not None:
            secret = env.get(k.secret_env, "")
            if not secret:
                raise KeysFileError(f"{source}: key {k.name!r}: the environment variable {k.secret_env} is not set")
            digest = hashlib.sha256(secret.encode()).digest()
        else:
            assert k.secret_sha256 is not None
            digest = bytes.fromhex(k.secret_sha256)
        if digest in by_digest:
            raise KeysFileError(f"{source}: key {k.name!r} has the same secret as key {by_digest[digest][0]!r}")
        policy = Policy(models=tuple(k.models), requests_per_minute=k.requests_per_minute,
                        tokens_per_minute=k.tokens_per_minute, max_concurrent=k.max_concurrent,
                        tokens_per_day=k.tokens_per_day, tokens_per_month=k.tokens_per_month,
                        priority=k.priority, admin=k.admin, metrics=k.metrics, max_class=k.max_class,
                        default_class=k.default_class)
        by_digest[digest] = (k.name, k.team, policy)
        policies[k.name] = policy
    shares: dict[str, float] = {**DEFAULT_SHARES, **{str(k): v for k, v in model.priority_shares.items()}}
    return KeyTable(by_digest, model.window_seconds, shares,
                    tuple(k.name for k in model.keys), {k.name: k.team for k in model.keys}, policies)


def _where(data: Any, loc: tuple[Any, ...]) -> str:
    """An error location in the file's words: `keys[2] ('search-prod').tokens_per_minute`."""
    out = ""
    node = data
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
            try:
                node = node[part]
                name = node.get("name") if isinstance(node, dict) else None
                if isinstance(name, str):
                    out += f" ({name!r})"
            except (IndexError, KeyError, TypeError):
                node = None
        else:
            out += ("." if out else "") + str(part)
            node = node.get(part) if isinstance(node, dict) else None
    return out or "the file"


def load_keys(path: Path, environ: Mapping[str, str] | None = None) -> KeyTable:
    """The keys file at `path` (JSON if it parses as JSON, else YAML). Raises `KeysFileError`."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise KeysFileError(f"{path}: cannot read: {e.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" (line {mark.line + 1})" if mark is not None else ""
            raise KeysFileError(f"{path}: neither JSON nor YAML{where}") from None
    if not isinstance(data, dict):
        raise KeysFileError(f"{path}: expected a mapping with a 'keys' list")
    return parse_keys(data, str(path), environ)
