"""The core every ``bench.run`` case builds on: the run's sizes (``Profile``), the shared constants and
``BenchCore`` - set-up of tritonserver and the gateway, the CPU probes, the sanity check and the load helpers
the cases share. The cases themselves are mixins of ``BenchCore`` (``bench.cases_*``); ``bench.run.Bench``
puts them together and drives a run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psutil

from bench.limit import Limit
from bench.load import CONTENT_MARKER, Counter, HTTPConnection, throughput
from bench.stack import EMBEDDING, REPO, SMOLLM_TOKENIZER, SYNTHETIC, Gateway, gateway_config, start_triton
from openai_api.text.templates import ChatTemplate
from openai_api.text.tokenizer import TextTokenizer

RESULTS = REPO / "bench" / "results"
MESSAGES = [{"role": "user", "content": "Tell me a long story about a quick brown fox."}]
SLOW_DELAY_MS = 1000


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


class BenchCore:
    """A run's processes (tritonserver, the gateway, the limit client) and what every case measures them
    with; ``start`` must have run before any case."""

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
        self.start_limit()

    def start_limit(self) -> None:
        """The bare gRPC client (`Limit`) on the bench's chat as the gateway templates and tokenizes it."""
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

    # ------------------------------------------------------------------ shared by the cases
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


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def glibc_version() -> str:
    """What ``ldd --version`` reports (first line), else the C library this interpreter runs on."""
    try:
        line = subprocess.run(["ldd", "--version"], capture_output=True, text=True, timeout=10).stdout.splitlines()[0]
        return line.rsplit(" ", 1)[-1]
    except (OSError, subprocess.SubprocessError, IndexError):
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").rsplit(" ", 1)[-1]
