"""Stub Triton replicas for the fleet benchmark: a paced synthetic LLM whose cost is time, with a prefix cache.

Each replica is one process-free object in a shared asyncio loop that speaks enough of Triton to stand in
for one Triton pod running TensorRT-LLM, on its own loopback address (127.0.0.N, so every replica has the
same gRPC and metrics ports on its own host, as pods do):

* **gRPC** (KServe v2, ``inference.GRPCInferenceService``, the generated servicer from ``tritonclient``):
  ``ServerLive``, ``ServerReady``, ``ModelReady``, ``ModelMetadata``, ``ModelConfig`` (the TensorRT-LLM
  token-id interface, decoupled, ``max_batch_size`` 8: what the gateway's start-up check and protocol
  detection read) and ``ModelStreamInfer`` (one request at a time per stream, as the gateway sends them;
  ``input_ids`` [1, L] and ``request_output_len`` in, one ``output_ids`` [1, 1, 1] response per token out, the
  last flagged ``triton_final_response``). Any model name is served.
* **Metrics** (Prometheus text on ``GET /metrics``, the port Triton serves on 8002):
  ``nv_inference_pending_request_count``, TensorRT-LLM's ``nv_trt_llm_request_metrics{request_type=
  "waiting"|"context"|"scheduled"|"active"|"max"}`` and ``nv_trt_llm_kv_cache_block_metrics{
  kv_cache_block_type="fraction"|"used"|"free"|"max"|"tokens_per"}``, labelled as Triton labels them
  (``model``, ``version``). ``GET /stats`` answers this replica's counters as JSON, ``POST /reset`` empties
  its cache and counters (between two traces).

The simulated engine (``SimEngine``, parameters in ``SimParams``), per replica:

* requests wait for a slot (at most ``max_active`` in flight), then for the one **prefill lane** (prefills
  run one after another, FIFO: prefill is compute-bound, so a batch of prefills takes the sum of their times).
  The lane runs on a virtual clock (each prefill's start and end are fixed when it is queued, and the sleeps
  aim at those times), so the process waking up late on a busy machine delays one answer but never the
  queue behind it; a request cancelled while queued keeps its place on that clock;
* prefill takes ``prefill_overhead_s + uncached_tokens * prefill_s_per_token`` where ``uncached_tokens`` are
  the prompt tokens after the longest run of leading ``block_tokens``-token blocks this replica holds
  (chained block hashes, as vLLM's and TensorRT-LLM's KV-cache reuse key them); the first token comes out at
  the end of prefill;
* then one token every ``decode_s * max(1, active / batch_knee)`` seconds (decode is memory-bound: flat up to
  a batch size, slower beyond);
* KV budget: ``kv_blocks`` blocks per replica. A request's blocks are pinned while it runs; finished blocks
  (prompt and output) stay cached in LRU order and are evicted oldest first when the budget is exceeded;
  pinned blocks are never evicted (the budget may be overcommitted then, counted in ``overcommit_blocks``).

What it does not model: prefill/decode interference (a prefill iteration does not delay other requests'
decode steps here), chunked prefill, preemption, the cost of cached tokens, network time. All costs are
``asyncio.sleep`` s, so the machine's CPU is not what is measured.

Run: ``python -m bench.fleet_replica --hosts 127.0.0.10,127.0.0.11 --grpc-port P --metrics-port M
[--params JSON]``; it prints one line ``ready`` once every replica listens and serves until stdin closes or
SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import signal
import struct
import sys
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import grpc
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "models" / "smollm2-135m-instruct" / "tokenizer.json"
# What a replica generates: English words (one token each in SmolLM2's vocabulary, looked up at start-up),
# so the gateway's detokenizer does real work and the next turn's prompt re-tokenizes to the same ids.
WORDS = (" The quick brown fox jumps over the lazy dog and then it runs across the green field to find a small"
         " house near the river where")


@dataclass
class SimParams:
    """The simulated engine's costs (seconds) and sizes; see the module docstring."""

    prefill_s_per_token: float = 0.0001  # 10,000 prompt tokens/s per replica
    prefill_overhead_s: float = 0.004  # per request: scheduling, the first forward pass's fixed part
    decode_s: float = 0.02  # one output token per 20 ms per sequence (50 tokens/s)
    batch_knee: int = 16  # decode slows linearly past this many sequences in flight
    max_active: int = 32  # sequences in flight; more wait (TensorRT-LLM's max_batch_size)
    block_tokens: int = 16  # KV-cache block size, the unit of prefix reuse
    kv_blocks: int = 1536  # KV budget per replica (24,576 tokens at 16 per block)

    @classmethod
    def from_json(cls, text: str) -> SimParams:
        raw = json.loads(text) if text else {}
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown simulation parameters: {sorted(unknown)}")
        return cls(**raw)


