"""The MiniLM encoder both MiniLM Triton models run (``all-minilm-l6-v2`` and ``minilm-rerank``, which imports this
file from beside ``all-minilm-l6-v2/1/model.py``, as the SmolLM2 family's models import their engine).

* ``Bert``: the BertModel forward pass (``last_hidden_state``) in plain torch, read straight from the checkpoint's
  ``config.json`` and ``model.safetensors``: word + position + token-type embeddings and LayerNorm, then per layer
  self-attention (torch's SDPA, padding masked), its dense + residual LayerNorm, the GELU intermediate, its dense +
  residual LayerNorm. The same operations in the same order as transformers' ``BertModel`` with SDPA attention
  (``tests/unit/test_minilm_encoder.py`` checks it against transformers). Why not transformers itself: importing
  it costs a Python-backend stub ~2 CPU-s at every start (torch.distributed, torch._dynamo and the model-loading
  machinery, none used here), and the test command starts these stubs ~16 times.
* ``plan_chunks``: how rows of different lengths are cut into padded forward passes.
* ``MiniLMEncoder``: rows in, hidden states and mean-pooled, L2-normalised sentence embeddings out.
* what both models read alike: the weights' folder (``resolve_model_dir``) and a request's input tensors.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file
from torch.nn import functional

MODEL_FOLDER = "all-minilm-l6-v2"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
DEFAULT_MAX_TOKENS_PER_FORWARD = 8192
# Fixed cost of one forward pass in padded tokens: ~7 ms against ~0.3 ms per token for this model
# on one x86 core (OMP_NUM_THREADS=1), measured with batches of 1..64 rows of 20 tokens.
DEFAULT_FORWARD_OVERHEAD_TOKENS = 24


def config_string(parameters: dict[str, Any], key: str, default: str = "") -> str:
    """The model config parameter `key`'s `string_value`; `default` when it is unset or empty."""
    return parameters.get(key, {}).get("string_value", "") or default


def resolve_model_dir(parameters: dict[str, Any]) -> Path:
    """Folder holding the HF BertModel: config parameter, then the env var, then the repo checkout."""
    configured = config_string(parameters, "model_dir")
    if configured:
        return Path(configured)
    env_dir = os.environ.get("OPENAI_API_MODELS_DIR")
    if env_dir:
        return Path(env_dir) / MODEL_FOLDER
    return Path(__file__).resolve().parents[3] / "models" / MODEL_FOLDER


