"""The client-alternatives bench's arithmetic (bench/client_alternatives_stats.py: CPU per token, medians over
repetitions, paired ratios to our client, what a switch would save of the gateway's CPU per token) on
recorded-shaped runs; the expected values are worked out by hand below each case."""

from __future__ import annotations

import math
from typing import Any

from bench.client_alternatives import render_md
from bench.client_alternatives_stats import cheapest, per_token_us, summarise


def run(client: str, rep: int, cpu_s: float, c: int = 16, tokens: int = 1000, **extra: Any) -> dict[str, Any]:
    return {
        "client": client,
        "concurrency": c,
        "rep": rep,
        "tokens": tokens,
        "seconds": 2.0,
        "client_cpu_s": cpu_s,
        "triton_cpu_s": 0.5,
        "errors": 0,
        **extra,
    }


RUNS = [
    run("rpc", 0, 0.28),
    run("rpc", 1, 0.30),
    run("http_aiohttp", 0, 0.11),
    run("http_aiohttp", 1, 0.13),
    run("gateway", 0, 0.09, gateway_cpu_s=0.44),
    run("gateway", 1, 0.10, gateway_cpu_s=0.46),
    run("grpc_sync", 0, 0.29, c=1, tokens=100),
    run("rpc", 0, 0.30, c=1, tokens=100),
]


def test_per_token_us_and_no_tokens() -> None:
    assert per_token_us(0.28, 1000) == 280.0
    assert per_token_us(0.1, 0) is None


def test_medians_spread_and_rates() -> None:
    rows = summarise(RUNS)["c16"]
    # rpc: 280 and 300 us/token -> median 290; Triton 0.5 s / 1000 tokens = 500 us; 1000 tokens / 2 s
    assert rows["rpc"]["client_cpu_us_per_token"] == {"median": 290.0, "min": 280.0, "max": 300.0}
    assert rows["rpc"]["triton_cpu_us_per_token"]["median"] == 500.0
    assert rows["rpc"]["tokens_per_s"]["median"] == 500.0
    assert rows["rpc"]["reps"] == 2


def test_paired_ratio_and_savings() -> None:
    rows = summarise(RUNS)["c16"]
    # paired per repetition: 110/280 = 0.392857, 130/300 = 0.433333 -> median 0.413095
    assert math.isclose(rows["http_aiohttp"]["ratio_to_rpc"], 0.413)
    # saved = median(rpc) 290 - median(aiohttp) 120 = 170 us; the gateway's median is (440 + 460) / 2 = 450
    assert rows["http_aiohttp"]["saved_us_per_token"] == 170.0
    assert rows["http_aiohttp"]["share_of_gateway"] == round(170 / 450, 3)
    assert rows["gateway"]["gateway_cpu_us_per_token"]["median"] == 450.0
    assert "saved_us_per_token" not in rows["gateway"] and "saved_us_per_token" not in rows["rpc"]


def test_no_gateway_measure_leaves_the_share_open() -> None:
    rows = summarise(RUNS)["c1"]
    # c=1: 2,900 vs 3,000 us/token, no gateway run at this level
    assert rows["grpc_sync"]["saved_us_per_token"] == 100.0
    assert rows["grpc_sync"]["share_of_gateway"] is None


def test_a_run_without_tokens_counts_in_reps_but_not_in_figures() -> None:
    rows = summarise([*RUNS, run("http_aiohttp", 2, 0.2, tokens=0)])["c16"]
    assert rows["http_aiohttp"]["reps"] == 3
    assert rows["http_aiohttp"]["client_cpu_us_per_token"]["median"] == 120.0


def test_cheapest_ignores_the_gateway_row() -> None:
    s = summarise(RUNS)
    # the gateway row's client column is its load generator (90-100 us): not a Triton client
    assert cheapest(s) == {"c1": "grpc_sync", "c16": "http_aiohttp"}


def test_markdown_names_every_row() -> None:
    s = summarise(RUNS)
    doc = {
        "meta": {
            "date": "d",
            "loadavg_start": [1],
            "loadavg_end": [2],
            "tokens": 64,
            "model": "m",
            "reps": 2,
            "measure_s": 5,
        },
        "summary": s,
        "cheapest": cheapest(s),
    }
    md = render_md(doc)
    assert "| 16 | http_aiohttp | 120.0 [110.0-130.0] |" in md
    assert "gateway 450.0 [440.0-460.0]" in md
