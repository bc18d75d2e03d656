"""The SmolLM2 reference engine's prefix KV cache: TensorRT-LLM's KV cache block reuse, on CPU with torch.

Imports neither Triton nor the engine, so it is tested on its own (``tests/unit/test_ref_prefix_cache.py``).

* **Blocks.** A prompt is cut into blocks of ``tokens_per_block`` tokens (TensorRT-LLM's ``tokens_per_block``,
  32 by default); only full blocks are kept. A block holds, for every layer, the keys and values of its
  tokens (``[1, kv_heads, tokens_per_block, head_dim]`` each, cloned out of the request's cache so a block
  never pins a whole request's tensors).
* **Keys.** Block ``i`` is keyed by SHA-256 of the key of block ``i - 1`` and block ``i``'s token ids (int32,
  little-endian): a key names the whole prefix up to the block's end, as vLLM's and TensorRT-LLM's chained
  block hashes do, so a block is found only after the same tokens from the start. A cryptographic hash,
  not Python's ``hash``: a prompt crafted to collide with another caller's prefix would otherwise read that
  caller's KV (vLLM's CVE-2025-25183). ``salt`` starts every chain: requests whose KV differs for the same
  tokens (another adapter) are keyed apart by giving a different salt.
* **Reuse.** ``match`` returns the longest run of stored blocks from the first one; the engine builds the
  request's past from them (``past``: one concatenation per layer) and prefills only the tokens after them.
  The engine matches at most ``len(prompt) - 1`` tokens, as TensorRT-LLM does: the last prompt token is
  always computed, since its logits give the first output token.
* **Stores.** ``store`` adds the blocks of a request's cache that are not stored yet: the engine stores a
  prompt's blocks right after its prefill (so a request arriving a moment later already finds them), and when
  the request completes the blocks its generated tokens filled (the next turn of a conversation repeats the
  answer in its prompt), as TensorRT-LLM stores a finished request's blocks.
* **Exactness.** A reused block holds the very numbers its first request computed. The tokens after the
  cached run are then computed in a smaller forward pass than a cold prefill's, whose float32 sums (matmuls,
  attention) are grouped differently: greedy outputs are the same with and without a hit (barring a near-tie
  of two tokens within that rounding), and log-probs agree to ~1e-5 (measured on this model: 4 prompts of 6
  bit-identical, the others within 4e-6; 8e-6 on a 40-token chat whose first block was reused). TensorRT-LLM's
  reuse rounds differently too. Bit-exact reuse would need every prefill cut at every block boundary (one
  forward pass per 32 tokens): measured here, that doubles a cold prefill's time (1,500 tokens: 11.9 s against
  5.8 s in one pass; 128-token passes cost nothing but could reuse only whole 128-token runs).
* **Eviction.** Least recently used first, whenever the blocks' bytes pass ``budget_bytes``. A chain is
  touched deepest block first, so its first block is the most recent and eviction takes chains from their
  tail: a block whose parent is gone could never be matched again, and is never the one left behind.

Not thread-safe: the engine's decode thread is its only user.

Prefix cache, measured with ``bench/prefix_cache_ttft.py`` (tritonserver, TensorRT-LLM tensors over gRPC,
one torch thread, this 2-core machine shared with other work; medians of 3 rounds), time to first token:

=========================================  ======================  =====================
request                                    load average 11-16      load average 5-7
=========================================  ======================  =====================
fresh 1,500-token prompt                   11.2 s                  4.36 s
same prompt + a 30-token new turn          0.82 s                  0.39 s
fresh 1,530-token prompt (the same size)   12.3 s                  7.58 s (4.1-8.1)
=========================================  ======================  =====================

The warm request reused 46 blocks (1,472 tokens) and prefilled 58. A 32-token block of this model is 1.4 MiB
(FP32 keys and values of 30 layers).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import DynamicCache

# (keys, values) per layer.
Block = list[tuple[torch.Tensor, torch.Tensor]]


@dataclass
class PrefixCacheStats:
    """Running counts: blocks found on lookups (``reused``), stored and evicted, and the bytes held now."""

    reused: int = 0
    stored: int = 0
    evicted: int = 0
    bytes: int = 0
    blocks: int = 0
    lookups: int = 0
    hits: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"kv_reused_blocks": self.reused, "kv_stored_blocks": self.stored, "kv_evicted_blocks": self.evicted,
                "kv_cache_bytes": self.bytes, "kv_cache_blocks": self.blocks, "kv_lookups": self.lookups,
                "kv_hits": self.hits}


@dataclass
class PrefixCache:
    """Blocks of KV keyed by chained prefix hashes, LRU under a byte budget (see the module docstring)."""

    tokens_per_block: int
    budget_bytes: int
    blocks: OrderedDict[bytes, tuple[Block, int]] = field(default_factory=OrderedDict)
    stats: PrefixCacheStats = field(default_factory=PrefixCacheStats)

    def keys(self, tokens: Sequence[int], salt: bytes = b"") -> list[bytes]:
        """The chained keys of every full block of ``tokens``."""
        n = len(tokens) // self.tokens_per_block
        if n == 0:
            return []
        arr = np.asarray(tokens[: n * self.tokens_per_block], dtype="<i4").reshape(n, self.tokens_per_block)
        parent = hashlib.sha256(b"smollm2-prefix:" + salt).digest()
        out = []
        for row in arr:
            parent = hashlib.sha256(parent + row.tobytes()).digest()
            out.append(parent)
        return out

    def match(self, keys: Sequence[bytes]) -> list[Block]:
        """The stored blocks of the longest run of ``keys`` from the first, touched (most recently used)."""
        found: list[Block] = []
        for key in keys:
            entry = self.blocks.get(key)
            if entry is None:
                break
            found.append(entry[0])
        self.stats.lookups += 1
        if found:
            self.stats.hits += 1
            self.stats.reused += len(found)
            self._touch(keys[: len(found)])
        return found

    @staticmethod
    def past(blocks: Sequence[Block]) -> DynamicCache:
        """A request's cache holding ``blocks``' tokens in order (one concatenation per layer and tensor)."""
        layers = len(blocks[0])
        return DynamicCache([(torch.cat([b[i][0] for b in blocks], dim=2), torch.cat([b[i][1] for b in blocks], dim=2))
                             for i in range(layers)])

    def store(self, keys: Sequence[bytes], cache: DynamicCache, first: int = 0) -> int:
        """Store blocks ``first..len(keys)-1`` of ``cache`` (block ``i`` = its tokens ``i*B .. (i+1)*B``) that are
        not stored yet; the chain is touched either way. Returns how many blocks were added."""
        b = self.tokens_per_block
        layers = cache.layers
        length = cache.get_seq_length()
        added = 0
        for i in range(first, len(keys)):
            if keys[i] in self.blocks or (i + 1) * b > length:
                continue
            block: Block = [(layer.keys[:, :, i * b:(i + 1) * b].clone(), layer.values[:, :, i * b:(i + 1) * b].clone())
                            for layer in layers]
            size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in block)
            if size > self.budget_bytes:
                break
            self.blocks[keys[i]] = (block, size)
            self.stats.bytes += size
            added += 1
        self.stats.stored += added
        self._touch(keys)
        self._evict()
        self.stats.blocks = len(self.blocks)
        return added

    def _touch(self, keys: Sequence[bytes]) -> None:
        """Mark a chain most recently used, its first block last (the most recent of all)."""
        for key in reversed(keys):
            if key in self.blocks:
                self.blocks.move_to_end(key)

    def _evict(self) -> None:
        while self.stats.bytes > self.budget_bytes and self.blocks:
            _, (_, size) = self.blocks.popitem(last=False)
            self.stats.bytes -= size
            self.stats.evicted += 1
        self.stats.blocks = len(self.blocks)
