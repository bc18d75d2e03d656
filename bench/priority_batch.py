"""Interactive chat beside a Batch API job on the same Triton: first-come-first-served against the priority scheduler.

One tritonserver (the embedded launcher) serves ``synthetic-llm-engine``: the synthetic LLM with its engine steps on
(``step_ms``, ``step_per_seq_ms``: every active request gets one token per step, and a step takes longer the more
requests are in it), so, as with a real engine's in-flight batching, capacity is fixed, a bigger batch gives more
tokens per second, and every request in flight slows the others' tokens and time to first token, at almost no CPU
(this 2-core machine is shared, so CPU-bound stand-ins would measure the neighbours).

**Engine costs.** Two models, both at almost no CPU:

* the old one (the defaults: ``--step-ms 10 --step-per-seq-ms 0.1``, no prefill cost, two-word prompts): a step
  per token, an interactive request's first token after one step - so its TTFT alone is one step and the wait for
  the step in progress (up to another) is the whole of any ratio: 2.03x with 16 batch requests in flight straight
  at Triton, no gateway (bench/results/priority-direct-2026-12-07.md). The worst case for a gateway.
* an engine that costs what real ones cost (``--step-ms 6 --step-per-seq-ms 0.08 --prefill-per-token-ms 0.015
  --step-token-budget 2048``, chats of ``--prompt-tokens 1500``, batch lines of ``--batch-prompt-tokens 1000``):
  TensorRT-LLM's published H100 figures (docs/source/performance.md, v0.5-v0.6.1, FP8) give LLaMA 7B a first token
  in 7 ms for a 128-token prompt and 36 ms for 2,048 at batch 1 - about 5 ms + 0.015 ms per prompt token - and
  decode steps of ~16 ms at batch 112 (6,818 output tokens/s, 128 in / 2,048 out) and ~39 ms at batch 768 (19,694
  tokens/s, 128/128): ~6-8 ms + 0.04-0.1 ms per sequence. Both engines batch in flight with chunked prefill: a
  step holds a token budget (vLLM's ``max_num_batched_tokens``, 2,048 by default in ``SchedulerConfig``;
  TensorRT-LLM's ``max_num_tokens``) that the running decodes take first and waiting prompts share in arrival
  order (vLLM's chunked-prefill docs and scheduler; TensorRT-LLM's "Tuning Max Batch Size and Max Num Tokens").
  So a request's TTFT alone is mostly its own prefill (~30 ms for 1,500 tokens), and what a batch adds is the step
  it lands in (a batch prompt's chunk makes it ~15-30 ms longer) and batch prompts queued ahead of its own.

One gateway process (the CLI) per mode sits in front of it, all started at once and used one at a time:

* ``fcfs``: today's admission, no classes (``--batch-slot-share 1``, no queue): the job's lines take whatever they
  can, ``--batch-concurrency`` at a time;
* a static share ``S`` (``0.5``): ``--max-in-flight-per-model N``, ``--batch-slot-share S``, a queue: the job's
  lines hold at most ``N x S`` slots and the rest wait in the queue, while interactive requests
  (``service_tier: priority``) take the free slots at once;
* ``adaptive[:C]``: the same with ``--batch-share-adaptive`` (``http.batch_share``), the share between
  ``--batch-share-min`` and ``C``.

``--rounds`` rounds, the modes' order rotating: per mode ``alone`` (interactive only) then the mode with the job,
and once per round ``batch alone`` (the job only, FCFS: the capacity it could use), each phase ``--duration``
seconds. Alternating spreads the shared machine's load over every mode alike; the p99s are pooled over the rounds
(one 160-sample phase's p99 is its second-worst request) and the per-round ratios show the spread. Each phase
records the CPU (cores) of the gateway, Triton (its Python stubs included) and this client, the 1-minute load
average, and the adaptive share (``openai_api_batch_slot_share``, once a second). The interactive load is
open-loop: streamed chat requests at ``--rate`` per second; TTFT is send -> first content chunk, measured here.
Batch throughput is the lines the job answered during the phase (read from ``GET /v1/batches/{id}``), and its
tokens (each line asks for ``--batch-tokens`` tokens, which the synthetic model always emits).

Run: ``.venv/bin/python -m bench.priority_batch [--rounds 3] [--duration 20] [--rate 10]
[--modes fcfs,0.5,0.75,adaptive:0.9,adaptive:0.9:1.1:0.99] [--nice -10] [--out bench/results/priority-batch]``
plus the engine flags above; writes ``<out>.json`` and ``<out>.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.stack import REPO, SYNTHETIC, Gateway, gateway_config
from openai_api.embedded.launcher import EmbeddedTriton

KEY = "bench-key"
ENGINE = "synthetic-llm-engine"
POISSON_SEED = 39  # --arrivals poisson: one seed, so every phase replays the same arrival times
HEADERS = {"Authorization": f"Bearer {KEY}"}


# Words that SmolLM2's tokenizer keeps as one token each (with their leading space), for prompts of a known size.
WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will can more out its who them "
         "about some time only new could these two may first then do any like my now over such our man me even most "
         "made after also did many before must through back years where much your way well down should because each "
         "just those people how too little state good very make world still own see men work long get here between "
         "both life being under never day same another know while last might us great old year off come since").split()


def prompt_text(i: int, tokens: int) -> str:
    """About `tokens` tokens of text, different for every `i` (no two prompts share more than their first word)."""
    if tokens <= 0:
        return f"question {i}"
    step = 1 + i % (len(WORDS) - 1)
    return f"{i} " + " ".join(WORDS[(i + k * step) % len(WORDS)] for k in range(tokens - 1))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def interactive(url: str, rate: float, duration: float, tokens: int, prompt_tokens: int = 0,
                      poisson: bool = False) -> dict[str, Any]:
    """Open-loop streamed chat at `rate`/s for `duration` s: TTFTs (ms) and the statuses. Every 1/`rate` s, or with
    `poisson` at random (exponential gaps of mean 1/`rate`, as vLLM's and aiperf's rate-based loads send; the same
    seed in every phase, so the alone and loaded phases see the same arrivals)."""
    gaps = random.Random(POISSON_SEED)
    ttfts: list[float] = []
    statuses: dict[str, int] = {}

    async def one(client: httpx.AsyncClient, i: int) -> None:
        body = {"model": ENGINE, "messages": [{"role": "user", "content": prompt_text(i, prompt_tokens)}],
                "max_tokens": tokens,
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
        due = 0.0
        while time.perf_counter() - start < duration:
            tasks.append(asyncio.create_task(one(client, i)))
            i += 1
            due += gaps.expovariate(rate) if poisson else 1 / rate
            await asyncio.sleep(max(0.0, start + due - time.perf_counter()))
        await asyncio.gather(*tasks)
    return {"requests": i, "statuses": statuses, **ttft_stats(ttfts), "ttfts": [round(t, 2) for t in ttfts]}


def ttft_stats(ttfts: list[float]) -> dict[str, float]:
    return {"ttft_p50_ms": pct(ttfts, 0.5), "ttft_p90_ms": pct(ttfts, 0.9), "ttft_p99_ms": pct(ttfts, 0.99),
            "ttft_mean_ms": statistics.fmean(ttfts) if ttfts else float("nan"), "samples": len(ttfts)}


async def start_batch(url: str, lines: int, tokens: int, prompt_tokens: int = 0) -> str:
    content = b"".join(json.dumps({"custom_id": f"b{i}", "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": ENGINE, "messages": [{"role": "user", "content": prompt_text(100_000 + i, prompt_tokens)
                                       if prompt_tokens else f"document {i}"}], "max_tokens": tokens}}
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
    """Cancel the job and wait until its lines in flight have ended (`cancelled`), at most 120 s: long lines (512
    tokens, ~5 s) outlived a fixed pause and ran into the next gateway's alone phase."""
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as c:
        await c.post(f"/v1/batches/{batch_id}/cancel")
        deadline = time.perf_counter() + 120
        while time.perf_counter() < deadline:
            if (await c.get(f"/v1/batches/{batch_id}")).json()["status"] in ("cancelled", "completed", "failed",
                                                                            "expired"):
                return
            await asyncio.sleep(0.2)


