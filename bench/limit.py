"""The limit: a bare client calling Triton itself over gRPC, in a process of its own.

The gateway's ratio is only meaningful against the fastest client there is, so the direct side of
every LLM case is the gateway's own Triton code (``openai_api.triton.rpc.TritonRPC`` on one
``grpc.aio`` channel, pooled ``ModelStreamInfer`` streams, requests built by
``openai_api.triton.wire.InferRequest``) with everything else stripped: no HTTP, no chat template,
no detokenization, no stop scanning; it counts tokens from the raw ``output_ids`` bytes. The old
baseline, ``tritonclient.grpc.aio`` (numpy ``InferInput`` s, a request generator and a consumer task
per call, an ``InferResult`` per response: the client the gateway dropped for being slower), runs
the same way with ``--client tritonclient`` and is kept only as a labelled extra figure.

Each run is its own process (``python -m bench.limit ...``), started by ``bench.run``: it never
shares an event loop or a GIL with the HTTP load generator or anything else. Protocol with the
parent: the child connects (one 2-token request), prints ``ready`` and waits for one line on stdin
(the wall-clock time, ``time.time()``, at which to start: several children start together); it then
runs its mode and prints one JSON object on stdout.

Modes:

* ``relay``: ``--concurrency`` loops of ``--tokens``-token streams; tokens/s over the window
  ``[start + warmup, start + warmup + measure]`` (wall clock, so the parent can sample Triton's CPU
  over the same window), and this process's CPU seconds in that window. ``--pace-us N`` spends N us
  of busy work per received token, as a client that does something with its tokens does: Triton
  delivers *more* tokens/s to such a client than to one that reads each message the instant it
  lands (responses then queue and leave Triton several per write instead of one per wake-up: on
  2 cores, c=16, 0 -> 40 us per token took the bare client from ~8,500 to ~13,900 tokens/s). The
  parent takes the best of several paces, so the limit is the fastest read cadence, not only the
  fastest reader.
* ``latency``: ``--concurrency`` workers each send ``--warmup-requests`` + ``--requests`` sequential
  requests (``--streaming 0``: one response, as the gateway asks for a non-streamed chat);
  per-request latencies in ms (raw, so the parent can merge processes).
* ``ttft``: as ``latency`` with streamed requests, timing the first response that carries a token.
* ``count``: one request; the number of tokens that came back (a sanity check).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc

from openai_api.triton.rpc import TritonRPC
from openai_api.triton.wire import InferRequest, raw_output

CLIENTS = ("rpc", "tritonclient")
LABELS = {
    "rpc": "openai_api.triton.rpc.TritonRPC (the gateway's own gRPC code, bare), own process",
    "tritonclient": "tritonclient.grpc.aio, own process",
}
_CHANNEL_ARGS = [
    ("grpc.max_send_message_length", 256 * 1024 * 1024),
    ("grpc.max_receive_message_length", 256 * 1024 * 1024),
]


class RpcLLM:
    """The gateway's Triton RPC code as a bare load generator."""

    def __init__(self, url: str, model: str, prompt_ids: list[int], end_id: int, pad_id: int) -> None:
        self.rpc = TritonRPC(grpc.aio.insecure_channel(url, options=_CHANNEL_ARGS))
        self.model = model
        self.prompt_ids, self.end_id, self.pad_id = prompt_ids, end_id, pad_id
        self._requests: dict[tuple[int, bool], InferRequest] = {}

    def use_prompt(self, prompt_ids: list[int]) -> None:
        """Send ``prompt_ids`` from now on (requests built for the previous prompt are dropped)."""
        self.prompt_ids = prompt_ids
        self._requests.clear()

    def request(self, max_tokens: int, streaming: bool) -> InferRequest:
        """The inputs the gateway's TensorRT-LLM adapter sends for a chat request without sampling
        parameters (batched model: every tensor [1, ...]). Built once per shape and resent, as a
        client repeating one request may."""
        key = (max_tokens, streaming)
        r = self._requests.get(key)
        if r is None:
            r = InferRequest(self.model)
            r.tensor("input_ids", "INT32", [1, len(self.prompt_ids)], self.prompt_ids)
            r.tensor("request_output_len", "INT32", [1, 1], [max_tokens])
            r.tensor("input_lengths", "INT32", [1, 1], [len(self.prompt_ids)])
            r.tensor("end_id", "INT32", [1, 1], [self.end_id])
            r.tensor("pad_id", "INT32", [1, 1], [self.pad_id])
            r.tensor("streaming", "BOOL", [1, 1], [streaming])
            if not streaming:
                r.tensor("exclude_input_in_output", "BOOL", [1, 1], [True])
            r.output("output_ids")
            if not streaming:
                r.output("sequence_length")
            self._requests[key] = r
        return r

    async def generate(
        self, max_tokens: int, on_count: Callable[[int], None] | None = None, streaming: bool = True
    ) -> int:
        total = 0
        responses = self.rpc.stream(self.request(max_tokens, streaming), model=self.model)
        try:
            async for result in responses:
                raw = raw_output(result.get_response(), "output_ids")
                k = len(raw) // 4 if raw else 0
                if k:
                    total += k
                    if on_count is not None:
                        on_count(k)
        finally:
            await responses.aclose()
        return total

    async def close(self) -> None:
        await self.rpc.close()


