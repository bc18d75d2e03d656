"""One command for every gateway benchmark: ``.venv/bin/python -m bench.run [--quick]``.

It starts one tritonserver (synthetic LLMs + all-minilm-l6-v2), the gateway as its own process and,
for embeddings, Infinity in its own venv; runs each case through the gateway and against its
baseline side by side; and writes ``bench/results/latest.{md,json}`` plus a dated JSON copy in
``bench/results/history/``. ``latest.json`` holds a ``summary`` object (the figures the issue's
targets are judged on; see ``bench.report.SUMMARY_KEYS``) from which the docs' table
(docs/performance/index.md) is rendered.
Nothing here asserts timings.

The limit (the direct side of every LLM case) is ``bench.limit``: the gateway's own Triton RPC code
as a bare client, in processes of its own. Cases (see bench/README.md): stream relay vs the limit
(c = 1, 16, 64), added latency of a short non-streamed chat (c = 1, 16) and of the first streamed
token, gateway CPU per token at 8,192 vs 64 output tokens, gateway RSS per open stream (1,000
streams), guided vs unguided decoding, ``--workers 2`` vs ``--workers 1``, AIPerf against the
gateway, py-spy profiles, embeddings vs Infinity.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from bench import aiperf_runner, infinity, profiling
from bench.limit import LABELS, Limit
from bench.load import (
    CONTENT_MARKER,
    TOOL_ARGS_MARKER,
    ConnectionPool,
    Counter,
    HTTPConnection,
    HTTPError,
    latencies,
    percentiles_ms,
    stream_timings,
    throughput,
)
from bench.report import TARGETS, build_summary
from bench.stack import (
    EMBEDDING,
    REPO,
    SMOLLM_TOKENIZER,
    SYNTHETIC,
    SYNTHETIC_PACED,
    SYNTHETIC_SLOW,
    Gateway,
    free_port,
    gateway_config,
    has_flag,
    start_triton,
    wait_http,
)
from openai_api.text.templates import ChatTemplate
from openai_api.text.tokenizer import TextTokenizer

RESULTS = REPO / "bench" / "results"
MESSAGES = [{"role": "user", "content": "Tell me a long story about a quick brown fox."}]
SLOW_DELAY_MS = 1000
# Guided decoding through the gateway: a JSON schema (response_format), and a forced (named) tool call
# whose arguments stream as tool-call deltas. The synthetic model emits one fixed JSON object either way.
GUIDE_SCHEMA = {"type": "object", "properties": {"text": {"type": "string"}}}
GUIDED: dict[str, tuple[dict[str, Any], bytes | None]] = {
    "unguided": ({}, None),
    "json_schema": (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "t", "schema": GUIDE_SCHEMA}}},
        None,
    ),
    "tool_call": (
        {
            "tools": [{"type": "function", "function": {"name": "t", "parameters": GUIDE_SCHEMA}}],
            "tool_choice": {"type": "function", "function": {"name": "t"}},
        },
        TOOL_ARGS_MARKER,
    ),
}
# A token event in LiteLLM's stream chunks (and the stand-in's, its bare side): its first delta puts
# "role" before "content", so the gateway's marker would miss the first token.
LITELLM_MARKER = '"content":"'
ALL_CASES = ["relay", "latency", "long", "streams", "guided", "workers", "aiperf", "profile", "embeddings", "board"]


class Profile:
    """Sizes of a run: --quick for a smoke test (~5 min), full for the committed numbers (<15 min)."""

    def __init__(self, quick: bool) -> None:
        self.name = "quick" if quick else "full"
        self.relay_concurrency = (1, 16, 64)
        self.relay_tokens = 512
        self.relay_warmup_s, self.relay_measure_s, self.relay_reps = (1.0, 3.0, 1) if quick else (1.5, 6.0, 3)
        self.latency_tokens = 16
        self.latency_requests = {1: 150, 16: 15} if quick else {1: 600, 16: 60}  # per worker
        self.long_reps = 1 if quick else 3
        self.streams = 1000
        self.streams_hold_s = 3.0 if quick else 6.0
        self.streams_tokens = 25 if quick else 35  # seconds each stream lasts at 1 token/s
        self.ttft_requests = 100 if quick else 300  # c = 1, streamed, 16 tokens
        self.limit_procs: tuple[int, ...] = (1, 2)  # the limit at c > 1: the best of one process and two
        # ... and of these read paces (us of busy work per token, one process): see bench.limit's relay mode
        self.limit_pace_us: tuple[int, ...] = (0, 40)
        self.embed_warmup_s, self.embed_measure_s = (2.0, 5.0) if quick else (3.0, 12.0)
        self.profile_s = 5 if quick else 10
        self.profile_svg = not quick
        self.guided_concurrency, self.guided_tokens = 16, 512
        self.guided_reps = 1 if quick else 2
        self.workers_concurrency = 64
        self.workers_reps = 1 if quick else 2
        self.aiperf_concurrency, self.aiperf_embed_concurrency = 16, 32
        self.aiperf_warmup_s, self.aiperf_duration_s = (2.0, 6.0) if quick else (3.0, 15.0)


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.p = Profile(args.quick)
        self.p.limit_procs = tuple(args.limit_procs)
        self.p.limit_pace_us = tuple(args.limit_pace_us)
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-"))
        self.results: dict[str, Any] = {"failures": []}
        self.gateway: Gateway | None = None
        self.triton: Any = None
        self.limit: Limit | None = None

    # ------------------------------------------------------------------ helpers
    def log(self, msg: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def fail(self, case: str, exc: BaseException) -> None:
        self.log(f"{case} FAILED: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        self.results["failures"].append({"case": case, "error": f"{type(exc).__name__}: {exc}"[:2000]})

    def gw_proc(self) -> psutil.Process:
        assert self.gateway is not None
        return psutil.Process(self.gateway.pid)

    def probe(self, gateway: Gateway | None = None) -> Callable[[], dict[str, float]]:
        """CPU seconds so far of the gateway (all its processes), Triton and this load generator."""
        gw = gateway or self.gateway
        assert gw is not None
        procs = {"gateway": gw.processes(), "triton": self.triton_procs(), "loadgen": [psutil.Process()]}
        return lambda: {k: self.cpu_s(v) for k, v in procs.items()}

    @staticmethod
    def window_pct(run: dict[str, Any]) -> dict[str, float]:
        return {k: round(100 * v / run["seconds"], 1) for k, v in run.get("window_cpu_s", {}).items()}

    def triton_procs(self) -> list[psutil.Process]:
        root = psutil.Process(self.triton.pid)
        return [root, *root.children(recursive=True)]

    @staticmethod
    def cpu_s(procs: list[psutil.Process]) -> float:
        total = 0.0
        for pr in procs:
            with contextlib.suppress(psutil.Error):
                t = pr.cpu_times()
                total += t.user + t.system
        return total

    async def measured(self, fn: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
        """Run ``fn`` and add the CPU seconds the gateway, Triton and this load generator spent."""
        procs = {"gateway": [self.gw_proc()], "triton": self.triton_procs(), "loadgen": [psutil.Process()]}
        before = {k: self.cpu_s(v) for k, v in procs.items()}
        t0 = time.perf_counter()
        out = await fn()
        wall = time.perf_counter() - t0
        out["cpu_pct"] = {k: round(100 * (self.cpu_s(v) - before[k]) / wall, 1) for k, v in procs.items()}
        out["loadavg_1m"] = round(os.getloadavg()[0], 2)
        return out

    @property
    def gateway_prefix(self) -> list[str] | None:
        """``taskset -c 0`` for the gateway and its peer under ``--pin`` (the bench process, and with it
        Triton and every load generator it starts, is moved to CPU 1 in ``start``)."""
        return ["taskset", "-c", "0"] if self.args.pin else None

    # ------------------------------------------------------------------ set-up
    def start(self) -> None:
        if self.args.pin:
            os.sched_setaffinity(0, {1})  # inherited by Triton, bench.limit and bench.board children
        # Same torch/OpenMP threads for Triton's MiniLM and for Infinity: on a shared 2-core box, OpenMP
        # workers spin at barriers whenever a neighbour holds a core, and encoders slow down severalfold.
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(self.args.torch_threads)
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))  # inherited by Triton and the gateway
        self.log(
            f"starting tritonserver (synthetic-llm, synthetic-llm-slow{', ' + EMBEDDING if self.embeddings else ''})"
        )
        self.triton, extra_repo = start_triton(SLOW_DELAY_MS, embeddings=self.embeddings)
        self.extra_repo = extra_repo
        self.gateway = Gateway(gateway_config(self.triton.grpc_url, self.triton.http_url), self.workdir).start(
            self.gateway_prefix
        )
        self.log(f"gateway pid {self.gateway.pid} on {self.gateway.url}; Triton gRPC {self.triton.grpc_url}")
        tok = TextTokenizer.from_folder(SMOLLM_TOKENIZER)
        template = ChatTemplate.from_file(REPO / "openai_api" / "chat_templates" / "smollm2.jinja")
        prompt = template.render(MESSAGES, add_generation_prompt=True, bos_token=tok.bos_token, eos_token=tok.eos_token)
        self.prompt_ids = tok.encode(prompt)
        end_id = tok.eos_token_ids[0]
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else end_id
        self.end_id, self.pad_id = end_id, pad_id
        self.limit = Limit(self.triton.grpc_url, SYNTHETIC, self.prompt_ids, end_id, pad_id)

    @property
    def embeddings(self) -> bool:
        return "embeddings" in self.args.cases or "aiperf" in self.args.cases

    async def check_alive(self, case: str) -> None:
        """A crashed Triton or gateway is reported with its last words, then both are restarted."""
        dead = []
        if self.triton is not None and not self.triton.is_running():
            crash = [ln for ln in self.triton.log_tail(200).splitlines() if "ASSERTION" in ln or "Signal (" in ln]
            dead.append(f"tritonserver died during {case}: {' | '.join(crash[-3:]) or self.triton.log_tail(5)}")
        if self.gateway is not None and self.gateway.proc is not None and self.gateway.proc.poll() is not None:
            dead.append(f"gateway died during {case}: {self.gateway.log_tail(1500)}")
        if not dead:
            return
        self.fail(case, RuntimeError("; ".join(dead)))
        self.log("restarting Triton and the gateway for the remaining cases")
        await self.stop()
        self.start()

    async def stop(self) -> None:
        if self.gateway is not None:
            self.gateway.stop()
        if self.triton is not None:
            self.triton.stop()
        if getattr(self, "extra_repo", None):
            shutil.rmtree(self.extra_repo, ignore_errors=True)

    def chat_payload(self, max_tokens: int, stream: bool, model: str = SYNTHETIC) -> dict[str, Any]:
        return {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "stream": stream}

    def new_conn(self, gateway: Gateway | None = None) -> HTTPConnection:
        gw = gateway or self.gateway
        assert gw is not None
        return HTTPConnection("127.0.0.1", gw.port)

    async def sanity(self) -> None:
        """Both paths produce the same number of tokens before anything is timed."""
        assert self.limit is not None
        n = 100
        direct = (await self.limit.run("count", 1, tokens=n))["tokens"]
        conn = self.new_conn()
        try:
            via_gw = await conn.post_stream("/v1/chat/completions", self.chat_payload(n, True), lambda k: None)
            status, body = await conn.post_json("/v1/chat/completions", self.chat_payload(16, False))
        finally:
            conn.close()
        if direct != n or via_gw != n:
            raise RuntimeError(f"token counts differ: direct {direct}, gateway content chunks {via_gw}, wanted {n}")
        usage = json.loads(body).get("usage", {}) if status == 200 else {}
        if usage.get("completion_tokens") != 16:
            raise RuntimeError(f"non-streamed chat: HTTP {status}, {body[:300]!r}")
        self.log(
            f"sanity: {n} tokens direct, {n} content chunks through the gateway; prompt {len(self.prompt_ids)} ids"
        )

    # ------------------------------------------------------------------ cases
    def gateway_stream_worker(
        self, payload: dict[str, Any], marker: bytes = CONTENT_MARKER, gateway: Gateway | None = None
    ) -> Callable[[Counter], Awaitable[Any]]:
        """One streamed chat per call on a new connection, counting token events as they arrive."""

        async def run(counter: Counter) -> None:
            conn = self.new_conn(gateway)
            try:
                await conn.post_stream("/v1/chat/completions", payload, counter.add, marker)
            finally:
                conn.close()

        return run

    async def gateway_relay(
        self, payload: dict[str, Any], c: int, marker: bytes = CONTENT_MARKER, gateway: Gateway | None = None
    ) -> dict[str, Any]:
        """Streamed chats through the gateway: tokens/s and the CPU of every process over the window."""
        r = await throughput(
            self.gateway_stream_worker(payload, marker, gateway),
            c,
            self.p.relay_warmup_s,
            self.p.relay_measure_s,
            probe=self.probe(gateway),
        )
        r.pop("window", None)
        r["cpu_pct"] = self.window_pct(r)
        r["gateway_cpu_us_per_token"] = round(r["window_cpu_s"]["gateway"] * 1e6 / max(r["units"], 1), 1)
        r["loadavg_1m"] = round(os.getloadavg()[0], 2)
        return r

    async def limit_relay(self, c: int, client: str, procs: int, pace_us: int = 0) -> dict[str, Any]:
        """The same 512-token streams straight from Triton, from ``bench.limit`` process(es)."""
        assert self.limit is not None
        r = await self.limit.run(
            "relay",
            c,
            client=client,
            procs=procs,
            probe=self.probe(),
            tokens=self.p.relay_tokens,
            warmup=self.p.relay_warmup_s,
            measure=self.p.relay_measure_s,
            **({"pace_us": pace_us} if pace_us else {}),
        )
        r.setdefault("window_cpu_s", {})["limit"] = round(r["cpu_s"], 4)
        r["cpu_pct"] = self.window_pct(r)
        r["loadavg_1m"] = round(os.getloadavg()[0], 2)
        return r

    async def case_relay(self) -> None:
        out: dict[str, Any] = {}
        n = self.p.relay_tokens
        for rep in range(self.p.relay_reps):
            for c in self.p.relay_concurrency:
                cell = out.setdefault(
                    f"c{c}", {"limit": {"runs": []}, "tritonclient": {"runs": []}, "gateway": {"runs": []}}
                )

                async def run_limit(c: int = c, cell: dict[str, Any] = cell, rep: int = rep) -> None:
                    variants: dict[str, dict[str, Any]] = {}
                    tries = [(procs, 0) for procs in self.p.limit_procs if procs <= c]
                    tries += [(1, pace) for pace in self.p.limit_pace_us if pace]
                    for procs, pace in tries:
                        r = await self.limit_relay(c, "rpc", procs, pace)
                        variants[f"{procs}proc" + (f"-pace{pace}us" if pace else "")] = r
                        self.log(
                            f"relay c={c} limit ({procs} process{'es' if procs > 1 else ''}"
                            f"{f', {pace} us/token' if pace else ''}) rep {rep}: "
                            f"{r['rate']:.0f} tokens/s, cpu {r['cpu_pct']}, errors {r['errors']}"
                        )
                        await asyncio.sleep(0.5)
                    best = max(variants, key=lambda k: variants[k]["rate"])
                    cell["limit"]["runs"].append({"rate": variants[best]["rate"], "best": best, "variants": variants})

                async def run_tritonclient(c: int = c, cell: dict[str, Any] = cell, rep: int = rep) -> None:
                    r = await self.limit_relay(c, "tritonclient", 1)
                    cell["tritonclient"]["runs"].append(r)
                    self.log(
                        f"relay c={c} tritonclient (old limit) rep {rep}: {r['rate']:.0f} tokens/s, cpu {r['cpu_pct']}"
                    )
                    await asyncio.sleep(0.5)

                async def run_gateway(c: int = c, cell: dict[str, Any] = cell, rep: int = rep) -> None:
                    r = await self.gateway_relay(self.chat_payload(n, True), c)
                    cell["gateway"]["runs"].append(r)
                    self.log(
                        f"relay c={c} gateway rep {rep}: {r['rate']:.0f} tokens/s, cpu {r['cpu_pct']}, "
                        f"{r['gateway_cpu_us_per_token']} us gateway CPU/token, errors {r['errors']}"
                    )
                    await asyncio.sleep(0.5)

                steps = [run_limit, run_tritonclient, run_gateway]
                for step in steps if rep % 2 == 0 else reversed(steps):  # no side always first
                    await step()
        for cell in out.values():
            # Limit and gateway runs alternate, so each pair saw the same neighbours: a ratio is the
            # median of the paired ratios, a rate the median of the runs.
            lim, tc, gw = (cell[k]["runs"] for k in ("limit", "tritonclient", "gateway"))
            for via in ("limit", "tritonclient", "gateway"):
                cell[via]["tokens_per_s"] = round(_median([r["rate"] for r in cell[via]["runs"]]), 1)
            for via in ("tritonclient", "gateway"):
                cell[via]["errors"] = sum(r["errors"] for r in cell[via]["runs"])
            cell["limit"]["errors"] = sum(v["errors"] for r in lim for v in r["variants"].values())
            pairs = [g["rate"] / max(x["rate"], 1e-9) for x, g in zip(lim, gw, strict=True)]
            pairs_tc = [g["rate"] / max(x["rate"], 1e-9) for x, g in zip(tc, gw, strict=True)]
            cell["ratio"] = round(_median(pairs), 3)
            cell["paired_ratios"] = [round(x, 3) for x in pairs]
            cell["ratio_vs_tritonclient"] = round(_median(pairs_tc), 3)
            cell["limit_over_tritonclient"] = round(
                _median([x["rate"] / max(t["rate"], 1e-9) for x, t in zip(lim, tc, strict=True)]), 3
            )
            cell["gateway_cpu_us_per_token"] = round(_median([r["gateway_cpu_us_per_token"] for r in gw]), 1)
        self.results["relay"] = out
        self.results["relay_meta"] = {
            "limit_client": LABELS["rpc"],
            "limit_processes": (
                (
                    f"the best of {' and '.join(str(p) for p in self.p.limit_procs)} processes at c > 1"
                    if len(self.p.limit_procs) > 1
                    else f"{self.p.limit_procs[0]} process(es)"
                )
                + (
                    f", and of {' and '.join(str(x) for x in self.p.limit_pace_us)} us of client work per token"
                    if len([x for x in self.p.limit_pace_us if x]) > 0
                    else ""
                )
            ),
            "limit_procs": list(self.p.limit_procs),
            "limit_pace_us": list(self.p.limit_pace_us),
            "old_limit_client": LABELS["tritonclient"],
        }

    async def limit_latency(
        self, mode: str, c: int, per_worker: int, streaming: bool, client: str = "rpc"
    ) -> dict[str, Any]:
        assert self.limit is not None
        r = await self.limit.run(
            mode,
            c,
            client=client,
            tokens=self.p.latency_tokens,
            requests=per_worker,
            warmup_requests=5,
            streaming=int(streaming),
        )
        r.pop("samples_ms", None)
        r["cpu_pct"] = {"limit": round(100 * r["cpu_s"] / max(r["wall_s"], 1e-9), 1)}
        return r

    async def case_latency(self) -> None:
        n = self.p.latency_tokens
        payload = self.chat_payload(n, False)
        out: dict[str, Any] = {}
        for c, per_worker in self.p.latency_requests.items():
            conns = [self.new_conn() for _ in range(c)]
            free = list(conns)

            async def via_gateway(free: list[HTTPConnection] = free) -> None:
                conn = free.pop()
                try:
                    status, body = await conn.post_json("/v1/chat/completions", payload)
                finally:
                    free.append(conn)
                if status != 200:
                    raise HTTPError(f"HTTP {status}: {body[:200]!r}")

            # The gateway sends a non-streamed chat with no stop strings as one streaming=false request
            # on a pooled stream: the like-for-like baseline is that request from the limit client. A
            # per-token stream and tritonclient's unary request are kept for information.
            cell: dict[str, Any] = {}
            cell["limit_unary"] = await self.limit_latency("latency", c, per_worker, streaming=False)
            self.log_latency(c, "limit_unary", cell["limit_unary"])
            await asyncio.sleep(0.3)
            cell["gateway"] = await self.measured(
                lambda c=c, per_worker=per_worker: latencies(via_gateway, c, per_worker)
            )
            self.log_latency(c, "gateway", cell["gateway"])
            await asyncio.sleep(0.3)
            cell["limit_stream"] = await self.limit_latency("latency", c, per_worker, streaming=True)
            self.log_latency(c, "limit_stream", cell["limit_stream"])
            await asyncio.sleep(0.3)
            cell["tritonclient_unary"] = await self.limit_latency(
                "latency", c, per_worker, streaming=False, client="tritonclient"
            )
            self.log_latency(c, "tritonclient_unary", cell["tritonclient_unary"])
            for conn in conns:
                conn.close()
            cell["added_p50_ms"] = round(cell["gateway"]["p50_ms"] - cell["limit_unary"]["p50_ms"], 3)
            cell["added_p99_ms"] = round(cell["gateway"]["p99_ms"] - cell["limit_unary"]["p99_ms"], 3)
            cell["added_p50_ms_vs_tritonclient"] = round(
                cell["gateway"]["p50_ms"] - cell["tritonclient_unary"]["p50_ms"], 3
            )
            out[f"c{c}"] = cell
        out["ttft_c1"] = await self.ttft()
        self.results["latency"] = out

    def log_latency(self, c: int, name: str, r: dict[str, Any]) -> None:
        self.log(f"latency c={c} {name}: p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, errors {r['errors']}")

    async def ttft(self) -> dict[str, Any]:
        """Time to the first streamed token at c = 1: a streamed chat through the gateway vs the same
        streamed request from the limit client."""
        n, count = self.p.latency_tokens, self.p.ttft_requests
        out: dict[str, Any] = {"limit": await self.limit_latency("ttft", 1, count, streaming=True)}
        self.log_latency(1, "ttft limit", out["limit"])
        payload = self.chat_payload(n, True)
        conn = self.new_conn()
        samples: list[float] = []
        errors: list[str] = []
        try:
            for i in range(5 + count):
                first: list[float] = []

                def on_count(_k: int, first: list[float] = first) -> None:
                    if not first:
                        first.append(time.perf_counter())

                t0 = time.perf_counter()
                try:
                    got = await conn.post_stream("/v1/chat/completions", payload, on_count)
                    if got != n:
                        raise RuntimeError(f"{got} content chunks, wanted {n}")
                except Exception as e:  # noqa: BLE001
                    errors.append(f"{type(e).__name__}: {e}"[:300])
                    continue
                if i >= 5:
                    samples.append(first[0] - t0)
        finally:
            conn.close()
        out["gateway"] = {**percentiles_ms(samples), "errors": len(errors), "first_errors": errors[:3]}
        self.log_latency(1, "ttft gateway", out["gateway"])
        out["added_p50_ms"] = round(out["gateway"]["p50_ms"] - out["limit"]["p50_ms"], 3)
        out["added_p99_ms"] = round(out["gateway"]["p99_ms"] - out["limit"]["p99_ms"], 3)
        return out

    async def case_long_outputs(self) -> None:
        gw = self.gw_proc()
        sets = {"short": (64, 128), "long": (8192, 1)}  # (tokens per request, requests): 8,192 tokens each
        runs: dict[str, list[float]] = {k: [] for k in sets}
        for rep in range(self.p.long_reps):
            for name, (tokens, count) in sets.items():
                conn = self.new_conn()
                payload = self.chat_payload(tokens, True)
                got = 0
                c0, t0 = self.cpu_s([gw]), time.perf_counter()
                try:
                    for _ in range(count):
                        got += await conn.post_stream("/v1/chat/completions", payload, lambda k: None)
                finally:
                    conn.close()
                cpu, wall = self.cpu_s([gw]) - c0, time.perf_counter() - t0
                if got != tokens * count:
                    raise RuntimeError(f"{name}: got {got} content chunks, wanted {tokens * count}")
                runs[name].append(cpu / got * 1e6)
                self.log(
                    f"long outputs rep {rep} {name}: {tokens} tokens x {count}: gateway {cpu / got * 1e6:.1f} "
                    f"us CPU/token, {got / wall:.0f} tokens/s"
                )
                await asyncio.sleep(0.3)
        med = {k: sorted(v)[len(v) // 2] for k, v in runs.items()}
        self.results["long_outputs"] = {
            "cpu_us_per_token_64": round(med["short"], 1),
            "cpu_us_per_token_8192": round(med["long"], 1),
            "ratio": round(med["long"] / med["short"], 3),
            "runs_us": {k: [round(x, 1) for x in v] for k, v in runs.items()},
        }

    async def case_many_streams(self) -> None:
        gw = self.gw_proc()
        n = self.p.streams
        # One token a second: every stream outlives the ramp-up and the hold, then ends by itself
        # (no mass cancellation, see bench.load.throughput).
        payload = self.chat_payload(self.p.streams_tokens, True, model=SYNTHETIC_SLOW)
        first: list[float] = []
        errors: list[str] = []
        counter = Counter()
        conns = [self.new_conn() for _ in range(n)]
        await asyncio.sleep(1.0)
        rss0 = gw.memory_info().rss

        def on_count(k: int, seen: list[bool]) -> None:
            counter.add(k)
            if not seen[0]:
                seen[0] = True
                first.append(time.perf_counter())

        async def hold(conn: HTTPConnection) -> None:
            seen = [False]
            try:
                await conn.post_stream("/v1/chat/completions", payload, lambda k: on_count(k, seen))
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001
                errors.append(f"{type(e).__name__}: {e}"[:300])

        t0 = time.perf_counter()
        tasks = []
        for i, conn in enumerate(conns):
            tasks.append(asyncio.create_task(hold(conn)))
            if i % 100 == 99:
                await asyncio.sleep(0.1)  # ramp up instead of a thousand simultaneous connects
        deadline = time.monotonic() + 60
        while len(first) + len(errors) < n and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        ramp_s = time.perf_counter() - t0
        open_streams = len(first)
        c0, tok0, h0 = self.cpu_s([gw]), counter.value, time.perf_counter()
        await asyncio.sleep(self.p.streams_hold_s)
        hold_s = time.perf_counter() - h0
        cpu_pct = 100 * (self.cpu_s([gw]) - c0) / hold_s
        tok_rate = (counter.value - tok0) / hold_s
        rss1 = gw.memory_info().rss
        await asyncio.wait(tasks, timeout=self.p.streams_tokens + 30)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for conn in conns:
            conn.close()
        await asyncio.sleep(2.0)
        rss2 = gw.memory_info().rss
        self.results["many_streams"] = {
            "streams": n,
            "open": open_streams,
            "errors": len(errors),
            "first_errors": errors[:3],
            "ramp_s": round(ramp_s, 1),
            "token_delay_ms": SLOW_DELAY_MS,
            "rss_before_mib": round(rss0 / 2**20, 1),
            "rss_held_mib": round(rss1 / 2**20, 1),
            "rss_after_close_mib": round(rss2 / 2**20, 1),
            "rss_per_stream_kib": round((rss1 - rss0) / max(open_streams, 1) / 1024, 1),
            "gateway_cpu_pct_while_held": round(cpu_pct, 1),
            "tokens_per_s_while_held": round(tok_rate, 1),
        }
        self.log(f"many streams: {self.results['many_streams']}")

    async def case_guided(self) -> None:
        """Gateway CPU per token and tokens/s with and without a guide (c = 16, 512-token streams):
        a JSON schema (`response_format`, content deltas) and a forced tool call (argument deltas)."""
        c, n = self.p.guided_concurrency, self.p.guided_tokens
        payloads = {
            name: ({**self.chat_payload(n, True), **extra}, marker or CONTENT_MARKER)
            for name, (extra, marker) in GUIDED.items()
        }
        conn = self.new_conn()
        try:  # every variant streams what it should before anything is timed
            for name, (payload, marker) in payloads.items():
                got = await conn.post_stream(
                    "/v1/chat/completions", {**payload, "max_tokens": 64}, lambda k: None, marker
                )
                want = 64 if name == "unguided" else 63  # guided: the JSON object, then end_id
                if got != want:
                    raise RuntimeError(f"guided sanity: {name} streamed {got} token events, wanted {want}")
        finally:
            conn.close()
        out: dict[str, Any] = {name: {"runs": []} for name in payloads}
        for rep in range(self.p.guided_reps):
            order = list(payloads) if rep % 2 == 0 else list(reversed(payloads))  # no variant always first
            for name in order:
                payload, marker = payloads[name]
                r = await self.gateway_relay(payload, c, marker)
                out[name]["runs"].append(r)
                self.log(
                    f"guided c={c} {name} rep {rep}: {r['rate']:.0f} tokens/s, "
                    f"{r['gateway_cpu_us_per_token']} us gateway CPU/token, errors {r['errors']}"
                )
                await asyncio.sleep(0.5)
        for name in payloads:
            runs = out[name]["runs"]
            out[name]["tokens_per_s"] = round(_median([r["rate"] for r in runs]), 1)
            out[name]["gateway_cpu_us_per_token"] = round(_median([r["gateway_cpu_us_per_token"] for r in runs]), 1)
            out[name]["errors"] = sum(r["errors"] for r in runs)
        base = out["unguided"]["runs"]
        for name in ("json_schema", "tool_call"):
            runs = out[name]["runs"]
            out[name]["tok_s_ratio"] = round(
                _median([g["rate"] / max(u["rate"], 1e-9) for u, g in zip(base, runs, strict=True)]), 3
            )
            out[name]["cpu_per_token_ratio"] = round(
                _median(
                    [
                        g["gateway_cpu_us_per_token"] / max(u["gateway_cpu_us_per_token"], 1e-9)
                        for u, g in zip(base, runs, strict=True)
                    ]
                ),
                3,
            )
        out["concurrency"], out["tokens_per_request"] = c, n
        self.results["guided"] = out

    async def case_workers(self) -> None:
        """Streamed tokens/s and gateway CPU per token (all its processes) with ``--workers 1`` and
        ``--workers 2``: two more gateways, started once each, measured alternately."""
        if not has_flag("--workers"):
            self.results["workers"] = {"skipped": "the gateway has no --workers flag (python openai_api_cli.py --help)"}
            self.log(f"workers: {self.results['workers']['skipped']}")
            return
        assert self.triton is not None
        c, n = self.p.workers_concurrency, self.p.relay_tokens
        gateways: dict[int, Gateway] = {}
        out: dict[str, Any] = {"concurrency": c, "tokens_per_request": n}
        try:
            for w in (1, 2):
                gateways[w] = Gateway(
                    gateway_config(self.triton.grpc_url, self.triton.http_url),
                    self.workdir,
                    extra_args=["--workers", str(w)],
                    name=f"gateway-workers{w}",
                )
                # Under --pin these gateways go on CPU 0 as the run's own does (without the prefix they inherit
                # this process's CPU 1 and share it with Triton and the load generator).
                await asyncio.to_thread(gateways[w].start, self.gateway_prefix)
                await asyncio.sleep(1.0)
                gw = gateways[w]
                out[f"workers{w}"] = {"runs": [], "processes": len(gw.processes())}
                conn = self.new_conn(gw)
                try:
                    got = await conn.post_stream("/v1/chat/completions", self.chat_payload(32, True), lambda k: None)
                finally:
                    conn.close()
                if got != 32:
                    raise RuntimeError(f"--workers {w}: {got} content chunks, wanted 32")
                if w > 1 and len(gw.processes()) < w:
                    out["warning"] = f"--workers {w} runs {len(gw.processes())} process(es)"
            for rep in range(self.p.workers_reps):
                for w in (1, 2) if rep % 2 == 0 else (2, 1):
                    gw = gateways[w]
                    r = await self.gateway_relay(self.chat_payload(n, True), c, gateway=gw)
                    out[f"workers{w}"]["runs"].append(r)
                    self.log(
                        f"workers={w} c={c} rep {rep}: {r['rate']:.0f} tokens/s, "
                        f"{r['gateway_cpu_us_per_token']} us gateway CPU/token, cpu {r['cpu_pct']}"
                    )
                    await asyncio.sleep(0.5)
        finally:
            for gw in gateways.values():
                gw.stop()
        for w in (1, 2):
            cell = out[f"workers{w}"]
            cell["tokens_per_s"] = round(_median([r["rate"] for r in cell["runs"]]), 1)
            cell["gateway_cpu_us_per_token"] = round(_median([r["gateway_cpu_us_per_token"] for r in cell["runs"]]), 1)
        out["tok_s_ratio"] = round(
            _median(
                [
                    b["rate"] / max(a["rate"], 1e-9)
                    for a, b in zip(out["workers1"]["runs"], out["workers2"]["runs"], strict=True)
                ]
            ),
            3,
        )
        self.results["workers"] = out

    async def case_aiperf(self) -> None:
        """NVIDIA AIPerf against the gateway (streamed chat at c = 16, 512 tokens; embeddings, 1 text per
        request at c = 32), each beside this bench's own load generator on the same load."""
        assert self.gateway is not None
        gw = self.gateway
        out: dict[str, Any] = {}
        await asyncio.to_thread(aiperf_runner.ensure_venv, self.workdir / "aiperf-install.log")
        c, n = self.p.aiperf_concurrency, self.p.relay_tokens
        pool = ConnectionPool("127.0.0.1", gw.port)
        ours = await stream_timings(
            pool,
            "/v1/chat/completions",
            self.chat_payload(n, True),
            c,
            self.p.aiperf_warmup_s,
            self.p.aiperf_duration_s,
        )
        pool.close()
        ours.pop("window", None)
        out["chat"] = {"concurrency": c, "output_tokens": n, "loadgen": ours}
        self.log(
            f"aiperf chat: our load generator {ours['rate']:.0f} tokens/s, TTFT p50 {ours['ttft']['p50_ms']:.2f} ms, "
            f"ITL p50 {ours['itl']['p50_ms']:.3f} ms"
        )
        data = await asyncio.to_thread(
            aiperf_runner.profile,
            gw.url,
            model=SYNTHETIC,
            endpoint_type="chat",
            concurrency=c,
            duration_s=self.p.aiperf_duration_s,
            warmup_s=self.p.aiperf_warmup_s,
            input_tokens=32,
            output_tokens=n,
            streaming=True,
            workdir=self.workdir,
            name="chat",
        )
        m = aiperf_runner.metric
        out["version"] = data.get("aiperf_version")
        out["chat"]["aiperf"] = {
            "ttft_p50_ms": m(data, "time_to_first_token", "p50"),
            "ttft_p99_ms": m(data, "time_to_first_token", "p99"),
            "itl_p50_ms": m(data, "inter_token_latency", "p50"),
            "itl_p99_ms": m(data, "inter_token_latency", "p99"),
            "output_tokens_per_s": m(data, "output_token_throughput"),
            "requests_per_s": m(data, "request_throughput"),
            "request_latency_p50_ms": m(data, "request_latency", "p50"),
            "output_sequence_length_avg": m(data, "output_sequence_length"),
            "requests": m(data, "request_count"),
            "errors": data.get("error_summary"),
            "command": data["command"],
        }
        self.log(f"aiperf chat: {out['chat']['aiperf']}")
        if self.embeddings:  # Triton loads MiniLM whenever the embeddings or aiperf case runs
            ce = self.p.aiperf_embed_concurrency
            texts = [f"The quick brown fox number {i} jumps over the lazy dog near the river." for i in range(512)]
            it = {"i": 0}
            epool = ConnectionPool("127.0.0.1", gw.port)

            async def embed_one() -> None:
                it["i"] = (it["i"] + 1) % len(texts)
                async with epool.connection() as conn:
                    status, body = await conn.post_json("/v1/embeddings", {"model": EMBEDDING, "input": texts[it["i"]]})
                if status != 200:
                    raise HTTPError(f"HTTP {status}: {body[:200]!r}")

            per_worker = max(4, int(self.p.aiperf_duration_s * 4))
            mine = await latencies(embed_one, ce, per_worker, warmup=2)
            epool.close()
            out["embeddings"] = {"concurrency": ce, "loadgen": mine}
            data = await asyncio.to_thread(
                aiperf_runner.profile,
                gw.url,
                model=EMBEDDING,
                endpoint_type="embeddings",
                concurrency=ce,
                duration_s=self.p.aiperf_duration_s,
                warmup_s=self.p.aiperf_warmup_s,
                input_tokens=16,
                output_tokens=None,
                streaming=False,
                workdir=self.workdir,
                name="embeddings",
            )
            out["embeddings"]["aiperf"] = {
                "requests_per_s": m(data, "request_throughput"),
                "request_latency_p50_ms": m(data, "request_latency", "p50"),
                "request_latency_p99_ms": m(data, "request_latency", "p99"),
                "requests": m(data, "request_count"),
                "errors": data.get("error_summary"),
                "command": data["command"],
            }
            self.log(f"aiperf embeddings: ours {mine['req_per_s']:.1f} req/s; aiperf {out['embeddings']['aiperf']}")
        self.results["aiperf"] = out

    async def case_perf_analyzer(self) -> None:
        """NVIDIA's perf_analyzer as a cross-check of the limit, where it can run (see perf_analyzer_status)."""
        ok, reason = perf_analyzer_status()
        if not ok:
            self.results["perf_analyzer"] = {"ran": False, "reason": reason}
            self.log(f"perf_analyzer: {reason}")
            return
        assert self.triton is not None
        exe = shutil.which("perf_analyzer") or str(Path(sys.executable).parent / "perf_analyzer")
        data = self.workdir / "pa-input.json"
        data.write_text(
            json.dumps(
                {
                    "data": [
                        {
                            "input_ids": {"content": self.prompt_ids, "shape": [len(self.prompt_ids)]},
                            "input_lengths": [len(self.prompt_ids)],
                            "request_output_len": [self.p.relay_tokens],
                            "streaming": [True],
                        }
                    ]
                }
            )
        )
        out: dict[str, Any] = {"ran": True, "runs": {}}
        for c in self.p.relay_concurrency:
            cmd = [
                exe,
                "-m",
                SYNTHETIC,
                "-u",
                self.triton.grpc_url,
                "-i",
                "grpc",
                "--streaming",
                "--input-data",
                str(data),
                "--concurrency-range",
                str(c),
                "--measurement-interval",
                str(int(self.p.relay_measure_s * 1000)),
            ]
            proc = await asyncio.to_thread(subprocess.run, cmd, capture_output=True, text=True, timeout=300)
            text = proc.stdout + proc.stderr
            rate = None
            for line in text.splitlines():  # "Response Throughput: N infer/sec" (decoupled models)
                if "Response Throughput" in line:
                    with contextlib.suppress(ValueError, IndexError):
                        rate = float(line.split(":", 1)[1].split()[0])
            out["runs"][f"c{c}"] = {"returncode": proc.returncode, "responses_per_s": rate, "tail": text[-800:]}
            self.log(f"perf_analyzer c={c}: {rate} responses/s (exit {proc.returncode})")
        self.results["perf_analyzer"] = out

    async def case_profile(self) -> None:
        assert self.gateway is not None
        out: dict[str, Any] = {}
        lat_payload = self.chat_payload(self.p.latency_tokens, False)
        lat_pool = ConnectionPool("127.0.0.1", self.gateway.port)

        async def latency_worker(counter: Counter) -> None:
            async with lat_pool.connection() as conn:
                status, _body = await conn.post_json("/v1/chat/completions", lat_payload)
                counter.add(1 if status == 200 else 0)

        relay = self.gateway_stream_worker(self.chat_payload(self.p.relay_tokens, True))
        loads = {"relay": (relay, 16), "latency": (latency_worker, 16)}
        for name, (worker, c) in loads.items():
            fmts = ["raw", *(["flamegraph"] if self.p.profile_svg else [])]
            for fmt in fmts:
                path = (self.workdir / f"profile-{name}.txt") if fmt == "raw" else RESULTS / f"profile-{name}.svg"
                spy = profiling.start(self.gateway.pid, path, self.p.profile_s, fmt)
                await throughput(worker, c, 0.0, self.p.profile_s + 1.5)
                try:
                    _, err = await asyncio.to_thread(spy.communicate, timeout=30)
                except subprocess.TimeoutExpired:
                    spy.kill()
                    raise RuntimeError("py-spy did not finish") from None
                if spy.returncode != 0 or not path.exists():
                    raise RuntimeError(f"py-spy failed ({spy.returncode}): {err.decode(errors='replace')[-500:]}")
                if fmt == "raw":
                    out[name] = profiling.summarize(path)
                    self.log(f"profile {name}: top self {out[name]['self'][:5]}")
        self.results["profile"] = out

    async def case_embeddings(self) -> None:
        rng = random.Random(7)
        words = (
            "the quick brown fox jumps over a lazy dog while data centers hum with servers that answer "
            "questions about finance law medicine travel weather music history science cooking sport "
            "markets rivers mountains cities languages systems networks memory latency throughput"
        ).split()
        texts = [" ".join(rng.choice(words) for _ in range(rng.randint(8, 24))).capitalize() + "." for _ in range(4096)]
        it = {"i": 0}

        def take(k: int) -> list[str]:
            i = it["i"]
            it["i"] = (i + k) % (len(texts) - k)
            return texts[i : i + k]

        def worker(port: int, path: str, model: str, batch: int) -> Callable[[Counter], Awaitable[Any]]:
            pool = ConnectionPool("127.0.0.1", port)

            async def run(counter: Counter) -> None:
                inp: Any = take(batch) if batch > 1 else take(1)[0]
                async with pool.connection() as conn:
                    status, body = await conn.post_json(path, {"model": model, "input": inp})
                if status != 200:
                    raise HTTPError(f"HTTP {status}: {body[:200]!r}")
                counter.add(batch)

            return run

        cases = {"single_c32": (1, 32), "batch32_c4": (32, 4)}
        out: dict[str, Any] = {k: {"batch": b, "concurrency": c} for k, (b, c) in cases.items()}
        assert self.gateway is not None
        for key, (batch, c) in cases.items():
            r = await self.measured(
                lambda batch=batch, c=c: throughput(
                    worker(self.gateway.port, "/v1/embeddings", EMBEDDING, batch),
                    c,
                    self.p.embed_warmup_s,
                    self.p.embed_measure_s,
                )
            )
            out[key]["gateway"] = r
            self.log(
                f"embeddings {key} gateway+triton: {r['rate']:.0f} texts/s, cpu {r['cpu_pct']}, errors {r['errors']}"
            )
        self.results["embeddings"] = out
        if self.args.skip_infinity:
            out["infinity_error"] = "skipped (--skip-infinity)"
            return
        server = None
        try:
            self.log("setting up Infinity (first run: creates bench/.venv-infinity, a few minutes)")
            await asyncio.to_thread(infinity.ensure_venv, self.workdir / "infinity-install.log")
            server = await asyncio.to_thread(infinity.InfinityServer(self.workdir).start)
            self.log(f"Infinity on {server.url}")
            for key, (batch, c) in cases.items():
                r = await throughput(
                    worker(server.port, "/embeddings", infinity.SERVED_NAME, batch),
                    c,
                    self.p.embed_warmup_s,
                    self.p.embed_measure_s,
                )
                r["loadavg_1m"] = round(os.getloadavg()[0], 2)
                out[key]["infinity"] = r
                out[key]["ratio"] = round(out[key]["gateway"]["rate"] / max(r["rate"], 1e-9), 3)
                self.log(f"embeddings {key} infinity: {r['rate']:.0f} texts/s, errors {r['errors']}")
        except Exception as e:  # noqa: BLE001 - reported in the results, the rest of the run stands
            out["infinity_error"] = f"{type(e).__name__}: {e}"[:2000]
            self.fail("embeddings/infinity", e)
        finally:
            if server is not None:
                server.stop()

    async def case_board(self) -> None:
        """The board's metrics (``bench.board``) for five sides, one after another, on 20 ms pacing:
        the bare client on Triton's ``synthetic-llm-paced`` (gRPC, the gateway's own client code), the
        gateway with 1 worker and with 2 (stall-free streams only) on that model, the paced stand-in
        (``bench.paced_upstream``) called directly and LiteLLM's proxy in front of it."""
        from bench import board

        assert self.triton is not None and self.gateway is not None
        sizes = board.Sizes(self.args.quick)
        cwd = str(REPO)
        out: dict[str, Any] = {
            "pacing_ms": board.PACING_MS,
            "stream_tokens": board.STREAM_TOKENS,
            "stall_factor": board.STALL_FACTOR,
            "ladder": list(sizes.ladder),
            "sides": {},
        }
        self.results["board"] = out

        def triton_cpu() -> float:
            return self.cpu_s(self.triton_procs())

        http = ["--target", "http", "--host", "127.0.0.1"]
        grpc_flags = [
            "--target",
            "grpc",
            "--url",
            self.triton.grpc_url,
            "--model",
            SYNTHETIC_PACED,
            "--prompt-ids",
            ",".join(map(str, self.prompt_ids)),
            "--end-id",
            str(self.end_id),
            "--pad-id",
            str(self.pad_id),
        ]

        def keep(name: str, r: dict[str, Any]) -> None:
            out["sides"][name] = r

        try:
            await self._board_sides(out, sizes, keep, triton_cpu, http, grpc_flags, cwd)
        finally:
            for r in out["sides"].values():
                for cell in r.values():  # the raw samples stay out of latest.json
                    if isinstance(cell, dict):
                        cell.pop("samples_ms", None)
                        cell.pop("gaps_ms", None)

    async def _board_sides(
        self,
        out: dict[str, Any],
        sizes: Any,
        keep: Callable[[str, dict[str, Any]], None],
        triton_cpu: Callable[[], float],
        http: list[str],
        grpc_flags: list[str],
        cwd: str,
    ) -> None:
        from bench import board, litellm_peer

        assert self.triton is not None and self.gateway is not None
        bare = await board.measure_side(
            board.Side("bare", grpc_flags, None, lambda: {"upstream": triton_cpu()}), sizes, cwd, self.log
        )
        gw = self.gateway
        gw_side = board.Side(
            "gateway",
            [*http, "--port", str(gw.port), "--model", SYNTHETIC_PACED],
            "gateway",
            lambda: {"gateway": self.cpu_s(gw.processes()), "upstream": triton_cpu()},
        )
        ours = await board.measure_side(gw_side, sizes, cwd, self.log)
        out["gateway_added"] = self._board_added(ours, bare)
        keep("bare", bare)
        keep("gateway", ours)
        if has_flag("--workers"):
            w2 = Gateway(
                gateway_config(self.triton.grpc_url, self.triton.http_url),
                self.workdir,
                extra_args=["--workers", "2"],
                name="gateway-board-w2",
            )
            try:
                await asyncio.to_thread(w2.start, self.gateway_prefix)
                await asyncio.sleep(1.0)
                procs = w2.processes()
                side = board.Side(
                    "gateway_w2",
                    [*http, "--port", str(w2.port), "--model", SYNTHETIC_PACED],
                    "gateway",
                    lambda: {"gateway": self.cpu_s(procs), "upstream": triton_cpu()},
                )
                keep("gateway_w2", await board.measure_side(side, sizes, cwd, self.log, only_streams=True))
            finally:
                w2.stop()
        else:
            out["gateway_w2"] = {"skipped": "the gateway has no --workers flag"}
        # LiteLLM, in front of the paced stand-in; the stand-in called directly is its bare side.
        upstream_port = free_port()
        upstream = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.paced_upstream",
                "--port",
                str(upstream_port),
                "--delay-ms",
                str(board.PACING_MS),
            ],
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        proxy: litellm_peer.LiteLLMProxy | None = None
        try:
            await asyncio.to_thread(wait_http, f"http://127.0.0.1:{upstream_port}/health", 30, upstream)
            up = psutil.Process(upstream.pid)

            def up_cpu() -> float:
                return self.cpu_s([up])

            standin = await board.measure_side(
                board.Side(
                    "standin",
                    [*http, "--port", str(upstream_port), "--model", "paced", "--marker", LITELLM_MARKER],
                    None,
                    lambda: {"upstream": up_cpu()},
                ),
                sizes,
                cwd,
                self.log,
            )
            keep("standin", standin)
            try:
                await asyncio.to_thread(litellm_peer.ensure_venv, self.workdir / "litellm-pip.log")
                proxy = litellm_peer.LiteLLMProxy(self.workdir, f"http://127.0.0.1:{upstream_port}/v1")
                await asyncio.to_thread(proxy.start, 180.0, self.gateway_prefix)
            except Exception as e:  # noqa: BLE001 - the rest of the run stands
                out["litellm_error"] = f"{type(e).__name__}: {e}"[:2000]
                self.fail("board/litellm", e)
                return
            out["litellm_version"] = litellm_peer.installed_version()
            self.results["meta"]["litellm_version"] = out["litellm_version"]
            root = psutil.Process(proxy.pid)
            lite_procs = [root, *root.children(recursive=True)]
            lite = await board.measure_side(
                board.Side(
                    "litellm",
                    [*http, "--port", str(proxy.port), "--model", litellm_peer.SERVED_NAME, "--marker", LITELLM_MARKER],
                    "litellm",
                    lambda: {"litellm": self.cpu_s(lite_procs), "upstream": up_cpu()},
                ),
                sizes,
                cwd,
                self.log,
            )
            out["litellm_added"] = self._board_added(lite, standin)
            keep("litellm", lite)
        finally:
            if proxy is not None:
                proxy.stop()
            upstream.terminate()
            upstream.wait(timeout=10)

    @staticmethod
    def _board_added(side: dict[str, Any], bare: dict[str, Any]) -> dict[str, Any]:
        """What ``side`` adds to ``bare``: non-streamed latency, TTFT and inter-token gaps (p50, p99)."""
        from bench.board_metrics import added_ms

        added: dict[str, Any] = {
            k: added_ms(side[k]["samples_ms"], bare[k]["samples_ms"]) for k in ("nonstream", "ttft")
        }
        added["itl"] = added_ms(side["itl"]["gaps_ms"], bare["itl"]["gaps_ms"])
        b, s = bare["streams"]["stall_free"], side["streams"]["stall_free"]
        added["stall_free_ratio"] = round(s / b, 3) if b else None
        return added

    # ------------------------------------------------------------------ driver
    async def run(self) -> None:
        started = time.time()
        self.results["meta"] = {
            "mode": self.p.name,
            "started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
            "loadavg_1m_at_start": round(os.getloadavg()[0], 2),
            "git": _git_commit(),
            "relay_tokens_per_request": self.p.relay_tokens,
            "latency_tokens": self.p.latency_tokens,
            "targets": TARGETS,
            "torch_threads": self.args.torch_threads,
            "glibc": glibc_version(),
            "cases": list(self.args.cases),
            "pinned": "gateway and LiteLLM on CPU 0, the rest on CPU 1" if self.args.pin else None,
        }
        try:
            self.start()
            await self.sanity()
        except Exception as e:  # noqa: BLE001
            self.fail("setup", e)
            if self.gateway is not None:
                print(self.gateway.log_tail(), file=sys.stderr)
            await self.stop()
            self.finish(started)
            return
        cases = {
            "relay": self.case_relay,
            "perf_analyzer": self.case_perf_analyzer,  # a cross-check of the limit, with the relay case
            "latency": self.case_latency,
            "long": self.case_long_outputs,
            "streams": self.case_many_streams,
            "guided": self.case_guided,
            "workers": self.case_workers,
            "aiperf": self.case_aiperf,
            "profile": self.case_profile,
            "embeddings": self.case_embeddings,
            "board": self.case_board,
        }
        try:
            for name, fn in cases.items():
                if name not in self.args.cases and not (name == "perf_analyzer" and "relay" in self.args.cases):
                    continue
                self.log(f"--- {name}")
                try:
                    await fn()
                except Exception as e:  # noqa: BLE001
                    self.fail(name, e)
                await self.check_alive(name)
        finally:
            await self.stop()
            self.finish(started)

    def finish(self, started: float) -> None:
        self.results["meta"]["duration_s"] = round(time.time() - started, 1)
        self.results["meta"]["loadavg_1m_at_end"] = round(os.getloadavg()[0], 2)
        self.results["summary"] = build_summary(self.results)
        from bench.report import write_results

        paths = write_results(self.results, RESULTS)
        self.log(f"wrote {', '.join(str(p.relative_to(REPO)) for p in paths)}")
        print((RESULTS / "latest.md").read_text())


