"""Fleet routing benchmark (issue #22): the real gateway in front of simulated Triton replicas, once per routing
policy, replaying a multi-turn chat/agent trace and a skewed trace; TTFT p50/p99 and throughput per policy.

``.venv/bin/python -m bench.fleet_sim [--quick] [--policies round_robin,least_outstanding,...] [--out DIR]``

What runs:

* ``bench.fleet_replica`` in a process of its own: ``--replicas`` (4) stub replicas per policy, each on its own
  loopback address (127.0.0.N) with the same gRPC and metrics ports, as Triton pods behind a headless Service
  have. Each is a paced simulated TensorRT-LLM engine with a prefix cache (see that module): its costs are
  ``asyncio`` sleeps, so this 2-core machine is not what is measured.
* One gateway (``openai_api_cli.py``, its own process, ``bench.stack.Gateway``) serving one model per policy,
  ``fleet-<policy>``, each over its own replica group (the same sizes and costs) with ``routing.policy`` set and
  ``routing.metrics_port`` pointing at the replicas' metrics: the policies differ in nothing else. SmolLM2's
  tokenizer and chat template, so the replicas see real token ids of the rendered conversation.
* This process replays each trace (``bench.fleet_trace``) once per policy through the gateway's HTTP API:
  streamed chat completions, every conversation's turns in order with the answer appended, think times
  between turns. Before each replay every replica's cache and counters are reset.

Measured per (trace, policy): time to first token (the first SSE event with content, from just before the
request is written), p50/p90/p99 over all requests and per group; output tokens/s and requests/s over the
replay's wall time; the replicas' own counters (prompt tokens served from cache, requests per replica).
Results: ``bench/results/fleet-<date>.json`` and ``.md`` (``--out`` elsewhere). Nothing asserts timings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson
import psutil

from bench.fleet_replica import SimParams
from bench.fleet_trace import QUICK, TRACES, Conversation, TraceShape
from bench.load import ConnectionPool, HTTPError, percentiles_ms
from bench.stack import REPO, SMOLLM_TOKENIZER, Gateway

RESULTS = REPO / "bench" / "results"
POLICIES = ("round_robin", "least_outstanding", "least_load", "prefix_affinity")
TRITON_MODEL = "fleet-llm"
# Replica i of policy group g listens on 127.0.0.(FIRST_HOST + g * replicas + i).
FIRST_HOST = 10
# Quick mode: the same shapes, smaller and faster (a smoke run: numbers, not figures).
QUICK_PARAMS = SimParams(prefill_s_per_token=0.00005, decode_s=0.004, kv_blocks=512)


@dataclass
class Record:
    cid: str
    group: str
    turn: int
    start: float
    ttft_s: float | None = None
    end: float | None = None
    tokens: int = 0
    prompt_tokens: int | None = None
    error: str | None = None


@dataclass
class Fleet:
    """The replica process: ``groups`` x ``replicas`` stub replicas."""

    policies: list[str]
    replicas: int
    params: SimParams
    grpc_port: int = 0
    metrics_port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    hosts: dict[str, list[str]] = field(default_factory=dict)

    def start(self, workdir: Path) -> None:
        n = 0
        for p in self.policies:
            self.hosts[p] = [f"127.0.0.{FIRST_HOST + n + i}" for i in range(self.replicas)]
            n += self.replicas
        every = [h for hs in self.hosts.values() for h in hs]
        self.grpc_port, self.metrics_port = free_ports(every, 2)
        self.log = workdir / "replicas.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "bench.fleet_replica", "--hosts", ",".join(every), "--grpc-port",
                 str(self.grpc_port), "--metrics-port", str(self.metrics_port), "--params",
                 json.dumps(asdict(self.params))],
                cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, start_new_session=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().decode().strip()
        if line != "ready":
            self.stop()
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"replicas did not start ({line!r}):\n{tail}")

    def urls(self, policy: str) -> list[str]:
        return [f"{h}:{self.grpc_port}" for h in self.hosts[policy]]

    def _http(self, host: str, method: str, path: str) -> bytes:
        req = urllib.request.Request(f"http://{host}:{self.metrics_port}{path}", method=method)
        with urllib.request.urlopen(req, timeout=5) as resp:
            body: bytes = resp.read()
            return body

    def reset(self, policy: str) -> None:
        for h in self.hosts[policy]:
            self._http(h, "POST", "/reset")

    def stats(self, policy: str) -> list[dict[str, Any]]:
        return [json.loads(self._http(h, "GET", "/stats")) for h in self.hosts[policy]]

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(OSError):
            assert self.proc.stdin is not None
            self.proc.stdin.close()  # the replica process stops when its stdin closes
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=5)
        self.proc = None


def free_ports(hosts: list[str], n: int) -> list[int]:
    """``n`` ports free on every one of ``hosts`` (each replica binds the same ports on its own address)."""
    for _ in range(50):
        ports = []
        for _ in range(n):
            with socket.socket() as s:
                s.bind((hosts[0], 0))
                ports.append(int(s.getsockname()[1]))
        try:
            for h in hosts:
                for p in ports:
                    with socket.socket() as s:
                        s.bind((h, p))
            return ports
        except OSError:
            continue
    raise RuntimeError("no port pair free on every replica address")


def gateway_config(fleet: Fleet, routing_extra: dict[str, Any]) -> dict[str, Any]:
    template = str(REPO / "openai_api" / "chat_templates" / "smollm2.jinja")
    llm = []
    for p in fleet.policies:
        routing = {"policy": p, "metrics_port": fleet.metrics_port, **routing_extra}
        llm.append({"name": f"fleet-{p}", "url": fleet.urls(p), "path": str(SMOLLM_TOKENIZER),
                    "triton_model": TRITON_MODEL, "chat_template": template, "routing": routing})
    return {"model_infos": [{"name": f"fleet-{p}", "end_id": -1, "max_len": 32768} for p in fleet.policies],
            "llm": llm, "embedding": [], "rerank": []}


# ------------------------------------------------------------------------------------------------ replay
def gateway_cpu_s(gw: Gateway) -> float:
    """CPU seconds (user + system) the gateway's processes have used so far."""
    total = 0.0
    for proc in gw.processes():
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system
    return total