def block_hashes(tokens: list[int], block: int) -> list[int]:
    """Chained hashes of the full ``block``-token blocks of ``tokens``: block i's hash covers blocks 0..i, so
    equal hashes mean equal prefixes (Python's hash of an int tuple is not randomized per process)."""
    out: list[int] = []
    h = 0
    for i in range(0, len(tokens) - block + 1, block):
        h = hash((h, *tokens[i:i + block]))
        out.append(h)
    return out


class SimEngine:
    """One replica's simulated TensorRT-LLM engine: slots, a prefill lane, paced decode and an LRU KV cache."""

    def __init__(self, params: SimParams, words: list[int]) -> None:
        self.p = params
        self.words = words or [1]
        self.slots = asyncio.Semaphore(params.max_active)
        self.reset()

    def reset(self) -> None:
        # hash -> pin count; order = least recently used first
        self.cache: OrderedDict[int, int] = OrderedDict()
        self.pinned = 0
        self.waiting = 0
        self.context = 0
        self.active = 0
        self.stats: dict[str, int] = dict.fromkeys(
            ("requests", "prompt_tokens", "cached_tokens", "computed_tokens", "output_tokens", "evicted_blocks",
             "overcommit_blocks", "cancelled", "first_token_us", "prefill_planned_us"), 0)
        self.ttft_us: list[int] = []  # each request's own time to first token here, in arrival order
        self.lane_free_at = 0.0  # when the last prefill queued on the lane ends (event-loop clock)

    def _touch(self, hashes: list[int], pin: bool) -> None:
        cache = self.cache
        for h in hashes:
            n = cache.pop(h, 0)
            if pin:
                if n == 0:
                    self.pinned += 1
                n += 1
            cache[h] = n
        self._evict()

    def _unpin(self, hashes: list[int]) -> None:
        for h in hashes:
            n = self.cache.get(h)
            if n:
                self.cache[h] = n - 1
                if n == 1:
                    self.pinned -= 1

    def _evict(self) -> None:
        over = len(self.cache) - self.p.kv_blocks
        if over <= 0:
            return
        victims = []
        for h, n in self.cache.items():
            if n == 0:
                victims.append(h)
                if len(victims) == over:
                    break
        for h in victims:
            del self.cache[h]
        self.stats["evicted_blocks"] += len(victims)
        if len(victims) < over:
            self.stats["overcommit_blocks"] = max(self.stats["overcommit_blocks"], over - len(victims))

    def cached_prefix_blocks(self, hashes: list[int]) -> int:
        n = 0
        for h in hashes:
            if h not in self.cache:
                break
            n += 1
        return n

    def kv_fraction(self) -> float:
        return min(1.0, self.pinned / self.p.kv_blocks)

    async def generate(self, prompt: list[int], max_tokens: int) -> AsyncIterator[int]:
        """The output tokens of one request, each at the time the simulated engine produces it."""
        p = self.p
        loop = asyncio.get_running_loop()
        arrived = loop.time()
        self.stats["requests"] += 1
        self.stats["prompt_tokens"] += len(prompt)
        hashes = block_hashes(prompt, p.block_tokens)
        pinned: list[int] = []
        admitted = False
        self.waiting += 1
        try:
            async with self.slots:
                hit = self.cached_prefix_blocks(hashes)
                self._touch(hashes, pin=True)
                pinned = hashes
                # A full hit still computes the last prompt token (its logits give the first output).
                cached = min(hit * p.block_tokens, len(prompt) - 1)
                self.stats["cached_tokens"] += cached
                self.stats["computed_tokens"] += len(prompt) - cached
                planned = p.prefill_overhead_s + (len(prompt) - cached) * p.prefill_s_per_token
                self.stats["prefill_planned_us"] += int(planned * 1e6)
                # The prefill lane on a virtual clock: this prefill starts when the ones before it end (first
                # come first served) and the sleeps aim at those absolute times, so a late wake-up of this
                # process (a busy machine) delays this answer but never shifts the queue behind it.
                begin = max(loop.time(), self.lane_free_at)
                done = begin + planned
                self.lane_free_at = done
                await asyncio.sleep(max(0.0, begin - loop.time()))
                self.waiting -= 1
                self.context += 1
                self.active += 1
                admitted = True
                try:
                    await asyncio.sleep(max(0.0, done - loop.time()))
                finally:
                    self.context -= 1
                # The simulated engine's own time to first token (queue + prefill on its clock); the client's
                # TTFT minus this is what the gateway, the network stack and the machine's load add.
                ttft_us = int((done - arrived) * 1e6)
                self.stats["first_token_us"] += ttft_us
                self.ttft_us.append(ttft_us)
                out: list[int] = []
                words = self.words
                for i in range(max_tokens):
                    if i:
                        await asyncio.sleep(p.decode_s * max(1.0, self.active / p.batch_knee))
                    token = words[i % len(words)]
                    out.append(token)
                    self.stats["output_tokens"] += 1
                    yield token
                # The finished sequence's blocks (prompt and output) stay cached for the next turn.
                self._unpin(pinned)
                pinned = []
                self._touch(block_hashes(prompt + out, p.block_tokens), pin=False)
        except (asyncio.CancelledError, GeneratorExit):
            self.stats["cancelled"] += 1
            raise
        finally:
            if pinned:
                self._unpin(pinned)
            if admitted:
                self.active -= 1
            else:
                self.waiting -= 1

    def metrics(self, model: str) -> str:
        """Prometheus text, named and labelled as Triton with the TensorRT-LLM backend names them."""
        # Triton writes labels in alphabetical order.
        mdl, ver = f'model="{model}"', 'version="1"'
        lbl = f"{mdl},{ver}"
        used = self.pinned
        rows = [
            "# HELP nv_inference_pending_request_count Instantaneous number of pending requests awaiting "
            "execution per-model.",
            "# TYPE nv_inference_pending_request_count gauge",
            f"nv_inference_pending_request_count{{{lbl}}} {self.waiting}",
            "# HELP nv_trt_llm_request_metrics TRT LLM request metrics",
            "# TYPE nv_trt_llm_request_metrics gauge",
            f'nv_trt_llm_request_metrics{{{mdl},request_type="waiting",{ver}}} {self.waiting}',
            f'nv_trt_llm_request_metrics{{{mdl},request_type="context",{ver}}} {self.context}',
            f'nv_trt_llm_request_metrics{{{mdl},request_type="scheduled",{ver}}} {self.active}',
            f'nv_trt_llm_request_metrics{{{mdl},request_type="active",{ver}}} {self.active}',
            f'nv_trt_llm_request_metrics{{{mdl},request_type="max",{ver}}} {self.p.max_active}',
            "# HELP nv_trt_llm_kv_cache_block_metrics TRT LLM KV cache block metrics",
            "# TYPE nv_trt_llm_kv_cache_block_metrics gauge",
            f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="fraction",{lbl}}} {self.kv_fraction():.6f}',
            f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="used",{lbl}}} {used}',
            f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="free",{lbl}}} '
            f"{max(0, self.p.kv_blocks - used)}",
            f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="max",{lbl}}} {self.p.kv_blocks}',
            f'nv_trt_llm_kv_cache_block_metrics{{kv_cache_block_type="tokens_per",{lbl}}} {self.p.block_tokens}',
        ]
        return "\n".join(rows) + "\n"