class TritonClientLLM:
    """The old baseline: what a client using ``tritonclient.grpc.aio`` does, one gRPC stream per request."""

    def __init__(self, url: str, model: str, prompt_ids: list[int], end_id: int, pad_id: int) -> None:
        import tritonclient.grpc.aio as grpc_aio

        self.client = grpc_aio.InferenceServerClient(url)
        self.model = model
        self.prompt_ids, self.end_id, self.pad_id = prompt_ids, end_id, pad_id

    async def close(self) -> None:
        await self.client.close()

    @staticmethod
    def _tensor(name: str, value: Any, dtype: str) -> Any:
        import numpy as np
        from tritonclient.grpc import InferInput

        arr = np.asarray(value, dtype={"INT32": np.int32, "BOOL": np.bool_}[dtype])[np.newaxis, ...]
        inp = InferInput(name, list(arr.shape), dtype)
        inp.set_data_from_numpy(arr)
        return inp

    def payload(self, max_tokens: int, streaming: bool) -> dict[str, Any]:
        from tritonclient.grpc import InferRequestedOutput

        t = self._tensor
        return {
            "model_name": self.model,
            "inputs": [
                t("input_ids", self.prompt_ids, "INT32"),
                t("request_output_len", [max_tokens], "INT32"),
                t("input_lengths", [len(self.prompt_ids)], "INT32"),
                t("end_id", [self.end_id], "INT32"),
                t("pad_id", [self.pad_id], "INT32"),
                t("streaming", [streaming], "BOOL"),
            ]
            + ([] if streaming else [t("exclude_input_in_output", [True], "BOOL")]),
            "outputs": [InferRequestedOutput("output_ids"), InferRequestedOutput("sequence_length")],
        }

    async def generate(
        self, max_tokens: int, on_count: Callable[[int], None] | None = None, streaming: bool = True
    ) -> int:
        payload = self.payload(max_tokens, streaming)

        async def one() -> AsyncIterator[dict[str, Any]]:
            yield payload

        stream = self.client.stream_infer(one())
        total = 0
        try:
            async for result, error in stream:
                if error is not None:
                    raise RuntimeError(f"Triton error: {error}")
                k = result.as_numpy("output_ids").size
                total += k
                if on_count is not None and k:
                    on_count(k)
        finally:
            stream.cancel()
        return total


# ---------------------------------------------------------------------------------------------- parent
class Limit:
    """Runs the limit client in child processes (``python -m bench.limit``) from the bench's event loop.

    ``procs`` > 1 splits the concurrency over that many processes, started together on one wall-clock
    time; their windows coincide, so their rates add up."""

    def __init__(self, url: str, model: str, prompt_ids: list[int], end_id: int, pad_id: int) -> None:
        self.base = [
            sys.executable,
            "-m",
            "bench.limit",
            "--url",
            url,
            "--model",
            model,
            "--prompt-ids",
            ",".join(str(i) for i in prompt_ids),
            "--end-id",
            str(end_id),
            "--pad-id",
            str(pad_id),
        ]

    async def run(
        self,
        mode: str,
        concurrency: int,
        *,
        client: str = "rpc",
        procs: int = 1,
        probe: Callable[[], dict[str, float]] | None = None,
        **opts: Any,
    ) -> dict[str, Any]:
        """Run ``mode`` in ``procs`` processes; with ``probe`` (relay only), ``probe()`` is sampled at
        both ends of the window and the differences are returned as ``window_cpu_s``."""
        from bench.stack import REPO

        procs = max(1, min(procs, concurrency))
        shares = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in opts.items()]
        children = []
        try:
            for share in shares:
                cmd = [*self.base, "--client", client, "--mode", mode, "--concurrency", str(share), *flags]
                children.append(await spawn_child(cmd, REPO))
            for ch in children:
                await wait_ready(ch, "bench.limit", 180)
            start = time.time() + 0.3
            for ch in children:
                assert ch.stdin is not None
                ch.stdin.write(f"{start!r}\n".encode())
                await ch.stdin.drain()
                ch.stdin.close()
            window: dict[str, float] = {}
            if probe is not None and mode == "relay":
                warmup, measure = float(opts.get("warmup", 1.0)), float(opts.get("measure", 3.0))
                await _sleep_until(start + warmup)
                before = probe()
                await _sleep_until(start + warmup + measure)
                after = probe()
                window = {k: after[k] - before[k] for k in after}
            outs = []
            for ch in children:
                stdout, stderr = await ch.communicate()
                if ch.returncode != 0:
                    raise RuntimeError(f"bench.limit exited {ch.returncode}: {stderr.decode(errors='replace')[-1500:]}")
                outs.append(json.loads(stdout.decode().strip().splitlines()[-1]))
        finally:
            for ch in children:
                await reap(ch)
        merged = _merge(outs)
        merged["procs"] = procs
        merged["client_label"] = LABELS[client]
        if window:
            merged["window_cpu_s"] = window
        return merged


