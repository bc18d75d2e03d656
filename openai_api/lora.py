"""LoRA adapters: read from disk (Hugging Face PEFT or TensorRT-LLM's own format), checked against the base
model, and converted to the tensors TensorRT-LLM takes with a request.

**PEFT** (what `peft`'s `save_pretrained` writes): `adapter_config.json` (`peft_type: LORA`, `r`, `lora_alpha`,
`use_rslora`, `target_modules`, `base_model_name_or_path`) and `adapter_model.safetensors`, whose tensors are
`...layers.<i>.(self_attn|mlp).<module>.lora_A.weight` `[r, in]` and `...lora_B.weight` `[out, r]`; the
adapter adds `scale * B @ A @ x` to the module's output, `scale = alpha / r` (`alpha / sqrt(r)` with rsLoRA).
Only safetensors is read (a pickled `adapter_model.bin` could run code when loaded).

**TensorRT-LLM** (what its `hf_lora_convert.py` writes, and what its backend takes per request):
`model.lora_weights.npy` `[1, N, W]` and `model.lora_config.npy` `[1, N, 3]` INT32. Row `k` of the config is
`[module_id, layer_idx, adapter_size r]`; row `k` of the weights is A `[r, in]` flattened, then B `[out, r]`
flattened and already multiplied by the scale, zero-padded to the widest row `W`. Module ids are TensorRT-LLM's
`LoraModule::ModuleType`; Llama-style names map as its converter maps them (`gate_proj` -> `mlp_h_to_4h`,
`up_proj` -> `mlp_gate`, `down_proj` -> `mlp_4h_to_h`). On the wire the Triton `tensorrt_llm` model takes
`lora_task_id` UINT64 `[1, 1]`, `lora_weights` `[1, N, W]` in its declared dtype (FP16 in the shipped configs)
and `lora_config` INT32 `[1, N, 3]`.

An adapter's task id is stable: a hash of its name and weights, so every gateway worker, replica and restart
names the same weights with the same id (and a reloaded adapter with new weights gets a new one). Weights are
read once, converted once per dtype and shared by every request.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

logger = logging.getLogger(__name__)

PEFT_CONFIG = "adapter_config.json"
PEFT_WEIGHTS = "adapter_model.safetensors"
TRTLLM_WEIGHTS = "model.lora_weights.npy"
TRTLLM_CONFIG = "model.lora_config.npy"
# TensorRT-LLM's LoraModule::ModuleType ids, and the Hugging Face (Llama-family) module names it maps to them.
MODULE_IDS = {"attn_qkv": 0, "attn_q": 1, "attn_k": 2, "attn_v": 3, "attn_dense": 4, "mlp_h_to_4h": 5,
              "mlp_4h_to_h": 6, "mlp_gate": 7}
HF_TO_TRTLLM = {"q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_dense",
                "gate_proj": "mlp_h_to_4h", "down_proj": "mlp_4h_to_h", "up_proj": "mlp_gate"}
ID_TO_HF = {MODULE_IDS[t]: h for h, t in HF_TO_TRTLLM.items()}
# The largest adapter file read (a rank-64 adapter of a 70B model is about 1.7 GB in FP16).
MAX_FILE_BYTES = 4 << 30
_KEY = re.compile(r".*\.layers\.(\d+)\.(?:self_attn|mlp)\.([a-z_]+)\.lora_([AB])(?:\.default)?\.weight$")
_ST_DTYPES = {"F32": "<f4", "F16": "<f2", "F64": "<f8"}

Format = Literal["peft", "trtllm"]


class AdapterError(ValueError):
    """An adapter that cannot be served, phrased for the operator or the client (one line)."""


@dataclass(frozen=True, slots=True)
class BaseShape:
    """What an adapter must fit: the base model's layers and each projection's (in, out) sizes."""

    layers: int
    dims: dict[str, tuple[int, int]]

    @classmethod
    def from_folder(cls, folder: Path) -> BaseShape | None:
        """From a Hugging Face `config.json` in `folder` (Llama-style attention and gated MLP); None without one."""
        try:
            cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
            hidden = int(cfg["hidden_size"])
            heads = int(cfg["num_attention_heads"])
            kv = int(cfg.get("num_key_value_heads") or heads)
            head_dim = int(cfg.get("head_dim") or hidden // heads)
            inter = int(cfg["intermediate_size"])
            layers = int(cfg["num_hidden_layers"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        q, kvo = heads * head_dim, kv * head_dim
        return cls(layers, {"q_proj": (hidden, q), "k_proj": (hidden, kvo), "v_proj": (hidden, kvo),
                            "o_proj": (q, hidden), "gate_proj": (hidden, inter), "up_proj": (hidden, inter),
                            "down_proj": (inter, hidden)})


@dataclass(slots=True)
class LoraModule:
    """One adapted projection of one layer: A `[r, in]` and B `[out, r]` with the scale folded in (FP32)."""

    module: str
    layer: int
    a: NDArray[np.float32]
    b: NDArray[np.float32]

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(eq=False)
class LoraAdapter:
    """An adapter served as a model. `modules` empty for one whose weights only the backend holds (vLLM's
    `multi_lora.json`); `lora_name` is the name the backend knows it by."""

    name: str
    base: str
    source: Path | None = None
    format: Format | None = None
    rank: int = 0
    target_modules: tuple[str, ...] = ()
    base_model: str | None = None
    modules: list[LoraModule] = field(default_factory=list)
    lora_name: str = ""
    task_id: int = 0
    # Called with "weights_sent" / "cache_misses" as they happen (the registry points it at /metrics).
    on_event: Callable[[str], None] | None = field(default=None, repr=False)
    _tensors: dict[str, tuple[NDArray[Any], NDArray[np.int32]]] = field(default_factory=dict, repr=False)
    _wire: dict[str, bytes] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.lora_name = self.lora_name or self.name
        if not self.task_id:
            digest = hashlib.sha256(self.name.encode())
            for m in self.modules:
                digest.update(f"{m.module}:{m.layer}".encode())
                digest.update(m.a.tobytes())
                digest.update(m.b.tobytes())
            # 63 bits: positive in every signed reading of a UINT64
            self.task_id = int.from_bytes(digest.digest()[:8], "little") & ((1 << 63) - 1) or 1

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (the config travels to `--workers` processes): the weights, not the lock, caches or callback."""
        state = dict(self.__dict__)
        state.update(_lock=None, _tensors={}, _wire={}, on_event=None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    def count(self, event: str) -> None:
        """Report a LoRA event of this adapter ("weights_sent", "cache_misses")."""
        if self.on_event is not None:
            self.on_event(event)

    @property
    def root(self) -> str:
        """What `/v1/models` shows as the adapter's `root`: its source folder, else the backend's name."""
        return str(self.source) if self.source is not None else self.lora_name

    def trtllm_tensors(self, dtype: str = "FP16") -> tuple[NDArray[Any], NDArray[np.int32]]:
        """(`lora_weights` [N, W], `lora_config` [N, 3]) in TensorRT-LLM's layout (module docstring), the
        weights in `dtype` (`FP32`, `FP16`, or `BF16` as its uint16 bit patterns); computed once per dtype."""
        with self._lock:
            cached = self._tensors.get(dtype)
            if cached is None:
                cached = self._tensors[dtype] = to_trtllm(self.modules, dtype)
            return cached

    def wire_bytes(self, dtype: str = "FP16") -> bytes:
        """`lora_weights` in `dtype` as the raw little-endian bytes Triton takes (BF16: the bit patterns),
        encoded once per dtype."""
        key = f"wire:{dtype}"
        with self._lock:
            raw = self._wire.get(key)
        if raw is None:
            weights, _ = self.trtllm_tensors(dtype)
            little = {"FP32": "<f4", "FP16": "<f2", "BF16": "<u2"}[dtype]
            raw = np.ascontiguousarray(weights, dtype=little).tobytes()
            with self._lock:
                self._wire[key] = raw
        return raw

    def check(self, shape: BaseShape | None, max_rank: int) -> None:
        """Raise `AdapterError` unless every module fits the base model (layer, in and out sizes) and no rank
        exceeds `max_rank`."""
        for m in self.modules:
            if m.rank < 1 or m.rank > max_rank:
                raise AdapterError(f"adapter {self.name!r}: rank {m.rank} of {m.module} (layer {m.layer}) does not "
                                   f"fit: the base model {self.base!r} takes ranks 1 to {max_rank}")
            if m.b.shape[1] != m.rank:
                raise AdapterError(f"adapter {self.name!r}: {m.module} (layer {m.layer}) has lora_A of rank "
                                   f"{m.rank} but lora_B of rank {m.b.shape[1]}")
            if shape is None:
                continue
            if m.layer >= shape.layers:
                raise AdapterError(f"adapter {self.name!r}: layer {m.layer} does not exist in the base model "
                                   f"{self.base!r} ({shape.layers} layers)")
            dims = shape.dims.get(m.module)
            if dims is None:
                raise AdapterError(f"adapter {self.name!r}: target module {m.module!r} is not one of the base "
                                   f"model's projections ({', '.join(shape.dims)})")
            got = (int(m.a.shape[1]), int(m.b.shape[0]))
            if got != dims:
                raise AdapterError(f"adapter {self.name!r}: {m.module} (layer {m.layer}) is {got[0]} -> {got[1]} "
                                   f"but the base model {self.base!r} has {dims[0]} -> {dims[1]} (hidden size "
                                   "mismatch: an adapter for another model?)")


def to_trtllm(modules: list[LoraModule], dtype: str = "FP16") -> tuple[NDArray[Any], NDArray[np.int32]]:
    """PEFT modules -> TensorRT-LLM's (`lora_weights` [N, W], `lora_config` [N, 3]): one row per layer and
    module, in layer order then module id, each row A flattened then B (scale folded in), zero-padded."""
    ordered = sorted(modules, key=lambda m: (m.layer, MODULE_IDS[HF_TO_TRTLLM[m.module]]))
    rows = [np.concatenate([m.a.reshape(-1), m.b.reshape(-1)]) for m in ordered]
    width = max((len(r) for r in rows), default=0)
    weights = np.zeros((len(rows), width), dtype=np.float32)
    for k, r in enumerate(rows):
        weights[k, : len(r)] = r
    config = np.asarray([[MODULE_IDS[HF_TO_TRTLLM[m.module]], m.layer, m.rank] for m in ordered],
                        dtype=np.int32).reshape(-1, 3)
    return cast_weights(weights, dtype), config


def cast_weights(weights: NDArray[np.float32], dtype: str) -> NDArray[Any]:
    """FP32 weights in a Triton dtype: FP32, FP16, or BF16 (its bit patterns as uint16, rounded to nearest)."""
    if dtype == "FP32":
        return weights
    if dtype == "FP16":
        return weights.astype(np.float16)
    if dtype == "BF16":
        bits = weights.astype(np.float32).view(np.uint32)
        return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    raise AdapterError(f"lora_weights of type {dtype} are not supported (FP32, FP16, BF16)")


def from_trtllm(weights: NDArray[Any], config: NDArray[Any], shape: BaseShape | None) -> list[LoraModule]:
    """TensorRT-LLM's tensors ([1, N, W] or [N, W]; [1, N, 3] or [N, 3]) back into modules; the in and out
    sizes of each row come from the base model's shape (the format does not carry them)."""
    w = np.asarray(weights, dtype=np.float32)
    c = np.asarray(config)
    if w.ndim == 3 and w.shape[0] == 1:
        w = w[0]
    if c.ndim == 3 and c.shape[0] == 1:
        c = c[0]
    if w.ndim != 2 or c.ndim != 2 or c.shape[1] < 3 or c.shape[0] != w.shape[0]:
        raise AdapterError(f"{TRTLLM_WEIGHTS} {list(weights.shape)} and {TRTLLM_CONFIG} {list(config.shape)} do not "
                           "have the shapes [1, N, W] and [1, N, 3]")
    if shape is None:
        raise AdapterError("a TensorRT-LLM format adapter needs the base model's config.json (the module sizes)")
    modules = []
    for row, (module_id, layer, rank) in zip(w, c[:, :3].tolist(), strict=True):
        hf = ID_TO_HF.get(int(module_id))
        if hf is None or hf not in shape.dims:
            raise AdapterError(f"{TRTLLM_CONFIG}: module id {module_id} is not one the gateway maps "
                               f"({', '.join(f'{MODULE_IDS[HF_TO_TRTLLM[h]]}={h}' for h in shape.dims)})")
        d_in, d_out = shape.dims[hf]
        if rank < 1 or rank * (d_in + d_out) > row.shape[0]:
            raise AdapterError(f"{TRTLLM_CONFIG}: rank {rank} of {hf} (layer {layer}) does not fit a row of "
                               f"{row.shape[0]} values for {d_in} -> {d_out}")
        a = row[: rank * d_in].reshape(rank, d_in)
        b = row[rank * d_in: rank * (d_in + d_out)].reshape(d_out, rank)
        modules.append(LoraModule(hf, int(layer), a.copy(), b.copy()))
    return modules


def read_safetensors(path: Path) -> dict[str, NDArray[np.float32]]:
    """Every tensor of a safetensors file as FP32 (F32, F16, BF16, F64), without executing anything."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise AdapterError(f"{path.name} is {size} bytes, over the {MAX_FILE_BYTES} read")
    data = path.read_bytes()
    if len(data) < 8:
        raise AdapterError(f"{path.name} is not a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    try:
        header = json.loads(data[8: 8 + n])
    except (ValueError, UnicodeDecodeError):
        raise AdapterError(f"{path.name} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise AdapterError(f"{path.name} is not a safetensors file")
    body = memoryview(data)[8 + n:]
    out: dict[str, NDArray[np.float32]] = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, dims, (start, end) = info["dtype"], [int(d) for d in info["shape"]], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise AdapterError(f"{path.name}: tensor {name!r} has no dtype, shape or offsets") from None
        raw = body[int(start): int(end)]
        if dtype == "BF16":
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        elif dtype in _ST_DTYPES:
            arr = np.frombuffer(raw, dtype=_ST_DTYPES[dtype]).astype(np.float32)
        else:
            raise AdapterError(f"{path.name}: tensor {name!r} is {dtype}; LoRA weights must be F32, F16 or BF16")
        if arr.size != math.prod(dims):
            raise AdapterError(f"{path.name}: tensor {name!r} holds {arr.size} values, not {dims}")
        out[name] = arr.reshape(dims)
    return out


def _peft(folder: Path, name: str, base: str) -> LoraAdapter:
    try:
        cfg = json.loads((folder / PEFT_CONFIG).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AdapterError(f"adapter {name!r}: {PEFT_CONFIG} cannot be read ({e})") from None
    if not isinstance(cfg, dict):
        raise AdapterError(f"adapter {name!r}: {PEFT_CONFIG} is not a JSON object")
    if str(cfg.get("peft_type", "LORA")).upper() != "LORA":
        raise AdapterError(f"adapter {name!r}: peft_type {cfg.get('peft_type')!r} is not LORA")
    for key in ("use_dora", "modules_to_save", "rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            raise AdapterError(f"adapter {name!r}: {key} is not supported (plain LoRA only)")
    if cfg.get("bias", "none") not in ("none", None):
        raise AdapterError(f"adapter {name!r}: trained biases (bias={cfg.get('bias')!r}) are not supported")
    try:
        r = int(cfg["r"])
        alpha = float(cfg.get("lora_alpha", r))
    except (KeyError, TypeError, ValueError):
        raise AdapterError(f"adapter {name!r}: {PEFT_CONFIG} has no integer r (the rank)") from None
    if r < 1:
        raise AdapterError(f"adapter {name!r}: rank r={r} must be at least 1")
    scale = alpha / math.sqrt(r) if cfg.get("use_rslora") else alpha / r
    weights_file = folder / PEFT_WEIGHTS
    if not weights_file.is_file():
        raise AdapterError(f"adapter {name!r}: {PEFT_WEIGHTS} is missing in {folder}")
    pairs: dict[tuple[int, str], dict[str, NDArray[np.float32]]] = {}
    for key, tensor in read_safetensors(weights_file).items():
        m = _KEY.match(key)
        if m is None:
            raise AdapterError(f"adapter {name!r}: tensor {key!r} is not a LoRA A/B weight of a layer's projection")
        if m.group(2) not in HF_TO_TRTLLM:
            raise AdapterError(f"adapter {name!r}: target module {m.group(2)!r} is not supported "
                               f"({', '.join(HF_TO_TRTLLM)})")
        if tensor.ndim != 2:
            raise AdapterError(f"adapter {name!r}: tensor {key!r} has shape {list(tensor.shape)}, not 2-D")
        pairs.setdefault((int(m.group(1)), m.group(2)), {})[m.group(3)] = tensor
    modules = []
    for (layer, module), ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"adapter {name!r}: {module} of layer {layer} lacks lora_{'B' if 'A' in ab else 'A'}")
        a, b = ab["A"], ab["B"]
        if a.shape[0] != r:
            raise AdapterError(f"adapter {name!r}: {module} of layer {layer} has rank {a.shape[0]}, but "
                               f"{PEFT_CONFIG} says r={r}")
        modules.append(LoraModule(module, layer, np.ascontiguousarray(a), np.ascontiguousarray(b * scale)))
    if not modules:
        raise AdapterError(f"adapter {name!r}: {PEFT_WEIGHTS} holds no LoRA weights")
    targets = cfg.get("target_modules") or []
    return LoraAdapter(name=name, base=base, source=folder, format="peft", rank=r,
                       target_modules=tuple(targets) if isinstance(targets, list) else (str(targets),),
                       base_model=str(cfg["base_model_name_or_path"]) if cfg.get("base_model_name_or_path") else None,
                       modules=modules)


def is_adapter_folder(folder: Path) -> bool:
    """Whether `folder` holds an adapter in either format."""
    return (folder / PEFT_CONFIG).is_file() or (folder / TRTLLM_WEIGHTS).is_file()


def read_adapter(folder: Path, name: str = "", base: str = "", shape: BaseShape | None = None) -> LoraAdapter:
    """The adapter in `folder` (PEFT, else TensorRT-LLM format), named `name` (default: the folder's name), for
    base model `base`; `AdapterError` when it cannot be read. Not checked against the base: see `check`."""
    name = name or folder.name
    if not folder.is_dir():
        raise AdapterError(f"adapter {name!r}: folder not found: {folder}")
    if (folder / PEFT_CONFIG).is_file():
        return _peft(folder, name, base)
    if (folder / TRTLLM_WEIGHTS).is_file() and (folder / TRTLLM_CONFIG).is_file():
        try:
            weights = np.load(folder / TRTLLM_WEIGHTS, allow_pickle=False)
            config = np.load(folder / TRTLLM_CONFIG, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise AdapterError(f"adapter {name!r}: cannot read its .npy files ({e})") from None
        modules = from_trtllm(weights, config, shape)
        return LoraAdapter(name=name, base=base, source=folder, format="trtllm",
                           rank=max(m.rank for m in modules) if modules else 0,
                           target_modules=tuple(sorted({m.module for m in modules})), modules=modules)
    raise AdapterError(f"adapter {name!r}: {folder} holds neither {PEFT_CONFIG} + {PEFT_WEIGHTS} (PEFT) nor "
                       f"{TRTLLM_WEIGHTS} + {TRTLLM_CONFIG} (TensorRT-LLM)")


MULTI_LORA = "multi_lora.json"


def abs_path(base: Path, value: Path | str) -> Path:
    """`value` (`~` and `$VARS` expanded) resolved against `base` when relative."""
    value = Path(os.path.expandvars(os.path.expanduser(str(value))))
    return (value if value.is_absolute() else base / value).resolve()


def base_matches(adapter: LoraAdapter, wanted: str) -> bool:
    """Whether the adapter's `base_model_name_or_path` names `wanted` (equal, or the same last path part,
    case-insensitively: `HuggingFaceTB/SmolLM2-135M-Instruct` matches `smollm2-135m-instruct`)."""
    have = (adapter.base_model or "").rstrip("/")

    def tail(s: str) -> str:
        return s.rstrip("/").rsplit("/", 1)[-1].lower()

    return bool(have) and (have == wanted or tail(have) == tail(wanted))


def scan_dir(folder: Path) -> list[tuple[str, Path | None, str]]:
    """(name, source, backend name) of every adapter in `folder`: each sub-folder holding one (named after the
    folder), and each entry of a vLLM `multi_lora.json` there (its path read here when it is an adapter folder
    on this machine, else the backend's alone)."""
    found: list[tuple[str, Path | None, str]] = []
    if not folder.is_dir():
        logger.warning("adapters_dir %s does not exist (yet): no adapters from it", folder)
        return found
    for sub in sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith(".")):
        if is_adapter_folder(sub):
            found.append((sub.name, sub, sub.name))
    listing = folder / MULTI_LORA
    if listing.is_file():
        try:
            entries = json.loads(listing.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise AdapterError(f"{listing}: not a JSON object of adapter names and paths ({e})") from None
        if not isinstance(entries, dict):
            raise AdapterError(f"{listing}: not a JSON object of adapter names and paths")
        known = {name for name, _, _ in found}
        for name, where in entries.items():
            if name in known:
                continue
            path = abs_path(folder, str(where))
            found.append((str(name), path if is_adapter_folder(path) else None, str(name)))
    return found


# Runtime loads and unloads recorded for a restart (an LLM's `persist_adapters`), in its adapters_dir:
# `{"loaded": {name: path relative to adapters_dir}, "unloaded": [name, ...]}`. An unloaded name stays unloaded
# at start-up (a scanned folder or a listed entry of that name is skipped) until it is loaded again.
RUNTIME_STATE = ".runtime_adapters.json"
_STATE_LOCK = threading.Lock()


def read_runtime_state(folder: Path) -> tuple[dict[str, str], set[str]]:
    """(loaded name -> path relative to `folder`, unloaded names) recorded in `folder`; empty when there is no
    record, and empty with a warning when the record cannot be read (a start-up never fails on it)."""
    path = folder / RUNTIME_STATE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, set()
    except (OSError, ValueError) as e:
        logger.warning("%s cannot be read (%s): no runtime-loaded adapters restored", path, e)
        return {}, set()
    loaded = data.get("loaded") if isinstance(data, dict) else None
    unloaded = data.get("unloaded") if isinstance(data, dict) else None
    if not isinstance(loaded, dict) or not isinstance(unloaded, list):
        logger.warning('%s is not {"loaded": {...}, "unloaded": [...]}: no runtime-loaded adapters restored', path)
        return {}, set()
    return {str(k): str(v) for k, v in loaded.items()}, {str(n) for n in unloaded}


def record_runtime(folder: Path, name: str, source: Path | None) -> None:
    """Record in `folder`'s `RUNTIME_STATE` that adapter `name` was loaded from `source` (inside `folder`), or
    unloaded (`source` None). Written whole to a temporary file renamed over the old one, so a crash leaves one
    record or the other; `OSError` when it cannot be written."""
    with _STATE_LOCK:
        loaded, unloaded = read_runtime_state(folder)
        if source is None:
            loaded.pop(name, None)
            unloaded.add(name)
        else:
            loaded[name] = str(source.resolve().relative_to(folder.resolve()))
            unloaded.discard(name)
        tmp = folder / f"{RUNTIME_STATE}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"loaded": loaded, "unloaded": sorted(unloaded)}, indent=1), encoding="utf-8")
        os.replace(tmp, folder / RUNTIME_STATE)
