"""LoRA for the SmolLM2 reference models: adapters applied in the forward pass, and the LRU that keeps them.

* ``LoraHooks`` reads an adapter in either wire form (TensorRT-LLM's ``lora_weights`` / ``lora_config`` tensors,
  ``from_trtllm``; a PEFT folder, as the vLLM backend loads it, ``from_peft``) into ``LoraWeights``, and adds the
  active adapter's ``(x @ A^T) @ B^T`` to every adapted projection's output while the engine's worker runs a job
  that carries one.
* ``LoraCache`` keeps adapters by name or task id, as TensorRT-LLM's host cache and vLLM's ``max_cpu_loras`` do.

A malformed adapter raises ``RequestError`` (``smollm2_requests.py``): the client's mistake, answered as INVALID_ARG.
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from smollm2_requests import RequestError

LoraWeights = dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]
# TensorRT-LLM's LoRA module ids (LoraModule::ModuleType) and the Llama projections they adapt, as its
# hf_lora_convert.py maps them.
LORA_MODULE_IDS = {1: "q_proj", 2: "k_proj", 3: "v_proj", 4: "o_proj", 5: "gate_proj", 6: "down_proj", 7: "up_proj"}


class LoraHooks:
    """LoRA in the forward pass: a hook on every attention and MLP projection adds ``(x @ A^T) @ B^T`` of the
    active adapter (``active``: (layer, module) -> (A^T, B^T), set by the worker around each job's forward
    pass) to the projection's output; with no adapter active a hook returns at once."""

    def __init__(self, model: Any) -> None:
        self.active: LoraWeights | None = None
        self.dims: dict[str, tuple[int, int]] = {}
        self.layers = 0
        self.linears: list[tuple[tuple[int, str], Any]] = []
        self.installed = False
        for layer_idx, layer in enumerate(model.model.layers):
            self.layers = layer_idx + 1
            for part in (layer.self_attn, layer.mlp):
                for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
                    linear = getattr(part, name, None)
                    if linear is None:
                        continue
                    self.dims[name] = (int(linear.in_features), int(linear.out_features))
                    self.linears.append(((layer_idx, name), linear))

    @contextlib.contextmanager
    def applied(self, weights: LoraWeights | None) -> Iterator[None]:
        """``weights`` (or no adapter) active in the forward passes inside; hooks installed on the first adapter.
        Only the worker thread runs forward passes, so one adapter at a time is all there is."""
        if weights is not None:
            self.install()
        self.active = weights
        try:
            yield
        finally:
            self.active = None

    def install(self) -> None:
        """Hook every projection, once, on the first job with an adapter (called by the worker thread, the
        only one running forward passes): a model never asked for LoRA keeps PyTorch's hook-free fast path."""
        if not self.installed:
            for key, linear in self.linears:
                linear.register_forward_hook(self._hook(key))
            self.installed = True

    def _hook(self, key: tuple[int, str]) -> Any:
        def hook(_module: Any, inputs: Any, output: torch.Tensor) -> torch.Tensor | None:
            active = self.active
            if active is None:
                return None
            ab = active.get(key)
            if ab is None:
                return None
            return output + (inputs[0] @ ab[0]) @ ab[1]

        return hook

    def from_trtllm(self, weights: np.ndarray, config: np.ndarray) -> LoraWeights:
        """TensorRT-LLM's ``lora_weights`` [N, W] and ``lora_config`` [N, 3] (module id, layer, rank): each row
        A [r, in] flattened, then B [out, r] (scale folded in), zero-padded to W."""
        if weights.ndim != 2 or config.ndim != 2 or config.shape[1] < 3 or config.shape[0] != weights.shape[0]:
            raise RequestError(f"lora_weights {list(weights.shape)} and lora_config {list(config.shape)}: expected "
                               "[1, N, W] and [1, N, 3]")
        out: LoraWeights = {}
        for row, (module_id, layer, rank) in zip(weights, config[:, :3].tolist(), strict=True):
            name = LORA_MODULE_IDS.get(int(module_id))
            if name is None or name not in self.dims:
                raise RequestError(f"lora_config: module id {module_id} is not supported by this model")
            if not 0 <= layer < self.layers:
                raise RequestError(f"lora_config: layer {layer} is outside 0..{self.layers - 1}")
            d_in, d_out = self.dims[name]
            if rank < 1 or rank * (d_in + d_out) > row.shape[0]:
                raise RequestError(f"lora_config: adapter size {rank} of module {module_id} does not fit "
                                   f"lora_weights rows of {row.shape[0]} values")
            a = torch.from_numpy(np.ascontiguousarray(row[: rank * d_in], dtype=np.float32)).reshape(rank, d_in)
            b = torch.from_numpy(np.ascontiguousarray(row[rank * d_in: rank * (d_in + d_out)],
                                                      dtype=np.float32)).reshape(d_out, rank)
            out[(int(layer), name)] = (a.t().contiguous(), b.t().contiguous())
        return out

    def from_peft(self, folder: Path) -> LoraWeights:
        """A PEFT adapter folder (adapter_config.json + adapter_model.safetensors), scale alpha / r folded in."""
        import re

        from safetensors.torch import load_file

        cfg = json.loads((folder / "adapter_config.json").read_text())
        rank, alpha = int(cfg["r"]), float(cfg.get("lora_alpha", cfg["r"]))
        scale = alpha / rank ** 0.5 if cfg.get("use_rslora") else alpha / rank
        pattern = re.compile(r".*\.layers\.(\d+)\.(?:self_attn|mlp)\.([a-z_]+)\.lora_([AB])\.weight$")
        parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
        for key, tensor in load_file(str(folder / "adapter_model.safetensors")).items():
            m = pattern.match(key)
            if m is None:
                raise RequestError(f"{folder.name}: unsupported tensor {key}")
            parts.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = tensor.float()
        return {k: (ab["A"].t().contiguous(), (ab["B"] * scale).t().contiguous()) for k, ab in parts.items()}


class LoraCache:
    """A bounded LRU of adapters, as TensorRT-LLM's host cache (``lora_cache_size`` adapters): ``put`` evicts the
    least recently used one beyond it; a running job keeps its own reference, so eviction never affects it."""

    def __init__(self, capacity: int) -> None:
        from collections import OrderedDict

        self.capacity = max(1, capacity)
        self.items: OrderedDict[Any, LoraWeights] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, key: Any) -> LoraWeights | None:
        with self.lock:
            found = self.items.get(key)
            if found is not None:
                self.items.move_to_end(key)
            return found

    def put(self, key: Any, weights: LoraWeights) -> int:
        """Store ``weights``; returns how many adapters were evicted."""
        with self.lock:
            self.items[key] = weights
            self.items.move_to_end(key)
            evicted = 0
            while len(self.items) > self.capacity:
                self.items.popitem(last=False)
                evicted += 1
            return evicted