async def warm(url: str, tokens: int, prompt_tokens: int) -> None:
    """A few interactive requests first, unmeasured: a fresh gateway's first requests pay one-time costs."""
    await interactive(url, 10.0, 1.0, tokens, prompt_tokens)


async def prompt_size(url: str, prompt_tokens: int) -> int:
    """The prompt tokens (usage, template included) of a request built as `interactive` builds them."""
    body = {"model": ENGINE, "messages": [{"role": "user", "content": prompt_text(7, prompt_tokens)}], "max_tokens": 1}
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=60) as c:
        return int((await c.post("/v1/chat/completions", json=body)).json()["usage"]["prompt_tokens"])


def cpu_seconds(procs: list[psutil.Process]) -> float:
    """User + system CPU of `procs` (children included: a gateway's workers, Triton's Python stubs)."""
    total = 0.0
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            for q in (proc, *proc.children(recursive=True)):
                with contextlib.suppress(psutil.Error):
                    t = q.cpu_times()
                    total += t.user + t.system
    return total


async def sample_share(url: str, into: list[float]) -> None:
    """The adaptive batch share (`openai_api_batch_slot_share`) once a second, until cancelled."""
    async with httpx.AsyncClient(base_url=url, headers=HEADERS, timeout=10) as c:
        while True:
            with contextlib.suppress(httpx.HTTPError):
                for line in (await c.get("/metrics")).text.splitlines():
                    if line.startswith("openai_api_batch_slot_share{") and ENGINE in line:
                        into.append(float(line.rsplit(" ", 1)[1]))
            await asyncio.sleep(1.0)


