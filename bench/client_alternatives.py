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
import queue
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

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
_STREAM = "/inference.GRPCInferenceService/ModelStreamInfer"


# ---------------------------------------------------------------------------------------------- arithmetic
def per_token_us(cpu_s: float, tokens: int) -> float | None:
    """CPU microseconds per token over a window (None when no token arrived)."""
    return round(cpu_s * 1e6 / tokens, 2) if tokens > 0 else None


def summarise(runs: list[dict[str, Any]], baseline: str = "rpc", gateway: str = "gateway") -> dict[str, Any]:
    """Per (concurrency, client): medians, min and max over repetitions of the client's CPU per token,
    Triton's CPU per token and tokens/s, and the paired ratio to ``baseline`` (same concurrency and
    repetition); per concurrency, what switching ``baseline`` for each client would save of the
    gateway's CPU per token (``saved_us`` = baseline median - client median; ``share_of_gateway`` =
    saved_us / the gateway's median CPU per token).

    ``runs``: dicts with ``client``, ``concurrency``, ``rep``, ``tokens``, ``client_cpu_s``, ``triton_cpu_s``,
    ``seconds``, ``errors`` and, for the gateway client, ``gateway_cpu_s``."""
    cells: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for r in runs:
        cells.setdefault(int(r["concurrency"]), {}).setdefault(r["client"], []).append(r)
    out: dict[str, Any] = {}
    for c, by_client in sorted(cells.items()):
        base = {r["rep"]: per_token_us(r["client_cpu_s"], r["tokens"]) for r in by_client.get(baseline, [])}
        rows: dict[str, Any] = {}
        for client, rs in by_client.items():
            cpu = [v for r in rs if (v := per_token_us(r["client_cpu_s"], r["tokens"])) is not None]
            tri = [v for r in rs if (v := per_token_us(r["triton_cpu_s"], r["tokens"])) is not None]
            rate = [r["tokens"] / r["seconds"] for r in rs if r["seconds"] > 0]
            ratios = []
            for r in rs:
                b, v = base.get(r["rep"]), per_token_us(r["client_cpu_s"], r["tokens"])
                if b and v is not None:
                    ratios.append(v / b)
            row: dict[str, Any] = {
                "reps": len(rs),
                "client_cpu_us_per_token": _spread(cpu),
                "triton_cpu_us_per_token": _spread(tri),
                "tokens_per_s": _spread(rate),
                "ratio_to_" + baseline: round(statistics.median(ratios), 3) if ratios else None,
                "errors": sum(int(r.get("errors", 0)) for r in rs),
            }
            if any("gateway_cpu_s" in r for r in rs):
                gw = [v for r in rs if (v := per_token_us(r.get("gateway_cpu_s", 0.0), r["tokens"])) is not None]
                row["gateway_cpu_us_per_token"] = _spread(gw)
            rows[client] = row
        gw_med = (rows.get(gateway) or {}).get("gateway_cpu_us_per_token", {}).get("median")
        base_med = (rows.get(baseline) or {}).get("client_cpu_us_per_token", {}).get("median")
        for client, row in rows.items():
            if client in (baseline, gateway) or base_med is None:
                continue
            med = row["client_cpu_us_per_token"]["median"]
            if med is None:
                continue
            saved = round(base_med - med, 2)
            row["saved_us_per_token"] = saved
            row["share_of_gateway"] = round(saved / gw_med, 3) if gw_med else None
        out[f"c{c}"] = rows
    return out


def _spread(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"median": None, "min": None, "max": None}
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2), "max": round(max(values), 2)}


def cheapest(summary: dict[str, Any], exclude: tuple[str, ...] = ("gateway",)) -> dict[str, str | None]:
    """Per concurrency, the client with the lowest median client CPU per token."""
    best: dict[str, str | None] = {}
    for cell, rows in summary.items():
        cands = [
            (row["client_cpu_us_per_token"]["median"], client)
            for client, row in rows.items()
            if client not in exclude and row["client_cpu_us_per_token"]["median"] is not None
        ]
        best[cell] = min(cands)[1] if cands else None
    return best


# ---------------------------------------------------------------------------------------------- child
class SyncGrpcLLM:
    """grpc's blocking API: one open ``ModelStreamInfer`` call per thread, requests written through a
    queue that the call's request iterator reads, responses read until Triton's final flag."""

    def __init__(self, url: str, request_pb: Any) -> None:
        import grpc
        from tritonclient.grpc import service_pb2

        self.channel = grpc.insecure_channel(url)
        self.call = self.channel.stream_stream(
            _STREAM,
            request_serializer=service_pb2.ModelInferRequest.SerializeToString,
            response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
        )
        request_pb.parameters["triton_enable_empty_final_response"].bool_param = True
        self.request_pb = request_pb

    def worker(self) -> SyncGrpcWorker:
        return SyncGrpcWorker(self)

    def close(self) -> None:
        self.channel.close()


