"""The synthetic LLM's prefill cost model: what one engine step holds and what it costs.

``model.py`` beside this file runs its engine steps from ``plan_step`` when the config sets
``prefill_per_token_ms`` or ``step_token_budget`` (its module docstring gives the wire-visible behaviour).
Plain arithmetic on token counts, with no Triton import, so the unit tests load it as it is.
"""

from __future__ import annotations


def plan_step(prefill_left: list[int], budget: int, step_s: float, per_seq_s: float,
              per_token_s: float) -> tuple[float, list[int]]:
    """One engine step over the requests in the batch, in their arrival order (`prefill_left`: each one's prompt
    tokens still to prefill, 0 = decoding): each decoding request takes one token of the step's `budget` (0 = no
    limit), the prefilling ones share what is left first-come-first-served, as vLLM's and TensorRT-LLM's chunked
    prefill schedule decodes first. Returns the step's time and each request's prefill chunk; a request emits a
    token at the step's end when it was decoding or its chunk finishes its prompt."""
    decoding = sum(1 for left in prefill_left if left == 0)
    room = budget - decoding if budget > 0 else sum(prefill_left)
    chunks: list[int] = []
    emitting = decoding
    for left in prefill_left:
        chunk = min(left, max(room, 0))
        room -= chunk
        chunks.append(chunk)
        emitting += 1 if left and chunk == left else 0
    return step_s + per_seq_s * emitting + per_token_s * sum(chunks), chunks
