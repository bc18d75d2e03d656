"""The board's metrics (issue #27): what a gateway adds to a paced upstream, measured as the public
gateway board ("onthebench") measures it, for our gateway, its bare client and LiteLLM side by side.

Every side is driven by the same load generator, ``python -m bench.board`` in a process of its own
(never the bench's event loop), over HTTP (``bench.load.HTTPConnection``: our gateway, LiteLLM, the
OpenAI-compatible stand-in) or over gRPC (``bench.limit.RpcLLM``: the bare client on Triton). A child
connects, prints ``ready``, waits for one line on stdin and runs one scenario:

* ``nonstream``: ``--requests`` sequential non-streamed chats of ``--tokens`` tokens (c = 1): latency;
* ``ttft``: ``--requests`` sequential streamed chats (c = 1): time to the first token;
* ``streams``: ``--rounds`` rounds of ``--concurrency`` streams started together, ``--tokens`` each:
  every stream's token arrival times (relative to its first token), from which the parent takes the
  inter-token gaps (c = 1) and the stall verdicts (the stall-free ladder).

It prints one JSON object: the raw samples, its errors, its wall and CPU seconds. The parent
(``Board.side``) samples the CPU seconds of the measured processes just before it sends the start line
and just after the result arrives; ``bench.board_metrics`` turns samples into figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from bench.board_metrics import cpu_us_per_unit, gaps_ms, judge_stream, level_passes, stall_free, summary_ms

PACING_MS = 20.0
STREAM_TOKENS = 64
STALL_FACTOR = 2.0
# Tries per ladder level: on a shared 2-core box one try of a level can stall on a neighbour's burst
# (gaps of 100-400 ms at 2 streams, the upstream's CPU at 5 %); a level fails when all its tries do.
LEVEL_TRIES = 3
MESSAGES = [{"role": "user", "content": "Tell me a long story about a quick brown fox."}]


# ---------------------------------------------------------------------------------------------- child
class _HTTPSide:
    def __init__(self, host: str, port: int, model: str, marker: bytes) -> None:
        from bench.load import ConnectionPool

        self.pool = ConnectionPool(host, port)
        self.model, self.marker = model, marker

    async def call(self, tokens: int, stream: bool, on_count: Callable[[int], None] | None) -> int:
        from bench.load import HTTPError

        payload = {"model": self.model, "messages": MESSAGES, "max_tokens": tokens, "stream": stream}
        async with self.pool.connection() as conn:
            if stream:
                return await conn.post_stream(
                    "/v1/chat/completions", payload, on_count or (lambda k: None), self.marker
                )
            status, body = await conn.post_json("/v1/chat/completions", payload)
        if status != 200:
            raise HTTPError(f"HTTP {status}: {body[:200]!r}")
        return tokens

    async def close(self) -> None:
        self.pool.close()


class _GRPCSide:
    def __init__(self, url: str, model: str, prompt_ids: list[int], end_id: int, pad_id: int) -> None:
        from bench.limit import RpcLLM

        self.llm = RpcLLM(url, model, prompt_ids, end_id, pad_id)

    async def call(self, tokens: int, stream: bool, on_count: Callable[[int], None] | None) -> int:
        return await self.llm.generate(tokens, on_count, streaming=stream)

    async def close(self) -> None:
        await self.llm.close()


async def _sequential(side: Any, a: argparse.Namespace, ttft: bool) -> dict[str, Any]:
    samples: list[float] = []
    errors: list[str] = []
    for _ in range(a.requests):
        first: list[float] = []

        def on_count(_k: int, first: list[float] = first) -> None:
            if not first:
                first.append(time.perf_counter())

        t0 = time.perf_counter()
        try:
            got = await side.call(a.tokens, ttft, on_count if ttft else None)
            if got != a.tokens:
                raise RuntimeError(f"{got} tokens, wanted {a.tokens}")
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            errors.append(f"{type(e).__name__}: {e}"[:300])
            continue
        samples.append(((first[0] if ttft else time.perf_counter()) - t0) * 1000.0)
    return {
        "samples_ms": [round(x, 4) for x in samples],
        "units": len(samples),
        "errors": len(errors),
        "first_errors": errors[:3],
    }


async def _streams(side: Any, a: argparse.Namespace) -> dict[str, Any]:
    streams: list[list[float]] = []
    errors: list[str] = []

    async def one() -> None:
        arrivals: list[float] = []

        def on_count(k: int) -> None:
            now = time.perf_counter()
            arrivals.extend([now] * k)

        try:
            await side.call(a.tokens, True, on_count)
        except Exception as e:  # noqa: BLE001 - a failed stream is judged on what arrived
            errors.append(f"{type(e).__name__}: {e}"[:300])
        t0 = arrivals[0] if arrivals else 0.0
        streams.append([round((t - t0) * 1000.0, 3) for t in arrivals])

    for _ in range(a.rounds):
        await asyncio.gather(*(one() for _ in range(a.concurrency)))
    return {
        "arrivals_ms": streams,
        "units": sum(len(s) for s in streams),
        "errors": len(errors),
        "first_errors": errors[:3],
    }


async def _child(a: argparse.Namespace) -> dict[str, Any]:
    side: Any
    if a.target == "http":
        side = _HTTPSide(a.host, a.port, a.model, a.marker.encode())
    else:
        side = _GRPCSide(a.url, a.model, [int(x) for x in a.prompt_ids.split(",")], a.end_id, a.pad_id)
    try:
        for _ in range(a.warmup_requests):  # connect, warm both paths
            await side.call(2, a.scenario != "nonstream", None)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        t0, c0 = time.perf_counter(), time.process_time()
        if a.scenario == "streams":
            out = await _streams(side, a)
        else:
            out = await _sequential(side, a, ttft=a.scenario == "ttft")
        out["wall_s"] = round(time.perf_counter() - t0, 4)
        out["loadgen_cpu_s"] = round(time.process_time() - c0, 4)
    finally:
        await side.close()
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.board", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--target", choices=("http", "grpc"), required=True)
    p.add_argument("--scenario", choices=("nonstream", "ttft", "streams"), required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--marker", default='"delta":{"content":', help="http: the bytes that mark one token event")
    p.add_argument("--url", default="", help="grpc: Triton host:port")
    p.add_argument("--prompt-ids", default="1")
    p.add_argument("--end-id", type=int, default=-1)
    p.add_argument("--pad-id", type=int, default=0)
    p.add_argument("--tokens", type=int, default=2)
    p.add_argument("--requests", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--warmup-requests", type=int, default=3)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import uvloop

    out = uvloop.run(_child(a))
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


# ---------------------------------------------------------------------------------------------- parent
@dataclass
class Sizes:
    """How much each scenario samples: ``quick`` for the smoke run."""

    quick: bool
    nonstream_requests: int = 0
    ttft_requests: int = 0
    itl_streams: int = 0
    ladder: tuple[int, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        self.nonstream_requests = 30 if self.quick else 300
        self.ttft_requests = 30 if self.quick else 300
        self.itl_streams = 2 if self.quick else 12
        self.ladder = (1, 8, 32) if self.quick else (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


@dataclass
class Side:
    """One measured path: the child's target flags, and which process the CPU figures belong to."""

    name: str
    flags: list[str]
    cpu_key: str | None  # key of the probe's dict charged with the side's CPU (None: bare client, no proxy)
    probe: Callable[[], dict[str, float]]


