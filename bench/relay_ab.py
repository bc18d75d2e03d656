"""A/B of the relay case between two checkouts of the gateway, side by side on one Triton.

``.venv/bin/python -m bench.relay_ab --side base=/tmp/base --side head=/tmp/head [--rounds 4]``

Each side is a checkout (``git worktree add /tmp/base <commit>``, with ``models/`` linked in) whose
gateway runs as its own process (``python <root>/openai_api_cli.py``, cwd and ``PYTHONPATH`` = root,
so it imports that checkout's ``openai_api``, not the venv's editable install; the import path each
side resolves is recorded). One tritonserver (``synthetic-llm``) serves both; both gateways stay up
for the whole run. Every case runs once per side per round, the two sides back to back, and the side
that goes first alternates by round, so neither side is always first and each pair saw the same
neighbours. Cases, all with the bench's own load generator (``bench.run``):

* ``relay_c{1,16,64}``: streamed chat, 512 tokens (the bench's relay case): tokens/s and gateway
  CPU microseconds per relayed token (psutil CPU of the gateway process over the measured window).
* ``tools_c16``: the same stream with one tool offered and ``tool_choice`` left to auto (the model
  answers in plain text, so every token goes through the tool-call parser).
* ``latency_c1``: non-streamed 16-token chat, c = 1, p50/p99, minus the same request from the limit
  client run just before it (added latency); ``ttft_c1``: streamed time to the first token, likewise.

Wall-clock figures (tokens/s, latency) move with whatever else the shared machine runs; CPU per
token is the figure to compare. Writes one JSON file (``--out``); nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import uvloop

from bench.load import latencies, percentiles_ms
from bench.run import SLOW_DELAY_MS, Bench, parse_args
from bench.stack import Gateway, gateway_config, start_triton, wait_http

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


class CheckoutGateway(Gateway):
    """The gateway of another checkout: its ``openai_api_cli.py``, its ``openai_api`` first on the path."""

    def __init__(self, root: Path, config: dict[str, Any], workdir: Path, name: str) -> None:
        super().__init__(config, workdir, name=name)
        self.root = root

    def env(self) -> dict[str, str]:
        return {**os.environ, "PYTHONPATH": str(self.root), "LOG_LEVEL": "WARNING"}

    def imports_from(self) -> str:
        """Where ``openai_api`` resolves for this side (same interpreter, cwd and path as the gateway)."""
        code = "import openai_api; print(openai_api.__file__)"
        return subprocess.run(
            [sys.executable, "-c", code], cwd=self.root, env=self.env(), capture_output=True, text=True, check=True
        ).stdout.strip()

    def start(self, prefix: list[str] | None = None) -> CheckoutGateway:
        cli = str(self.root / "openai_api_cli.py")
        helptext = subprocess.run(
            [sys.executable, cli, "--help"], cwd=self.root, env=self.env(), capture_output=True, text=True
        ).stdout
        flags = [
            x for f in ("--max-in-flight", "--max-in-flight-per-model") if f"{f} " in helptext for x in (f, "100000")
        ]
        cmd = [
            *(prefix or []),
            sys.executable,
            cli,
            "--config-file",
            str(self.config_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--uvicorn-log-level",
            "warning",
            *flags,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                cmd,
                cwd=self.root,
                env=self.env(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_http(f"{self.url}/health", 90, self.proc, self.log_path)
        return self


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 3) if xs else float("nan")


class AB(Bench):
    def __init__(self, args: argparse.Namespace, sides: dict[str, Path], rounds: int) -> None:
        super().__init__(args)
        self.sides = sides
        self.rounds = rounds
        self.gws: dict[str, CheckoutGateway] = {}

    def start_ab(self) -> None:
        self.triton, self.extra_repo = start_triton(SLOW_DELAY_MS, embeddings=False)
        for name, root in self.sides.items():
            cfg = gateway_config(self.triton.grpc_url, self.triton.http_url)
            for m in cfg["llm"]:
                # The templates moved into the package (openai_api/chat_templates); an older checkout has them at
                # its root.
                templates = next(d for d in (root / "openai_api" / "chat_templates", root / "chat_templates")
                                 if d.is_dir())
                m["chat_template"] = str(templates / "smollm2.jinja")
            gw = CheckoutGateway(root, cfg, self.workdir, name)
            gw.start()
            self.gws[name] = gw
            self.log(f"{name}: gateway pid {gw.pid} from {root}, openai_api from {gw.imports_from()}")
        self.start_limit()

    async def stop(self) -> None:
        for gw in self.gws.values():
            gw.stop()
        self.gateway = None
        await super().stop()

    def payload(self, tools: bool, tokens: int, stream: bool) -> dict[str, Any]:
        p = self.chat_payload(tokens, stream)
        if tools:
            p["tools"] = TOOLS
        return p

    async def warm(self, name: str) -> None:
        """Each side answers the bench's streams with every token as content, with and without tools."""
        gw = self.gws[name]
        for tools in (False, True):
            for _ in range(3):
                conn = self.new_conn(gw)
                try:
                    got = await conn.post_stream("/v1/chat/completions", self.payload(tools, 100, True), lambda k: None)
                finally:
                    conn.close()
                if got != 100:
                    raise RuntimeError(f"{name}: {got} content events for 100 tokens (tools={tools})")

    async def relay(self, name: str, c: int, tools: bool) -> dict[str, Any]:
        r = await self.gateway_relay(self.payload(tools, self.p.relay_tokens, True), c, gateway=self.gws[name])
        await asyncio.sleep(0.5)
        return r

    async def latency(self, name: str, n: int) -> dict[str, Any]:
        gw = self.gws[name]
        lim = await self.limit_latency("latency", 1, n, streaming=False)
        conn = self.new_conn(gw)
        payload = self.payload(False, self.p.latency_tokens, False)

        async def call() -> None:
            status, body = await conn.post_json("/v1/chat/completions", payload)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:200]!r}")

        cpu0 = self.cpu_s(gw.processes())
        try:
            g = await latencies(call, 1, n)
        finally:
            conn.close()
        cpu_us = (self.cpu_s(gw.processes()) - cpu0) * 1e6 / (n + 5)
        await asyncio.sleep(0.3)
        return {
            "gateway": g,
            "limit": lim,
            "gateway_cpu_us_per_request": round(cpu_us, 1),
            "added_p50_ms": round(g["p50_ms"] - lim["p50_ms"], 3),
            "added_p99_ms": round(g["p99_ms"] - lim["p99_ms"], 3),
            "loadavg_1m": round(os.getloadavg()[0], 2),
        }

    async def ttft_side(self, name: str, n: int) -> dict[str, Any]:
        gw = self.gws[name]
        lim = await self.limit_latency("ttft", 1, n, streaming=True)
        payload = self.payload(False, self.p.latency_tokens, True)
        conn = self.new_conn(gw)
        samples: list[float] = []
        try:
            for i in range(5 + n):
                first: list[float] = []

                def on_count(_k: int, first: list[float] = first) -> None:
                    if not first:
                        first.append(time.perf_counter())

                t0 = time.perf_counter()
                await conn.post_stream("/v1/chat/completions", payload, on_count)
                if i >= 5:
                    samples.append(first[0] - t0)
        finally:
            conn.close()
        g = percentiles_ms(samples)
        await asyncio.sleep(0.3)
        return {"gateway": g, "limit": lim, "added_p50_ms": round(g["p50_ms"] - lim["p50_ms"], 3)}

    async def run_ab(self, only: list[str] | None = None, latency_requests: int = 200) -> dict[str, Any]:
        names = list(self.sides)
        for name in names:
            await self.warm(name)
        cases: dict[str, Any] = {
            "relay_c1": lambda s: self.relay(s, 1, False),
            "relay_c16": lambda s: self.relay(s, 16, False),
            "relay_c64": lambda s: self.relay(s, 64, False),
            "tools_c16": lambda s: self.relay(s, 16, True),
            "latency_c1": lambda s: self.latency(s, latency_requests),
            "ttft_c1": lambda s: self.ttft_side(s, 100),
        }
        if only:
            cases = {k: v for k, v in cases.items() if k in only}
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {k: {s: [] for s in names} for k in cases}
        for rnd in range(self.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            for case, fn in cases.items():
                for side in order:
                    r = await fn(side)
                    r["round"], r["order"] = rnd, order.index(side)
                    runs[case][side].append(r)
                    brief = (
                        f"{r['rate']:.0f} tok/s, {r['gateway_cpu_us_per_token']} us CPU/token, "
                        f"errors {r['errors']}, load {r['loadavg_1m']}"
                        if "rate" in r
                        else f"gateway p50 {r['gateway']['p50_ms']:.3f} ms, added p50 {r['added_p50_ms']} ms"
                    )
                    self.log(f"round {rnd} {case} {side}: {brief}")
        summary: dict[str, Any] = {}
        for case, by_side in runs.items():
            row: dict[str, Any] = {}
            for side, rs in by_side.items():
                if "rate" in rs[0]:
                    row[side] = {
                        "cpu_us_per_token": [r["gateway_cpu_us_per_token"] for r in rs],
                        "tokens_per_s": [round(r["rate"], 1) for r in rs],
                    }
                else:
                    row[side] = {
                        "p50_ms": [round(r["gateway"]["p50_ms"], 3) for r in rs],
                        "added_p50_ms": [r["added_p50_ms"] for r in rs],
                    }
                    if "gateway_cpu_us_per_request" in rs[0]:
                        row[side]["cpu_us_per_request"] = [r["gateway_cpu_us_per_request"] for r in rs]
                row[side]["median"] = {k: _median(v) for k, v in list(row[side].items())}
            summary[case] = row
        return {"summary": summary, "runs": runs}


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--side", action="append", required=True, help="name=checkout root (two or more)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument(
        "--cases", help="comma-separated subset of relay_c1,relay_c16,relay_c64,tools_c16,latency_c1,ttft_c1"
    )
    p.add_argument("--latency-requests", type=int, default=200, help="non-streamed chats per latency_c1 run")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args(argv)
    sides = {s.split("=", 1)[0]: Path(s.split("=", 1)[1]).resolve() for s in a.side}
    bench = AB(parse_args(["--cases", "relay"]), sides, a.rounds)
    signal.signal(signal.SIGTERM, _interrupt)  # a killed run still stops Triton and both gateways
    out: dict[str, Any] = {"started": dt.datetime.now().isoformat(timespec="seconds"), "rounds": a.rounds}
    try:
        bench.start_ab()
        out["sides"] = {
            n: {
                "root": str(r),
                "commit": subprocess.run(
                    ["git", "-C", str(r), "rev-parse", "HEAD"], capture_output=True, text=True
                ).stdout.strip(),
                "openai_api": bench.gws[n].imports_from(),
            }
            for n, r in sides.items()
        }
        out.update(uvloop.run(bench.run_ab(a.cases.split(",") if a.cases else None, a.latency_requests)))
    finally:
        uvloop.run(bench.stop())
        out["loadavg_end"] = os.getloadavg()
        a.out.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