def _merge(outs: list[dict[str, Any]]) -> dict[str, Any]:
    if len(outs) == 1:
        return outs[0]
    first = outs[0]
    merged: dict[str, Any] = {k: first[k] for k in ("client", "mode", "loop")}
    merged["concurrency"] = sum(o["concurrency"] for o in outs)
    merged["errors"] = sum(o.get("errors", 0) for o in outs)
    merged["first_errors"] = [e for o in outs for e in o.get("first_errors", [])][:3]
    merged["cpu_s"] = sum(o.get("cpu_s", 0.0) for o in outs)
    if first["mode"] == "relay":
        merged["units"] = sum(o["units"] for o in outs)
        merged["seconds"] = max(o["seconds"] for o in outs)
        merged["rate"] = sum(o["rate"] for o in outs)
    elif "samples_ms" in first:
        samples = [x for o in outs for x in o["samples_ms"]]
        merged.update(_percentiles(samples), samples_ms=samples)
        merged["wall_s"] = max(o["wall_s"] for o in outs)
        merged["req_per_s"] = len(samples) / merged["wall_s"]
    else:
        merged["tokens"] = [o.get("tokens") for o in outs]
    return merged


# ---------------------------------------------------------------------------------------------- child
def _percentiles(samples_ms: list[float]) -> dict[str, Any]:
    from bench.load import percentiles_ms

    return percentiles_ms([x / 1000.0 for x in samples_ms])


async def _sleep_until(wall: float) -> None:
    delay = wall - time.time()
    if delay > 0:
        await asyncio.sleep(delay)


# The parent's side of a bench child's handshake (this module's, `bench.board`'s, `bench.client_alternatives`'):
# the child prints `ready` once set up, then reads its go (a start time, or a line) on stdin.
async def spawn_child(cmd: list[str], cwd: Any) -> asyncio.subprocess.Process:
    """`cmd` with its stdin, stdout and stderr piped to this process."""
    return await asyncio.create_subprocess_exec(
        *cmd, cwd=cwd, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )


async def wait_ready(ch: asyncio.subprocess.Process, what: str, timeout: float) -> None:
    """Return once the child printed `ready`; else a RuntimeError naming `what`, with its stderr's tail."""
    assert ch.stdout is not None
    line = await asyncio.wait_for(ch.stdout.readline(), timeout)
    if line.strip() != b"ready":
        err = (await ch.stderr.read()).decode(errors="replace") if ch.stderr else ""
        raise RuntimeError(f"{what} did not start: {line!r} {err[-1500:]}")


async def reap(ch: asyncio.subprocess.Process) -> None:
    """Kill a child that is still running (its run failed or was cancelled) and wait for it."""
    if ch.returncode is None:
        ch.kill()
        await ch.wait()


