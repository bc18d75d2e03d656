"""Interactive chat beside a Batch API job on the same Triton: first-come-first-served against the priority scheduler.

One tritonserver (the embedded launcher) serves ``synthetic-llm-engine``: the synthetic LLM with its engine steps on
(``step_ms``, ``step_per_seq_ms``: every active request gets one token per step, and a step takes longer the more
requests are in it), so, as with a real engine's in-flight batching, capacity is fixed, a bigger batch gives more
tokens per second, and every request in flight slows the others' tokens and time to first token, at almost no CPU
(this 2-core machine is shared, so CPU-bound stand-ins would measure the neighbours).
Two gateway processes (the CLI) sit in front of it, one at a time:

* ``fcfs``: today's admission, no classes (``--batch-slot-share 1``, no queue): the job's lines take whatever they
  can, ``--batch-concurrency`` at a time;
* ``scheduler``: ``--max-in-flight-per-model N``, ``--batch-slot-share S``, a queue: the job's lines hold at most
  ``N x S`` slots and the rest wait in the queue, while interactive requests (``service_tier: priority``) take the
  free slots at once.

Phases, each ``--duration`` seconds: ``alone`` (interactive only), ``batch alone`` (the job only, FCFS: the
capacity
the job could use), then ``fcfs`` and ``scheduler`` with both. The interactive load is open-loop: streamed chat
requests at ``--rate`` per second; TTFT is send -> first content chunk, measured here. Batch throughput is the
lines the job answered during the phase (read from ``GET /v1/batches/{id}``), and its tokens (each line asks for
``--batch-tokens`` tokens, which the synthetic model always emits).

Run: ``.venv/bin/python -m bench.priority_batch [--duration 15] [--rate 4] [--out bench/results/priority-batch]``;
writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.stack import REPO, SYNTHETIC, Gateway, gateway_config
from openai_api.embedded.launcher import EmbeddedTriton

KEY = "bench-key"
ENGINE = "synthetic-llm-engine"
HEADERS = {"Authorization": f"Bearer {KEY}"}


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def interactive(url: str, rate: float, duration: float, tokens: int) -> dict[str, Any]:
    """Open-loop streamed chat at `rate`/s for `duration` s: TTFTs (ms) and the statuses."""
    ttfts: list[float] = []
    statuses: dict[str, int] = {}

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {"model": ENGINE, "messages": [{"role": "user", "content": f"question {i}"}], "max_tokens": tokens,
                "stream": True, "service_tier": "priority"}
        t0 = time.perf_counter()
        try:
            async with client.stream("POST", "/v1/chat/completions", json=body) as r:
                statuses[str(r.status_code)] = statuses.get(str(r.status_code), 0) + 1
                first = None
                async for line in r.aiter_lines():
                    if first is None and line.startswith("data: {") and '"content"' in line:
                        first = time.perf_counter()
                if r.status_code == 200 and first is not None:
                    ttfts.append((first - t0) * 1000)
        except httpx.HTTPError as e:
            statuses[type(e).__name__] = statuses.get(type(e).__name__, 0) + 1

    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=120,
                                 limits=httpx.Limits(max_connections=1000)) as client:
        tasks = []
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < duration:
            tasks.append(asyncio.create_task(one(client, i)))
            i += 1
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        await asyncio.gather(*tasks)
    return {"requests": i, "statuses": statuses, "ttft_p50_ms": pct(ttfts, 0.5), "ttft_p90_ms": pct(ttfts, 0.9),
            "ttft_p99_ms": pct(ttfts, 0.99),
            "ttft_mean_ms": statistics.fmean(ttfts) if ttfts else float("nan")}


async def start_batch(url: str, lines: int, tokens: int) -> str:
    content = b"".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": ENGINE, "messages": [{"role": "user", "content": f"document {i}"}], "max_tokens": tokens}}
        ).encode() + b"\n" for i in range(lines))
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as c:
        f = (await c.post("/v1/files", data={"purpose": "batch"}, files={"file": ("job.jsonl", content)})).json()
        b = (await c.post("/v1/batches", json={"input_file_id": f["id"], "endpoint": "/v1/chat/completions",
                                               "completion_window": "24h"})).json()
        return str(b["id"])


async def batch_done(url: str, batch_id: str) -> int:
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as c:
        counts = (await c.get(f"/v1/batches/{batch_id}")).json()["request_counts"]
        return int(counts["completed"]) + int(counts["failed"])


async def cancel(url: str, batch_id: str) -> None:
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as c:
        await c.post(f"/v1/batches/{batch_id}/cancel")


async def warm(url: str, tokens: int) -> None:
    """A few interactive requests first, unmeasured: a fresh gateway's first requests pay one-time costs."""
    await interactive(url, 10.0, 1.0, tokens)