class SyncGrpcWorker:
    def __init__(self, llm: SyncGrpcLLM) -> None:
        from openai_api.triton.wire import raw_output

        self._raw_output = raw_output
        self.llm = llm
        self.q: queue.Queue[Any] = queue.Queue()
        self.responses = llm.call(iter(self.q.get, None))

    def generate(self, on_count: Any) -> int:
        self.q.put(self.llm.request_pb)
        total = 0
        for resp in self.responses:
            if resp.error_message:
                raise RuntimeError(resp.error_message)
            raw = self._raw_output(resp.infer_response, "output_ids")
            k = len(raw) // 4 if raw else 0
            if k:
                total += k
                on_count(k)
            params = resp.infer_response.parameters
            if "triton_final_response" in params and params["triton_final_response"].bool_param:
                return total
        raise RuntimeError("stream ended before the final response")

    def close(self) -> None:
        self.q.put(None)  # half-close: Triton ends the call, no cancellation burst
        for _ in self.responses:
            pass


class SyncTritonClientWorker:
    """``tritonclient.grpc``: one client, one callback stream; requests wait for their final response."""

    def __init__(self, url: str, model: str, inputs: list[Any], outputs: list[Any]) -> None:
        import tritonclient.grpc as grpcclient

        self.client = grpcclient.InferenceServerClient(url)
        self.model, self.inputs, self.outputs = model, inputs, outputs
        self.results: queue.Queue[Any] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.results.put((result, error)))

    def generate(self, on_count: Any) -> int:
        self.client.async_stream_infer(self.model, self.inputs, outputs=self.outputs, enable_empty_final_response=True)
        total = 0
        while True:
            result, error = self.results.get()
            if error is not None:
                raise RuntimeError(str(error))
            k = 0
            arr = result.as_numpy("output_ids")
            if arr is not None:
                k = int(arr.size)
            if k:
                total += k
                on_count(k)
            resp = result.get_response()
            if resp.parameters["triton_final_response"].bool_param:
                return total

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


class HTTPGenerateLLM:
    """Triton's ``generate_stream`` over HTTP/1.1 keep-alive (aiohttp or httpx), SSE parsed per event."""

    def __init__(self, http_url: str, model: str, body: dict[str, Any], lib: str, concurrency: int) -> None:
        import orjson

        self.url = f"http://{http_url}/v2/models/{model}/generate_stream"
        self.body = orjson.dumps(body)
        self.loads = orjson.loads
        self.lib = lib
        self.concurrency = concurrency
        self.session: Any = None

    async def open(self) -> None:
        if self.lib == "aiohttp":
            import aiohttp

            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.concurrency + 4), timeout=aiohttp.ClientTimeout(total=None)
            )
        else:
            import httpx

            self.session = httpx.AsyncClient(
                timeout=None, limits=httpx.Limits(max_connections=self.concurrency + 4, max_keepalive_connections=None)
            )

    def _count(self, line: bytes) -> int:
        if not line.startswith(b"data:"):
            return 0
        event = self.loads(line[5:])
        if "error" in event:
            raise RuntimeError(f"generate_stream error: {event['error']}")
        ids = event.get("output_ids")
        return len(ids) if isinstance(ids, list) else (0 if ids is None else 1)

    async def generate(self, max_tokens: int, on_count: Any = None, streaming: bool = True) -> int:
        total = 0
        headers = {"Content-Type": "application/json"}
        if self.lib == "aiohttp":
            async with self.session.post(self.url, data=self.body, headers=headers) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"HTTP {resp.status}: {(await resp.read())[:300]!r}")
                async for line in resp.content:
                    k = self._count(line)
                    if k:
                        total += k
                        if on_count is not None:
                            on_count(k)
        else:
            async with self.session.stream("POST", self.url, content=self.body, headers=headers) as resp:
                if resp.status_code != 200:
                    raise RuntimeError(f"HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
                async for text in resp.aiter_lines():
                    k = self._count(text.encode())
                    if k:
                        total += k
                        if on_count is not None:
                            on_count(k)
        return total

    async def close(self) -> None:
        if self.session is not None:
            await (self.session.close() if self.lib == "aiohttp" else self.session.aclose())


class GatewayChat:
    """Streamed chats through the gateway, counted from the raw SSE bytes (``bench.load``)."""

    def __init__(self, gateway_url: str, model: str) -> None:
        from bench.load import ConnectionPool

        host, port = gateway_url.rsplit("/", 1)[-1].rsplit(":", 1)
        self.pool = ConnectionPool(host, int(port))
        self.model = model

    async def generate(self, max_tokens: int, on_count: Any = None, streaming: bool = True) -> int:
        from bench.board import MESSAGES
        from bench.load import CONTENT_MARKER

        payload = {"model": self.model, "messages": MESSAGES, "max_tokens": max_tokens, "stream": True}
        async with self.pool.connection() as conn:
            return await conn.post_stream("/v1/chat/completions", payload, on_count or (lambda k: None), CONTENT_MARKER)

    async def close(self) -> None:
        self.pool.close()


def _http_body(a: argparse.Namespace, prompt_ids: list[int]) -> dict[str, Any]:
    """The TensorRT-LLM inputs as generate-extension JSON fields (a list is a tensor of that length;
    Triton adds the batch dimension of this batched model)."""
    return {
        "input_ids": prompt_ids,
        "input_lengths": [len(prompt_ids)],
        "request_output_len": [a.tokens],
        "end_id": [a.end_id],
        "pad_id": [a.pad_id],
        "streaming": [True],
    }


def _tritonclient_io(a: argparse.Namespace, prompt_ids: list[int]) -> tuple[list[Any], list[Any]]:
    from bench.limit import TritonClientLLM

    llm = TritonClientLLM.__new__(TritonClientLLM)  # its payload builder only, no client
    llm.model, llm.prompt_ids, llm.end_id, llm.pad_id = a.model, prompt_ids, a.end_id, a.pad_id
    p = llm.payload(a.tokens, True)
    return p["inputs"], p["outputs"]


def _relay_threads(workers: list[Any], a: argparse.Namespace, start: float) -> dict[str, Any]:
    """The sync clients' relay: a thread per stream, counts per thread (no lock on the hot path)."""
    counts = [0] * len(workers)
    errors: list[str] = []
    stop = threading.Event()

    def loop(i: int) -> None:
        def add(k: int) -> None:
            counts[i] += k

        while not stop.is_set():
            try:
                workers[i].generate(add)
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                errors.append(f"{type(e).__name__}: {e}"[:300])
                time.sleep(0.05)

    _sleep_until_sync(start)
    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(workers))]
    for t in threads:
        t.start()
    _sleep_until_sync(start + a.warmup)
    v0, t0, c0 = sum(counts), time.perf_counter(), time.process_time()
    _sleep_until_sync(start + a.warmup + a.measure)
    v1, t1, c1 = sum(counts), time.perf_counter(), time.process_time()
    stop.set()
    for t in threads:
        t.join(timeout=30)
    return {"units": v1 - v0, "seconds": t1 - t0, "cpu_s": c1 - c0, "errors": len(errors), "first_errors": errors[:3]}


