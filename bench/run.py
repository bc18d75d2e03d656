"""One command for every gateway benchmark: ``.venv/bin/python -m bench.run [--quick]``.

It starts one tritonserver (synthetic LLMs + all-minilm-l6-v2), the gateway as its own process and,
for embeddings, Infinity in its own venv; runs each case through the gateway and against its
baseline side by side; and writes ``bench/results/latest.{md,json}`` plus a dated JSON copy in
``bench/results/history/``. Targets are read from those files; nothing here asserts timings.

Cases (see bench/README.md): stream relay vs direct gRPC (c = 1, 16, 64), added latency of a short
non-streamed chat (c = 1, 16), embeddings vs Infinity (single texts at c = 32, 32-text batches),
gateway CPU per token at 8,192 vs 64 output tokens, gateway RSS per open stream (1,000 streams),
and py-spy profiles of the gateway on the relay and latency cases.
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
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from bench import infinity, profiling
from bench.load import ConnectionPool, Counter, DirectLLM, HTTPConnection, HTTPError, latencies, throughput
from bench.stack import (
    EMBEDDING,
    REPO,
    SMOLLM_TOKENIZER,
    SYNTHETIC,
    SYNTHETIC_SLOW,
    Gateway,
    gateway_config,
    start_triton,
)
from openai_api.text.templates import ChatTemplate
from openai_api.text.tokenizer import TextTokenizer

RESULTS = REPO / "bench" / "results"
TARGETS = {
    "relay_ratio_min": 0.9,
    "added_p50_ms_max": 1.0,
    "embeddings_ratio_min": 1.0,
    "long_output_cpu_ratio_max": 1.1,
}
MESSAGES = [{"role": "user", "content": "Tell me a long story about a quick brown fox."}]
SLOW_DELAY_MS = 1000


class Profile:
    """Sizes of a run: --quick for a smoke test (~3 min), full for the committed numbers (<15 min)."""

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
        self.embed_warmup_s, self.embed_measure_s = (2.0, 5.0) if quick else (3.0, 12.0)
        self.profile_s = 5 if quick else 10
        self.profile_svg = not quick


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.p = Profile(args.quick)
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-"))
        self.results: dict[str, Any] = {"failures": []}
        self.gateway: Gateway | None = None
        self.triton: Any = None
        self.direct: DirectLLM | None = None

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

    # ------------------------------------------------------------------ set-up
    def start(self) -> None:
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
        self.gateway = Gateway(gateway_config(self.triton.grpc_url, self.triton.http_url), self.workdir).start()
        self.log(f"gateway pid {self.gateway.pid} on {self.gateway.url}; Triton gRPC {self.triton.grpc_url}")
        tok = TextTokenizer.from_folder(SMOLLM_TOKENIZER)
        template = ChatTemplate.from_file(REPO / "chat_templates" / "smollm2.jinja")
        prompt = template.render(MESSAGES, add_generation_prompt=True, bos_token=tok.bos_token, eos_token=tok.eos_token)
        self.prompt_ids = tok.encode(prompt)
        end_id = tok.eos_token_ids[0]
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else end_id
        self.direct = DirectLLM(self.triton.grpc_url, SYNTHETIC, self.prompt_ids, end_id, pad_id)

    @property
    def embeddings(self) -> bool:
        return "embeddings" in self.args.cases

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
        if self.direct is not None:
            with contextlib.suppress(Exception):
                await self.direct.close()
        if self.gateway is not None:
            self.gateway.stop()
        if self.triton is not None:
            self.triton.stop()
        if getattr(self, "extra_repo", None):
            shutil.rmtree(self.extra_repo, ignore_errors=True)

    def chat_payload(self, max_tokens: int, stream: bool, model: str = SYNTHETIC) -> dict[str, Any]:
        return {"model": model, "messages": MESSAGES, "max_tokens": max_tokens, "stream": stream}

    def new_conn(self) -> HTTPConnection:
        assert self.gateway is not None
        return HTTPConnection("127.0.0.1", self.gateway.port)

    async def sanity(self) -> None:
        """Both paths produce the same number of tokens before anything is timed."""
        assert self.direct is not None
        n = 100
        direct = await self.direct.generate(n)
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
    def relay_worker(self, via: str) -> Callable[[Counter], Awaitable[Any]]:
        n = self.p.relay_tokens
        if via == "direct":
            assert self.direct is not None
            direct = self.direct

            async def run_direct(counter: Counter) -> None:
                await direct.generate(n, counter.add)

            return run_direct
        payload = self.chat_payload(n, True)

        async def run_gateway(counter: Counter) -> None:
            conn = self.new_conn()
            try:
                await conn.post_stream("/v1/chat/completions", payload, counter.add)
            finally:
                conn.close()

        return run_gateway

    async def case_relay(self) -> None:
        out: dict[str, Any] = {}
        for rep in range(self.p.relay_reps):
            for c in self.p.relay_concurrency:
                for via in ("direct", "gateway"):
                    r = await self.measured(
                        lambda via=via, c=c: throughput(
                            self.relay_worker(via), c, self.p.relay_warmup_s, self.p.relay_measure_s
                        )
                    )
                    cell = out.setdefault(f"c{c}", {}).setdefault(via, {"runs": []})
                    cell["runs"].append(r)
                    self.log(
                        f"relay c={c} {via} rep {rep}: {r['rate']:.0f} tokens/s, cpu {r['cpu_pct']}, "
                        f"errors {r['errors']}"
                    )
                    await asyncio.sleep(0.5)
        for _c, cell in out.items():
            # Direct and gateway runs alternate, so each pair saw the same neighbours: the ratio is the
            # median of the paired ratios, the rates the medians of the runs.
            pairs = sorted(
                g["rate"] / max(d["rate"], 1e-9)
                for d, g in zip(cell["direct"]["runs"], cell["gateway"]["runs"], strict=False)
            )
            for via in ("direct", "gateway"):
                rates = sorted(r["rate"] for r in cell[via]["runs"])
                cell[via]["tokens_per_s"] = round(rates[len(rates) // 2], 1)
                cell[via]["errors"] = sum(r["errors"] for r in cell[via]["runs"])
            cell["ratio"] = round(pairs[len(pairs) // 2], 3)
            cell["paired_ratios"] = [round(x, 3) for x in pairs]
            gw_runs = sorted(cell["gateway"]["runs"], key=lambda r: r["rate"])
            mid = gw_runs[len(gw_runs) // 2]
            cell["gateway_cpu_us_per_token"] = round(mid["cpu_pct"]["gateway"] / 100 * 1e6 / max(mid["rate"], 1e-9), 1)
        self.results["relay"] = out

    async def case_latency(self) -> None:
        assert self.direct is not None
        direct = self.direct
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

            async def direct_stream() -> None:
                if await direct.generate(n) != n:
                    raise RuntimeError("short answer")

            async def direct_unary() -> None:
                if await direct.generate(n, streaming=False) != n:
                    raise RuntimeError("short answer")

            cell: dict[str, Any] = {}
            for name, call in (
                ("direct_stream", direct_stream),
                ("gateway", via_gateway),
                ("direct_unary", direct_unary),
            ):
                cell[name] = await self.measured(
                    lambda call=call, c=c, per_worker=per_worker: latencies(call, c, per_worker)
                )
                self.log(
                    f"latency c={c} {name}: p50 {cell[name]['p50_ms']:.2f} ms, p99 {cell[name]['p99_ms']:.2f} ms"
                    f", errors {cell[name]['errors']}"
                )
                await asyncio.sleep(0.3)
            for conn in conns:
                conn.close()
            # The gateway sends a non-streamed chat with no stop strings as one streaming=false request,
            # so the like-for-like baseline is the direct unary request; the per-token stream is kept
            # for information (it is what the gateway sent before that change).
            cell["added_p50_ms"] = round(cell["gateway"]["p50_ms"] - cell["direct_unary"]["p50_ms"], 3)
            cell["added_p99_ms"] = round(cell["gateway"]["p99_ms"] - cell["direct_unary"]["p99_ms"], 3)
            cell["added_p50_ms_vs_stream"] = round(cell["gateway"]["p50_ms"] - cell["direct_stream"]["p50_ms"], 3)
            out[f"c{c}"] = cell
        self.results["latency"] = out

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

    async def case_profile(self) -> None:
        assert self.gateway is not None
        out: dict[str, Any] = {}
        lat_payload = self.chat_payload(self.p.latency_tokens, False)
        lat_pool = ConnectionPool("127.0.0.1", self.gateway.port)

        async def latency_worker(counter: Counter) -> None:
            async with lat_pool.connection() as conn:
                status, _body = await conn.post_json("/v1/chat/completions", lat_payload)
                counter.add(1 if status == 200 else 0)

        loads = {"relay": (self.relay_worker("gateway"), 16), "latency": (latency_worker, 16)}
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
            "latency": self.case_latency,
            "long": self.case_long_outputs,
            "streams": self.case_many_streams,
            "profile": self.case_profile,
            "embeddings": self.case_embeddings,
        }
        try:
            for name, fn in cases.items():
                if name not in self.args.cases:
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
        self.results["summary"] = summary_rows(self.results)
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


def summary_rows(res: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target: what was measured, against what, and whether it meets the target."""
    rows: list[dict[str, Any]] = []
    for key, cell in res.get("relay", {}).items():
        rows.append(
            {
                "check": f"stream relay {key.replace('c', 'c=')} (tokens/s)",
                "gateway": cell["gateway"]["tokens_per_s"],
                "baseline": cell["direct"]["tokens_per_s"],
                "baseline_name": "direct gRPC",
                "value": cell["ratio"],
                "unit": "x",
                "target": f">= {TARGETS['relay_ratio_min']}",
                "pass": cell["ratio"] >= TARGETS["relay_ratio_min"],
            }
        )
    for key, cell in res.get("latency", {}).items():
        rows.append(
            {
                "check": f"added latency {key.replace('c', 'c=')} p50 (ms)",
                "gateway": round(cell["gateway"]["p50_ms"], 2),
                "baseline": round(cell["direct_unary"]["p50_ms"], 2),
                "baseline_name": "direct gRPC, same request",
                "value": cell["added_p50_ms"],
                "unit": "ms",
                "target": f"<= {TARGETS['added_p50_ms_max']}",
                "pass": cell["added_p50_ms"] <= TARGETS["added_p50_ms_max"],
            }
        )
        rows.append(
            {
                "check": f"added latency {key.replace('c', 'c=')} p99 (ms)",
                "gateway": round(cell["gateway"]["p99_ms"], 2),
                "baseline": round(cell["direct_unary"]["p99_ms"], 2),
                "baseline_name": "direct gRPC, same request",
                "value": cell["added_p99_ms"],
                "unit": "ms",
                "target": "report",
                "pass": None,
            }
        )
    emb = res.get("embeddings", {})
    for key in ("single_c32", "batch32_c4"):
        cell = emb.get(key)
        if not cell or "gateway" not in cell:
            continue
        label = "embeddings 1 text/request, c=32" if key == "single_c32" else "embeddings 32 texts/request, c=4"
        ratio = cell.get("ratio")
        rows.append(
            {
                "check": f"{label} (texts/s)",
                "gateway": round(cell["gateway"]["rate"], 1),
                "baseline": round(cell["infinity"]["rate"], 1) if "infinity" in cell else None,
                "baseline_name": "Infinity",
                "value": ratio,
                "unit": "x",
                "target": f">= {TARGETS['embeddings_ratio_min']}",
                "pass": None if ratio is None else ratio >= TARGETS["embeddings_ratio_min"],
            }
        )
    lo = res.get("long_outputs")
    if lo:
        rows.append(
            {
                "check": "gateway CPU/token, 8,192 vs 64 output tokens (us)",
                "gateway": lo["cpu_us_per_token_8192"],
                "baseline": lo["cpu_us_per_token_64"],
                "baseline_name": "64-token requests",
                "value": lo["ratio"],
                "unit": "x",
                "target": f"<= {TARGETS['long_output_cpu_ratio_max']}",
                "pass": lo["ratio"] <= TARGETS["long_output_cpu_ratio_max"],
            }
        )
    ms = res.get("many_streams")
    if ms:
        rows.append(
            {
                "check": f"gateway RSS per open stream, {ms['open']}/{ms['streams']} streams (KiB)",
                "gateway": ms["rss_per_stream_kib"],
                "baseline": None,
                "baseline_name": "",
                "value": None,
                "unit": "",
                "target": "report",
                "pass": None if ms["open"] == ms["streams"] else False,
            }
        )
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    all_cases = ["relay", "latency", "long", "streams", "profile", "embeddings"]
    p = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help="short smoke run (~3 min): same cases, smaller samples")
    p.add_argument("--cases", default=",".join(all_cases), help=f"comma-separated subset of {','.join(all_cases)}")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="OMP_NUM_THREADS for both embedding servers (Triton's MiniLM and Infinity); default 1",
    )
    p.add_argument("--skip-infinity", action="store_true", help="embeddings through the gateway only")
    args = p.parse_args(argv)
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
