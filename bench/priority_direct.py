"""Interactive time to first token straight at Triton (no gateway), alone and beside N non-streamed batch requests
kept in flight: how much of the interactive slowdown in `bench/priority_batch.py` the engine itself causes.

The same engine as `bench.priority_batch` (the synthetic LLM with engine steps: ``--step-ms`` + ``--step-per-seq-ms``
per active request, at most ``--engine-batch`` in its batch), one tritonserver, the gateway's own gRPC code as the
client (`bench.limit.RpcLLM`, TensorRT-LLM tensors). Interactive: streamed, 16 tokens, open-loop at ``--rate`` per
second; batch: ``N`` workers each sending 64-token non-streamed requests back to back (as the Batch API's lines go
to Triton). Phases alternate over ``--rounds``; TTFT is send -> first streamed response, measured here.

Run: ``.venv/bin/python -m bench.priority_direct [--rounds 2] [--duration 15] [--batch 0,16,24]`` (plus
`bench.priority_batch`'s engine and prompt flags for the engine that costs what real ones do); writes
``bench/results/priority-direct.{json,md}`` (``--out``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.limit import RpcLLM
from bench.priority_batch import ENGINE, engine_repository
from openai_api.embedded.launcher import EmbeddedTriton


def prompt(tokens: int) -> list[int]:
    """A prompt of `tokens` ids (the synthetic engine has no prefix cache: only the length matters)."""
    return [100 + i % 1000 for i in range(tokens)]


async def _interactive(url: str, rate: float, duration: float, out: list[float], tokens: int) -> None:
    llm = RpcLLM(url, ENGINE, prompt(tokens), -1, 0)

    async def one() -> None:
        t0 = time.perf_counter()
        first: list[float] = []
        await llm.generate(16, on_count=lambda n: first.append(time.perf_counter()) if not first else None)
        if first:
            out.append((first[0] - t0) * 1000)

    tasks = []
    end = time.perf_counter() + duration
    while time.perf_counter() < end:
        tasks.append(asyncio.create_task(one()))
        await asyncio.sleep(1 / rate)
    await asyncio.gather(*tasks)


async def _batch(url: str, workers: int, stop: asyncio.Event, done: list[int], prompt_tokens: int,
                 tokens: int) -> None:
    llm = RpcLLM(url, ENGINE, prompt(prompt_tokens), -1, 0)

    async def worker() -> None:
        while not stop.is_set():
            await llm.generate(tokens, streaming=False)
            done[0] += 1

    await asyncio.gather(*(worker() for _ in range(workers)))


def _q(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else float("nan")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    repo = engine_repository(Path(tempfile.mkdtemp()), args.step_ms, args.step_per_seq_ms, args.engine_batch,
                             args.prefill_per_token_ms, args.step_token_budget)
    triton = EmbeddedTriton(models=[ENGINE], extra_args=[f"--model-repository={repo}"]).start()
    pooled: dict[int, list[float]] = {n: [] for n in args.batch}
    lines: dict[int, int] = {n: 0 for n in args.batch}
    rounds: list[dict[str, Any]] = []
    try:
        for r in range(args.rounds):
            for n in args.batch:
                ttft: list[float] = []
                stop, done = asyncio.Event(), [0]
                job = asyncio.create_task(_batch(triton.grpc_url, n, stop, done, args.batch_prompt_tokens,
                                                 args.batch_tokens)) if n else None
                await asyncio.sleep(2.0 if n else 0.0)  # the batch in flight first
                start = done[0]
                await _interactive(triton.grpc_url, args.rate, args.duration, ttft, args.prompt_tokens)
                answered = done[0] - start
                stop.set()
                if job is not None:
                    await job
                pooled[n] += ttft
                lines[n] += answered
                rounds.append({"round": r, "batch": n, "samples": len(ttft), "p50": statistics.median(ttft),
                               "p99": _q(ttft, 99), "lines": answered, "load": os.getloadavg()[0]})
    finally:
        triton.stop()
    alone = pooled[args.batch[0]]
    rows = [{"batch": n, "samples": len(v), "p50": statistics.median(v), "p90": _q(v, 90), "p99": _q(v, 99),
             "p99_vs_alone": _q(v, 99) / _q(alone, 99),
             "tokens_per_s": lines[n] * args.batch_tokens / (args.duration * args.rounds)}
            for n, v in pooled.items()]
    return {"args": {k: v for k, v in vars(args).items() if k != "out"}, "rows": rows, "rounds": rounds}


def report(result: dict[str, Any]) -> str:
    a = result["args"]
    out = ["# Interactive TTFT straight at Triton beside batch work (bench/priority_direct.py)", "",
           f"No gateway: the gateway's gRPC code as the client. Interactive: {a['rate']}/s streamed, 16 tokens, "
           f"{a.get('prompt_tokens', 40)}-token prompts; batch: N workers of {a.get('batch_tokens', 64)}-token "
           f"non-streamed requests back to back, {a.get('batch_prompt_tokens', 40)}-token prompts; {a['rounds']} "
           f"rounds of {a['duration']} s phases; engine: the synthetic LLM, steps of {a['step_ms']} ms + "
           f"{a['step_per_seq_ms']} ms per request, at most {a['engine_batch']} in its batch, prefill "
           f"{a.get('prefill_per_token_ms', 0)} ms per prompt token within {a.get('step_token_budget', 0) or 'no'} "
           f"tokens per step. Load average (1 min) per phase in the JSON.", "",
           "| batch requests in flight | samples | TTFT p50 ms | p90 ms | p99 ms | p99 vs alone | batch tokens/s |",
           "|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        out.append(f"| {row['batch']} | {row['samples']} | {row['p50']:.1f} | {row['p90']:.1f} | {row['p99']:.1f} | "
                   f"{row['p99_vs_alone']:.2f}x | {row['tokens_per_s']:.0f} |")
    return "\n".join(out) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--batch", type=lambda s: [int(x) for x in s.split(",")], default=[0, 16, 24])
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--step-per-seq-ms", type=float, default=0.1)
    p.add_argument("--engine-batch", type=int, default=32)
    p.add_argument("--prefill-per-token-ms", type=float, default=0.0)
    p.add_argument("--step-token-budget", type=int, default=0)
    p.add_argument("--prompt-tokens", type=int, default=40)
    p.add_argument("--batch-prompt-tokens", type=int, default=40)
    p.add_argument("--batch-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=Path("bench/results/priority-direct"))
    args = p.parse_args()
    result = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(report(result))
    print(report(result))


if __name__ == "__main__":
    main()