async def phase(gw: Gateway, args: argparse.Namespace, *, with_interactive: bool, with_batch: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    await warm(gw.url, args.tokens)
    batch_id = None
    if with_batch:
        batch_id = await start_batch(gw.url, args.batch_lines, args.batch_tokens)
        await asyncio.sleep(args.warmup)  # the job's lines in flight (and queued) before measuring
        before, t0 = await batch_done(gw.url, batch_id), time.perf_counter()
    if with_interactive:
        out["interactive"] = await interactive(gw.url, args.rate, args.duration, args.tokens)
    else:
        await asyncio.sleep(args.duration)
    if batch_id is not None:
        answered, elapsed = await batch_done(gw.url, batch_id) - before, time.perf_counter() - t0
        out["batch"] = {"lines_per_s": answered / elapsed, "tokens_per_s": answered * args.batch_tokens / elapsed,
                        "lines": answered, "seconds": elapsed}
        await cancel(gw.url, batch_id)
        await asyncio.sleep(2)  # the cancelled job's lines in flight end before the next phase
    return out


def engine_repository(work: Path, step_ms: float, per_seq_ms: float, max_active: int) -> Path:
    """A model repository holding ENGINE: the synthetic LLM with its engine steps on."""
    dst = work / "models" / ENGINE
    (dst / "1").mkdir(parents=True)
    src = REPO / "triton_models" / SYNTHETIC
    shutil.copy2(src / "1" / "model.py", dst / "1" / "model.py")
    cfg = (src / "config.pbtxt").read_text().replace(f'name: "{SYNTHETIC}"', f'name: "{ENGINE}"')
    cfg = cfg.replace("parameters: [", "parameters: [\n"
                      f'  {{ key: "step_ms" value: {{ string_value: "{step_ms}" }} }},\n'
                      f'  {{ key: "step_per_seq_ms" value: {{ string_value: "{per_seq_ms}" }} }},\n'
                      f'  {{ key: "max_active" value: {{ string_value: "{max_active}" }} }},')
    (dst / "config.pbtxt").write_text(cfg)
    return dst.parent


async def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="bench-priority-"))
    repo = engine_repository(work, args.step_ms, args.step_per_seq_ms, args.engine_batch)
    triton = EmbeddedTriton(models=[ENGINE], extra_args=[f"--model-repository={repo}"])
    triton.start()
    config = gateway_config(triton.grpc_url, triton.http_url)
    entry = next(e for e in config["llm"] if e["name"] == SYNTHETIC)
    config["llm"] = [{**entry, "name": ENGINE, "triton_model": ENGINE}]
    config["model_infos"] = [{"name": ENGINE, "end_id": -1, "max_len": 32768}]
    config["embedding"] = []
    common = ["--batch-concurrency", str(args.batch_concurrency)]
    modes = {"fcfs": [*common, "--batch-slot-share", "1", "--max-queue-per-model", "0"]}
    for share in args.batch_share.split(","):
        modes[f"scheduler-{share}"] = [*common, "--max-in-flight-per-model", str(args.per_model),
                                       "--batch-slot-share", share, "--max-queue-per-model", "1024",
                                       "--queue-timeout", "600"]
    results: dict[str, Any] = {"args": vars(args)}
    try:
        for mode, flags in modes.items():
            gw = Gateway(config, work, ["--api-key", KEY, "--batch-dir", str(work / mode), *flags], name=mode)
            gw.start()
            try:
                # Interactive alone on each gateway: its ratio is against the same process, minutes apart at most.
                results[f"alone ({mode})"] = await phase(gw, args, with_interactive=True, with_batch=False)
                if mode == "fcfs":
                    results["batch alone"] = await phase(gw, args, with_interactive=False, with_batch=True)
                results[mode] = await phase(gw, args, with_interactive=True, with_batch=True)
            finally:
                gw.stop()
    finally:
        triton.stop()
    results["loadavg"] = [round(x, 1) for x in os.getloadavg()]
    capacity = results["batch alone"]["batch"]["tokens_per_s"]
    results["summary"] = {mode: {
        "ttft_p50_ratio": results[mode]["interactive"]["ttft_p50_ms"] / results[f"alone ({mode})"]["interactive"][
            "ttft_p50_ms"],
        "ttft_p99_ratio": results[mode]["interactive"]["ttft_p99_ms"] / results[f"alone ({mode})"]["interactive"][
            "ttft_p99_ms"],
        "batch_of_batch_alone": results[mode]["batch"]["tokens_per_s"] / capacity} for mode in modes}
    return results


