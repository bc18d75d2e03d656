"""Smoke test of the board case's load generator (bench/board.py, issue #27): every scenario runs
against the paced stand-in (bench/paced_upstream.py, on loopback) and produces numbers. No tritonserver:
the stand-in is the upstream. Figures are not compared with targets here (bench/results/ does that);
the test only checks that each scenario measured what it says (sample counts, tokens, the ladder).
About 10 s on 2 shared cores (four load generator processes)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench import board
from bench.stack import REPO, free_port, wait_http


@pytest.fixture(scope="module")
def standin() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.paced_upstream", "--port", str(port), "--delay-ms", str(board.PACING_MS)],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", 30, proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_every_board_scenario_produces_numbers(standin: int) -> None:
    sizes = board.Sizes(quick=True)
    sizes.nonstream_requests, sizes.ttft_requests, sizes.itl_streams, sizes.ladder = 5, 5, 1, (2,)
    calls = {"n": 0}

    def probe() -> dict[str, float]:
        calls["n"] += 1
        return {"upstream": float(calls["n"])}  # a stand-in CPU clock: 1 s per sample

    side = board.Side(
        "standin",
        ["--target", "http", "--port", str(standin), "--model", "paced", "--marker", '"content":"'],
        "upstream",
        probe,
    )
    logs: list[str] = []
    out = asyncio.run(board.measure_side(side, sizes, str(REPO), logs.append))
    assert out["nonstream"]["n"] == 5 and out["nonstream"]["errors"] == 0
    assert out["nonstream"]["p50_ms"] >= board.PACING_MS  # a 2-token answer waits one pacing interval
    assert out["nonstream"]["cpu_us_per_request"] == 1e6 / 5  # 1 probe second over 5 requests
    assert out["ttft"]["n"] == 5 and out["ttft"]["p99_ms"] > 0
    assert out["itl"]["n"] == board.STREAM_TOKENS - 1  # one stream: 63 gaps
    assert out["itl"]["p50_ms"] > 0
    assert list(out["streams"]["levels"]) == ["2"]
    for tries in out["streams"]["levels"].values():
        assert tries[-1]["lost_tokens"] == 0 and tries[-1]["errors"] == 0
    assert out["streams"]["stall_free"] in (0, 2)  # a neighbour's burst may stall a level: not asserted
    assert any("streams=2" in line for line in logs)