async def _relay(llm: Any, a: argparse.Namespace, start: float) -> dict[str, Any]:
    from bench.load import Counter

    counter = Counter()
    stop = asyncio.Event()
    pace_s = a.pace_us / 1e6

    def paced(k: int) -> None:
        end = time.perf_counter() + pace_s * k
        while time.perf_counter() < end:  # busy on purpose: a client working on its tokens
            pass
        counter.add(k)

    on_count: Callable[[int], None] = paced if pace_s > 0 else counter.add

    async def loop() -> None:
        while not stop.is_set():
            try:
                await llm.generate(a.tokens, on_count)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - recorded, the run goes on
                counter.errors.append(f"{type(e).__name__}: {e}"[:300])
                await asyncio.sleep(0.05)

    await _sleep_until(start)
    tasks = [asyncio.create_task(loop()) for _ in range(a.concurrency)]
    try:
        await _sleep_until(start + a.warmup)
        v0, t0, c0 = counter.value, time.perf_counter(), time.process_time()
        await _sleep_until(start + a.warmup + a.measure)
        v1, t1, c1 = counter.value, time.perf_counter(), time.process_time()
        stop.set()
        # In-flight streams finish instead of being cancelled all at once (see bench.load.throughput).
        await asyncio.wait(tasks, timeout=30)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "units": v1 - v0,
        "seconds": t1 - t0,
        "rate": (v1 - v0) / (t1 - t0),
        "cpu_s": c1 - c0,
        "errors": len(counter.errors),
        "first_errors": counter.errors[:3],
    }


async def _latency(llm: Any, a: argparse.Namespace, start: float, ttft: bool) -> dict[str, Any]:
    samples: list[float] = []
    errors: list[str] = []
    streaming = True if ttft else bool(a.streaming)

    async def worker() -> None:
        for i in range(a.warmup_requests + a.requests):
            first: list[float] = []
            t0 = time.perf_counter()

            def on_count(_k: int, first: list[float] = first) -> None:
                if not first:
                    first.append(time.perf_counter())

            try:
                got = await llm.generate(a.tokens, on_count if ttft else None, streaming)
                if got != a.tokens:
                    raise RuntimeError(f"{got} tokens, wanted {a.tokens}")
            except Exception as e:  # noqa: BLE001
                errors.append(f"{type(e).__name__}: {e}"[:300])
                continue
            if i >= a.warmup_requests:
                samples.append(((first[0] if ttft else time.perf_counter()) - t0) * 1000.0)

    await _sleep_until(start)
    t0, c0 = time.perf_counter(), time.process_time()
    await asyncio.gather(*(worker() for _ in range(a.concurrency)))
    wall = time.perf_counter() - t0
    return {
        **_percentiles(samples),
        "samples_ms": [round(x, 4) for x in samples],
        "req_per_s": len(samples) / wall if wall else 0.0,
        "cpu_s": time.process_time() - c0,
        "wall_s": wall,
        "errors": len(errors),
        "first_errors": errors[:3],
    }


async def _main(a: argparse.Namespace) -> dict[str, Any]:
    cls = RpcLLM if a.client == "rpc" else TritonClientLLM
    llm = cls(a.url, a.model, [int(x) for x in a.prompt_ids.split(",")], a.end_id, a.pad_id)
    try:
        await llm.generate(2)  # connect (and fill the stream pool by one) before saying ready
        print("ready", flush=True)
        line = (await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)).strip()
        start = float(line) if line else time.time()
        if a.mode == "relay":
            out = await _relay(llm, a, start)
        elif a.mode in ("latency", "ttft"):
            out = await _latency(llm, a, start, ttft=a.mode == "ttft")
        else:
            out = {"tokens": await llm.generate(a.tokens, streaming=bool(a.streaming))}
    finally:
        await llm.close()
    out.update(client=a.client, mode=a.mode, concurrency=a.concurrency, loop=a.loop)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.limit", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", required=True, help="Triton gRPC host:port")
    p.add_argument("--model", required=True)
    p.add_argument("--prompt-ids", required=True, help="comma-separated prompt token ids")
    p.add_argument("--end-id", type=int, required=True)
    p.add_argument("--pad-id", type=int, required=True)
    p.add_argument("--client", choices=CLIENTS, default="rpc")
    p.add_argument("--mode", choices=("relay", "latency", "ttft", "count"), default="relay")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--warmup", type=float, default=1.0, help="relay: seconds before the window")
    p.add_argument("--measure", type=float, default=3.0, help="relay: window length in seconds")
    p.add_argument("--pace-us", type=float, default=0.0, help="relay: busy work per received token, in us")
    p.add_argument("--requests", type=int, default=100, help="latency/ttft: timed requests per worker")
    p.add_argument("--warmup-requests", type=int, default=5, help="latency/ttft: untimed requests per worker")
    p.add_argument("--streaming", type=int, default=1, help="latency/count: 0 for one response per request")
    p.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="the gateway runs on uvloop")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.loop == "uvloop":
        import uvloop

        out = uvloop.run(_main(a))
    else:
        out = asyncio.run(_main(a))
    sys.stdout.write(json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