def _git_commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def glibc_version() -> str:
    """What ``ldd --version`` reports (first line), else the C library this interpreter runs on."""
    try:
        line = subprocess.run(["ldd", "--version"], capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
        return line.rsplit(" ", 1)[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").rsplit(" ", 1)[-1]


PERF_ANALYZER_GLIBC = (2, 38)  # the perf-analyzer wheel on PyPI is tagged manylinux_2_38


def perf_analyzer_status() -> tuple[bool, str]:
    """Whether NVIDIA's perf_analyzer can run here, and why not."""
    version = glibc_version()
    try:
        have = tuple(int(x) for x in version.split(".")[:2])
    except ValueError:
        have = (0, 0)
    exe = shutil.which("perf_analyzer") or (
        str(Path(sys.executable).parent / "perf_analyzer")
        if (Path(sys.executable).parent / "perf_analyzer").is_file()
        else None
    )
    if have < PERF_ANALYZER_GLIBC:
        return False, (
            f"not run: the perf-analyzer wheel on PyPI (2.60.0) is tagged manylinux_2_38 (glibc >= 2.38) and this "
            f"machine has glibc {version} (ldd --version); pip here resolves only the 0.1.0 placeholder package, "
            "which has no binary"
        )
    if exe is None:
        return False, f"not run: glibc {version} would do, but no perf_analyzer binary is installed"
    return True, f"perf_analyzer at {exe}, glibc {version}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    all_cases = ALL_CASES
    p = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="short smoke run (~5 min): same cases, smaller samples")
    p.add_argument("--cases", default=",".join(all_cases), help=f"comma-separated subset of {','.join(all_cases)}")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS for both embedding servers (Triton's MiniLM and Infinity); default 1",
    )
    p.add_argument("--skip-infinity", action="store_true", help="embeddings through the gateway only")
    p.add_argument(
        "--pin",
        action="store_true",
        help="as the public gateway board pins: the gateway (and LiteLLM) on CPU 0, everything else (Triton, "
        "the load generators, the stand-in) on CPU 1 (needs 2 CPUs; other jobs on the machine are not moved)",
    )
    p.add_argument(
        "--limit-procs",
        default="1,2",
        help="process counts the limit client is tried with at c > 1 (the faster counts); default 1,2",
    )
    p.add_argument(
        "--limit-pace-us",
        default="0,40",
        help="us of busy client work per token the one-process limit is also tried with (the fastest counts: "
        "Triton delivers more to a client that is not waiting on every message); default 0,40",
    )
    args = p.parse_args(argv)
    try:
        args.limit_pace_us = sorted({int(x) for x in args.limit_pace_us.split(",") if x.strip()} | {0})
    except ValueError:
        p.error("--limit-pace-us: comma-separated integers")
    try:
        args.limit_procs = sorted({int(x) for x in args.limit_procs.split(",") if x.strip()})
    except ValueError:
        p.error("--limit-procs: comma-separated integers")
    if not args.limit_procs or min(args.limit_procs) < 1:
        p.error("--limit-procs: at least one count, each >= 1")
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = set(args.cases) - set(all_cases)
    if unknown:
        p.error(f"unknown cases: {', '.join(sorted(unknown))}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    bench = Bench(args)
    try:
        import uvloop

        uvloop.run(bench.run())
    except ImportError:
        asyncio.run(bench.run())
    return 1 if any(f["case"] == "setup" for f in bench.results["failures"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