def _sleep_until_sync(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        time.sleep(delay)


def _child_sync(a: argparse.Namespace, prompt_ids: list[int]) -> dict[str, Any]:
    workers: list[Any] = []
    shared: Any = None
    if a.client == "grpc_sync":
        from bench.limit import RpcLLM

        req = RpcLLM.__new__(RpcLLM)  # its request builder only, no channel
        req.model, req.prompt_ids, req.end_id, req.pad_id, req._requests = (a.model, prompt_ids, a.end_id, a.pad_id, {})
        shared = SyncGrpcLLM(a.url, req.request(a.tokens, True).pb)
        workers = [shared.worker() for _ in range(a.concurrency)]
    else:
        inputs, outputs = _tritonclient_io(a, prompt_ids)
        workers = [SyncTritonClientWorker(a.url, a.model, inputs, outputs) for _ in range(a.concurrency)]
    try:
        # Connect every stream before saying ready, all at once (one after another, 16 paced 64-token
        # requests took ~20 s).
        with ThreadPoolExecutor(len(workers)) as pool:
            list(pool.map(lambda w: w.generate(lambda k: None), workers))
        print("ready", flush=True)
        line = sys.stdin.readline().strip()
        return _relay_threads(workers, a, float(line) if line else time.time())
    finally:
        for w in workers:
            w.close()
        if shared is not None:
            shared.close()


async def _child_async(a: argparse.Namespace, prompt_ids: list[int]) -> dict[str, Any]:
    from bench.limit import RpcLLM, TritonClientLLM, _relay

    llm: Any
    if a.client == "rpc":
        llm = RpcLLM(a.url, a.model, prompt_ids, a.end_id, a.pad_id)
    elif a.client == "tritonclient_aio":
        llm = TritonClientLLM(a.url, a.model, prompt_ids, a.end_id, a.pad_id)
    elif a.client == "gateway":
        llm = GatewayChat(a.gateway_url, a.model)
    else:
        llm = HTTPGenerateLLM(a.http_url, a.model, _http_body(a, prompt_ids), a.client.split("_", 1)[1], a.concurrency)
        await llm.open()
    try:
        got = await asyncio.gather(*(llm.generate(a.tokens) for _ in range(a.concurrency)))
        if any(g != a.tokens for g in got):
            raise RuntimeError(f"{a.client}: {got} tokens, wanted {a.tokens}")
        print("ready", flush=True)
        line = (await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)).strip()
        a.pace_us = 0.0
        return await _relay(llm, a, float(line) if line else time.time())
    finally:
        await llm.close()


def child_main(a: argparse.Namespace) -> int:
    prompt_ids = [int(x) for x in a.prompt_ids.split(",")]
    a.concurrency = int(a.concurrency)  # one level per child (the parent's flag is a list)
    if a.client in ("grpc_sync", "tritonclient_sync"):
        out = _child_sync(a, prompt_ids)
    else:
        import uvloop

        out = uvloop.run(_child_async(a, prompt_ids))
    out.update(client=a.client, concurrency=a.concurrency)
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


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
