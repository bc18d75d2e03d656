"""What a problem in the model config is, and how one reaches the operator: `ConfigError` (one line naming the
file, the field and the reason), `_Problems` (where the loader puts each: `load_config` stops at the first,
`check_config` lists them all), and `_Strict`, the base of every model of the file, under which an unknown key is
a problem rather than a silent default. Apart so that the entry models, the files' checks, the adapters and the
loader report problems one way without importing one another."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict


class ConfigError(Exception):
    """A config problem, already phrased as `file: field: reason` for the operator."""

    def __init__(self, file: Path | str, field: str, reason: str) -> None:
        self.file, self.field, self.reason = str(file), field, reason
        where = f"{self.file}: {field}: " if field else f"{self.file}: "
        super().__init__(where + reason)


class _Strict(BaseModel):
    # Typos in a model entry ("chat_templte") must fail loudly rather than silently use a default.
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class _Problems:
    """Where the loader puts what it finds: `load_config` stops at the first (raised), `check_config` keeps
    going and lists them all."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict
        self.found: list[ConfigError] = []

    def add(self, file: Path, field: str, reason: str) -> None:
        error = ConfigError(file, field, reason)
        if self.strict:
            raise error from None  # one line: never the exception the problem was found in
        self.found.append(error)