async def phase(gw: Gateway, triton: psutil.Process, args: argparse.Namespace, *, with_interactive: bool,
                with_batch: bool) -> dict[str, Any]:
    """One phase on `gw`; with the CPU seconds per wall second that the gateway, Triton and this client spent
    while measuring (where the interactive requests' time goes on a machine whose cores they share)."""
    out: dict[str, Any] = {}
    await warm(gw.url, args.tokens, args.prompt_tokens)
    batch_id = None
    if with_batch:
        batch_id = await start_batch(gw.url, args.batch_lines, args.batch_tokens, args.batch_prompt_tokens)
        await asyncio.sleep(args.warmup)  # the job's lines in flight (and queued) before measuring
        before = await batch_done(gw.url, batch_id)
    gw_procs = [psutil.Process(gw.pid)]
    cpu0 = (cpu_seconds(gw_procs), cpu_seconds([triton]), time.process_time())
    t0 = time.perf_counter()
    shares: list[float] = []
    sampler = asyncio.create_task(sample_share(gw.url, shares))
    if with_interactive:
        out["interactive"] = await interactive(gw.url, args.rate, args.duration, args.tokens, args.prompt_tokens,
                                               args.arrivals == "poisson")
    else:
        await asyncio.sleep(args.duration)
    elapsed = time.perf_counter() - t0
    sampler.cancel()
    if shares:
        out["batch_share"] = {"mean": round(statistics.fmean(shares), 3), "min": min(shares), "max": max(shares)}
    cpu1 = (cpu_seconds(gw_procs), cpu_seconds([triton]), time.process_time())
    out["cpu"] = {name: round((b - a) / elapsed, 3) for name, a, b in zip(("gateway", "triton", "client"), cpu0,
                                                                             cpu1, strict=True)}
    out["loadavg"] = round(os.getloadavg()[0], 2)
    if batch_id is not None:
        answered = await batch_done(gw.url, batch_id) - before
        out["batch"] = {"lines_per_s": answered / elapsed, "tokens_per_s": answered * args.batch_tokens / elapsed,
                        "lines": answered, "seconds": elapsed}
        await cancel(gw.url, batch_id)  # its lines in flight end before the next phase
    return out