async def run_child(side: Side, scenario: str, opts: dict[str, Any], cwd: str) -> dict[str, Any]:
    """One child run of ``scenario``; its result plus ``cpu_s`` (the probe's differences over the run)."""
    from bench.limit import reap, spawn_child, wait_ready  # the parent's side of the children's handshake

    cmd = [sys.executable, "-m", "bench.board", *side.flags, "--scenario", scenario]
    cmd += [f"--{k.replace('_', '-')}={v}" for k, v in opts.items()]
    ch = await spawn_child(cmd, cwd)
    try:
        assert ch.stdin is not None
        await wait_ready(ch, "bench.board child", 120)
        before = side.probe()
        ch.stdin.write(b"go\n")
        await ch.stdin.drain()
        ch.stdin.close()
        stdout, stderr = await asyncio.wait_for(ch.communicate(), 600)
        after = side.probe()
        if ch.returncode != 0:
            raise RuntimeError(f"bench.board child exited {ch.returncode}: {stderr.decode(errors='replace')[-1500:]}")
    finally:
        await reap(ch)
    out: dict[str, Any] = json.loads(stdout.decode().strip().splitlines()[-1])
    out["cpu_s"] = {k: round(after[k] - before[k], 4) for k in after}
    out["cpu_us_per_unit"] = {k: cpu_us_per_unit(before, after, k, out["units"]) for k in after}
    return out


def _per_unit(r: dict[str, Any], key: str | None) -> float | None:
    if key is None:
        return None
    v = r["cpu_us_per_unit"].get(key)
    return None if v is None or v != v else v


