"""Time to first token of the SmolLM2 reference model with and without a prefix KV cache hit, through a real
tritonserver (the embedded launcher, only ``smollm2-135m-instruct`` loaded) and TensorRT-LLM's tensors over gRPC.

Per round, three streamed requests with ``return_perf_metrics``, each prompt starting with a fresh nonce:

* ``cold``: a prompt of ``--prompt`` tokens (a long first turn);
* ``warm``: the same prompt + a short new turn (``--turn`` tokens): its blocks are in the cache;
* ``cold same size``: another fresh prompt as long as ``warm``: what the warm request would cost without a hit.

TTFT is measured by the client (send -> first response) and by the engine (``first_token_time_ns -
arrival_time_ns`` of its perf outputs); ``kv_cache_reused_blocks`` says what the warm request reused. Prints the
medians over ``--rounds`` rounds as a small table.

Run: ``.venv/bin/python -m bench.prefix_cache_ttft [--prompt 1500] [--turn 30] [--rounds 3]``.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
from tokenizers import Tokenizer

from openai_api.embedded.launcher import EmbeddedTriton

REPO = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
WORDS = "the quick brown fox jumps over the lazy dog while a small red hen counts seven green apples".split()


def prompt_ids(tok: Tokenizer, tokens: int) -> list[int]:
    """A fresh prompt of exactly `tokens` tokens: a nonce, then filler text."""
    text = f"Session {uuid.uuid4().hex}. " + " ".join(WORDS[i % len(WORDS)] + f" {i}" for i in range(tokens))
    return list(tok.encode(text).ids[:tokens])


def infer(client: grpcclient.InferenceServerClient, ids: list[int], max_tokens: int = 2) -> dict[str, Any]:
    """One streamed request: client-side TTFT, and the engine's perf outputs from its first response."""
    inputs = []
    for name, value, dtype in (("input_ids", np.asarray([ids], dtype=np.int32), "INT32"),
                               ("input_lengths", np.asarray([[len(ids)]], dtype=np.int32), "INT32"),
                               ("request_output_len", np.asarray([[max_tokens]], dtype=np.int32), "INT32"),
                               ("temperature", np.asarray([[0.0]], dtype=np.float32), "FP32"),
                               ("streaming", np.asarray([[True]]), "BOOL"),
                               ("return_perf_metrics", np.asarray([[True]]), "BOOL")):
        t = grpcclient.InferInput(name, list(value.shape), dtype)
        t.set_data_from_numpy(value)
        inputs.append(t)
    outputs = [grpcclient.InferRequestedOutput(n) for n in ("output_ids", "kv_cache_reused_blocks",
                                                            "arrival_time_ns", "first_token_time_ns")]
    got: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((time.perf_counter(), result, error)))
    start = time.perf_counter()
    client.async_stream_infer(MODEL, inputs, outputs=outputs, request_id=uuid.uuid4().hex)
    first_at, result, error = got.get(timeout=600)
    if error is not None:
        raise RuntimeError(str(error))
    final = result
    while not final.get_response().parameters["triton_final_response"].bool_param:
        _, final, error = got.get(timeout=600)
        if error is not None:
            raise RuntimeError(str(error))
    client.stop_stream()
    first = int(result.as_numpy("first_token_time_ns").reshape(-1)[0])
    arrival = int(result.as_numpy("arrival_time_ns").reshape(-1)[0])
    return {"ttft_client_s": first_at - start, "ttft_engine_s": (first - arrival) / 1e9,
            "reused_blocks": int(result.as_numpy("kv_cache_reused_blocks").reshape(-1)[0]), "tokens": len(ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompt", type=int, default=1500, help="tokens of the first turn's prompt")
    parser.add_argument("--turn", type=int, default=30, help="tokens the second turn adds")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    tok = Tokenizer.from_file(str(REPO / "models" / MODEL / "tokenizer.json"))
    rows: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": [], "cold same size": []}
    with EmbeddedTriton(REPO / "triton_models", models=[MODEL], models_dir=REPO / "models") as triton:
        client = grpcclient.InferenceServerClient(triton.grpc_url)
        infer(client, prompt_ids(tok, 64))  # first request pays one-time set-up
        for _ in range(args.rounds):
            first = prompt_ids(tok, args.prompt)
            turn = prompt_ids(tok, args.turn + 8)[8:]  # no nonce in the turn: just new tokens
            rows["cold"].append(infer(client, first))
            rows["warm"].append(infer(client, first + turn))
            rows["cold same size"].append(infer(client, prompt_ids(tok, args.prompt + args.turn)))
    print("| request | prompt tokens | reused blocks | TTFT client (median s) | TTFT engine (median s) |")
    print("|---|---:|---:|---:|---:|")
    for name, runs in rows.items():
        print(f"| {name} | {runs[0]['tokens']} | {statistics.median(r['reused_blocks'] for r in runs):.0f} | "
              f"{statistics.median(r['ttft_client_s'] for r in runs):.3f} | "
              f"{statistics.median(r['ttft_engine_s'] for r in runs):.3f} |")
    print("all runs:", {k: [round(r["ttft_client_s"], 3) for r in v] for k, v in rows.items()})


if __name__ == "__main__":
    main()
