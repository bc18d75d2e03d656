"""The fleet routing benchmark (bench/fleet_sim.py, issue #22): its simulated replica's prefix cache and metrics,
and a quick run through the real gateway that must produce numbers for every trace and policy (never judged
against targets here: timings are the benchmark's business, not a test's)."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.fleet_replica import SimEngine, SimParams, block_hashes
from bench.fleet_sim import POLICIES, latest_results, readme_table
from bench.fleet_trace import QUICK, TRACES

REPO = Path(__file__).resolve().parents[2]
# No sleeping: only the cache bookkeeping is under test.
FREE = SimParams(prefill_s_per_token=0.0, prefill_overhead_s=0.0, decode_s=0.0, block_tokens=4, kv_blocks=8)


async def run(engine: SimEngine, prompt: list[int], n: int = 2) -> list[int]:
    return [t async for t in engine.generate(prompt, n)]


async def test_a_repeated_prefix_is_served_from_the_cache() -> None:
    engine = SimEngine(FREE, [7])
    await run(engine, list(range(10)))  # 2 full blocks of 4 (+ 2 tokens): nothing cached yet
    assert (engine.stats["cached_tokens"], engine.stats["computed_tokens"]) == (0, 10)
    await run(engine, [*range(10), 50, 51, 52, 53])  # the same 8-token prefix, then new tokens
    assert engine.stats["cached_tokens"] == 8
    await run(engine, [99, *range(10)])  # a different first block: the chain breaks at once
    assert engine.stats["cached_tokens"] == 8


async def test_a_full_hit_still_computes_the_last_token_and_the_answer_is_cached_too() -> None:
    engine = SimEngine(FREE, [7, 8, 9])
    out = await run(engine, [1, 2, 3, 4, 5, 6, 7, 8], 4)
    assert out == [7, 8, 9, 7]
    # The next turn's prompt is prompt + answer + more: all 3 blocks were cached, the answer's included.
    await run(engine, [1, 2, 3, 4, 5, 6, 7, 8, 7, 8, 9, 7, 1])
    assert engine.stats["cached_tokens"] == 12
    engine.reset()
    await run(engine, [1, 2, 3, 4])
    await run(engine, [1, 2, 3, 4])
    assert engine.stats["cached_tokens"] == 3  # 4 cached, but the last prompt token is computed again


async def test_the_kv_budget_evicts_least_recently_used_blocks_and_never_pinned_ones() -> None:
    engine = SimEngine(FREE, [7])
    a, b, c = [list(range(k, k + 16)) for k in (0, 100, 200)]  # 4 blocks each; the budget holds 8
    await run(engine, a, 1)
    await run(engine, b, 1)
    await run(engine, a, 1)  # a is now the most recent
    await run(engine, c, 1)  # evicts b's blocks, not a's
    assert engine.stats["evicted_blocks"] >= 4
    before = engine.stats["cached_tokens"]
    await run(engine, a, 1)
    assert engine.stats["cached_tokens"] - before == 15
    before = engine.stats["cached_tokens"]
    await run(engine, b, 1)
    assert engine.stats["cached_tokens"] == before  # b was evicted
    # A request's own blocks are pinned while it runs: with a budget smaller than the prompt nothing of it
    # is evicted mid-request, the overcommit is counted instead.
    small = SimEngine(SimParams(**{**FREE.__dict__, "kv_blocks": 2}), [7])
    await run(small, list(range(16)), 1)
    assert small.stats["overcommit_blocks"] == 2 and small.pinned == 0


async def test_load_gauges_while_requests_run_and_wait() -> None:
    params = SimParams(prefill_s_per_token=0.0, prefill_overhead_s=0.0, decode_s=0.05, max_active=1,
                       block_tokens=4, kv_blocks=8)
    engine = SimEngine(params, [7])
    gens = [engine.generate(list(range(8)), 3), engine.generate(list(range(8)), 3)]
    first = asyncio.ensure_future(gens[0].__anext__())
    await first  # request 1 has its slot (decoding)
    second = asyncio.ensure_future(gens[1].__anext__())
    await asyncio.sleep(0)
    assert (engine.active, engine.waiting) == (1, 1)  # request 2 waits for the one slot
    text = engine.metrics("fleet-llm")
    samples = {m.group(1): float(m.group(2)) for m in re.finditer(r"^(\S+\}) (\S+)$", text, re.M)}
    assert samples['nv_trt_llm_request_metrics{model="fleet-llm",request_type="waiting",version="1"}'] == 1
    assert samples['nv_trt_llm_request_metrics{model="fleet-llm",request_type="active",version="1"}'] == 1
    assert samples['nv_inference_pending_request_count{model="fleet-llm",version="1"}'] == 1
    frac = samples['nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction",model="fleet-llm",version="1"}']
    assert frac == 2 / 8  # request 1 pins its 2 blocks
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    await gens[0].aclose()
    await gens[1].aclose()
    assert (engine.active, engine.waiting, engine.pinned) == (0, 0, 0)
    assert engine.stats["cancelled"] >= 1


def test_block_hashes_are_chained_prefix_hashes() -> None:
    h1, h2 = block_hashes([1, 2, 3, 4, 5], 2), block_hashes([1, 2, 3, 4, 6, 7], 2)
    assert len(h1) == 2 and h1 == h2[:2] and len(h2) == 3
    assert block_hashes([9, 2, 3, 4], 2)[1] != h1[1]  # same second block, other prefix


def test_traces_extend_each_conversation_and_the_skewed_one_has_a_hot_prefix() -> None:
    mt, sk = TRACES["multi_turn"](QUICK), TRACES["skewed"](QUICK)
    assert len(mt) == QUICK.conversations and all(len(c.turns) == QUICK.turns for c in mt)
    assert len({c.system for c in mt}) == len(mt)  # every conversation has a prefix of its own
    hot = [c for c in sk if c.group == "hot"]
    assert len(hot) == QUICK.hot_clients and len({c.system for c in hot}) == 1
    assert TRACES["multi_turn"](QUICK)[0].system == mt[0].system  # deterministic


def test_bench_readme_fleet_table_is_rendered_from_the_newest_full_run() -> None:
    path = latest_results()
    assert path is not None, "no bench/results/fleet-<date>.json committed"
    readme = (REPO / "bench" / "README.md").read_text()
    start, end = "<!-- fleet-table:start -->", "<!-- fleet-table:end -->"
    committed = readme.split(start, 1)[1].split(end, 1)[0].strip("\n")
    assert committed == readme_table(json.loads(path.read_text())).strip("\n"), (
        "bench/README.md's fleet table is not what the newest bench/results/fleet-*.json renders: paste the "
        "output of `.venv/bin/python -m bench.fleet_sim --report` between the fleet-table markers")


@pytest.mark.slow
def test_quick_run_through_the_gateway_measures_every_trace_and_policy(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "bench.fleet_sim", "--quick", "--out", str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=240)
    files = list(tmp_path.glob("fleet-*-quick.json"))
    assert files, proc.stdout[-2000:] + proc.stderr[-3000:]
    res = json.loads(files[0].read_text())
    assert proc.returncode == 0 and not res.get("failures"), json.dumps(res.get("failures"))[:3000]
    for trace in TRACES:
        for policy in POLICIES:
            r = res[trace][policy]
            assert r["errors"] == 0, (trace, policy, r["first_errors"])
            assert r["requests"] > 0 and r["ttft"]["n"] == r["requests"]
            for which in ("ttft", "replica_ttft"):
                for key in ("p50_ms", "p99_ms"):
                    assert isinstance(r[which][key], float), (trace, policy, which, key)
            assert r["output_tok_s"] > 0 and sum(r["replicas"]["requests"]) == r["requests"]
    assert (tmp_path / files[0].name.replace(".json", ".md")).is_file()