async def measure_side(
    side: Side, sizes: Sizes, cwd: str, log: Callable[[str], None], only_streams: bool = False
) -> dict[str, Any]:
    """Every board scenario against one side; raw samples stay in the child results' summaries only."""
    out: dict[str, Any] = {}
    if not only_streams:
        r = await run_child(side, "nonstream", {"requests": sizes.nonstream_requests, "tokens": 2}, cwd)
        out["nonstream"] = {
            **summary_ms(r["samples_ms"]),
            "errors": r["errors"],
            "first_errors": r["first_errors"],
            "cpu_us_per_request": _per_unit(r, side.cpu_key),
            "cpu_s": r["cpu_s"],
            "samples_ms": r["samples_ms"],
        }
        log(
            f"board {side.name} nonstream: p50 {out['nonstream']['p50_ms']:.2f} p99 {out['nonstream']['p99_ms']:.2f} ms"
            f", cpu/request {out['nonstream']['cpu_us_per_request']} us, errors {r['errors']}"
        )
        r = await run_child(side, "ttft", {"requests": sizes.ttft_requests, "tokens": 2}, cwd)
        out["ttft"] = {
            **summary_ms(r["samples_ms"]),
            "errors": r["errors"],
            "first_errors": r["first_errors"],
            "samples_ms": r["samples_ms"],
        }
        log(f"board {side.name} ttft: p50 {out['ttft']['p50_ms']:.2f} p99 {out['ttft']['p99_ms']:.2f} ms")
        r = await run_child(
            side, "streams", {"concurrency": 1, "rounds": sizes.itl_streams, "tokens": STREAM_TOKENS}, cwd
        )
        gaps = [g for s in r["arrivals_ms"] for g in gaps_ms([t / 1000.0 for t in s])]
        out["itl"] = {
            **summary_ms(gaps),
            "errors": r["errors"],
            "first_errors": r["first_errors"],
            "cpu_us_per_token": _per_unit(r, side.cpu_key),
            "cpu_s": r["cpu_s"],
            "gaps_ms": [round(g, 3) for g in gaps],
        }
        log(
            f"board {side.name} itl: p50 {out['itl']['p50_ms']:.3f} p99 {out['itl']['p99_ms']:.3f} ms, "
            f"cpu/token {out['itl']['cpu_us_per_token']} us"
        )
    levels: dict[int, bool] = {}
    detail: dict[str, Any] = {}
    for n in sizes.ladder:
        tries = []
        for _attempt in range(LEVEL_TRIES):  # a level fails only if every try fails (a neighbour's burst)
            r = await run_child(side, "streams", {"concurrency": n, "rounds": 1, "tokens": STREAM_TOKENS}, cwd)
            verdicts = [
                judge_stream([t / 1000.0 for t in s], STREAM_TOKENS, PACING_MS, STALL_FACTOR) for s in r["arrivals_ms"]
            ]
            ok = level_passes(verdicts, n, r["errors"])
            tries.append(
                {
                    "passed": ok,
                    "stalled_streams": sum(v.stalled for v in verdicts),
                    "lost_tokens": sum(v.lost for v in verdicts),
                    "max_gap_ms": max((v.max_gap_ms for v in verdicts), default=None),
                    "errors": r["errors"],
                    "first_errors": r["first_errors"],
                    "cpu_us_per_token": _per_unit(r, side.cpu_key),
                    "cpu_pct": {k: round(100 * v / max(r["wall_s"], 1e-9), 1) for k, v in r["cpu_s"].items()},
                    "loadgen_cpu_pct": round(100 * r["loadgen_cpu_s"] / max(r["wall_s"], 1e-9), 1),
                }
            )
            if ok:
                break
        levels[n] = tries[-1]["passed"]
        detail[str(n)] = tries
        log(
            f"board {side.name} streams={n}: {'pass' if levels[n] else 'STALL'} after {len(tries)} tr"
            f"{'y' if len(tries) == 1 else 'ies'}; max gap {tries[-1]['max_gap_ms']} ms, lost "
            f"{tries[-1]['lost_tokens']}, cpu {tries[-1]['cpu_pct']}"
        )
        if not levels[n]:
            break
    best = stall_free(levels)
    out["streams"] = {
        "levels": detail,
        "stall_free": best,
        "ladder_top": max(sizes.ladder),
        "cpu_us_per_token_at_stall_free": detail[str(best)][-1]["cpu_us_per_token"] if best else None,
    }
    return out


if __name__ == "__main__":
    raise SystemExit(main())