def markdown(r: dict[str, Any]) -> str:
    a = r["args"]
    rows = [f"Interactive: {a['rate']}/s streamed chat, {a['tokens']} tokens each, `service_tier: priority`; batch: "
            f"a {a['batch_lines']}-line job of {a['batch_tokens']}-token chats, {a['batch_concurrency']} lines at "
            f"once; scheduler-S: {a['per_model']} slots per model, batch share S; "
            f"{a['duration']} s per phase; engine: the synthetic LLM with steps of {a['step_ms']} ms + "
            f"{a['step_per_seq_ms']} ms per request, at most {a['engine_batch']} requests in its batch (the rest "
            f"wait first-come-first-served). Load average at the end: {r.get('loadavg')}.", "",
            "| phase | interactive TTFT p50 ms | p90 ms | p99 ms | p99 vs alone (same gateway) | statuses | "
            "batch tokens/s | of batch alone |", "|---|---|---|---|---|---|---|---|"]
    cap = r["batch alone"]["batch"]["tokens_per_s"]
    for name in [k for k in r if k not in ("args", "summary", "loadavg")]:
        p = r[name]
        i, b = p.get("interactive"), p.get("batch")
        mode = name[len("alone ("):-1] if name.startswith("alone (") else name
        alone = r.get(f"alone ({mode})", {}).get("interactive", {}).get("ttft_p99_ms", float("nan"))
        empty = f"| {name} | - | - | - | - | - | "
        rows.append(f"| {name} | {i['ttft_p50_ms']:.1f} | {i['ttft_p90_ms']:.1f} | {i['ttft_p99_ms']:.1f} | "
                    f"{i['ttft_p99_ms'] / alone:.2f}x | {i['statuses']} | " if i else empty)
        rows[-1] += f"{b['tokens_per_s']:.0f} | {b['tokens_per_s'] / cap:.0%} |" if b else "- | - |"
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=15.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--rate", type=float, default=8.0)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--batch-lines", type=int, default=5000)
    p.add_argument("--batch-tokens", type=int, default=64)
    p.add_argument("--batch-concurrency", type=int, default=64)
    p.add_argument("--per-model", type=int, default=32)
    p.add_argument("--batch-share", default="0.5,0.75", help="comma-separated: one scheduler phase each")
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--step-per-seq-ms", type=float, default=0.1)
    p.add_argument("--engine-batch", type=int, default=32, help="requests in the engine's batch; others queue")
    p.add_argument("--out", type=Path, default=Path("bench/results/priority-batch"))
    args = p.parse_args()
    results = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    table = markdown(results)
    args.out.with_suffix(".md").write_text("# Priority classes and the Batch API (bench/priority_batch.py)\n\n"
                                           + table)
    print(table)


if __name__ == "__main__":
    main()
