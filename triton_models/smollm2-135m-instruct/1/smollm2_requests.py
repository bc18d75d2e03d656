"""Reading a Triton request for the SmolLM2 reference models: the helpers every protocol's ``parse`` uses.

Each ``model.py`` turns a Triton request into a ``Job`` with these: tensors by name (``input_array``), scalars and
strings sent with or without a batch dim (``batched_scalar``, ``batched_string``), TensorRT-LLM's words lists
(``word_list``), a seed's generator and a checked temperature; a model's config.pbtxt parameters
(``config_parameter``). A client's mistake raises ``RequestError``, whose message goes back verbatim as an
INVALID_ARG error (``triton_error``); the engine and the LoRA loader raise it too.

Imports Triton's ``triton_python_backend_utils``, which exists only inside Triton's Python backend stub.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils


class RequestError(ValueError):
    """Invalid request; the message goes back to the client verbatim."""


def checked_temperature(value: float, name: str = "temperature") -> float:
    """A sampling temperature, refused when negative (0 is greedy)."""
    if value < 0:
        raise RequestError(f"{name} must be >= 0")
    return value


def triton_error(message: str, code_name: str = "INVALID_ARG") -> Any:
    code = getattr(pb_utils.TritonError, code_name, None)
    return pb_utils.TritonError(message, code) if code is not None else pb_utils.TritonError(message)


def input_array(request: Any, name: str) -> np.ndarray | None:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def batched_scalar(request: Any, name: str, default: Any) -> Any:
    """A scalar sent as [1, 1] (batch dim) or [1] (no batch dim); a batch of more than one is refused."""
    arr = input_array(request, name)
    if arr is None or arr.size == 0:
        return default
    if arr.shape[0] != 1:
        raise RequestError(f"{name}: batch size {arr.shape[0]} not supported, send one sequence per request")
    return arr.reshape(-1)[0].item()


def batched_string(request: Any, name: str) -> str | None:
    """A BYTES scalar sent as [1, 1] (batch dim) or [1], decoded as UTF-8; None when absent."""
    arr = input_array(request, name)
    if arr is None or arr.size == 0:
        return None
    if arr.shape[0] != 1 or arr.size != 1:
        raise RequestError(f"{name}: expected one string (shape [1, 1]), got shape {list(arr.shape)}")
    raw = arr.reshape(-1)[0]
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RequestError(f"{name}: not valid UTF-8 ({exc})") from None
    return str(raw)


def word_list(request: Any, name: str) -> list[list[int]]:
    """Decode a words list ([1, 2, N] or [2, N]: ids, cumulative end offsets -1-padded) into id sequences."""
    arr = input_array(request, name)
    if arr is None or arr.size == 0:
        return []
    if arr.ndim == 2:  # tolerate a client that dropped the batch dim
        arr = arr[None]
    if arr.ndim != 3 or arr.shape[0] != 1 or arr.shape[1] != 2:
        raise RequestError(f"{name}: expected shape [1, 2, N], got {list(arr.shape)}")
    ids, offsets = arr[0, 0].tolist(), arr[0, 1].tolist()
    words: list[list[int]] = []
    start = 0
    for end in offsets:
        if end < 0:
            break
        if end <= start or end > len(ids):
            if end == start:
                continue
            raise RequestError(f"{name}: bad offset {end}")
        words.append([int(t) for t in ids[start:end]])
        start = end
    return words


def seeded_generator(seed: int | None) -> torch.Generator | None:
    if seed is None:
        return None
    return torch.Generator().manual_seed(int(seed) & 0xFFFF_FFFF_FFFF_FFFF)


def config_parameter(args: dict[str, str], key: str, default: str) -> str:
    """A string parameter of the model's config.pbtxt (``parameters { key: ... }``), else ``default``."""
    try:
        params = json.loads(args.get("model_config", "{}")).get("parameters", {})
        value = params.get(key, {}).get("string_value")
    except (ValueError, AttributeError):
        return default
    return str(value) if value not in (None, "") else default

