"""Loading and unloading LoRA adapters while the gateway runs (vLLM's `/v1/load_lora_adapter` and
`/v1/unload_lora_adapter`).

An adapter is read only from inside a base model's `adapters_dir` (its real path, symlinks and `..` resolved:
no reading arbitrary files), read and checked against the base model before it appears (the files parse, each
module fits the base model's layers and sizes, its rank is within `max_lora_rank`, the name is free), then
served as a model like a configured one. Unloading stops new requests on it; streams already using it hold
their own reference and finish. Without `persist_adapters` either lasts until the gateway stops (an adapter
loaded from a folder of `adapters_dir` named like the adapter comes back at a restart through the start-up
scan); with it, each is recorded in `adapters_dir` (`openai_api.lora.RUNTIME_STATE`) before it is answered, and
replayed at the next start-up. Each gateway worker process serves its own set: without `persist_adapters` a load
reaches the worker that answered it; with it, every other worker applies the record within a second of the
change (`sync`, called by `openai_api.reload`'s file poll), so the workers serve the same adapters.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from openai_api.config import LLMModel
from openai_api.errors import InternalError, InvalidRequestError, ModelNotFoundError
from openai_api.lora import (
    RUNTIME_STATE,
    AdapterError,
    BaseShape,
    LoraAdapter,
    read_adapter,
    read_runtime_state,
    record_runtime,
)
from openai_api.services.registry import ModelRegistry

logger = logging.getLogger(__name__)


def _bad(message: str, param: str, code: str = "invalid_lora_adapter") -> InvalidRequestError:
    return InvalidRequestError(message, param=param, code=code)


def _read_checked(base: LLMModel, folder: Path, name: str, shape: BaseShape | None) -> LoraAdapter:
    """The adapter in `folder` served as `name` on `base`, read and checked against it (`AdapterError` if not)."""
    adapter = read_adapter(folder, name, base.name, shape)
    adapter.check(shape, base.max_lora_rank)
    return adapter


class LoraService:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    def _taken(self, name: str) -> str | None:
        """What already answers to `name` (a model, an adapter, an alias), else None."""
        rt = self.registry.llms.get(name)
        if rt is not None:
            return f"the adapter {name!r} of {rt.adapter.base!r}" if rt.adapter is not None else f"the model {name!r}"
        if self.registry.kind_of(name) is not None:
            return f"the model {name!r}"
        if any(name in m.aliases for m in self.registry.config.llm):
            return f"an alias of a model ({name!r})"
        return None

    def _base(self, path: str, base_model: str | None) -> tuple[LLMModel, Path]:
        """The base model whose adapters_dir holds `path` (`base_model` when given), and the path resolved."""
        bases = [m for m in self.registry.config.llm if m.adapters_dir is not None]
        if base_model is not None:
            found = next((m for m in self.registry.config.llm if m.name == base_model), None)
            if found is None:
                raise _bad(f"base_model {base_model!r} is not a configured LLM.", "base_model")
            if found.adapters_dir is None:
                raise _bad(f"The model {base_model!r} has no adapters_dir, so adapters cannot be loaded onto it at "
                           "runtime.", "base_model")
            bases = [found]
        if not bases:
            raise _bad("No model has an adapters_dir, the only place adapters may be loaded from at runtime.",
                       "lora_path")
        for m in bases:
            root = Path(str(m.adapters_dir)).resolve()
            given = Path(path)
            real = (given if given.is_absolute() else root / given).resolve()
            if real == root or not real.is_relative_to(root):
                continue
            return m, real
        roots = ", ".join(str(m.adapters_dir) for m in bases)
        raise _bad(f"lora_path {path!r} is outside the allowed adapters root ({roots}); adapters are loaded only "
                   "from a model's adapters_dir.", "lora_path", code="lora_path_not_allowed")

    async def load(self, name: str, path: str, base_model: str | None = None) -> LoraAdapter:
        """Read, check and serve the adapter at `path` as model `name`; a 400 naming the problem otherwise."""
        if not name or not name.strip():
            raise _bad("lora_name must be a non-empty model name.", "lora_name")
        if (taken := self._taken(name)) is not None:
            raise _bad(f"lora_name {name!r} is already the name of {taken}.", "lora_name", code="name_collision")
        base, folder = self._base(path, base_model)
        shape = BaseShape.from_folder(base.path)

        try:  # off the event loop: the weights are read and hashed
            adapter = await asyncio.to_thread(_read_checked, base, folder, name, shape)
        except AdapterError as e:
            raise _bad(f"The adapter cannot be loaded: {e}.", "lora_path") from None
        if (taken := self._taken(name)) is not None:  # loaded meanwhile by a concurrent request
            raise _bad(f"lora_name {name!r} is already the name of {taken}.", "lora_name", code="name_collision")
        self.registry.add_adapter(adapter)
        if base.persist_adapters:
            try:
                await asyncio.to_thread(record_runtime, Path(str(base.adapters_dir)), name, folder)
            except OSError as e:
                self.registry.remove_adapter(name)
                logger.error("LoRA adapter %s not loaded: %s cannot be written (%s)", name, RUNTIME_STATE, e)
                raise InternalError(f"The adapter {name!r} was not loaded: the gateway could not record it for a "
                                    "restart (persist_adapters); its log has the details.") from None
        logger.info("LoRA adapter %s loaded from %s onto %s (rank %d, %d modules, task id %d)", name, folder,
                    base.name, adapter.rank, len(adapter.modules), adapter.task_id)
        return adapter

    def unload(self, name: str) -> LoraAdapter:
        """Stop serving adapter `name` (requests already running on it finish)."""
        rt = self.registry.llms.get(name)
        if rt is not None and rt.adapter is None:
            raise _bad(f"{name!r} is a base model, not a LoRA adapter.", "lora_name")
        removed = self.registry.remove_adapter(name)
        if removed is None or removed.adapter is None:
            raise ModelNotFoundError(f"The LoRA adapter {name!r} cannot be found.", param="lora_name")
        base = next((m for m in self.registry.config.llm if m.name == removed.adapter.base), None)
        if base is not None and base.persist_adapters and base.adapters_dir is not None:
            try:  # a small JSON file: written in place of a thread hop
                record_runtime(Path(str(base.adapters_dir)), name, None)
            except OSError as e:  # unloaded all the same: it may come back at a restart, which the log says
                logger.error("LoRA adapter %s unloaded, but %s cannot be written (%s): it comes back at a restart",
                             name, RUNTIME_STATE, e)
        logger.info("LoRA adapter %s unloaded", name)
        return removed.adapter

    async def sync(self, base: LLMModel) -> tuple[list[str], list[str]]:
        """Apply `base`'s runtime record (`persist_adapters`: what another worker loaded and unloaded) to this
        process: an unloaded adapter of `base` stops being served, a loaded one this process lacks is read,
        checked and served (a folder that no longer reads is skipped with a warning). Nothing is recorded: the
        record is the source. Idempotent. Returns (added, removed) names."""
        if base.adapters_dir is None or base.name not in self.registry.llms:
            return [], []
        folder = Path(str(base.adapters_dir)).resolve()
        loaded, unloaded = await asyncio.to_thread(read_runtime_state, folder)
        removed = []
        for name in sorted(unloaded):
            rt = self.registry.llms.get(name)
            if rt is not None and rt.adapter is not None and rt.adapter.base == base.name:
                self.registry.remove_adapter(name)
                removed.append(name)
        added = []
        shape: BaseShape | None = None
        for name, rel in sorted(loaded.items()):
            source = (folder / rel).resolve()
            rt = self.registry.llms.get(name)
            if rt is not None and rt.adapter is not None and rt.adapter.base == base.name and \
                    rt.adapter.source is not None and rt.adapter.source.resolve() != source:
                self.registry.remove_adapter(name)  # loaded again from another folder: replaced below
            elif self._taken(name) is not None or source == folder or not source.is_relative_to(folder):
                continue
            if shape is None:
                shape = await asyncio.to_thread(BaseShape.from_folder, base.path)
            try:
                adapter = await asyncio.to_thread(_read_checked, base, source, name, shape)
            except AdapterError as e:
                logger.warning("LoRA adapter %s recorded in %s not served here: %s", name, RUNTIME_STATE, e)
                continue
            if self._taken(name) is None:
                self.registry.add_adapter(adapter)
                added.append(name)
        if added or removed:
            logger.info("LoRA adapters of %s synced from %s: %s added, %s removed", base.name, RUNTIME_STATE,
                        added or "none", removed or "none")
        return added, removed