def engine_repository(work: Path, step_ms: float, per_seq_ms: float, max_active: int, prefill_per_token_ms: float = 0.0,
                      step_token_budget: int = 0) -> Path:
    """A model repository holding ENGINE: the synthetic LLM with its engine steps on (and its prefill cost model
    when `prefill_per_token_ms` or `step_token_budget` is set)."""
    dst = work / "models" / ENGINE
    src = REPO / "triton_models" / SYNTHETIC
    # The whole version folder: model.py imports the modules beside it (synthetic_engine.py).
    shutil.copytree(src / "1", dst / "1", ignore=shutil.ignore_patterns("__pycache__"))
    cfg = (src / "config.pbtxt").read_text().replace(f'name: "{SYNTHETIC}"', f'name: "{ENGINE}"')
    cfg = cfg.replace("parameters: [", "parameters: [\n"
                      f'  {{ key: "step_ms" value: {{ string_value: "{step_ms}" }} }},\n'
                      f'  {{ key: "step_per_seq_ms" value: {{ string_value: "{per_seq_ms}" }} }},\n'
                      f'  {{ key: "max_active" value: {{ string_value: "{max_active}" }} }},\n'
                      f'  {{ key: "prefill_per_token_ms" value: {{ string_value: "{prefill_per_token_ms}" }} }},\n'
                      f'  {{ key: "step_token_budget" value: {{ string_value: "{step_token_budget}" }} }},')
    (dst / "config.pbtxt").write_text(cfg)
    return dst.parent


def mode_flags(mode: str, args: argparse.Namespace) -> list[str]:
    """`fcfs`, a static share (`0.75`), or `adaptive[:ceiling[:target[:quantile]]]` (the adaptive share: its
    ceiling, default 1, its `--batch-ttft-target`, default 1.1, and its `--batch-ttft-quantile`, default 0.5);
    then, each after a `+`: `hold` (a static share S with the hold for interactive first tokens: the adaptive
    share pinned at S, `--batch-share-min S`), `startsN` (`--batch-prefills-per-model N`)."""
    mode, *extras = mode.split("+")
    more: list[str] = []
    for extra in extras:
        if extra == "hold":
            more += ["--batch-share-adaptive", "--batch-share-min", mode]
        elif extra.startswith("starts"):
            more += ["--batch-prefills-per-model", extra.removeprefix("starts")]
        else:
            raise SystemExit(f"unknown mode modifier {extra!r} in {mode!r}")
    return [*_base_flags(mode, args), *more]


def _base_flags(mode: str, args: argparse.Namespace) -> list[str]:
    common = ["--batch-concurrency", str(args.batch_concurrency)]
    if mode == "fcfs":
        return [*common, "--batch-slot-share", "1", "--max-queue-per-model", "0"]
    sched = [*common, "--max-in-flight-per-model", str(args.per_model), "--max-queue-per-model", "1024",
             "--queue-timeout", "600"]
    if mode.startswith("adaptive"):
        parts = mode.split(":")
        ceiling = parts[1] if len(parts) > 1 else "1"
        target = parts[2] if len(parts) > 2 else "1.1"
        q = ["--batch-ttft-quantile", parts[3]] if len(parts) > 3 else []
        return [*sched, "--batch-slot-share", ceiling, "--batch-share-adaptive", "--batch-ttft-target", target, *q,
                "--batch-share-min", str(args.share_min)]
    return [*sched, "--batch-slot-share", mode]


