"""One generation request of the SmolLM2 reference models and its decoding state: ``Job``.

A protocol's ``parse`` (each ``model.py``) builds it from a Triton request; once queued, the engine's worker thread
owns it (``smollm2_engine.py``), and sampling reads its settings (``smollm2_sampling.py``).

Imports neither Triton nor the engine.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import torch
from smollm2_guide import GuideSpec


@dataclass
class Job:
    """One generation request and its decoding state (owned by the worker thread once queued).

    ``state`` is the protocol's own per-request data (a detokenizer, flags for optional outputs).
    """

    request: Any
    sender: Any
    prompt: list[int]
    max_new: int
    end_id: int
    streaming: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    # Token sequences that end generation and stay in the output (TensorRT-LLM stop words).
    stop_words: list[list[int]] = field(default_factory=list)
    # Extra ids that end generation like end_id and are not emitted (vLLM stop_token_ids).
    stop_ids: frozenset[int] = frozenset()
    bad_words: list[list[int]] = field(default_factory=list)
    generator: torch.Generator | None = None
    # Guided decoding: the spec from ``parse``; the matcher state, made by the grammar thread.
    guide: GuideSpec | None = None
    guide_state: Any = None
    state: dict[str, Any] = field(default_factory=dict)
    cache: Any = None
    pending: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    # Alternatives (vLLM's `logprobs: k`): None = not asked for; else k, and per generated token its rank
    # in the distribution it was sampled from and that distribution's k most likely (id, log-prob).
    top_logprobs: int | None = None
    ranks: list[int] = field(default_factory=list)
    alternatives: list[list[tuple[int, float]]] = field(default_factory=list)
    counts: Counter[int] = field(default_factory=Counter)
    # LoRA: the adapter's weights applied in every forward pass of this job ((layer, module) -> (A^T, B^T), the
    # scale folded into B); held by the job, so evicting the adapter from a cache never touches a running job.
    lora: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] | None = None
    finish_reason: str | None = None
    started: float = field(default_factory=time.monotonic)
    # TensorRT-LLM's request perf metrics (``perf_metric_tensors``): the prefix cache's blocks this request
    # reused, and its times in ns since the epoch (0: not reached yet).
    reused_blocks: int = 0
    arrival_ns: int = field(default_factory=time.time_ns)
    scheduled_ns: int = 0
    first_token_ns: int = 0
    last_token_ns: int = 0

    @property
    def decoding(self) -> bool:
        """Prefilled and one token to feed: the job's next step is the round's batched decode."""
        return bool(self.scheduled_ns) and len(self.pending) == 1

    def __post_init__(self) -> None:
        self.pending = list(self.prompt)
        self.bad_single = [w[0] for w in self.bad_words if len(w) == 1]
        self.bad_multi = [w for w in self.bad_words if len(w) > 1]

