"""The SmolLM2 reference engine's prefix KV cache (triton_models/smollm2-135m-instruct/1/smollm2_prefix_cache.py),
on its own: chained block keys, longest-run matching, stores, and LRU eviction under the byte budget."""

from __future__ import annotations

import hashlib

import pytest

from tests.helpers import reference_module

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

B = 4  # tokens per block in these tests
LAYERS, HEADS, DIM = 2, 3, 5
BLOCK_BYTES = LAYERS * 2 * HEADS * B * DIM * 4  # FP32 keys and values of every layer


pc = reference_module("smollm2_prefix_cache")


def request_cache(tokens: list[int]) -> transformers.DynamicCache:
    """A cache whose position i holds the value tokens[i] everywhere (so a block's content says where it came from)."""
    values = torch.tensor(tokens, dtype=torch.float32).view(1, 1, -1, 1).expand(1, HEADS, len(tokens), DIM)
    return transformers.DynamicCache([(values.clone(), -values.clone()) for _ in range(LAYERS)])


def test_keys_chain_the_whole_prefix() -> None:
    cache = pc.PrefixCache(B, 10 * BLOCK_BYTES)
    keys = cache.keys(list(range(10)))
    assert len(keys) == 2  # full blocks only: 10 tokens hold two blocks of 4
    first = hashlib.sha256(hashlib.sha256(b"smollm2-prefix:").digest()
                           + bytes.fromhex("00000000010000000200000003000000")).digest()
    assert keys[0] == first
    # The same second block after another first block is another key: a key names the prefix, not the block.
    other = cache.keys([9, 9, 9, 9, 4, 5, 6, 7])
    assert other[1] != keys[1]
    # A salt (another adapter) starts another chain.
    assert cache.keys(list(range(8)), salt=b"lora:1")[0] != keys[0]


def test_match_returns_the_longest_stored_run_and_past_rebuilds_it() -> None:
    cache = pc.PrefixCache(B, 10 * BLOCK_BYTES)
    tokens = list(range(1, 14))  # 3 full blocks and a tail
    keys = cache.keys(tokens)
    assert cache.store(keys, request_cache(tokens)) == 3
    assert cache.stats.bytes == 3 * BLOCK_BYTES

    # A prompt sharing the first 9 tokens: blocks 0 and 1 match, block 2 differs.
    other = [*tokens[:9], 99, 99, 99, 99]
    found = cache.match(cache.keys(other))
    assert len(found) == 2
    past = cache.past(found)
    assert past.get_seq_length() == 2 * B
    assert past.layers[1].keys[0, 2, :, 0].tolist() == [float(t) for t in tokens[: 2 * B]]
    assert past.layers[0].values[0, 0, :, 3].tolist() == [-float(t) for t in tokens[: 2 * B]]
    # A prompt whose first block differs matches nothing, even though its later tokens are the same.
    assert cache.match(cache.keys([0, *tokens[1:]])) == []
    assert (cache.stats.lookups, cache.stats.hits, cache.stats.reused) == (2, 1, 2)


def test_store_skips_blocks_already_held_and_blocks_past_the_cache() -> None:
    cache = pc.PrefixCache(B, 10 * BLOCK_BYTES)
    tokens = list(range(12))
    keys = cache.keys(tokens)
    assert cache.store(keys[:1], request_cache(tokens[:4])) == 1
    # Block 2 is not in a cache of 10 tokens yet: only block 1 is new.
    assert cache.store(keys, request_cache(tokens[:10]), first=1) == 1
    assert cache.store(keys, request_cache(tokens)) == 1
    assert cache.stats.stored == 3 and len(cache.blocks) == 3
    # Stored blocks are copies: changing the request's cache afterwards changes nothing stored.
    live = request_cache(list(range(100, 112)))
    keys2 = cache.keys(list(range(100, 112)))
    cache.store(keys2, live)
    live.layers[0].keys.zero_()
    assert cache.past(cache.match(keys2)).layers[0].keys[0, 0, :, 0].tolist()[:2] == [100.0, 101.0]


def test_eviction_is_least_recently_used_and_takes_a_chain_from_its_tail() -> None:
    cache = pc.PrefixCache(B, 4 * BLOCK_BYTES)
    a = list(range(12))
    b = list(range(100, 112))
    keys_a, keys_b = cache.keys(a), cache.keys(b)
    cache.store(keys_a, request_cache(a))  # 3 blocks
    cache.store(keys_b, request_cache(b))  # 3 more: 2 must go, and they are a's deepest ones
    assert cache.stats.evicted == 2 and cache.stats.bytes == 4 * BLOCK_BYTES
    assert len(cache.match(keys_a)) == 1  # a's first block survives: a prefix is still usable
    assert len(cache.match(keys_b)) == 3
    # Touching a (above, then again) makes it recent: the next store evicts b's tail first.
    cache.match(keys_a)
    c = list(range(200, 204))
    cache.store(cache.keys(c), request_cache(c))
    assert len(cache.match(keys_a)) == 1 and len(cache.match(keys_b)) == 2


def test_a_budget_smaller_than_one_block_stores_nothing() -> None:
    cache = pc.PrefixCache(B, BLOCK_BYTES - 1)
    tokens = list(range(8))
    assert cache.store(cache.keys(tokens), request_cache(tokens)) == 0
    assert cache.stats.bytes == 0 and not cache.blocks