def pooled(phases: list[dict[str, Any]]) -> dict[str, float]:
    return ttft_stats([t for p in phases for t in p["interactive"]["ttfts"]])


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every mode's gateway up at once (idle ones cost nothing), then `--rounds` rounds of: per mode (the order
    rotating each round) its interactive-alone phase and its interactive-with-the-job phase, and the job alone
    once (the capacity it could use). Alternating puts the neighbours' load on every mode alike; pooling the
    rounds' samples gives the p99 enough of them, and the per-round ratios show the spread."""
    work = Path(tempfile.mkdtemp(prefix="bench-priority-"))
    repo = engine_repository(work, args.step_ms, args.step_per_seq_ms, args.engine_batch, args.prefill_per_token_ms,
                             args.step_token_budget)
    triton = EmbeddedTriton(models=[ENGINE], extra_args=[f"--model-repository={repo}"])
    triton.start()
    assert triton.pid is not None
    triton_proc = psutil.Process(triton.pid)
    config = gateway_config(triton.grpc_url, triton.http_url)
    entry = next(e for e in config["llm"] if e["name"] == SYNTHETIC)
    config["llm"] = [{**entry, "name": ENGINE, "triton_model": ENGINE}]
    config["model_infos"] = [{"name": ENGINE, "end_id": -1, "max_len": 32768}]
    config["embedding"] = []
    modes = args.modes.split(",")
    results: dict[str, Any] = {"args": vars(args), "rounds": []}
    gateways: dict[str, Gateway] = {}
    capacity = "fcfs"  # the job alone runs on a gateway that holds it back in no way
    try:
        for mode in modes if capacity in modes else [*modes, capacity]:
            name = mode.replace(":", "-")
            gateways[mode] = Gateway(config, work, ["--api-key", KEY, "--batch-dir", str(work / name),
                                                    *mode_flags(mode, args)], name=name).start()
        results["prompt_tokens"] = {"interactive": await prompt_size(gateways[capacity].url, args.prompt_tokens),
                                    "batch": await prompt_size(gateways[capacity].url, args.batch_prompt_tokens)}
        for r in range(args.rounds):
            rnd: dict[str, Any] = {}
            order = modes[r % len(modes):] + modes[:r % len(modes)]
            for mode in order:
                gw = gateways[mode]
                rnd[f"alone ({mode})"] = await phase(gw, triton_proc, args, with_interactive=True, with_batch=False)
                rnd[mode] = await phase(gw, triton_proc, args, with_interactive=True, with_batch=True)
            rnd["batch alone"] = await phase(gateways[capacity], triton_proc, args, with_interactive=False,
                                             with_batch=True)
            results["rounds"].append(rnd)
            print(f"round {r + 1}/{args.rounds} done, load {os.getloadavg()[0]:.2f}", flush=True)
    finally:
        for gw in gateways.values():
            gw.stop()
        triton.stop()
    results["loadavg"] = [round(x, 1) for x in os.getloadavg()]
    results["summary"] = summary(results["rounds"], modes)
    return results


