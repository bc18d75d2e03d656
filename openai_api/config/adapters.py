"""A config's LoRA adapters: each LLM entry's listed adapters and those found in its `adapters_dir`, read and checked
against the base model (`openai_api.lora`) once, when the config loads, and the runtime loads that
`persist_adapters` recorded, restored. Apart from the loader: the services' registry asks here for each LLM's
adapters (`adapters_of`), read now for a config built in code rather than loaded from a file."""

from __future__ import annotations

import logging
from pathlib import Path

from openai_api.config.entries import LLMModel, LoraAdapterEntry
from openai_api.config.gateway import GatewayConfig
from openai_api.config.problems import _Problems
from openai_api.lora import (
    RUNTIME_STATE,
    AdapterError,
    BaseShape,
    LoraAdapter,
    abs_path,
    base_matches,
    read_adapter,
    read_runtime_state,
    scan_dir,
)

logger = logging.getLogger(__name__)


def _load_entry(m: LLMModel, entry: LoraAdapterEntry, shape: BaseShape | None) -> LoraAdapter:
    """One configured adapter, read and checked against its base model `m` (`AdapterError` if it cannot be
    served); without a `source` an adapter whose weights only the backend holds."""
    if entry.source is None:
        return LoraAdapter(name=entry.name, base=m.name, lora_name=entry.lora_name or "")
    adapter = read_adapter(Path(entry.source), entry.name, m.name, shape)
    adapter.lora_name = entry.lora_name or entry.name
    adapter.check(shape, m.max_lora_rank)
    if entry.base is not None and not base_matches(adapter, entry.base):
        raise AdapterError(f"adapter {entry.name!r} was trained on {adapter.base_model or 'an unnamed base model'!r}, "
                           f"not {entry.base!r} (its `base` check)")
    return adapter


def resolve_adapters(config: GatewayConfig, file: Path, problems: _Problems | None = None) -> None:
    """Read, check and attach every LLM's adapters (listed, and found in its `adapters_dir`); a problem, or an
    adapter name that is already a model's, an alias or another adapter's, is a `ConfigError` naming both
    (raised, or each added to `problems`)."""
    problems = problems or _Problems(strict=True)
    base = file.resolve().parent
    taken: dict[str, str] = {m.name: f"model {m.name!r}" for m in config.all_models()}
    for m in config.llm:
        for alias in m.aliases:
            taken.setdefault(alias, f"alias {alias!r} of model {m.name!r}")
    for llm, m in ((where, m) for where, m in config.entries() if isinstance(m, LLMModel)):
        entries = [e.model_copy(update={"source": abs_path(base, e.source) if e.source is not None else None})
                   for e in m.adapters]
        if m.adapters_dir is not None:
            m.adapters_dir = abs_path(base, m.adapters_dir)
            try:
                scanned = scan_dir(m.adapters_dir)
            except AdapterError as e:
                problems.add(file, f"{llm}.adapters_dir", str(e))
                scanned = []
            listed = {e.name for e in entries}
            entries += [LoraAdapterEntry(name=n, source=src, lora_name=None if ln == n else ln)
                        for n, src, ln in scanned if n not in listed]
        runtime: dict[str, str] = {}
        if m.persist_adapters:
            if m.adapters_dir is None:
                problems.add(file, f"{llm}.persist_adapters",
                             "needs adapters_dir (where runtime loads are read from and recorded)")
            else:
                runtime, unloaded = read_runtime_state(m.adapters_dir)
                entries = [e for e in entries if e.name not in unloaded and e.name not in runtime]
        shape = BaseShape.from_folder(m.path) if entries or runtime else None
        loaded = []
        for j, entry in enumerate(entries):
            where = f"{llm}.adapters[{j}]" if j < len(m.adapters) else f"{llm}.adapters_dir"
            if entry.name in taken:
                problems.add(file, where, f"adapter {entry.name!r} of model {m.name!r} has the same name as "
                                          f"{taken[entry.name]}")
                continue
            taken[entry.name] = f"adapter {entry.name!r} of model {m.name!r}"
            try:
                loaded.append(_load_entry(m, entry, shape))
            except AdapterError as e:
                problems.add(file, where, str(e))
        if runtime:
            loaded += _restore_runtime(m, runtime, shape, taken)
        m._lora = loaded


def _restore_runtime(m: LLMModel, runtime: dict[str, str], shape: BaseShape | None,
                     taken: dict[str, str]) -> list[LoraAdapter]:
    """The runtime loads recorded for `m` (`persist_adapters`), read and checked again; one that no longer serves
    (folder gone, name taken by a model since, outside adapters_dir) is skipped with a warning, never fatal."""
    assert m.adapters_dir is not None
    restored = []
    for name, rel in runtime.items():
        source = abs_path(m.adapters_dir, rel)
        problem = (f"its name is already {taken[name]}" if name in taken else
                   "it is not inside adapters_dir" if not source.is_relative_to(m.adapters_dir) else None)
        if problem is None:
            try:
                restored.append(_load_entry(m, LoraAdapterEntry(name=name, source=source), shape))
                taken[name] = f"adapter {name!r} of model {m.name!r}"
            except AdapterError as e:
                problem = str(e)
        if problem is not None:
            logger.warning("model %s: the runtime-loaded adapter %s (%s, recorded in %s) is not restored: %s",
                           m.name, name, source, RUNTIME_STATE, problem)
    return restored


def adapters_of(m: LLMModel) -> list[LoraAdapter]:
    """The adapters of LLM entry `m`: as `load_config` read them, else (a config built in code) read now."""
    if m._lora is None:
        shape = BaseShape.from_folder(m.path) if m.adapters else None
        m._lora = [_load_entry(m, e, shape) for e in m.adapters]
    return list(m._lora)
