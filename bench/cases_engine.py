"""The cases of ``bench.run`` that vary the gateway's own work: guided vs unguided decoding (``guided``),
``--workers 2`` vs ``--workers 1`` (``workers``) and py-spy profiles of the gateway (``profile``)."""

from __future__ import annotations

import asyncio
import subprocess
from typing import Any

from bench import profiling
from bench.core import RESULTS, BenchCore, _median
from bench.load import CONTENT_MARKER, TOOL_ARGS_MARKER, ConnectionPool, Counter, throughput
from bench.stack import Gateway, gateway_config, has_flag

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


class EngineCases(BenchCore):
    """``bench.run``'s guided, workers and profile cases."""

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