def summary(rounds: list[dict[str, Any]], modes: list[str]) -> dict[str, Any]:
    """Per mode: TTFT pooled over the rounds, the p99 ratio to interactive alone pooled over every mode's alone
    phases (the same requests on an idle Triton; each gateway's alone phases, if they differ, show the noise),
    the per-round p99 ratios (against the alone phase just before), and the job's share of its throughput alone."""
    alone_all = [rnd[k] for rnd in rounds for k in rnd if k.startswith("alone (")]
    base = pooled(alone_all)
    capacity = statistics.fmean(rnd["batch alone"]["batch"]["tokens_per_s"] for rnd in rounds)
    # The median of the alone phases' own p99s: one phase hit by the neighbours (a p99 of 300 ms where the others
    # have 60-80) moves the pooled p99 of every mode's ratio; this reference does not.
    phase_p99 = statistics.median(p["interactive"]["ttft_p99_ms"] for p in alone_all)
    out: dict[str, Any] = {"alone": base, "alone_phase_p99_median": phase_p99, "batch_alone_tokens_per_s": capacity,
                           "modes": {}}
    for mode in modes:
        loaded = [rnd[mode] for rnd in rounds]
        own_alone = pooled([rnd[f"alone ({mode})"] for rnd in rounds])
        stats = pooled(loaded)
        ratios = [rnd[mode]["interactive"]["ttft_p99_ms"] / rnd[f"alone ({mode})"]["interactive"]["ttft_p99_ms"]
                  for rnd in rounds]
        shares = [rnd[mode]["batch"]["tokens_per_s"] / capacity for rnd in rounds]
        out["modes"][mode] = {
            "ttft": stats, "alone_same_gateway": own_alone,
            "p99_ratio": stats["ttft_p99_ms"] / base["ttft_p99_ms"],
            "p50_ratio": stats["ttft_p50_ms"] / base["ttft_p50_ms"],
            "p90_ratio": stats["ttft_p90_ms"] / base["ttft_p90_ms"],
            "p99_vs_phase_median": stats["ttft_p99_ms"] / phase_p99,
            "p99_ratio_per_round": [round(x, 2) for x in ratios],
            "batch_of_batch_alone": statistics.fmean(shares),
            "batch_of_batch_alone_per_round": [round(x, 2) for x in shares],
            "batch_share": [rnd[mode].get("batch_share") for rnd in rounds],
            "cpu": {k: round(statistics.fmean(p["cpu"][k] for p in loaded), 2) for k in loaded[0]["cpu"]}}
    out["alone_cpu"] = {k: round(statistics.fmean(p["cpu"][k] for p in alone_all), 2) for k in alone_all[0]["cpu"]}
    return out


def prefill(r: dict[str, Any]) -> str:
    """The engine's prefill model and the prompt sizes, for the report's first paragraph."""
    a, sizes = r["args"], r.get("prompt_tokens", {})
    if not (a.get("prefill_per_token_ms") or a.get("step_token_budget")):
        return f"; no prefill cost (prompts of {sizes.get('interactive')} / {sizes.get('batch')} tokens)"
    budget = a["step_token_budget"] or "no"
    return (f"; prefill {a['prefill_per_token_ms']} ms per prompt token, chunked within {budget} tokens per step "
            f"(decodes first); prompts (template included): interactive {sizes.get('interactive')} "
            f"tokens, batch lines {sizes.get('batch')}")