# ------------------------------------------------------------------------------------------------ gRPC side
def model_config(name: str) -> mc.ModelConfig:
    """The TensorRT-LLM token-id interface (a subset of the backend's inputs), decoupled, batched."""
    cfg = mc.ModelConfig(name=name, backend="python", max_batch_size=8)
    cfg.model_transaction_policy.decoupled = True
    inputs = [("input_ids", mc.TYPE_INT32, [-1], False), ("input_lengths", mc.TYPE_INT32, [1], False),
              ("request_output_len", mc.TYPE_INT32, [1], False), ("end_id", mc.TYPE_INT32, [1], True),
              ("pad_id", mc.TYPE_INT32, [1], True), ("streaming", mc.TYPE_BOOL, [1], True),
              ("exclude_input_in_output", mc.TYPE_BOOL, [1], True), ("temperature", mc.TYPE_FP32, [1], True),
              ("runtime_top_p", mc.TYPE_FP32, [1], True), ("runtime_top_k", mc.TYPE_INT32, [1], True),
              ("seed", mc.TYPE_UINT64, [1], True), ("min_tokens", mc.TYPE_INT32, [1], True)]
    for n, dt, dims, optional in inputs:
        cfg.input.add(name=n, data_type=dt, dims=dims, optional=optional)
    cfg.output.add(name="output_ids", data_type=mc.TYPE_INT32, dims=[-1, -1])
    cfg.output.add(name="sequence_length", data_type=mc.TYPE_INT32, dims=[-1])
    return cfg


