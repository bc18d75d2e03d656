"""Gateway CPU and time to first token of requests on a LoRA adapter against the base model, in one run.

``.venv/bin/python -m bench.lora_cpu [--reps 6] [--out bench/results/lora-cpu-DATE.json]``

Issue #26 asks that a request on an adapter cost no more gateway CPU per token than one on its base model
(the weights sent once). The adapter's own work is all above Triton: the `LoraBackend` naming the adapter on
the request, the TensorRT-LLM adapter adding `lora_task_id` (and, the first time per replica or after a
cache miss, `lora_weights` + `lora_config`, encoded once per adapter and dtype). So this runs the real
pipeline in-process - `ChatService.create` streamed, the registry's runtimes (base: instrumented backend;
adapter: `registry.add_adapter`, as a served adapter is) over the real `TensorRTLLMAdapter` - with only the
gRPC stream faked: it answers each request with one response per token (real `ModelInferResponse`s, one
`output_ids` token each; the ids of " The quick brown fox jumps over the lazy dog", cycled), and counts the
requests that carried weights. Model: the bundled `smollm2-135m-instruct` (its tokenizer, template and Triton
model config, `lora_weights` FP16 as TensorRT-LLM's shipped configs), adapter `lora-upper` from
`models/adapters` (set-up trains it: 84 rows, rank 8).

Per model (``base``; ``adapter``: id only, its weights already sent; ``weights``: the weights on every
request, as after a cache miss each time): ``stream`` (512 tokens: CPU per token), ``short`` (16 tokens:
mostly the request's cost) and the time from the request to its first content byte (``ttft_us``, wall,
in-process: the gateway's own part of TTFT). The summary adds the marginal per-token cost ((stream -
short) / 496) and per-request overhead, and the adapter/base ratios paired per repetition. Each repetition
is a fresh child process running every case of every model, the order alternating. The model's own cost
of an adapter (the LoRA matmuls) is Triton's, not measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"
ADAPTER = "lora-upper"
SENTENCE = " The quick brown fox jumps over the lazy dog"
SHORT = 16
PROMPT = "Tell me a long story about a quick brown fox."
KINDS = ("base", "adapter", "weights")
CASES = ("stream", "short")
REPO = Path(__file__).resolve().parents[1]


def _tensor(name: str, dtype: str, dims: list[int], optional: bool = True) -> dict[str, Any]:
    return {"name": name, "data_type": f"TYPE_{dtype}", "dims": [str(d) for d in dims], "optional": optional}


# The reference model's Triton config (triton_models/smollm2-135m-instruct/config.pbtxt) as gRPC's JSON gives
# it, with lora_weights FP16 as TensorRT-LLM's shipped tensorrt_llm configs declare it.
SPEC = {"config": {
    "name": MODEL, "backend": "python", "max_batch_size": 1, "model_transaction_policy": {"decoupled": True},
    "input": [_tensor("input_ids", "INT32", [-1], False), _tensor("input_lengths", "INT32", [1], False),
              _tensor("request_output_len", "INT32", [1], False), _tensor("end_id", "INT32", [1]),
              _tensor("pad_id", "INT32", [1]), _tensor("stop_words_list", "INT32", [2, -1]),
              _tensor("bad_words_list", "INT32", [2, -1]), _tensor("runtime_top_k", "INT32", [1]),
              _tensor("runtime_top_p", "FP32", [1]), _tensor("temperature", "FP32", [1]),
              _tensor("repetition_penalty", "FP32", [1]), _tensor("presence_penalty", "FP32", [1]),
              _tensor("frequency_penalty", "FP32", [1]), _tensor("min_tokens", "INT32", [1]),
              _tensor("seed", "UINT64", [1]), _tensor("streaming", "BOOL", [1]),
              _tensor("return_log_probs", "BOOL", [1]), _tensor("exclude_input_in_output", "BOOL", [1]),
              _tensor("guided_decoding_guide_type", "STRING", [1]), _tensor("guided_decoding_guide", "STRING", [1]),
              _tensor("lora_task_id", "UINT64", [1]),
              _tensor("lora_weights", "FP16", [-1, -1]), _tensor("lora_config", "INT32", [-1, 3])],
    "output": [_tensor("output_ids", "INT32", [-1, -1], False), _tensor("sequence_length", "INT32", [-1], False)],
}}


def child(streams: int, tokens: int, kinds: tuple[str, ...]) -> dict[str, Any]:
    """Runs in a fresh interpreter: CPU per token / request and in-process TTFT of each kind of request."""
    import numpy as np
    from tritonclient.grpc import InferResult, service_pb2

    import openai_api
    from openai_api.config import BUNDLED_CONFIG, adapters_of, load_config
    from openai_api.http.dialects.openai_chat import encode
    from openai_api.observability import Metrics
    from openai_api.schemas.openai import ChatCompletionRequest
    from openai_api.services.backends import InstrumentedLLMBackend
    from openai_api.services.chat import ChatService
    from openai_api.services.context import RequestContext
    from openai_api.services.preprocess import Preprocessor
    from openai_api.services.registry import ModelRegistry
    from openai_api.text.workers import CPUWorkers
    from openai_api.triton.client import TritonClientPool
    from openai_api.triton.tensorrt_llm import TensorRTLLMAdapter
    from openai_api.triton.wire import parse_model_config

    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    entry = next(dict(e) for e in data["llm"] if e.get("name") == MODEL)
    for key in ("path", "chat_template", "adapters_dir"):
        entry[key] = str((BUNDLED_CONFIG.parent / entry[key]).resolve())
    entry["adapters"] = []
    infos = [i for i in data.get("model_infos", []) if i.get("name") == MODEL]
    folder = Path(tempfile.mkdtemp(prefix="lora-cpu-"))
    (folder / "model_config.json").write_text(json.dumps({"model_infos": infos, "llm": [entry]}))
    config = load_config(folder / "model_config.json")
    adapter = next(a for a in adapters_of(config.llm[0]) if a.name == ADAPTER)
    registry = ModelRegistry(config, TritonClientPool(), Metrics())
    rt0 = registry.llm(MODEL)
    ids = rt0.tokenizer.encode(SENTENCE * (tokens // 9 + 1))[:tokens]
    assert len(ids) == tokens

    def response(token: int) -> InferResult:
        resp = service_pb2.ModelInferResponse()
        out = resp.outputs.add()
        out.name, out.datatype = "output_ids", "INT32"
        out.shape.extend([1, 1, 1])
        resp.raw_output_contents.append(np.asarray([token], dtype="<i4").tobytes())
        return InferResult(resp)

    results = [response(t) for t in ids]

    class Stream:
        def __init__(self, n: int) -> None:
            self.i, self.n = 0, n

        def __aiter__(self) -> Stream:
            return self

        async def __anext__(self) -> InferResult:
            if self.i >= self.n:
                raise StopAsyncIteration
            self.i += 1
            return results[self.i - 1]

        async def aclose(self) -> None:
            return None

    class FakeRPC:
        """Triton's inference RPC: one response per token, as many as request_output_len asks."""

        weights_sent = 0

        def stream(self, request: Any, *, model: str, timeout_s: float | None = None,
                   idle_s: float | None = None) -> Stream:
            inputs = request.inputs()
            if "lora_weights" in inputs:
                FakeRPC.weights_sent += 1
            n = int(np.frombuffer(inputs["request_output_len"][2], dtype="<i4")[0])
            return Stream(n)

    metrics = registry.metrics
    trt = TensorRTLLMAdapter(FakeRPC(), parse_model_config(SPEC), model=MODEL, triton_model=MODEL)
    reg = copy.copy(registry)
    reg.llms = {MODEL: copy.copy(rt0)}
    reg.llms[MODEL].backend = InstrumentedLLMBackend(trt, metrics, MODEL)
    reg.add_adapter(adapter)
    chat = ChatService(reg, Preprocessor(CPUWorkers(1)))

    async def one(model: str, n: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        req = ChatCompletionRequest.model_validate({"model": model, "messages": [{"role": "user", "content": PROMPT}],
                                                    "max_tokens": n, "stream": True})
        out = await chat.create(req, RequestContext("rid"))
        assert not isinstance(out, dict)
        got, ttft = 0, 0.0
        async for chunk in encode(out):  # as the chat dialect writes it
            k = chunk.count(b'"delta":{"content":')
            if k and not got:
                ttft = time.perf_counter() - t0
            got += k
        return got, ttft

    async def measure(kind: str, case: str) -> dict[str, Any]:
        model = MODEL if kind == "base" else ADAPTER
        n = tokens if case == "stream" else SHORT
        for _ in range(5):
            got, _ = await one(model, n)
        if got != n:
            raise RuntimeError(f"{kind} {case}: {got} content events for {n} tokens")
        count = streams if case == "stream" else streams * tokens // (4 * n)
        sent0 = FakeRPC.weights_sent
        ttfts = []
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(count):
            if kind == "weights":
                trt.lora_sent.clear()  # as after a cache miss: this request carries the weights
            ttfts.append((await one(model, n))[1])
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        return {"cpu_us_per_token": round(cpu * 1e6 / (count * n), 2),
                "cpu_us_per_request": round(cpu * 1e6 / count, 1),
                "wall_us_per_token": round(wall * 1e6 / (count * n), 2),
                "ttft_us": round(statistics.median(ttfts) * 1e6, 1), "count": count,
                "weights_sent": FakeRPC.weights_sent - sent0}

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {k: {} for k in kinds}
        order = list(kinds)
        for case in CASES:
            for k in order:
                out[k][case] = await measure(k, case)
            order.reverse()
        return out

    return {"openai_api": openai_api.__file__, "adapter_rows": len(adapter.modules),
            "weights_bytes": len(adapter.wire_bytes("FP16")), **asyncio.run(run())}


def _child_cmd(streams: int, tokens: int, kinds: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", "--streams", str(streams), "--tokens",
            str(tokens), "--kinds", kinds]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--streams", type=int, default=40)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--out", type=Path)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kinds", default=",".join(KINDS), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child:
        print(json.dumps(child(a.streams, a.tokens, tuple(a.kinds.split(",")))))
        return 0
    env = {**os.environ, "PYTHONPATH": str(REPO), "LOG_LEVEL": "WARNING"}
    runs: list[dict[str, Any]] = []
    for rep in range(a.reps):
        order = KINDS if rep % 2 == 0 else KINDS[::-1]
        done = subprocess.run(_child_cmd(a.streams, a.tokens, ",".join(order)), cwd=REPO, env=env,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        r = json.loads(done.stdout.strip().splitlines()[-1])
        r["rep"], r["loadavg_1m"] = rep, round(os.getloadavg()[0], 2)
        runs.append(r)
        print(f"rep {rep}: " + ", ".join(
            f"{k} {r[k]['stream']['cpu_us_per_token']} us/token, {r[k]['short']['cpu_us_per_request']} us/request, "
            f"ttft {r[k]['short']['ttft_us']} us, weights sent {r[k]['stream']['weights_sent']}" for k in KINDS)
            + f" (load {r['loadavg_1m']})", flush=True)
    summary: dict[str, Any] = {}
    for k in KINDS:
        marg = [(r[k]["stream"]["cpu_us_per_request"] - r[k]["short"]["cpu_us_per_request"]) / (a.tokens - SHORT)
                for r in runs]
        summary[k] = {
            "cpu_us_per_token": statistics.median(r[k]["stream"]["cpu_us_per_token"] for r in runs),
            "marginal_us_per_token": round(statistics.median(marg), 2),
            "request_overhead_us": round(statistics.median(
                r[k]["short"]["cpu_us_per_request"] - SHORT * m for r, m in zip(runs, marg, strict=True)), 1),
            "ttft_us": statistics.median(r[k]["short"]["ttft_us"] for r in runs),
            "tokens_per_s_wall": round(1e6 / statistics.median(r[k]["stream"]["wall_us_per_token"] for r in runs)),
            "weights_sent_per_request": statistics.median(
                r[k]["stream"]["weights_sent"] / r[k]["stream"]["count"] for r in runs),
        }
    for k in ("adapter", "weights"):
        for metric, case in (("cpu_us_per_token", "stream"), ("ttft_us", "short"), ("wall_us_per_token", "stream")):
            pairs = [r[k][case][metric] / r["base"][case][metric] for r in runs]
            summary[f"{k}_over_base_{metric}"] = {"paired": [round(x, 3) for x in pairs],
                                                  "median": round(statistics.median(pairs), 3)}
    meta = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "streams": a.streams, "tokens": a.tokens,
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                     text=True).stdout.strip(), "cpus": os.cpu_count()}
    result = {"summary": summary, "runs": runs, **meta}
    print(json.dumps(summary, indent=1))
    if a.out is not None:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
