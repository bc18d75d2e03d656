"""One decode step for several jobs at once: the reference engine's in-flight batching.

Why: a SmolLM2-135M decode step on a CPU core is bound by reading the weights (~0.5 GB of FP32 per forward
pass): one job's step costs ~60-70 ms, and so does nearly every other job's, one after the other. TensorRT-LLM and
vLLM run every active request's next token in one forward pass (in-flight / continuous batching); this module does
the same for the jobs the engine's worker has ready, so N concurrent requests cost about one pass plus their own
attention, not N passes.

How: the model's own modules, layer by layer, on the new token of every job as one [B, 1, hidden] batch - the
embedding, RMSNorms, q/k/v/o projections (LoRA hooks included: a batch shares one adapter) and MLPs run once for the
batch; rotary embeddings at each job's own position; attention per job, against that job's own ``DynamicCache``
(appended by the cache layer's ``update``, as Hugging Face's attention does) with transformers' SDPA function, so
every job keeps its KV cache as the single-job path keeps it (the prefix cache and the prefill read and write the
same objects). Only the last (new) position is computed, as a decode step with ``logits_to_keep=1`` does.

Numerics: a batch of one is bit-identical to ``model(input_ids=[[token]], past_key_values=cache)`` (checked by
``tests/unit/test_reference_batch.py``); in a larger batch a job's logits may differ in the last bits (the matrix
products' summation order depends on the batch's size), as they do between batch sizes in the production engines.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


def decode_step(model: Any, tokens: list[int], caches: list[Any]) -> torch.Tensor:
    """Feed ``tokens[i]`` to job ``i`` whose KV cache is ``caches[i]`` (a ``DynamicCache``, appended in place);
    returns the next-token logits, [B, vocab]. Callers hold ``torch.inference_mode()``."""
    inner = model.model
    batch = len(tokens)
    positions = torch.tensor([[cache.get_seq_length()] for cache in caches], dtype=torch.long)
    hidden = inner.embed_tokens(torch.tensor([[t] for t in tokens], dtype=torch.long))
    cos, sin = inner.rotary_emb(hidden, position_ids=positions)
    for index, layer in enumerate(inner.layers):
        attn = layer.self_attn
        residual = hidden
        normed = layer.input_layernorm(hidden)
        shape = (batch, 1, -1, attn.head_dim)
        q = attn.q_proj(normed).view(shape).transpose(1, 2)
        k = attn.k_proj(normed).view(shape).transpose(1, 2)
        v = attn.v_proj(normed).view(shape).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        outs = []
        for i, cache in enumerate(caches):
            keys, values = cache.layers[index].update(k[i:i + 1], v[i:i + 1])
            out, _ = sdpa_attention_forward(attn, q[i:i + 1], keys, values, None, dropout=0.0, scaling=attn.scaling)
            outs.append(out)
        attended = (outs[0] if batch == 1 else torch.cat(outs, 0)).reshape(batch, 1, -1).contiguous()
        hidden = residual + attn.o_proj(attended)
        residual = hidden
        hidden = residual + layer.mlp(layer.post_attention_layernorm(hidden))
    hidden = inner.norm(hidden)
    return model.lm_head(hidden[:, -1, :]).float()