def _inputs(req: pb.ModelInferRequest) -> dict[str, tuple[str, bytes]]:
    return {t.name: (t.datatype, raw) for t, raw in zip(req.inputs, req.raw_input_contents, strict=False)}


def _ints(dtype_raw: tuple[str, bytes] | None) -> list[int]:
    if dtype_raw is None:
        return []
    dtype, raw = dtype_raw
    code = {"INT32": "i", "UINT32": "I", "INT64": "q"}.get(dtype)
    if code is None:
        raise ValueError(f"integer tensor expected, got {dtype}")
    return list(struct.unpack(f"<{len(raw) // struct.calcsize(code)}{code}", raw))


class ReplicaServicer(pb_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=True)

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        cfg = model_config(request.name)
        resp = pb.ModelMetadataResponse(name=request.name, versions=["1"], platform="python")
        for t in cfg.input:
            resp.inputs.add(name=t.name, datatype=mc.DataType.Name(t.data_type).removeprefix("TYPE_"),
                            shape=[-1, *t.dims])
        for t in cfg.output:
            resp.outputs.add(name=t.name, datatype=mc.DataType.Name(t.data_type).removeprefix("TYPE_"),
                             shape=[-1, *t.dims])
        return resp

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=model_config(request.name))

    async def ModelStreamInfer(self, request_iterator: Any, context: Any) -> AsyncIterator[
            pb.ModelStreamInferResponse]:
        async for req in request_iterator:
            async for resp in self._one(req):
                yield resp

    async def _one(self, req: pb.ModelInferRequest) -> AsyncIterator[pb.ModelStreamInferResponse]:
        try:
            ins = _inputs(req)
            prompt = _ints(ins.get("input_ids"))
            max_tokens = (_ints(ins.get("request_output_len")) or [16])[0]
            streaming = bool(ins.get("streaming", ("BOOL", b"\x00"))[1][:1] == b"\x01")
        except (ValueError, struct.error) as e:
            yield pb.ModelStreamInferResponse(error_message=f"bad request: {e}")
            return
        if not prompt or max_tokens < 1:
            yield pb.ModelStreamInferResponse(error_message="input_ids is empty or request_output_len < 1")
            return
        tokens: list[int] = []
        async for token in self.engine.generate(prompt, max_tokens):
            tokens.append(token)
            if streaming:
                yield self._response(req, [token], final=len(tokens) == max_tokens)
        if not streaming:
            yield self._response(req, tokens, final=True)

    @staticmethod
    def _response(req: pb.ModelInferRequest, tokens: list[int], final: bool) -> pb.ModelStreamInferResponse:
        r = pb.ModelInferResponse(model_name=req.model_name, model_version="1", id=req.id)
        r.outputs.add(name="output_ids", datatype="INT32", shape=[1, 1, len(tokens)])
        r.raw_output_contents.append(struct.pack(f"<{len(tokens)}i", *tokens))
        r.parameters["triton_final_response"].bool_param = final
        return pb.ModelStreamInferResponse(infer_response=r)