def markdown(r: dict[str, Any]) -> str:
    a, s = r["args"], r["summary"]
    base = s["alone"]
    arrivals = "at random (Poisson, the same arrivals in every phase)" if a.get("arrivals") == "poisson" else \
        "evenly spaced"
    rows = [f"Interactive: {a['rate']}/s streamed chat ({arrivals}), {a['tokens']} tokens each, "
            "`service_tier: priority`; batch: "
            f"a {a['batch_lines']}-line job of {a['batch_tokens']}-token chats, {a['batch_concurrency']} lines at "
            f"once; scheduler modes: {a['per_model']} slots per model, a static batch share S, or "
            f"`adaptive[:ceiling[:target[:quantile]]]` from a floor of {a.get('share_min', 0.25)}; "
            f"{a['rounds']} rounds of {a['duration']} s phases, modes alternating; engine: the synthetic LLM with "
            f"steps of {a['step_ms']} ms + {a['step_per_seq_ms']} ms per request, at most {a['engine_batch']} "
            f"requests in its batch (the rest wait first-come-first-served){prefill(r)}. Load average (1 min) at "
            f"each phase's end in the JSON; at the end: {r.get('loadavg')}.", "",
            f"Interactive alone (all alone phases pooled, {base['samples']} samples): TTFT p50 "
            f"{base['ttft_p50_ms']:.1f} ms, p90 {base['ttft_p90_ms']:.1f} ms, p99 {base['ttft_p99_ms']:.1f} ms; "
            f"CPU (cores) gateway / Triton / bench client: {s['alone_cpu']['gateway']} / {s['alone_cpu']['triton']}"
            f" / {s['alone_cpu']['client']}. The job alone: {s['batch_alone_tokens_per_s']:.0f} tokens/s.", "",
            f"The alone phases' own p99s: median {s['alone_phase_p99_median']:.1f} ms (a reference one noisy phase "
            f"does not move).", "",
            "| mode | TTFT p50 ms | p90 ms | p99 ms | p99 vs alone | p99 vs the alone phases' median | p90 vs alone "
            "| per round (vs the alone phase before) | alone p99 on this gateway | batch of its throughput alone | "
            "per round | CPU gateway / Triton / client |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for mode, m in s["modes"].items():
        t, cpu = m["ttft"], m["cpu"]
        rows.append(f"| {mode} | {t['ttft_p50_ms']:.1f} | {t['ttft_p90_ms']:.1f} | {t['ttft_p99_ms']:.1f} | "
                    f"{m['p99_ratio']:.2f}x | {m['p99_vs_phase_median']:.2f}x | {m['p90_ratio']:.2f}x | "
                    f"{m['p99_ratio_per_round']} | "
                    f"{m['alone_same_gateway']['ttft_p99_ms']:.1f} | {m['batch_of_batch_alone']:.0%} | "
                    f"{m['batch_of_batch_alone_per_round']} | {cpu['gateway']} / {cpu['triton']} / {cpu['client']} |")
    return "\n".join(rows) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--rate", type=float, default=10.0)
    p.add_argument("--arrivals", choices=("fixed", "poisson"), default="fixed",
                   help="the chats every 1/rate s, or at random (Poisson, the same arrivals in every phase)")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--batch-lines", type=int, default=5000)
    p.add_argument("--batch-tokens", type=int, default=64)
    p.add_argument("--batch-concurrency", type=int, default=64)
    p.add_argument("--per-model", type=int, default=32)
    p.add_argument("--modes", default="fcfs,0.75,adaptive",
                   help="comma-separated: fcfs, a static batch share (0.5), "
                        "adaptive[:ceiling[:target[:quantile]]]; then +hold, +startsN (mode_flags)")
    p.add_argument("--share-min", type=float, default=0.25, help="the adaptive modes' --batch-share-min")
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--step-per-seq-ms", type=float, default=0.1)
    p.add_argument("--engine-batch", type=int, default=32, help="requests in the engine's batch; others queue")
    p.add_argument("--prefill-per-token-ms", type=float, default=0.0,
                   help="the engine's prefill cost per prompt token (0: prompts cost nothing, the old model)")
    p.add_argument("--step-token-budget", type=int, default=0,
                   help="the engine's tokens per step with chunked prefill (vLLM's max_num_batched_tokens); 0: none")
    p.add_argument("--prompt-tokens", type=int, default=0, help="interactive prompt size (0: a two-word question)")
    p.add_argument("--batch-prompt-tokens", type=int, default=0, help="batch line prompt size (0: two words)")
    p.add_argument("--out", type=Path, default=Path("bench/results/priority-batch"))
    p.add_argument("--nice", type=int, default=0,
                   help="run the bench (Triton, the gateways, this client) at this niceness, e.g. -10 on a shared "
                        "machine: the neighbours' load then delays them less (needs the privilege)")
    p.add_argument("--report", type=Path, help="only write <out>.md again from this run's JSON (its summary anew)")
    args = p.parse_args()
    if args.report:
        results = json.loads(args.report.read_text())
        results["summary"] = summary(results["rounds"], results["args"]["modes"].split(","))
        args.out.with_suffix(".json").write_text(json.dumps(results, default=str) + "\n")
        args.out.with_suffix(".md").write_text("# Priority classes and the Batch API (bench/priority_batch.py)\n\n"
                                               + markdown(results))
        return
    if args.nice:
        os.setpriority(os.PRIO_PROCESS, 0, args.nice)  # the processes it starts inherit it
    results = asyncio.run(run(args))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, default=str) + "\n")
    table = markdown(results)
    args.out.with_suffix(".md").write_text("# Priority classes and the Batch API (bench/priority_batch.py)\n\n"
                                           + table)
    print(table)


if __name__ == "__main__":
    main()
