"""The relay cases of ``bench.run``: streamed tokens/s vs the limit (``relay``), the latency a short chat and
the first streamed token gain (``latency``), gateway CPU per token at 8,192 vs 64 output tokens (``long``) and
gateway RSS per open stream (``streams``)."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from bench.core import SLOW_DELAY_MS, BenchCore, _median
from bench.limit import LABELS
from bench.load import Counter, HTTPConnection, HTTPError, latencies, percentiles_ms
from bench.stack import SYNTHETIC_SLOW


class RelayCases(BenchCore):
    """``bench.run``'s relay, latency, long and streams cases (and the limit runs they compare against)."""

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
