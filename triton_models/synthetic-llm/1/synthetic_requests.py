"""Reading a Triton request for the synthetic LLM: the helpers ``model.py`` beside this file parses with.

Tensors by name (``input_array``), scalars and strings sent with or without a batch dim (``batched_scalar``,
``batched_string``), TensorRT-LLM's words lists (``word_list``) and the guided-decoding inputs, checked as
smollm2-135m-instruct checks them but never compiled (``guided``). A client's mistake raises ``RequestError``,
whose message goes back verbatim as an INVALID_ARG error. The names follow smollm2_requests.py's; the two folders
share no code, as Triton loads each model's folder on its own.

Imports Triton's ``triton_python_backend_utils``, which exists only inside Triton's Python backend stub.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

GUIDE_TYPES = ("json", "json_schema", "regex", "ebnf_grammar")


class RequestError(ValueError):
    """Invalid request; the message goes back to the client verbatim."""


def input_array(request: Any, name: str) -> np.ndarray | None:
    """The input tensor `name` as an array; None when the request does not carry it."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return None if tensor is None else tensor.as_numpy()


def batched_scalar(request: Any, name: str, default: Any) -> Any:
    """A scalar sent as [1, 1] (batch dim) or [1] (no batch dim), `default` when absent; a batch of more than one
    is refused."""
    arr = input_array(request, name)
    if arr is None or arr.size == 0:
        return default
    if arr.shape[0] != 1:
        raise RequestError(f"{name}: batch size {arr.shape[0]} not supported, send one sequence per request")
    return arr.reshape(-1)[0].item()


def batched_string(request: Any, name: str) -> str | None:
    """A BYTES scalar sent as [1, 1] (batch dim) or [1], decoded as UTF-8 (bad bytes replaced); None when absent."""
    arr = input_array(request, name)
    if arr is None or arr.size == 0:
        return None
    if arr.shape[0] != 1 or arr.size != 1:
        raise RequestError(f"{name}: expected one string (shape [1, 1]), got shape {list(arr.shape)}")
    raw = arr.reshape(-1)[0]
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def guided(request: Any) -> bool:
    """Whether the request carries a guide, checked as smollm2-135m-instruct checks it (not compiled)."""
    guide_type = batched_string(request, "guided_decoding_guide_type")
    guide = batched_string(request, "guided_decoding_guide")
    if guide_type is None:
        if guide:
            raise RequestError("guided_decoding_guide was sent without guided_decoding_guide_type "
                               f"(one of {', '.join(GUIDE_TYPES)})")
        return False
    if guide_type not in GUIDE_TYPES:
        raise RequestError(f"guided_decoding_guide_type {guide_type!r} is not supported; "
                           f"use one of {', '.join(GUIDE_TYPES)}")
    if guide_type != "json" and not guide:
        raise RequestError(f"guided_decoding_guide is required with guided_decoding_guide_type {guide_type!r}")
    if guide_type == "json_schema":
        try:
            schema = json.loads(guide or "")
        except ValueError as exc:
            raise RequestError(f"guided_decoding_guide: the JSON schema is not valid JSON ({exc})") from None
        if not isinstance(schema, dict | bool):
            raise RequestError("guided_decoding_guide: a JSON schema must be a JSON object")
    return True


def word_list(request: Any, name: str) -> list[list[int]]:
    """Decode a TensorRT-LLM words list ([1, 2, N]: ids, cumulative end offsets) into id sequences."""
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