def gateway_routing(gw: Gateway, model: str) -> dict[str, Any]:
    """What the gateway's /metrics says about ``model``'s routing: decisions by reason (cumulative) and whether
    it holds scraped Triton figures for its replicas (so least_load is known to read them)."""
    with urllib.request.urlopen(f"{gw.url}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    decisions: dict[str, float] = {}
    scraped = 0
    tag = f'model="{model}"'
    for line in text.splitlines():
        if tag not in line or line.startswith("#"):
            continue
        if line.startswith("openai_api_routing_decisions_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            decisions[reason] = decisions.get(reason, 0.0) + float(line.rsplit(" ", 1)[1])
        elif line.startswith("openai_api_replica_triton_in_flight{"):
            scraped += 1
    return {"decisions": decisions, "replicas_scraped": scraped}


async def chat_stream(conns: ConnectionPool, payload: dict[str, Any], rec: Record) -> str:
    """POST a streamed chat completion; fill ``rec`` (TTFT, tokens, usage) and return the answer's text."""
    text: list[str] = []
    async with conns.connection() as conn:
        body = orjson.dumps(payload)
        reused = conn.writer is not None
        try:
            status, headers = await conn._send("/v1/chat/completions", body)
        except (ConnectionError, asyncio.IncompleteReadError):
            if not reused:
                raise
            # The server closed this idle keep-alive connection (uvicorn's keep-alive timeout is 5 s; think
            # times come close): the request never reached it, so send it again on a fresh connection.
            conn.close()
            rec.start = time.perf_counter()
            status, headers = await conn._send("/v1/chat/completions", body)
        if status != 200:
            body = b"".join([c async for c in conn._chunks(headers)])
            raise HTTPError(f"HTTP {status}: {body[:300]!r}")
        buf = b""
        done = False
        async for chunk in conn._chunks(headers):
            buf += chunk
            while b"\n\n" in buf:
                event, buf = buf.split(b"\n\n", 1)
                if not event.startswith(b"data: "):
                    continue
                data = event[6:]
                if data == b"[DONE]":
                    done = True
                    continue
                obj = orjson.loads(data)
                if "error" in obj:
                    raise HTTPError(f"stream error event: {data[:300]!r}")
                for choice in obj.get("choices") or []:
                    content = (choice.get("delta") or {}).get("content")
                    if content:
                        if rec.ttft_s is None:
                            rec.ttft_s = time.perf_counter() - rec.start
                        rec.tokens += 1
                        text.append(content)
                usage = obj.get("usage")
                if usage:
                    rec.prompt_tokens = usage.get("prompt_tokens")
        if not done:
            raise HTTPError("stream ended without data: [DONE]")
    rec.end = time.perf_counter()
    return "".join(text)


async def replay(url: str, model: str, trace: list[Conversation]) -> tuple[list[Record], float]:
    host, port = url.removeprefix("http://").split(":")
    conns = ConnectionPool(host, int(port))
    records: list[Record] = []
    t0 = time.perf_counter()

    async def conversation(conv: Conversation) -> None:
        await asyncio.sleep(max(0.0, t0 + conv.start_s - time.perf_counter()))
        messages: list[dict[str, str]] = [{"role": "system", "content": conv.system}]
        for k, turn in enumerate(conv.turns):
            messages.append({"role": "user", "content": turn.user})
            rec = Record(conv.cid, conv.group, k, time.perf_counter())
            records.append(rec)
            payload = {"model": model, "messages": messages, "max_tokens": turn.max_tokens, "stream": True,
                       "stream_options": {"include_usage": True}}
            try:
                answer = await chat_stream(conns, payload, rec)
            except Exception as e:  # noqa: BLE001 - recorded; the conversation cannot go on without its answer
                rec.error = f"{type(e).__name__}: {e}"[:300]
                return
            messages.append({"role": "assistant", "content": answer})
            await asyncio.sleep(turn.think_s)

    try:
        await asyncio.gather(*(conversation(c) for c in trace))
    finally:
        conns.close()
    return records, time.perf_counter() - t0


def summarize(records: list[Record], wall_s: float, stats: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in records if r.error is None and r.ttft_s is not None and r.end is not None]
    out: dict[str, Any] = {
        "requests": len(records),
        "errors": len(records) - len(ok),
        "first_errors": [r.error for r in records if r.error][:3],
        "ttft": _ms(percentiles_ms([r.ttft_s for r in ok if r.ttft_s is not None])),
        "e2e": _ms(percentiles_ms([r.end - r.start for r in ok if r.end is not None])),
        "wall_s": round(wall_s, 3),
        "output_tok_s": round(sum(r.tokens for r in ok) / wall_s, 1) if wall_s else None,
        "req_s": round(len(ok) / wall_s, 2) if wall_s else None,
        "prompt_tokens_mean": round(statistics.fmean(r.prompt_tokens for r in ok if r.prompt_tokens), 1)
        if any(r.prompt_tokens for r in ok) else None,
    }
    groups = sorted({r.group for r in ok})
    if len(groups) > 1:
        out["ttft_by_group"] = {g: _ms(percentiles_ms([r.ttft_s for r in ok if r.group == g and r.ttft_s is not None]))
                                for g in groups}
    first = [r.ttft_s for r in ok if r.turn == 0 and r.ttft_s is not None]
    later = [r.ttft_s for r in ok if r.turn > 0 and r.ttft_s is not None]
    out["ttft_first_turn"] = _ms(percentiles_ms(first))
    out["ttft_later_turns"] = _ms(percentiles_ms(later))
    prompt = sum(s["prompt_tokens"] for s in stats)
    out["replicas"] = {
        "requests": [s["requests"] for s in stats],
        "cache_hit_fraction": round(sum(s["cached_tokens"] for s in stats) / prompt, 3) if prompt else None,
        "computed_prompt_tokens": sum(s["computed_tokens"] for s in stats),
        "evicted_blocks": sum(s["evicted_blocks"] for s in stats),
        "cancelled": sum(s["cancelled"] for s in stats),
    }
    n = sum(s["requests"] for s in stats)
    if n and ok:
        # Where the time to first token goes: the replicas' own (queue + simulated prefill), and the rest
        # (the gateway, the network stack and this machine's load), as means over the requests.
        replica_ms = sum(s.get("first_token_us", 0) for s in stats) / n / 1000
        # The same percentiles of the replicas' own TTFT: what routing changes, without the gateway's time and
        # this machine's load (which inflate the client's figures alike for every policy).
        out["replica_ttft"] = _ms(percentiles_ms([us / 1e6 for s in stats for us in s.get("ttft_us", [])]))
        out["ttft_split_mean_ms"] = {
            "replica": round(replica_ms, 1),
            "planned_prefill": round(sum(s.get("prefill_planned_us", 0) for s in stats) / n / 1000, 1),
            "gateway_and_machine": round(statistics.fmean(r.ttft_s for r in ok if r.ttft_s) * 1000 - replica_ms, 1),
        }
    return out


def _ms(p: dict[str, float]) -> dict[str, float | None]:
    """Milliseconds to 0.1; NaN (no samples) as None, so the JSON stays valid."""
    out: dict[str, float | None] = {}
    for k, v in p.items():
        out[k] = (round(v, 1) if v == v else None) if isinstance(v, float) else v
    return out


# ------------------------------------------------------------------------------------------------ report
def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a and b else None


def verdicts(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets, judged from the measured numbers (never asserted)."""
    mt, sk = results.get("multi_turn", {}), results.get("skewed", {})

    def get(d: dict[str, Any], p: str, key: str, which: str = "ttft") -> float | None:
        v = ((d.get(p) or {}).get(which) or {}).get(key)
        return float(v) if isinstance(v, int | float) else None

    speedup = ratio(get(mt, "least_outstanding", "p50_ms"), get(mt, "prefix_affinity", "p50_ms"))
    p99 = ratio(get(sk, "prefix_affinity", "p99_ms"), get(sk, "least_outstanding", "p99_ms"))
    return {
        # The same two ratios on the replicas' own TTFT (no gateway time, no machine load in them).
        "replica_multi_turn_ttft_p50_ratio": ratio(get(mt, "least_outstanding", "p50_ms", "replica_ttft"),
                                                   get(mt, "prefix_affinity", "p50_ms", "replica_ttft")),
        "replica_skewed_ttft_p99_ratio": ratio(get(sk, "prefix_affinity", "p99_ms", "replica_ttft"),
                                               get(sk, "least_outstanding", "p99_ms", "replica_ttft")),
        "multi_turn_ttft_p50_least_outstanding_over_prefix_affinity": speedup,
        "multi_turn_target_2x": None if speedup is None else speedup >= 2.0,
        "skewed_ttft_p99_prefix_affinity_over_least_outstanding": p99,
        # "No regression" read with a 10% allowance: p99 of a few hundred requests on a shared machine moves
        # by about that much between runs.
        "skewed_target_no_p99_regression": None if p99 is None else p99 <= 1.10,
    }


def markdown(res: dict[str, Any]) -> str:
    meta = res["meta"]
    lines = [f"# Fleet routing benchmark, {meta['date']} ({'quick' if meta['quick'] else 'full'})", "",
             "A simulation: stub replicas whose costs are sleeps (bench/fleet_replica.py); see bench/README.md "
             "(Fleet routing) for what it assumes.", "",
             f"{meta['replicas']} replicas per policy; engine: " + ", ".join(f"{k}={v}" for k, v in
                                                                             meta["sim_params"].items()),
             f"Gateway: {meta['gateway_args']}; load average {meta['loadavg']}", ""]
    lines += table(res)
    v = res.get("verdicts", {})
    lines += ["", f"* multi-turn TTFT p50, least_outstanding / prefix_affinity: "
              f"**{v.get('multi_turn_ttft_p50_least_outstanding_over_prefix_affinity')}x** (target >= 2x: "
              f"{_met(v.get('multi_turn_target_2x'))})",
              f"* skewed TTFT p99, prefix_affinity / least_outstanding: "
              f"**{v.get('skewed_ttft_p99_prefix_affinity_over_least_outstanding')}x** (target <= 1.1x, no "
              f"regression: {_met(v.get('skewed_target_no_p99_regression'))})",
              f"* the same on the replicas' own TTFT: {v.get('replica_multi_turn_ttft_p50_ratio')}x and "
              f"{v.get('replica_skewed_ttft_p99_ratio')}x"]
    for note in meta.get("notes", []):
        lines.append(f"* {note}")
    if res.get("failures"):
        lines += ["", "Failures:"] + [f"* {f['case']}: {f['error']}" for f in res["failures"]]
    return "\n".join(lines) + "\n"


def _decisions(r: dict[str, Any]) -> str:
    d = (r.get("routing") or {}).get("decisions") or {}
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items(), key=lambda kv: -kv[1])) or "-"


def readme_table(res: dict[str, Any]) -> str:
    """What bench/README.md holds between its fleet-table markers: the table and the two targets' verdicts."""
    meta, v = res["meta"], res.get("verdicts", {})
    lines = [f"Run of {meta['date']}, {meta['replicas']} replicas per policy, every figure over {meta['rounds']} "
             f"replays of each trace, load average at the end {meta['loadavg']}:", "", *table(res), "",
             f"* multi-turn TTFT p50, least_outstanding / prefix_affinity: "
             f"{v.get('multi_turn_ttft_p50_least_outstanding_over_prefix_affinity')}x (target >= 2x: "
             f"{_met(v.get('multi_turn_target_2x'))})",
             f"* skewed TTFT p99, prefix_affinity / least_outstanding: "
             f"{v.get('skewed_ttft_p99_prefix_affinity_over_least_outstanding')}x (target: no regression, read as "
             f"<= 1.1x: {_met(v.get('skewed_target_no_p99_regression'))})",
             f"* the same on the replicas' own TTFT: {v.get('replica_multi_turn_ttft_p50_ratio')}x and "
             f"{v.get('replica_skewed_ttft_p99_ratio')}x"]
    return "\n".join(lines) + "\n"


def latest_results(folder: Path = RESULTS) -> Path | None:
    """The newest full run's JSON in ``folder``: ``fleet-<date>.json`` (quick runs are smoke tests and tagged runs
    variants, never the README's table)."""
    runs = sorted(f for f in folder.glob("fleet-*.json") if re.fullmatch(r"fleet-\d{4}-\d\d-\d\d", f.stem))
    return runs[-1] if runs else None


def _met(v: bool | None) -> str:
    return "not measured" if v is None else ("met" if v else "**missed**")


def table(res: dict[str, Any]) -> list[str]:
    rows = ["| trace | policy | TTFT p50 | TTFT p99 | replica TTFT p50 | replica TTFT p99 | TTFT mean: replica + rest "
            "| gateway CPU per request | output tok/s | req/s | cache hit | requests per replica | routing decisions "
            "| errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for trace in TRACES:
        for p in res["meta"]["policies"]:
            r = res.get(trace, {}).get(p)
            if not r:
                continue
            t = r["ttft"]
            split = r.get("ttft_split_mean_ms")
            split_s = f"{split['replica']} + {split['gateway_and_machine']} ms" if split else "-"
            rt = r.get("replica_ttft") or {}
            rows.append(f"| {trace} | {p} | {t['p50_ms']} ms | {t['p99_ms']} ms | {rt.get('p50_ms')} ms "
                        f"| {rt.get('p99_ms')} ms | {split_s} | {r.get('gateway_cpu_ms_per_request')} ms "
                        f"| {r['output_tok_s']} | {r['req_s']} "
                        f"| {r['replicas']['cache_hit_fraction']} "
                        f"| {r['replicas']['requests']} | {_decisions(r)} | {r['errors']} |")
    return rows


# ------------------------------------------------------------------------------------------------ main
async def run_all(gw: Gateway, fleet: Fleet, shape: TraceShape, rounds: int, traces: list[str]) -> dict[str, Any]:
    res: dict[str, Any] = {"failures": []}
    for trace_name in traces:
        build = TRACES[trace_name]
        trace = build(shape)
        res[trace_name] = {}
        pooled: dict[str, tuple[list[Record], float, list[dict[str, Any]]]] = {}
        cpu: dict[str, float] = {}
        for rnd in range(rounds):
            # Alternate the order between rounds so that drift in the machine's load does not favour one policy.
            order = fleet.policies if rnd % 2 == 0 else list(reversed(fleet.policies))
            for p in order:
                try:
                    fleet.reset(p)
                    before = gateway_routing(gw, f"fleet-{p}")
                    cpu0 = gateway_cpu_s(gw)
                    records, wall = await replay(gw.url, f"fleet-{p}", trace)
                    cpu_s = gateway_cpu_s(gw) - cpu0
                    stats = fleet.stats(p)
                    summary = summarize(records, wall, stats)
                    summary["gateway_cpu_ms_per_request"] = round(cpu_s * 1000 / max(1, len(records)), 2)
                    cpu[p] = cpu.get(p, 0.0) + cpu_s
                    after = gateway_routing(gw, f"fleet-{p}")
                    summary["routing"] = {
                        "decisions": {k: int(v - before["decisions"].get(k, 0.0))
                                      for k, v in after["decisions"].items() if v > before["decisions"].get(k, 0.0)},
                        "replicas_scraped": after["replicas_scraped"]}
                    res[trace_name].setdefault(p, {"rounds": []})["rounds"].append(summary)
                    recs, walls, totals = pooled.get(p, ([], 0.0, [{} for _ in stats]))
                    pooled[p] = (recs + records, walls + wall,
                                 [{k: t.get(k, type(v)()) + v for k, v in s.items()} for t, s in zip(totals, stats,
                                                                                                  strict=True)])
                    t = summary["ttft"]
                    print(f"{trace_name:10} {p:18} ttft p50 {t['p50_ms']} p99 {t['p99_ms']} ms, "
                          f"{summary['output_tok_s']} tok/s, hit {summary['replicas']['cache_hit_fraction']}, "
                          f"errors {summary['errors']}", file=sys.stderr, flush=True)
                except Exception as e:  # noqa: BLE001 - one case failing leaves the others standing
                    res["failures"].append({"case": f"{trace_name}/{p}", "error": f"{type(e).__name__}: {e}",
                                            "traceback": traceback.format_exc()[-2000:]})
        # The headline per policy pools every round's requests (percentiles over all of them, tokens over the
        # rounds' summed wall time); each round's own summary stays under "rounds".
        for p, (recs, walls, totals) in pooled.items():
            rounds_ = res[trace_name][p]["rounds"]
            decisions: dict[str, int] = {}
            for r in rounds_:
                for k, v in r["routing"]["decisions"].items():
                    decisions[k] = decisions.get(k, 0) + v
            res[trace_name][p] = {**summarize(recs, walls, totals),
                                  "gateway_cpu_ms_per_request": round(cpu[p] * 1000 / max(1, len(recs)), 2),
                                  "routing": {
                "decisions": decisions, "replicas_scraped": rounds_[-1]["routing"]["replicas_scraped"]},
                "rounds": rounds_}
    return res


async def warm(gw: Gateway, fleet: Fleet) -> None:
    """One short request per model (templates, tokenizer, gRPC channels), then the caches are reset."""
    for p in fleet.policies:
        rec = Record("warm", "warm", 0, time.perf_counter())
        conns = ConnectionPool("127.0.0.1", gw.port)
        try:
            await chat_stream(conns, {"model": f"fleet-{p}", "messages": [{"role": "user", "content": "hi"}],
                                      "max_tokens": 2, "stream": True}, rec)
        finally:
            conns.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run of a few seconds per case")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--traces", default=",".join(TRACES), help="which traces to replay")
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=None, help="replays per (trace, policy); default 1 quick, 2 full")
    ap.add_argument("--out", type=Path, default=RESULTS, help="folder for fleet-<date>.{json,md}")
    ap.add_argument("--params", default="", help="SimParams overrides as JSON")
    ap.add_argument("--routing", default="", help="extra routing keys for every model, as JSON")
    ap.add_argument("--workers", type=int, default=1, help="gateway processes (each routes on its own state)")
    ap.add_argument("--tag", default="", help="a variant's name: results go to fleet-<date>-<tag>.{json,md}")
    ap.add_argument("--report", type=Path, nargs="?", const=True, default=None,
                    help="print the README table of a results JSON (default: the newest full run) and exit")
    args = ap.parse_args()
    if args.report is not None:
        path = latest_results() if args.report is True else args.report
        if path is None:
            sys.exit("no bench/results/fleet-*.json yet")
        print(readme_table(json.loads(path.read_text())), end="")
        return
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    policies = [p for p in args.policies.split(",") if p]
    base = QUICK_PARAMS if args.quick else SimParams()
    params = SimParams(**{**asdict(base), **(json.loads(args.params) if args.params else {})})
    shape = QUICK if args.quick else TraceShape()
    rounds = args.rounds or (1 if args.quick else 2)
    routing_extra = json.loads(args.routing) if args.routing else {}
    workdir = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    fleet = Fleet(policies, args.replicas, params)
    gw: Gateway | None = None
    now = dt.datetime.now(dt.UTC)
    res: dict[str, Any] = {"meta": {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"), "quick": args.quick, "policies": policies,
        "replicas": args.replicas, "rounds": rounds, "sim_params": asdict(params), "trace_shape": asdict(shape),
        "routing_extra": routing_extra, "tag": args.tag, "gateway_args": f"--workers {args.workers}",
        "host": platform.node(), "cpus": os.cpu_count(), "notes": []}}
    try:
        fleet.start(workdir)
        gw = Gateway(gateway_config(fleet, routing_extra), workdir, name="fleet-gateway",
                     extra_args=["--workers", str(args.workers)] if args.workers != 1 else []).start()
        asyncio.run(warm(gw, fleet))
        res.update(asyncio.run(run_all(gw, fleet, shape, rounds, [t for t in args.traces.split(",") if t])))
    except Exception as e:  # noqa: BLE001 - written into the results, exit code 1
        res.setdefault("failures", []).append({"case": "setup", "error": f"{type(e).__name__}: {e}",
                                               "traceback": traceback.format_exc()[-3000:]})
        if gw is not None:
            res["meta"]["gateway_log_tail"] = gw.log_tail()
    finally:
        if gw is not None:
            gw.stop()
        fleet.stop()
    res["meta"]["loadavg"] = [round(x, 2) for x in os.getloadavg()]
    res["verdicts"] = verdicts(res)
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"fleet-{now.strftime('%Y-%m-%d')}" + ("-quick" if args.quick else "") + (f"-{args.tag}" if args.tag else "")
    (args.out / f"{stem}.json").write_text(json.dumps(res, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(res))
    print(markdown(res))
    sys.exit(1 if res.get("failures") else 0)


if __name__ == "__main__":
    main()
