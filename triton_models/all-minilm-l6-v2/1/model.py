"""Triton Python-backend sentence-embedding model: all-MiniLM-L6-v2 (BERT, hidden size 384).

Wire contract (``max_batch_size: 64``, so every tensor carries the batch dim B):

inputs
    ``input_ids``       INT64 [B, L]  WordPiece ids of the MiniLM ``tokenizer.json`` (``[CLS] ... [SEP]``).
    ``attention_mask``  INT64 [B, L]  1 for real tokens, 0 for padding (any non-zero counts as 1).
    ``token_type_ids``  INT64 [B, L]  optional; zeros when absent.

outputs (only those the request asks for are computed and returned; Triton asks for all when the
client names none)
    ``last_hidden_state``  FP32 [B, L, 384]  encoder output, what an ONNX export of the BertModel
                           gives; positions with ``attention_mask == 0`` are 0.0 so the tensor does not
                           depend on how requests were batched together.
    ``sentence_embedding`` FP32 [B, 384]     sentence-transformers pooling: mean over positions with
                           ``attention_mask == 1``, then L2-normalised (a row with no real token gives
                           the zero vector).

Requests with different L are batched together by Triton's dynamic batcher (``allow_ragged_batch``)
and padded here into shared forward passes; outputs are cut back to each request's own L.
Malformed requests (shape mismatch, ids out of range, L > 512) get an error response of their own;
the other requests in the same batch still succeed.

Weights come from ``$OPENAI_API_MODELS_DIR/all-minilm-l6-v2`` (or the ``model_dir`` config parameter,
or ``<repo>/models/all-minilm-l6-v2``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import triton_python_backend_utils as pb_utils
from transformers import AutoModel

MODEL_FOLDER = "all-minilm-l6-v2"
INPUT_NAMES = ("input_ids", "attention_mask", "token_type_ids")
DEFAULT_MAX_TOKENS_PER_FORWARD = 8192
# Fixed cost of one forward pass in padded tokens: ~7 ms against ~0.3 ms per token for this model
# on one x86 core (OMP_NUM_THREADS=1), measured with batches of 1..64 rows of 20 tokens.
DEFAULT_FORWARD_OVERHEAD_TOKENS = 24


def resolve_model_dir(parameters: dict[str, Any]) -> Path:
    """Folder holding the HF BertModel: config parameter, then the env var, then the repo checkout."""
    configured = parameters.get("model_dir", {}).get("string_value", "")
    if configured:
        return Path(configured)
    env_dir = os.environ.get("OPENAI_API_MODELS_DIR")
    if env_dir:
        return Path(env_dir) / MODEL_FOLDER
    return Path(__file__).resolve().parents[3] / "models" / MODEL_FOLDER


def int_parameter(parameters: dict[str, Any], key: str, default: int) -> int:
    raw = parameters.get(key, {}).get("string_value", "")
    return int(raw) if raw else default


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
    """Runs the BertModel over many variable-length rows with as little padding as practical."""

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
        self.model = AutoModel.from_pretrained(str(model_dir)).eval()
        self.hidden_size = int(self.model.config.hidden_size)
        self.vocab_size = int(self.model.config.vocab_size)
        self.type_vocab_size = int(self.model.config.type_vocab_size)
        self.max_length = int(self.model.config.max_position_embeddings)
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
            mask_t = torch.from_numpy(mask)
            with torch.inference_mode():
                states = self.model(
                    input_ids=torch.from_numpy(ids),
                    attention_mask=mask_t,
                    token_type_ids=torch.from_numpy(types),
                ).last_hidden_state
                weights = mask_t.unsqueeze(-1).to(states.dtype)
                # where() rather than multiply: keeps NaN/inf from masked positions out of the result.
                states = torch.where(weights > 0, states, torch.zeros((), dtype=states.dtype))
                summed = states.sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
                normalised = torch.nn.functional.normalize(summed, p=2.0, dim=1)
            pooled[chunk] = normalised.float().numpy()
            if want_hidden:
                states_np = states.float().numpy()
                for slot, row in enumerate(chunk):
                    hidden[row] = states_np[slot, : lengths[row]]
        return hidden, pooled


def read_request(request: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
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
    return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))


class TritonPythonModel:
    """Triton entry point; see the module docstring for the wire contract."""

    def initialize(self, args: dict[str, str]) -> None:
        config = json.loads(args["model_config"])
        parameters = config.get("parameters", {})
        model_dir = resolve_model_dir(parameters)
        budget = int_parameter(parameters, "max_tokens_per_forward", DEFAULT_MAX_TOKENS_PER_FORWARD)
        overhead = int_parameter(parameters, "forward_overhead_tokens", DEFAULT_FORWARD_OVERHEAD_TOKENS)
        self.encoder = MiniLMEncoder(model_dir, budget, overhead)
        pb_utils.Logger.log_info(
            f"{config['name']}: loaded {model_dir} (max_tokens_per_forward={budget}, "
            f"forward_overhead_tokens={overhead})"
        )

    def execute(self, requests: list[Any]) -> list[Any]:
        responses: list[Any] = [None] * len(requests)
        # Per accepted request: (index, first row, batch size, seq_len, mask, wants hidden, wants pooled).
        accepted: list[tuple[int, int, int, int, np.ndarray, bool, bool]] = []
        rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        for index, request in enumerate(requests):
            try:
                ids, mask, types = read_request(request)
                problem = self.encoder.check_row_inputs(ids, mask, types)
                if problem is not None:
                    responses[index] = error_response(problem)
                    continue
                wanted = set(request.requested_output_names())
                if types is None:
                    types = np.zeros_like(ids)
                mask = (mask != 0).astype(np.int64)
                accepted.append(
                    (
                        index,
                        len(rows),
                        ids.shape[0],
                        ids.shape[1],
                        mask,
                        "last_hidden_state" in wanted,
                        "sentence_embedding" in wanted,
                    )
                )
                rows.extend(zip(ids, mask, types, strict=True))
            except Exception as exc:  # noqa: BLE001 - one bad request must not fail its batch mates
                responses[index] = error_response(f"invalid request: {exc}")
        if accepted:
            try:
                want_hidden = any(entry[5] for entry in accepted)
                hidden, pooled = self.encoder.encode(rows, want_hidden)
                for index, first, batch, seq_len, mask, wants_hidden, wants_pooled in accepted:
                    outputs = []
                    if wants_hidden:
                        full = np.zeros((batch, seq_len, self.encoder.hidden_size), dtype=np.float32)
                        for offset in range(batch):
                            states = hidden[first + offset]
                            if states is not None:
                                full[offset, : states.shape[0]] = states
                        # Holes inside the effective length (non-contiguous masks) are zeroed too.
                        full *= mask[:, :, None].astype(np.float32)
                        outputs.append(pb_utils.Tensor("last_hidden_state", full))
                    if wants_pooled:
                        outputs.append(pb_utils.Tensor("sentence_embedding", pooled[first : first + batch]))
                    responses[index] = pb_utils.InferenceResponse(output_tensors=outputs)
            except Exception as exc:  # noqa: BLE001 - report instead of taking the stub down
                pb_utils.Logger.log_error(f"encoder forward failed: {exc!r}")
                for entry in accepted:
                    responses[entry[0]] = error_response(f"encoder forward failed: {exc}")
        return responses

    def finalize(self) -> None:
        self.encoder = None  # type: ignore[assignment]
