"""Gateway CPU of the Messages API against the chat API on the same model and prompts, side by side, in-process.

``.venv/bin/python -m bench.messages_cpu [--reps 6] [--out bench/results/messages-cpu-DATE.json]``
``.venv/bin/python -m bench.messages_cpu --instructions``  (machine instructions under callgrind instead)
``.venv/bin/python -m bench.messages_cpu --root /tmp/other``  (another checkout's ``openai_api``, e.g. a commit
``git archive``d there with ``models/`` linked in: the children import it and record its path)

Issue #25 asks that Messages cost no more gateway CPU per token than chat: it is a dialect at the HTTP edge
over the same chat service, so what it adds is its own request mapping (``http.dialects.anthropic_messages.parse``),
its event encoder (``http.dialects.anthropic_events.MessagesStreamEncoder``, ``BlockBuilder``), the ping relay
(``with_pings``) and its bigger events. This measures exactly that pipeline for both dialects in one process:
the request body validated (``ChatCompletionRequest`` / ``MessagesRequest`` + ``parse``), the service's
``create``, and every byte of the SSE stream (or the unary answer dumped as the route does), over a
scripted backend that yields the synthetic model's tokens one per chunk (the ids of " The quick brown
fox jumps over the lazy dog", cycled), with the bundled ``smollm2-135m-instruct`` entry (SmolLM2
tokenizer and template). No HTTP, no gRPC (the same for both dialects: their difference is above them).

Cases per dialect: ``stream`` (512 tokens streamed), ``short`` (16 tokens streamed: mostly the request's
own cost) and ``unary`` (16 tokens, not streamed); the summary adds the marginal per-token cost
((stream - short) / 496 per request) and the per-request overhead. Each repetition is a fresh child process
(``--child``) that runs every case of both dialects, the dialect that goes first alternating by case and
repetition, after a warm-up; the messages/chat ratios are paired per repetition (same neighbours on a
shared box). ``--instructions``: each case under callgrind at ``--streams`` and 3x as many requests, the
difference in instructions over the difference in tokens (requests): load-independent.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import dataclasses
import datetime as dt
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any

MODEL = "smollm2-135m-instruct"
SENTENCE = " The quick brown fox jumps over the lazy dog"
SHORT = 16
PROMPT = "Tell me a long story about a quick brown fox."
CASES = ("stream", "short", "unary")
DIALECTS = ("chat", "messages")
REPO = Path(__file__).resolve().parents[1]


def child(streams: int, tokens: int, cases: tuple[str, ...], dialects: tuple[str, ...],
          profile: Path | None = None) -> dict[str, Any]:
    """Runs in a fresh interpreter: CPU per token (stream) or per request (short, unary) of each dialect."""
    import orjson

    from openai_api.config import BUNDLED_CONFIG, load_config
    from openai_api.http.dialects.anthropic_messages import parse

    try:  # the dialects encode the services' prepared streams (from issue #37's last step); before, the services did
        from openai_api.http.dialects.anthropic_messages import encode as encode_messages
        from openai_api.http.dialects.openai_chat import encode as encode_chat
    except ImportError:
        def encode_messages(out: Any) -> Any:  # type: ignore[misc]
            return out

        def encode_chat(out: Any) -> Any:  # type: ignore[misc]
            return out
    from openai_api.observability import Metrics
    from openai_api.schemas.anthropic import MessagesRequest
    from openai_api.schemas.openai import ChatCompletionRequest
    from openai_api.services.chat import ChatService
    from openai_api.services.context import RequestContext
    from openai_api.services.messages import MessagesService
    from openai_api.services.preprocess import Preprocessor
    from openai_api.services.registry import ModelRegistry
    from openai_api.text.workers import CPUWorkers
    from openai_api.triton.client import TritonClientPool
    from openai_api.triton.llm import GUIDE_KINDS, GenerationChunk, GenerationRequest

    data = json.loads(BUNDLED_CONFIG.read_text(encoding="utf-8"))
    entry = next(dict(e) for e in data["llm"] if e.get("name") == MODEL)
    entry["path"] = str((BUNDLED_CONFIG.parent / entry["path"]).resolve())
    entry["chat_template"] = str((BUNDLED_CONFIG.parent / entry["chat_template"]).resolve())
    entry.pop("adapters_dir", None)  # no adapters: this compares dialects
    entry.pop("adapters", None)
    infos = [i for i in data.get("model_infos", []) if i.get("name") == MODEL]
    folder = Path(tempfile.mkdtemp(prefix="messages-cpu-"))
    (folder / "model_config.json").write_text(json.dumps({"model_infos": infos, "llm": [entry]}))
    config = load_config(folder / "model_config.json")
    registry = ModelRegistry(config, TritonClientPool(), Metrics())
    rt0 = registry.llm(MODEL)
    ids = rt0.tokenizer.encode(SENTENCE * (tokens // 9 + 1))[:tokens]
    assert len(ids) == tokens

    class Scripted:
        model = MODEL
        protocol = "tensorrt_llm"
        guide_kinds = GUIDE_KINDS

        def supports(self, param: str) -> bool:
            return param != "images"

        async def check(self) -> None:
            return None

        async def generate(self, request: GenerationRequest) -> AsyncGenerator[GenerationChunk, None]:
            for i in ids[: request.max_tokens]:  # as Triton honours request_output_len
                yield GenerationChunk(token_ids=[i])

    rt = dataclasses.replace(rt0, backend=Scripted())
    reg = copy.copy(registry)
    reg.llms = {rt.name: rt}
    chat = ChatService(reg, Preprocessor(CPUWorkers(1)))
    messages = MessagesService(chat)

    async def one_chat(body: dict[str, Any]) -> int:
        req = ChatCompletionRequest.model_validate(body)
        out = await chat.create(req, RequestContext("rid"))
        if isinstance(out, dict):
            orjson.dumps(out)  # as the route answers it
            return int(out["usage"]["completion_tokens"])
        n = 0
        async for chunk in encode_chat(out):  # as the chat dialect writes it
            n += chunk.count(b'"delta":{"content":')
        return n

    async def one_messages(body: dict[str, Any]) -> int:
        req = MessagesRequest.model_validate(body)
        out = await messages.create(parse(req, messages), RequestContext("rid"))
        if isinstance(out, dict):
            orjson.dumps(out)
            return int(out["usage"]["output_tokens"])
        n = 0
        async for chunk in encode_messages(out):  # as the Messages dialect writes it
            n += chunk.count(b'"type":"text_delta"')
        return n

    async def measure(dialect: str, case: str) -> dict[str, Any]:
        n = tokens if case == "stream" else SHORT
        # The same body is a valid chat and a valid Messages request (a string content, max_tokens, stream).
        b = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": n,
             "stream": case != "unary"}
        one = one_chat if dialect == "chat" else one_messages
        got = 0
        for _ in range(5):
            got = await one(b)
        if got != n:
            raise RuntimeError(f"{dialect} {case}: {got} text events for {n} tokens")
        count = streams if case == "stream" else streams * tokens // (4 * n)  # short requests: more of them
        prof = None
        if profile is not None:  # not counted: cProfile slows it severalfold
            import cProfile

            prof = cProfile.Profile()
            prof.enable()
        c0, w0 = time.process_time(), time.perf_counter()
        for _ in range(count):
            await one(b)
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        if prof is not None:
            prof.disable()
            prof.dump_stats(f"{profile}-{dialect}-{case}.prof")
        return {"cpu_us_per_token": round(cpu * 1e6 / (count * n), 2),
                "cpu_us_per_request": round(cpu * 1e6 / count, 1),
                "wall_us_per_token": round(wall * 1e6 / (count * n), 2), "count": count}

    async def run() -> dict[str, Any]:
        out: dict[str, Any] = {d: {} for d in dialects}
        order = list(dialects)
        for case in cases:
            for d in order:
                out[d][case] = await measure(d, case)
            order.reverse()  # the next case starts with the other dialect
        return out

    import openai_api

    return {"openai_api": openai_api.__file__, **asyncio.run(run())}


def _child_cmd(streams: int, tokens: int, cases: str, dialects: str) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--child", "--streams", str(streams), "--tokens",
            str(tokens), "--cases", cases, "--dialects", dialects]


ROOT = REPO  # the checkout whose openai_api the children import (--root)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "LOG_LEVEL": "WARNING"}


def instructions(a: argparse.Namespace) -> dict[str, Any]:
    """Instructions per token (stream) or per request (short, unary) of each dialect under callgrind: each
    case at `--streams` and 3x as many requests, the difference divided by the difference in units."""
    out: dict[str, Any] = {d: {} for d in DIALECTS}
    for case in a.cases.split(","):
        got: dict[str, list[tuple[int, int]]] = {d: [] for d in DIALECTS}
        for streams in (a.streams, 3 * a.streams):
            with tempfile.TemporaryDirectory() as tmp:
                # One dialect per child under callgrind: the whole process's count is that dialect's.
                for d in DIALECTS:
                    cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/cg-{d}.out",
                           *_child_cmd(streams, a.tokens, case, d)]
                    done = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True)
                    if done.returncode != 0:
                        raise RuntimeError(f"{d} {case}: {done.stderr[-2000:]}")
                    ir = int(next(ln for ln in done.stderr.splitlines() if "Collected :" in ln).split(":")[-1])
                    r = json.loads(done.stdout.strip().splitlines()[-1])
                    units = r[d][case]["count"] * (a.tokens if case == "stream" else 1)
                    got[d].append((ir, units))
        for d in DIALECTS:
            (ir1, u1), (ir2, u2) = got[d]
            out[d][case] = round((ir2 - ir1) / (u2 - u1))
            unit = "token" if case == "stream" else "request"
            print(f"{d} {case}: {out[d][case]:,} instructions per {unit}", flush=True)
    for case in out["chat"]:
        out[f"messages_over_chat_{case}"] = round(out["messages"][case] / out["chat"][case], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=6)
    p.add_argument("--streams", type=int, default=40)
    p.add_argument("--tokens", type=int, default=512)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--out", type=Path)
    p.add_argument("--instructions", action="store_true", help="count instructions under callgrind instead of timing")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dialects", default=",".join(DIALECTS), help=argparse.SUPPRESS)
    p.add_argument("--profile", type=Path, help="with --child: cProfile each case to PROFILE-<dialect>-<case>.prof")
    p.add_argument("--root", type=Path, default=REPO,
                   help="the checkout whose openai_api is measured (default this one; another commit: git archive it "
                        "and link models/ in)")
    a = p.parse_args(argv)
    global ROOT
    ROOT = a.root.resolve()
    if a.child:
        print(json.dumps(child(a.streams, a.tokens, tuple(a.cases.split(",")), tuple(a.dialects.split(",")),
                               a.profile)))
        return 0
    meta = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "streams": a.streams, "tokens": a.tokens,
            "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                     text=True).stdout.strip(), "root": str(ROOT), "cpus": os.cpu_count()}
    if a.instructions:
        result = {"instructions": instructions(a), **meta}
        print(json.dumps(result, indent=1))
        if a.out is not None:
            a.out.write_text(json.dumps(result, indent=1) + "\n")
        return 0
    runs: list[dict[str, Any]] = []
    for rep in range(a.reps):
        order = DIALECTS if rep % 2 == 0 else DIALECTS[::-1]
        done = subprocess.run(_child_cmd(a.streams, a.tokens, a.cases, ",".join(order)), cwd=ROOT, env=_env(),
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        r = json.loads(done.stdout.strip().splitlines()[-1])
        r["rep"], r["loadavg_1m"] = rep, round(os.getloadavg()[0], 2)
        runs.append(r)
        print(f"rep {rep}: " + ", ".join(
            f"{d} stream {r[d]['stream']['cpu_us_per_token']} us/token short {r[d]['short']['cpu_us_per_request']} "
            f"us/request unary {r[d]['unary']['cpu_us_per_request']} us/request" for d in DIALECTS)
            + f" (load {r['loadavg_1m']})", flush=True)
    unit = {"stream": "cpu_us_per_token", "short": "cpu_us_per_request", "unary": "cpu_us_per_request"}
    summary: dict[str, Any] = {}
    for d in DIALECTS:
        summary[d] = {c: statistics.median(r[d][c][unit[c]] for r in runs) for c in CASES}
        marg = [(r[d]["stream"]["cpu_us_per_request"] - r[d]["short"]["cpu_us_per_request"]) / (a.tokens - SHORT)
                for r in runs]
        summary[d]["marginal_us_per_token"] = round(statistics.median(marg), 2)
        summary[d]["request_overhead_us"] = round(statistics.median(
            r[d]["short"]["cpu_us_per_request"] - SHORT * m for r, m in zip(runs, marg, strict=True)), 1)
    for c in CASES:
        pairs = [r["messages"][c][unit[c]] / r["chat"][c][unit[c]] for r in runs]
        summary[f"messages_over_chat_{c}"] = {"paired": [round(x, 3) for x in pairs],
                                             "median": round(statistics.median(pairs), 3)}
    result = {"summary": summary, "runs": runs, **meta}
    print(json.dumps(summary, indent=1))
    if a.out is not None:
        a.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
