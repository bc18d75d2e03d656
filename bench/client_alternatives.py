"""Triton client alternatives side by side (issue #27, item 3): what each maintained way of calling Triton
costs per streamed token, in the client's own process.

The gateway's gRPC client (``grpc.aio`` under ``openai_api.triton.rpc``) was about 45% of its CPU in the
last profile. Before anything is changed there, this measures the maintained alternatives on the same
load, each in a process of its own (as ``bench.limit``'s children are), one Triton for all:

* ``rpc``: the gateway's own client (``bench.limit.RpcLLM``: ``TritonRPC``, ``grpc.aio``, pooled
  ``ModelStreamInfer`` streams), on uvloop as the gateway;
* ``grpc_sync``: grpc's blocking API, one thread per concurrent stream, each keeping one
  ``ModelStreamInfer`` call open and writing its requests through a queue-fed iterator (pooled, as
  ``rpc`` is; ``triton_enable_empty_final_response`` marks each request's end);
* ``tritonclient_aio``: ``tritonclient.grpc.aio`` (``bench.limit.TritonClientLLM``: one stream per request);
* ``tritonclient_sync``: ``tritonclient.grpc``, one client and one ``start_stream`` callback stream per
  thread (the sync client can ask for empty final responses);
* ``http_aiohttp`` / ``http_httpx``: Triton's HTTP ``generate_stream`` (SSE; inputs as JSON fields) with
  aiohttp / httpx on uvloop, a keep-alive pool, each event parsed with orjson and ``output_ids`` counted;
* ``gateway``: for scale, streamed chats through the gateway itself (``openai_api_cli.py``, one worker)
  from the bench's raw HTTP client; there the figure that matters is the gateway's CPU, not the client's.

Load: ``--concurrency`` loops of ``--tokens``-token streams (64) on ``synthetic-llm-paced`` (20 ms
between tokens, no model maths: Triton's own cost is its frontend and the Python stub's ``send``), so
every token is one message on the wire, as a paced real model sends them. A child connects, prints
``ready``, gets a wall-clock start on stdin, counts tokens over ``[start + warmup, start + warmup +
measure]`` and reports its own CPU over that window (``time.process_time``: every thread of the process,
in ns, where psutil's ``cpu_times`` has 10 ms ticks); the parent samples Triton's (and the gateway's)
CPU with psutil over the same window. Every repetition runs every client once, in an order that
rotates per repetition, so drift on a shared machine spreads over all of them.

``python -m bench.client_alternatives [--quick]`` writes ``bench/results/client-alternatives-<date>.json``
and ``.md``. The arithmetic (``summarise``) is unit-tested in ``tests/unit/test_bench_client_alternatives.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.client_alternatives_child import child_main
from bench.client_alternatives_stats import cheapest, per_token_us, summarise

CLIENTS = ("rpc", "grpc_sync", "tritonclient_aio", "tritonclient_sync", "http_aiohttp", "http_httpx", "gateway")
LABELS = {
    "rpc": "ours: TritonRPC (grpc.aio, pooled ModelStreamInfer streams)",
    "grpc_sync": "grpc sync API (blocking stub, a thread per stream, pooled streams)",
    "tritonclient_aio": "tritonclient.grpc.aio (a stream per request)",
    "tritonclient_sync": "tritonclient.grpc sync (start_stream callback, a stream per thread)",
    "http_aiohttp": "Triton HTTP generate_stream (SSE) with aiohttp",
    "http_httpx": "Triton HTTP generate_stream (SSE) with httpx",
    "gateway": "the gateway (1 worker), streamed chat, bench's raw HTTP client",
}


# ---------------------------------------------------------------------------------------------- parent
async def run_one(client: str, c: int, base: list[str], a: argparse.Namespace, probe: Any) -> dict[str, Any]:
    """One child run; its window's CPU next to Triton's (and the gateway's) over the same window."""
    from bench.limit import _sleep_until, reap, spawn_child, wait_ready
    from bench.stack import REPO

    cmd = [*base, "--client", client, "--concurrency", str(c), f"--warmup={a.warmup}", f"--measure={a.measure}"]
    ch = await spawn_child(cmd, REPO)
    try:
        assert ch.stdin is not None
        await wait_ready(ch, client, 120)
        start = time.time() + 0.3
        ch.stdin.write(f"{start!r}\n".encode())
        await ch.stdin.drain()
        ch.stdin.close()
        await _sleep_until(start + a.warmup)
        before = probe()
        await _sleep_until(start + a.warmup + a.measure)
        after = probe()
        stdout, stderr = await asyncio.wait_for(ch.communicate(), 120)
        if ch.returncode != 0:
            raise RuntimeError(f"{client} exited {ch.returncode}: {stderr.decode(errors='replace')[-1500:]}")
    finally:
        await reap(ch)
    r = json.loads(stdout.decode().strip().splitlines()[-1])
    out = {
        "client": client,
        "concurrency": c,
        "tokens": r["units"],
        "seconds": round(r["seconds"], 3),
        "client_cpu_s": round(r["cpu_s"], 4),
        "triton_cpu_s": round(after["triton"] - before["triton"], 4),
        "errors": r["errors"],
        "first_errors": r["first_errors"],
        "loadavg_1m": round(os.getloadavg()[0], 2),
    }
    if client == "gateway":
        out["gateway_cpu_s"] = round(after["gateway"] - before["gateway"], 4)
    return out


def _cpu_s(procs: list[Any]) -> float:
    import psutil

    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


async def http_cancel_probe(http_url: str, stats_dir: Path, body: dict[str, Any]) -> dict[str, Any]:
    """Does closing a ``generate_stream`` connection cancel the request in Triton? One 30-token stream on
    ``synthetic-llm-slow`` (1 token/s) read for one event, then the connection is dropped; the synthetic
    model writes its counters (``cancelled``, ``completed``) when a request ends."""
    import aiohttp

    from bench.stack import SYNTHETIC_SLOW

    stats = stats_dir / f"{SYNTHETIC_SLOW}.json"
    before = json.loads(stats.read_text()) if stats.exists() else {}
    url = f"http://{http_url}/v2/models/{SYNTHETIC_SLOW}/generate_stream"
    t0 = time.monotonic()
    async with aiohttp.ClientSession() as s:
        resp = await s.post(url, json={**body, "request_output_len": [30]})
        await resp.content.readline()
        resp.close()  # drops the connection (no keep-alive reuse of an unfinished body)
    await asyncio.sleep(4.0)
    after = json.loads(stats.read_text()) if stats.exists() else {}
    return {
        "stats_before": before,
        "stats_after_4s": after,
        "cancelled_within_4s": after.get("cancelled", 0) > before.get("cancelled", 0),
        "elapsed_s": round(time.monotonic() - t0, 2),
    }


def render_md(doc: dict[str, Any]) -> str:
    lines = [
        f"# Triton client alternatives, {doc['meta']['date']} (load average {doc['meta']['loadavg_start']} at the "
        f"start, {doc['meta']['loadavg_end']} at the end)",
        "",
        f"Load: {doc['meta']['tokens']}-token streams on `{doc['meta']['model']}` "
        f"({'20 ms between tokens' if str(doc['meta']['model']).endswith('paced') else 'unpaced'}), "
        f"{doc['meta']['reps']} repetition(s), {doc['meta']['measure_s']} s windows; every client in a process "
        "of its own, one Triton. CPU per token: the client process's CPU (all its threads) over the window / "
        "tokens received in it; Triton's likewise; for the gateway row, the gateway's CPU (its load generator's "
        "is in the client column). median [min-max] over repetitions.",
        "",
        "| c | client | client CPU us/token | Triton CPU us/token | tokens/s | client / ours (paired) "
        "| saved us/token | share of gateway CPU/token | errors |",
        "|---|---|---|---|---|---|---|---|---|",
    ]

    def fmt(s: dict[str, Any]) -> str:
        if s.get("median") is None:
            return "-"
        return f"{s['median']:.1f} [{s['min']:.1f}-{s['max']:.1f}]"

    for cell, rows in doc["summary"].items():
        for client in CLIENTS:
            row = rows.get(client)
            if row is None:
                continue
            first = fmt(row["client_cpu_us_per_token"])
            if client == "gateway":
                first = f"gateway {fmt(row['gateway_cpu_us_per_token'])} (loadgen {first})"
            lines.append(
                f"| {cell[1:]} | {client} | {first} | {fmt(row['triton_cpu_us_per_token'])} | "
                f"{fmt(row['tokens_per_s'])} | {row.get('ratio_to_rpc') or '-'} | "
                f"{row.get('saved_us_per_token', '-')} | {row.get('share_of_gateway') or '-'} | {row['errors']} |"
            )
    lines += ["", f"Cheapest client per token (gateway excluded): {doc['cheapest']}", ""]
    if doc.get("http_cancel"):
        lines.append(f"HTTP generate_stream, connection dropped after one event: {doc['http_cancel']}")
    if doc.get("skipped"):
        lines.append(f"Skipped: {doc['skipped']}")
    if doc.get("failures"):
        lines.append(f"Failures: {doc['failures']}")
    return "\n".join(lines) + "\n"


async def parent_main(a: argparse.Namespace) -> int:
    import psutil

    from bench.stack import (
        REPO,
        SMOLLM_TOKENIZER,
        SYNTHETIC,
        SYNTHETIC_PACED,
        Gateway,
        gateway_config,
        start_triton,
    )
    from openai_api.text.templates import ChatTemplate
    from openai_api.text.tokenizer import TextTokenizer

    upstream = SYNTHETIC_PACED if a.upstream == "paced" else SYNTHETIC
    stats_dir = Path(tempfile.mkdtemp(prefix="bench-ca-stats-"))
    os.environ["OPENAI_API_REF_STATS_DIR"] = str(stats_dir)  # the synthetic model's counters (cancel probe)
    clients = [c for c in a.clients.split(",") if c]
    skipped: dict[str, str] = {}
    for c in list(clients):
        mod = {
            "tritonclient_aio": "tritonclient.grpc.aio",
            "tritonclient_sync": "tritonclient.grpc",
            "http_aiohttp": "aiohttp",
            "http_httpx": "httpx",
        }.get(c)
        if mod:
            try:
                __import__(mod)
            except ImportError as e:
                skipped[c] = f"not installed: {e}"
                clients.remove(c)
    la0 = [round(x, 2) for x in os.getloadavg()]
    t_start = time.time()
    triton, extra = start_triton(1000, embeddings=False)
    gateway: Gateway | None = None
    runs: list[dict[str, Any]] = []
    failures: list[str] = []
    doc: dict[str, Any] = {}
    try:
        from bench.board import MESSAGES

        tok = TextTokenizer.from_folder(SMOLLM_TOKENIZER)
        template = ChatTemplate.from_file(REPO / "openai_api" / "chat_templates" / "smollm2.jinja")
        prompt = template.render(MESSAGES, add_generation_prompt=True, bos_token=tok.bos_token, eos_token=tok.eos_token)
        prompt_ids = tok.encode(prompt)
        end_id = tok.eos_token_ids[0]
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else end_id
        tri_root = psutil.Process(triton.pid)
        tri_procs = [tri_root, *tri_root.children(recursive=True)]
        gw_procs: list[Any] = []
        if "gateway" in clients:
            gateway = Gateway(gateway_config(triton.grpc_url, triton.http_url), Path(stats_dir), name="gateway-ca")
            await asyncio.to_thread(gateway.start)
            gw_procs = gateway.processes()

        def probe() -> dict[str, float]:
            return {"triton": _cpu_s(tri_procs), "gateway": _cpu_s(gw_procs)}

        base = [
            sys.executable,
            "-m",
            "bench.client_alternatives",
            "--child",
            "--url",
            triton.grpc_url,
            "--http-url",
            triton.http_url,
            "--gateway-url",
            gateway.url if gateway else "",
            "--model",
            upstream,
            "--prompt-ids",
            ",".join(map(str, prompt_ids)),
            "--end-id",
            str(end_id),
            "--pad-id",
            str(pad_id),
            "--tokens",
            str(a.tokens),
        ]
        body = {
            "input_ids": prompt_ids,
            "input_lengths": [len(prompt_ids)],
            "request_output_len": [a.tokens],
            "end_id": [end_id],
            "pad_id": [pad_id],
            "streaming": [True],
        }
        try:
            doc["http_cancel"] = await http_cancel_probe(triton.http_url, stats_dir, body)
            print(f"[ca] http cancel probe: {doc['http_cancel']}", flush=True)
        except Exception as e:  # noqa: BLE001 - recorded, the run goes on
            failures.append(f"http cancel probe: {type(e).__name__}: {e}")
        concs = [int(x) for x in a.concurrency.split(",")]
        for rep in range(a.reps):
            order = clients[rep % len(clients) :] + clients[: rep % len(clients)]  # rotate per repetition
            for c in concs:
                for client in order:
                    try:
                        r = await run_one(client, c, base, a, probe)
                    except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                        failures.append(f"{client} c={c} rep {rep}: {type(e).__name__}: {e}"[:600])
                        print(f"[ca] FAILED {failures[-1]}", flush=True)
                        continue
                    r["rep"] = rep
                    runs.append(r)
                    us = per_token_us(r["client_cpu_s"], r["tokens"])
                    gw = per_token_us(r.get("gateway_cpu_s", 0.0), r["tokens"]) if client == "gateway" else None
                    print(
                        f"[ca {time.strftime('%H:%M:%S')}] rep {rep} c={c} {client}: {r['tokens'] / r['seconds']:.0f}"
                        f" tok/s, client {us} us/token, triton {per_token_us(r['triton_cpu_s'], r['tokens'])} us/token"
                        + (f", gateway {gw} us/token" if gw is not None else "")
                        + f", load {r['loadavg_1m']}",
                        flush=True,
                    )
    finally:
        if gateway is not None:
            gateway.stop()
        triton.stop()
        import shutil

        shutil.rmtree(extra, ignore_errors=True)
    summary = summarise(runs)
    date = time.strftime("%Y-%m-%d", time.gmtime())
    doc.update(
        meta={
            "date": date,
            "started_utc": time.strftime("%H:%M:%S", time.gmtime(t_start)),
            "wall_s": round(time.time() - t_start, 1),
            "loadavg_start": la0,
            "loadavg_end": [round(x, 2) for x in os.getloadavg()],
            "model": upstream,
            "tokens": a.tokens,
            "reps": a.reps,
            "warmup_s": a.warmup,
            "measure_s": a.measure,
            "quick": a.quick,
            "cpus": os.cpu_count(),
            "labels": {c: LABELS[c] for c in clients},
            "versions": _versions(),
        },
        summary=summary,
        cheapest=cheapest(summary),
        runs=runs,
        skipped=skipped,
        failures=failures,
    )
    out = Path(a.out) if a.out else Path(__file__).resolve().parent / "results" / f"client-alternatives-{date}"
    if a.quick and not a.out:
        out = out.with_name(out.name + "-quick")
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1) + "\n")
    out.with_suffix(".md").write_text(render_md(doc))
    print(render_md(doc))
    return 1 if failures and not runs else 0


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("grpcio", "tritonclient", "aiohttp", "httpx", "uvloop", "protobuf"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            out[pkg] = "not installed"
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.client_alternatives",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help="1 repetition, 2 s windows (smoke run, ~2 min)")
    p.add_argument("--clients", default=",".join(CLIENTS))
    p.add_argument("--concurrency", default="1,16")
    p.add_argument("--reps", type=int, default=None, help="default 3 (1 with --quick)")
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument(
        "--upstream",
        choices=("paced", "unpaced"),
        default="paced",
        help="synthetic-llm-paced (20 ms per token, default) or synthetic-llm (as fast as Triton sends)",
    )
    p.add_argument("--warmup", type=float, default=None, help="seconds before each window (default 1.5; quick 1)")
    p.add_argument("--measure", type=float, default=None, help="window seconds (default 5; quick 2)")
    p.add_argument("--out", default="", help="path without suffix (default bench/results/client-alternatives-<date>)")
    # child side
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--client", choices=CLIENTS, default="rpc", help=argparse.SUPPRESS)
    p.add_argument("--url", default="", help=argparse.SUPPRESS)
    p.add_argument("--http-url", default="", help=argparse.SUPPRESS)
    p.add_argument("--gateway-url", default="", help=argparse.SUPPRESS)
    p.add_argument("--model", default="", help=argparse.SUPPRESS)
    p.add_argument("--prompt-ids", default="", help=argparse.SUPPRESS)
    p.add_argument("--end-id", type=int, default=2, help=argparse.SUPPRESS)
    p.add_argument("--pad-id", type=int, default=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.reps is None:
        a.reps = 1 if a.quick else 3
    if a.warmup is None:
        a.warmup = 1.0 if a.quick else 1.5
    if a.measure is None:
        a.measure = 2.0 if a.quick else 5.0
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.child:
        return child_main(a)
    return asyncio.run(parent_main(a))


if __name__ == "__main__":
    raise SystemExit(main())