class Bert:
    """BertModel's encoder (no pooler) over the weights of ``model_dir``; inference only."""

    def __init__(self, model_dir: Path) -> None:
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        if config.get("hidden_act", "gelu") != "gelu" or config.get("position_embedding_type",
                                                                   "absolute") != "absolute":
            raise ValueError(f"{model_dir}: only BERT with GELU and absolute positions is supported")
        self.hidden_size = int(config["hidden_size"])
        self.heads = int(config["num_attention_heads"])
        self.layers = int(config["num_hidden_layers"])
        self.vocab_size = int(config["vocab_size"])
        self.type_vocab_size = int(config["type_vocab_size"])
        self.max_length = int(config["max_position_embeddings"])
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        weights = load_file(str(model_dir / "model.safetensors"))
        # Checkpoints saved from BertForX carry a "bert." prefix; BertModel's own do not.
        self.w = {name.removeprefix("bert."): tensor.float() for name, tensor in weights.items()}

    def _norm(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return functional.layer_norm(x, (self.hidden_size,), self.w[f"{prefix}.weight"], self.w[f"{prefix}.bias"],
                                     self.eps)

    def _dense(self, x: torch.Tensor, prefix: str) -> torch.Tensor:
        return functional.linear(x, self.w[f"{prefix}.weight"], self.w[f"{prefix}.bias"])

    def __call__(self, ids: torch.Tensor, mask: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        """``last_hidden_state`` [B, L, H] of [B, L] ids, attention mask (non-zero: a real token) and token types.
        Callers hold ``torch.inference_mode()``."""
        w = self.w
        batch, length = ids.shape
        hidden = functional.embedding(ids, w["embeddings.word_embeddings.weight"])
        hidden = hidden + functional.embedding(types, w["embeddings.token_type_embeddings.weight"])
        hidden = hidden + w["embeddings.position_embeddings.weight"][:length].unsqueeze(0)
        hidden = self._norm(hidden, "embeddings.LayerNorm")
        # Keys at padding are never attended to; no mask at all when nothing is padding (as transformers does).
        attend = None if bool(mask.all()) else (mask != 0)[:, None, None, :]
        head_dim = self.hidden_size // self.heads
        split = (batch, length, self.heads, head_dim)
        for i in range(self.layers):
            p = f"encoder.layer.{i}"
            q = self._dense(hidden, f"{p}.attention.self.query").view(split).transpose(1, 2)
            k = self._dense(hidden, f"{p}.attention.self.key").view(split).transpose(1, 2)
            v = self._dense(hidden, f"{p}.attention.self.value").view(split).transpose(1, 2)
            attended = functional.scaled_dot_product_attention(q, k, v, attn_mask=attend, dropout_p=0.0,
                                                               scale=head_dim ** -0.5)
            attended = attended.transpose(1, 2).reshape(batch, length, self.hidden_size)
            hidden = self._norm(self._dense(attended, f"{p}.attention.output.dense") + hidden,
                                f"{p}.attention.output.LayerNorm")
            inner = functional.gelu(self._dense(hidden, f"{p}.intermediate.dense"))
            hidden = self._norm(self._dense(inner, f"{p}.output.dense") + hidden, f"{p}.output.LayerNorm")
        return hidden


def plan_chunks(lengths: list[int], max_tokens: int, overhead_tokens: int) -> list[list[int]]:
    """Group row indices (rows of length 0 left out) into forward passes, longest rows first.

    A chunk is a run of the rows sorted by length, padded to its first (longest) row. On CPU a
    forward pass costs about ``overhead_tokens + rows * longest`` padded tokens' worth of time, so
    the split minimising that sum is found exactly by dynamic programming over the sorted rows
    (O(rows^2), rows <= max_batch_size: well under a millisecond), with at most ``max_tokens``
    padded tokens per chunk. Padding a merged batch of 10-30 token texts to its longest row costs
    ~30% more forward time; many tiny forwards cost their fixed overhead instead.
    """
    order = sorted((i for i, n in enumerate(lengths) if n > 0), key=lambda i: -lengths[i])
    # best[end]: cheapest cost of the first `end` sorted rows; start[end]: first row of its last chunk.
    best = [0] * (len(order) + 1)
    start = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        best[end] = -1
        for first in range(end - 1, -1, -1):
            padded = (end - first) * lengths[order[first]]
            if padded > max_tokens and first < end - 1:
                break  # padded only grows as the chunk reaches back to longer rows
            cost = best[first] + overhead_tokens + padded
            if best[end] < 0 or cost < best[end]:
                best[end], start[end] = cost, first
    chunks: list[list[int]] = []
    end = len(order)
    while end > 0:
        chunks.append(order[start[end] : end])
        end = start[end]
    chunks.reverse()
    return chunks


class MiniLMEncoder:
    """Runs the BERT encoder over many variable-length rows with as little padding as practical."""

    def __init__(
        self,
        model_dir: Path,
        max_tokens_per_forward: int,
        forward_overhead_tokens: int = DEFAULT_FORWARD_OVERHEAD_TOKENS,
    ) -> None:
        # One intra-op thread unless OPENAI_API_REF_TORCH_THREADS says otherwise (as the SmolLM2 engine): with
        # torch's default (a thread per core), OpenMP's threads spin at every op's barrier whenever another
        # process holds a core - on a loaded 2-core box the same 300 small forwards took 50 CPU-s instead of 13.
        torch.set_num_threads(max(1, int(os.environ.get("OPENAI_API_REF_TORCH_THREADS", "1"))))
        self.model = Bert(model_dir)
        self.hidden_size = self.model.hidden_size
        self.vocab_size = self.model.vocab_size
        self.type_vocab_size = self.model.type_vocab_size
        self.max_length = self.model.max_length
        self.max_tokens_per_forward = max_tokens_per_forward
        self.forward_overhead_tokens = forward_overhead_tokens

    def check_row_inputs(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray | None) -> str | None:
        """Return why these [B, L] tensors cannot be encoded, or None when they can."""
        if ids.ndim != 2:
            return f"input_ids must be 2-D [batch, seq_len], got shape {list(ids.shape)}"
        if mask.shape != ids.shape:
            return f"attention_mask shape {list(mask.shape)} != input_ids shape {list(ids.shape)}"
        if types is not None and types.shape != ids.shape:
            return f"token_type_ids shape {list(types.shape)} != input_ids shape {list(ids.shape)}"
        if ids.shape[1] == 0:
            return "input_ids has seq_len 0"
        if ids.shape[1] > self.max_length:
            return f"seq_len {ids.shape[1]} exceeds the model's maximum of {self.max_length} tokens"
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            return f"input_ids must lie in [0, {self.vocab_size})"
        if types is not None and types.size and (types.min() < 0 or types.max() >= self.type_vocab_size):
            return f"token_type_ids must lie in [0, {self.type_vocab_size})"
        return None

    def encode(
        self,
        rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
        want_hidden: bool,
    ) -> tuple[list[np.ndarray | None], np.ndarray]:
        """Encode 1-D (ids, mask, types) rows of any lengths.

        Returns per row the hidden states of its first ``effective length`` positions (where the
        effective length ends at the last mask==1 token; None when not wanted), and the pooled,
        normalised embeddings [rows, H].
        """
        count = len(rows)
        pooled = np.zeros((count, self.hidden_size), dtype=np.float32)
        hidden: list[np.ndarray | None] = [None] * count
        lengths = [int(np.flatnonzero(mask)[-1]) + 1 if mask.any() else 0 for _, mask, _ in rows]
        for chunk in plan_chunks(lengths, self.max_tokens_per_forward, self.forward_overhead_tokens):
            longest = lengths[chunk[0]]
            ids = np.zeros((len(chunk), longest), dtype=np.int64)
            mask = np.zeros_like(ids)
            types = np.zeros_like(ids)
            for slot, row in enumerate(chunk):
                n = lengths[row]
                ids[slot, :n], mask[slot, :n], types[slot, :n] = (part[:n] for part in rows[row])
            states, normalised = self._forward(ids, mask, types)
            pooled[chunk] = normalised
            if want_hidden:
                for slot, row in enumerate(chunk):
                    hidden[row] = states[slot, : lengths[row]]
        return hidden, pooled

    def embed(self, sequences: list[np.ndarray]) -> np.ndarray:
        """Mean-pooled, L2-normalised embeddings [N, H] of unpadded 1-D id sequences (token type 0)."""
        pooled = np.zeros((len(sequences), self.hidden_size), dtype=np.float32)
        lengths = [len(sequence) for sequence in sequences]
        for chunk in plan_chunks(lengths, self.max_tokens_per_forward, self.forward_overhead_tokens):
            longest = lengths[chunk[0]]
            ids = np.zeros((len(chunk), longest), dtype=np.int64)
            mask = np.zeros_like(ids)
            for slot, row in enumerate(chunk):
                ids[slot, : len(sequences[row])] = sequences[row]
                mask[slot, : len(sequences[row])] = 1
            pooled[chunk] = self._forward(ids, mask, np.zeros_like(ids))[1]
        return pooled

    def _forward(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One padded forward pass: the hidden states [B, L, H] (0.0 at padding) and the pooled embeddings."""
        mask_t = torch.from_numpy(mask)
        with torch.inference_mode():
            states = self.model(torch.from_numpy(ids), mask_t, torch.from_numpy(types))
            weights = mask_t.unsqueeze(-1).to(states.dtype)
            # where() rather than multiply: keeps NaN/inf from masked positions out of the result.
            states = torch.where(weights > 0, states, torch.zeros((), dtype=states.dtype))
            summed = states.sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
            normalised = functional.normalize(summed, p=2.0, dim=1)
        return states.float().numpy(), normalised.float().numpy()


def read_request(request: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """A Triton request's input tensors; raises ValueError. (The Python backend's utilities exist only inside
    Triton's stub, so they are imported here, not with this module.)"""
    import triton_python_backend_utils as pb_utils

    tensors = {}
    for name in INPUT_NAMES:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        tensors[name] = None if tensor is None else tensor.as_numpy()
    if tensors["input_ids"] is None or tensors["attention_mask"] is None:
        raise ValueError("input_ids and attention_mask are required")
    for name, array in tensors.items():
        if array is not None and array.dtype != np.int64:
            raise ValueError(f"{name} must be INT64, got {array.dtype}")
    return tensors["input_ids"], tensors["attention_mask"], tensors["token_type_ids"]


def error_response(message: str) -> Any:
    import triton_python_backend_utils as pb_utils

    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))