# --------------------------------------------------------------------------------------------- metrics side
async def _serve_http(engine: SimEngine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One HTTP request (then the connection closes): GET /metrics, GET /stats, POST /reset."""
    try:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        method, path = head.split(b" ", 2)[:2]
        length = 0
        for line in head.split(b"\r\n")[1:]:
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        if length:
            await reader.readexactly(length)
        status, ctype, body = "200 OK", "text/plain; version=0.0.4", b""
        if method == b"GET" and path.startswith(b"/metrics"):
            body = engine.metrics("fleet-llm").encode()
        elif method == b"GET" and path.startswith(b"/stats"):
            stats = {**engine.stats, "cached_blocks": len(engine.cache), "pinned_blocks": engine.pinned,
                     "waiting": engine.waiting, "active": engine.active, "ttft_us": engine.ttft_us}
            ctype, body = "application/json", json.dumps(stats).encode()
        elif method == b"POST" and path.startswith(b"/reset"):
            if engine.active or engine.waiting:
                status, body = "409 Conflict", b"requests in flight\n"
            else:
                engine.reset()
                body = b"reset\n"
        else:
            status, body = "404 Not Found", b"not found\n"
        writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                     "Connection: close\r\n\r\n".encode() + body)
        await writer.drain()
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
        pass
    finally:
        writer.close()


def word_ids() -> list[int]:
    """SmolLM2's ids of ``WORDS``, one per word."""
    from tokenizers import Tokenizer

    return list(Tokenizer.from_file(str(TOKENIZER)).encode(WORDS, add_special_tokens=False).ids)


async def serve(hosts: list[str], grpc_port: int, metrics_port: int, params: SimParams) -> None:
    words = word_ids()
    servers: list[grpc.aio.Server] = []
    https: list[asyncio.Server] = []
    for host in hosts:
        engine = SimEngine(params, words)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(ReplicaServicer(engine), server)
        if server.add_insecure_port(f"{host}:{grpc_port}") == 0:
            raise RuntimeError(f"cannot listen on {host}:{grpc_port}")
        await server.start()
        servers.append(server)
        https.append(await asyncio.start_server(functools.partial(_serve_http, engine), host, metrics_port))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    fd = sys.stdin.fileno()

    def on_stdin() -> None:
        if not os.read(fd, 1 << 16):  # the parent closed our stdin (or died): stop
            loop.remove_reader(fd)
            stop.set()

    loop.add_reader(fd, on_stdin)
    print("ready", flush=True)
    await stop.wait()
    for h in https:
        h.close()
    await asyncio.gather(*(s.stop(0.5) for s in servers), return_exceptions=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--hosts", required=True, help="comma-separated loopback addresses, one replica each")
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--params", default="", help="SimParams as JSON (defaults otherwise)")
    args = ap.parse_args()
    params = SimParams.from_json(args.params)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.hosts.split(","), args.grpc_port, args.metrics_port, params))


if __name__ == "__main__":
    main()

