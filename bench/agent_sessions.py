"""Coding-agent sessions through the gateway: CPU and added latency per turn as the conversation grows, with the
prompt cache off and on, one and two workers (issue #36 item 4).

``.venv/bin/python -m bench.agent_sessions [--quick] [--cases sessions,short,profile] [--out PATH]``

What runs: one tritonserver (``synthetic-llm``: the TensorRT-LLM interface, no model maths, so what is measured
is the gateway's own work), and four gateways as processes of their own (``openai_api_cli.py``, the bench's
model config with the synthetic model's context raised to 262,144 tokens): ``--workers 1`` and ``--workers 2``,
each with ``--prompt-cache-mb 0`` (no prompt cache: every turn tokenized whole, the behaviour before it) and
with the default (128). Cases:

* ``sessions``: replayed sessions (``bench.agent_traffic``): Claude Code over ``/v1/messages`` and Codex over
  ``/v1/responses``, 26 turns of ~4,500 new tokens of source text each (to ~117k tokens), non-streamed,
  ``max_tokens`` 1. Every turn goes to each gateway in a rotating order (the same bytes), then the bare gRPC
  client sends the same token ids to Triton (``bench.limit.RpcLLM`` in a process of its own, 1 + 3 requests,
  the median): *added wall* = the gateway's wall minus that, at the same turn. Per request: the gateway's CPU
  (every thread of every one of its processes, ``/proc/<pid>/task/*/schedstat``, nanoseconds: psutil's
  ``cpu_times`` counts 10 ms ticks, too coarse for one request) from just before the request to 20 ms after
  its answer, the wall, ``usage``'s prompt and cached tokens, and with two workers which worker served it.
  Connections: one keep-alive connection per session (``-keep``), and with two workers also a new connection
  per turn (``-new``: the kernel spreads new connections over the workers, so a turn may land on the worker
  that has not seen the session). Each repetition replays new sessions (the corpus read on), so no session is
  ever in a cache before its first turn. With ``--sessions-base COMMIT``, the gateway of that commit (exported
  as for ``short``, ``--workers 1``, cache on, keep-alive: arm ``b1-on-keep``) gets every turn too, in the same
  rotation: old and new side by side in one run, on the same bytes. Also, once per repetition, a Claude Code
  session with its billing header fixed for the session (what stripping it, issue #36 item 2, would give the
  prompt cache), and a streamed session per dialect (time to the first text event). ``--reps N`` sets the
  repetitions (default 3).
* ``short``: the bench's own short chat (41 tokens as templated), 16 tokens out, non-streamed: CPU per request
  of this checkout's gateway and of the commit before the prompt cache (``--base``, default 2bfb556, exported
  with ``git archive`` to a temporary folder with ``models/`` linked in), both up together on the same Triton,
  rounds alternating which side goes first (as ``bench.relay_ab``).
* ``profile``: where a turn's CPU goes, in this process (``bench.agent_inprocess``): each stage's CPU and the
  whole ASGI app's at a ~9k and the last turn of the first repetition's sessions, cache on and off, set against
  the gateway's own CPU at those turns; cProfile (CPU clock) of the last three turns with the cache on.

Writes ``bench/results/agent-sessions-<date>[-quick].{json,md}`` (``bench.agent_results`` renders the markdown
and judges issue #36's targets). Nothing here asserts timings.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import datetime as dt
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from bench import agent_results
from bench.agent_traffic import Corpus, SessionShape, claude_code_session, codex_session, stdlib_files
from bench.load import HTTPConnection
from bench.stack import REPO, SMOLLM_TOKENIZER, SYNTHETIC, Gateway, gateway_config, has_flag

RESULTS = REPO / "bench" / "results"
BASE_COMMIT = "2bfb556"
CONTEXT = 262_144
SETTLE_S = 0.02
# The bench's own short chat (bench.run's latency case, the "about 1.1 ms here"): 41 tokens as templated.
SHORT_PROMPT = "Tell me a long story about a quick brown fox."
# Without the prompt cache a connection's worker does not matter, so `--workers 2` without it runs keep-alive only.
ARMS = ("w1-off-keep", "w1-on-keep", "w2-off-keep", "w2-on-keep", "w2-on-new")
# The gateways, by the arm's first two words; the new-connection arms of `--workers 2` get gateways of their own
# (`w2n-`), since a turn their keep-alive twins had just sent would be in the serving worker's cache.
GATEWAYS = {"w1-off": ["--workers", "1", "--prompt-cache-mb", "0"], "w1-on": ["--workers", "1"],
            "w2-off": ["--workers", "2", "--prompt-cache-mb", "0"], "w2-on": ["--workers", "2"],
            "w2n-on": ["--workers", "2"]}
# The base commit's gateway (`--sessions-base`) and its arm.
BASE_GATEWAY = "b1-on"
BASE_ARM = "b1-on-keep"
# The first text event of a streamed answer, per dialect.
TEXT_EVENT = {"claude_code": b'"text_delta"', "codex": b"response.output_text.delta"}


@dataclass
class Sizes:
    """--quick for a smoke run (~3-5 min); full for the committed figures."""

    turns: int
    reps: int
    limit_requests: int
    short_rounds: int
    short_requests: int
    tokens_per_turn: int = 4500
    system_tokens: int = 3000

    @classmethod
    def of(cls, quick: bool) -> Sizes:
        return cls(turns=6, reps=1, limit_requests=2, short_rounds=2, short_requests=60) if quick else \
            cls(turns=26, reps=3, limit_requests=3, short_rounds=10, short_requests=400)


@dataclass
class Turn:
    turn: int
    path: str
    headers: dict[str, str]
    body: bytes
    ids: list[int]


def gateway_of(arm: str) -> str:
    """The gateway an arm is sent to: ``w2-on-new`` -> ``w2n-on``."""
    workers, cache, conn = arm.split("-")[:3]
    return f"{workers}{'n' if conn == 'new' else ''}-{cache}"


def cpu_ns(pids: list[int]) -> dict[int, int]:
    """CPU time so far of each process, summed over its live threads (``/proc/<pid>/task/<tid>/schedstat``, first
    field: nanoseconds on a CPU, user and system)."""
    out: dict[int, int] = {}
    for pid in pids:
        total = 0
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
        out[pid] = total
    return out


def psutil_cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds so far of the processes, as psutil reads them (in clock ticks)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(pid).cpu_times()
            total += t.user + t.system
    return total


def usage_of(dialect: str, body: bytes) -> dict[str, int | None]:
    """prompt_tokens and cached_tokens as the answer's usage states them (a streamed answer: its last usage).
    Anthropic's input_tokens leaves out the tokens read from or written to its cache, so its prompt is the
    sum of the three."""
    def last(key: str) -> int | None:
        found = re.findall(rb'"' + key.encode() + rb'":(\d+)', body)
        return int(found[-1]) if found else None

    inp = last("input_tokens")
    if dialect == "claude_code":
        read, made = last("cache_read_input_tokens"), last("cache_creation_input_tokens")
        prompt = None if inp is None else inp + (read or 0) + (made or 0)
        return {"prompt_tokens": prompt, "cached_tokens": read, "cache_creation_tokens": made}
    return {"prompt_tokens": inp, "cached_tokens": last("cached_tokens"), "cache_creation_tokens": None}


class LimitChild:
    """The bare client (``RpcLLM``, the gateway's own gRPC code) in a process of its own, asked per turn."""

    def __init__(self, url: str, end_id: int, pad_id: int) -> None:
        self.cmd = [sys.executable, "-m", "bench.agent_sessions", "--limit-child", "--url", url, "--end-id",
                    str(end_id), "--pad-id", str(pad_id)]
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *self.cmd, cwd=REPO, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        line = await asyncio.wait_for(self._line(), 180)
        if line != "ready":
            raise RuntimeError(f"limit child did not start: {line!r}")

    async def _line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        return (await self.proc.stdout.readline()).decode().strip()

    async def ask(self, command: str) -> str:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(command.encode() + b"\n")
        await self.proc.stdin.drain()
        return await asyncio.wait_for(self._line(), 300)

    async def load(self, path: Path) -> None:
        if await self.ask(f"load {path}") != "ok":
            raise RuntimeError("limit child could not load the prompts")

    async def run(self, index: int, n: int) -> tuple[list[float], float]:
        """The wall ms of each of ``n`` requests of prompt ``index``, and the client's CPU ms per request (the
        request built once, as ``RpcLLM`` resends it: its gRPC exchange)."""
        out = json.loads(await self.ask(f"run {index} {n}"))
        if out.get("error"):
            raise RuntimeError(f"limit child: {out['error']}")
        return [float(x) for x in out["ms"]], float(out["cpu_ms"])

    async def close(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(Exception):
                await self.ask("quit")
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


async def limit_child_main(a: argparse.Namespace) -> None:
    """The child side: ``load PATH`` (a JSON list of prompts' ids) -> ``ok``; ``run I N`` -> one JSON line, the
    ms of N non-streamed 1-token requests of prompt I after one untimed; ``quit``."""
    from bench.limit import RpcLLM

    llm = RpcLLM(a.url, SYNTHETIC, [1, 2, 3], a.end_id, a.pad_id)
    prompts: list[list[int]] = []
    try:
        await llm.generate(1, streaming=False)
        print("ready", flush=True)
        loop = asyncio.get_running_loop()
        while True:
            line = (await loop.run_in_executor(None, sys.stdin.readline)).split()
            if not line or line[0] == "quit":
                return
            if line[0] == "load":
                prompts = json.loads(Path(line[1]).read_text())
                print("ok", flush=True)
                continue
            llm.use_prompt(prompts[int(line[1])])
            ms: list[float] = []
            try:
                for i in range(int(line[2]) + 1):
                    if i == 1:
                        c0 = time.process_time()
                    t0 = time.perf_counter()
                    got = await llm.generate(1, streaming=False)
                    if got != 1:
                        raise RuntimeError(f"{got} tokens for 1")
                    if i:
                        ms.append((time.perf_counter() - t0) * 1e3)
                cpu = (time.process_time() - c0) * 1e3 / max(len(ms), 1)
                print(json.dumps({"ms": ms, "cpu_ms": cpu}), flush=True)
            except Exception as e:  # noqa: BLE001 - reported to the parent
                print(json.dumps({"error": f"{type(e).__name__}: {e}"[:500]}), flush=True)
    finally:
        await llm.close()


class AgentBench:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.sizes = Sizes.of(a.quick)
        if a.reps:
            self.sizes.reps = a.reps
        self.workdir = Path(tempfile.mkdtemp(prefix="bench-agents-"))
        self.triton: Any = None
        self.extra_repo: Path | None = None
        self.gws: dict[str, Gateway] = {}
        self.pids: dict[str, list[int]] = {}
        self.records: list[dict[str, Any]] = []
        self.cpu_checks: list[dict[str, Any]] = []
        self.failures: list[dict[str, str]] = []
        self.loads: list[float] = []
        self.first_sessions: dict[str, list[Turn]] = {}
        self.meta: dict[str, Any] = {}

    def log(self, msg: str) -> None:
        print(f"[agents {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    def fail(self, case: str, exc: BaseException) -> None:
        self.log(f"{case} FAILED: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        self.failures.append({"case": case, "error": f"{type(exc).__name__}: {exc}"[:2000]})

    # ------------------------------------------------------------------ set-up
    def config(self) -> dict[str, Any]:
        cfg = gateway_config(self.triton.grpc_url, self.triton.http_url)
        for info in cfg["model_infos"]:
            info["max_len"] = CONTEXT  # the synthetic model has no position limit; sessions reach ~120k tokens
        return cfg

    async def start(self) -> None:
        from bench.agent_inprocess import InProcessGateway
        from bench.run import SLOW_DELAY_MS
        from bench.stack import start_triton
        from openai_api.text.tokenizer import TextTokenizer

        if not has_flag("--prompt-cache-mb"):
            raise RuntimeError("this gateway has no --prompt-cache-mb flag (python openai_api_cli.py --help)")
        self.log("starting tritonserver")
        self.triton, self.extra_repo = await asyncio.to_thread(start_triton, SLOW_DELAY_MS, False)
        cfg = self.config()
        self.config_path = self.workdir / "agents-config.json"
        self.config_path.write_text(json.dumps(cfg))
        for name, flags in GATEWAYS.items():  # one at a time: a start is CPU-bound and the box is small
            gw = Gateway(cfg, self.workdir, extra_args=flags, name=f"gateway-{name}")
            await asyncio.to_thread(gw.start)
            self.gws[name] = gw
            await asyncio.sleep(1.0)
            self.pids[name] = [p.pid for p in gw.processes()]
            self.log(f"gateway {name} ({' '.join(flags)}): pids {self.pids[name]}")
        if self.a.sessions_base:
            from bench.relay_ab import CheckoutGateway

            self.base_root = self.base_checkout(self.a.sessions_base)
            gw = CheckoutGateway(self.base_root, cfg, self.workdir, "gateway-base")  # --workers 1, cache on
            await asyncio.to_thread(gw.start)
            self.gws[BASE_GATEWAY] = gw
            await asyncio.sleep(1.0)
            self.pids[BASE_GATEWAY] = [p.pid for p in gw.processes()]
            self.log(f"gateway {BASE_GATEWAY} ({self.a.sessions_base}): pids {self.pids[BASE_GATEWAY]}")
        self.tok = TextTokenizer.from_folder(SMOLLM_TOKENIZER)
        end_id = self.tok.eos_token_ids[0]
        pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else end_id
        self.limit = LimitChild(self.triton.grpc_url, end_id, pad_id)
        await self.limit.start()
        self.inproc = InProcessGateway(self.config_path, SYNTHETIC)
        files = stdlib_files()
        raw = self.tok.tokenizer

        def count(texts: list[str]) -> list[int]:
            return [len(e.ids) for e in raw.encode_batch(texts, add_special_tokens=False)]

        # Claude Code reads every other file of the standard library, Codex the others: no text is shared.
        self.corpus = {"claude_code": Corpus.from_paths(files[0::2], count, numbered=True),
                       "codex": Corpus.from_paths(files[1::2], count, numbered=False)}
        self.prose = [t for _, t in self.corpus["claude_code"].files[:200]]
        await self.warm_up(files[-40:], count)
        self.idle = {name: await self.idle_cpu(name) for name in self.gws}
        self.log(f"idle gateway CPU (ms per s): {self.idle}")

    async def warm_up(self, files: list[Path], count: Any) -> None:
        """A short session of each dialect through every gateway, each turn sent 4 times on new connections (so
        both of two workers see it), from files the measured sessions never reach: first-request costs (template
        compilation, the tokenizer's tables, pydantic's first validations) are paid before anything is timed."""
        shape = SessionShape(turns=3, tokens_per_turn=1500, system_tokens=self.sizes.system_tokens)
        bodies = []
        for dialect, numbered in (("claude_code", True), ("codex", False)):
            corpus = Corpus.from_paths(files, count, numbered=numbered)
            gen = claude_code_session if dialect == "claude_code" else codex_session
            bodies += [(r.path, r.headers, r.encoded()) for r in gen(corpus, self.prose, shape, "warm-up")]
        for gw in self.gws.values():
            for path, headers, body in bodies:
                for _ in range(4):
                    conn = HTTPConnection("127.0.0.1", gw.port)
                    try:
                        status, answer = await conn.post_body(path, body, headers)
                    finally:
                        conn.close()
                    if status != 200:
                        raise RuntimeError(f"warm-up {path}: HTTP {status} {answer[:300]!r}")

    async def idle_cpu(self, name: str, seconds: float = 2.0) -> float:
        c0 = sum(cpu_ns(self.pids[name]).values())
        await asyncio.sleep(seconds)
        return round((sum(cpu_ns(self.pids[name]).values()) - c0) / 1e6 / seconds, 3)

    async def stop(self) -> None:
        if getattr(self, "limit", None) is not None:
            await self.limit.close()
        for gw in self.gws.values():
            gw.stop()
        if self.triton is not None:
            self.triton.stop()
        if getattr(self, "base_root", None) is not None:
            shutil.rmtree(self.base_root, ignore_errors=True)
        if self.extra_repo is not None:
            shutil.rmtree(self.extra_repo, ignore_errors=True)

    # ------------------------------------------------------------------ sessions
    async def session(self, dialect: str, rep: int, variant: str = "") -> list[Turn]:
        """A new session's turns: the bodies, and the token ids the gateway sends for each (in-process)."""
        stream = variant == "stream"
        shape = SessionShape(turns=self.sizes.turns, tokens_per_turn=self.sizes.tokens_per_turn,
                             system_tokens=self.sizes.system_tokens)
        seed = f"{dialect}:{rep}:{variant}"
        if dialect == "claude_code":
            gen = claude_code_session(self.corpus[dialect], self.prose, shape, seed, stable_billing=variant == "stable")
        else:
            gen = codex_session(self.corpus[dialect], self.prose, shape, seed)
        turns = []
        for r in gen:
            body = r.encoded()
            ids = await self.inproc.prompt_ids(r.path, body)
            if stream:
                body = json.dumps({**r.body, "stream": True}, ensure_ascii=False, separators=(",", ":")).encode()
            turns.append(Turn(r.turn, r.path, r.headers, body, ids))
        return turns

    async def request(self, arm: str, dialect: str, t: Turn, conn: HTTPConnection | None) -> dict[str, Any]:
        name = gateway_of(arm)
        gw, pids = self.gws[name], self.pids[name]
        own = conn or HTTPConnection("127.0.0.1", gw.port)
        marker = TEXT_EVENT[dialect]
        first: list[float] = []

        def on_chunk(c: bytes) -> None:
            if not first and marker in c:
                first.append(time.perf_counter())

        opened = own.opened
        c0 = cpu_ns(pids)
        t0 = time.perf_counter()
        try:
            status, body = await own.post_body(t.path, t.body, t.headers, on_chunk)
        except (asyncio.IncompleteReadError, ConnectionError):
            # The server closed the keep-alive connection as the request went out (its idle timeout): as HTTP
            # clients do, send it again on a new connection (the gateway read nothing of the first).
            c0 = cpu_ns(pids)
            t0 = time.perf_counter()
            status, body = await own.post_body(t.path, t.body, t.headers, on_chunk)
        finally:
            wall = time.perf_counter() - t0
            if conn is None:
                own.close()
        await asyncio.sleep(SETTLE_S)
        c1 = cpu_ns(pids)
        deltas = {p: c1[p] - c0.get(p, c1[p]) for p in c1}
        rec: dict[str, Any] = {"dialect": dialect, "arm": arm, "turn": t.turn, "status": status,
                               "wall_ms": round(wall * 1e3, 3), "cpu_ms": round(sum(deltas.values()) / 1e6, 3),
                               "ids": len(t.ids), "loadavg": round(os.getloadavg()[0], 2)}
        if conn is not None and own.opened > opened and opened:
            rec["reconnected"] = True  # the gateway had closed the idle keep-alive connection
        if first:
            rec["ttft_ms"] = round((first[0] - t0) * 1e3, 3)
        if status == 200:
            rec.update(usage_of(dialect, body))
        else:
            rec["error"] = body[:300].decode(errors="replace")
        workers = sorted(pids[1:])
        if len(workers) > 1:
            served = max(workers, key=lambda p: deltas.get(p, 0))
            rec["worker"] = workers.index(served)
        return rec

    async def replay(self, dialect: str, rep: int, turns: list[Turn], arms: tuple[str, ...]) -> None:
        """Each turn to every arm (rotating which goes first), then the bare client on the same ids."""
        path = self.workdir / f"prompts-{dialect}-{rep}.json"
        path.write_text(json.dumps([t.ids for t in turns]))
        await self.limit.load(path)
        keep = {arm: HTTPConnection("127.0.0.1", self.gws[gateway_of(arm)].port) for arm in arms if "-keep" in arm}
        names = sorted({gateway_of(arm) for arm in arms})
        before = {n: (psutil_cpu_s(self.pids[n]), sum(cpu_ns(self.pids[n]).values()) / 1e9) for n in names}
        try:
            for i, t in enumerate(turns):
                order = arms[i % len(arms):] + arms[:i % len(arms)]
                recs = []
                for arm in order:
                    rec = await self.request(arm, dialect, t, keep.get(arm))
                    rec["rep"] = rep
                    recs.append(rec)
                samples, limit_cpu = await self.limit.run(i, self.sizes.limit_requests)
                limit_ms = round(statistics.median(samples), 3)
                for rec in recs:
                    rec["limit_ms"], rec["limit_cpu_ms"] = limit_ms, round(limit_cpu, 3)
                    if rec["status"] == 200:
                        rec["added_ms"] = round(rec["wall_ms"] - limit_ms, 3)
                    if rec.get("prompt_tokens") not in (None, len(t.ids)):
                        rec["ids_mismatch"] = True
                self.records += recs
                self.loads.append(os.getloadavg()[0])
                brief = ", ".join(f"{r['arm']} {r['cpu_ms']:.0f}/{r['wall_ms']:.0f}" for r in recs)
                bad = [r for r in recs if r["status"] != 200]
                self.log(f"{dialect} rep {rep} turn {t.turn} ({len(t.ids):,} ids): CPU/wall ms {brief}; "
                         f"bare {limit_ms:.1f} ms" + (f"; FAILED {bad[0].get('error')}" if bad else ""))
        finally:
            for c in keep.values():
                c.close()
            path.unlink(missing_ok=True)  # ~10 MB of ids a session; the limit child has read them
        # The per-request figures sum live threads' schedstat; psutil's totals (10 ms ticks, exited threads
        # included) over the whole session should agree with their sum.
        for n in names:
            ps, ss = psutil_cpu_s(self.pids[n]), sum(cpu_ns(self.pids[n]).values()) / 1e9
            self.cpu_checks.append({"dialect": dialect, "rep": rep, "gateway": n, "arms": list(arms),
                                    "psutil_s": round(ps - before[n][0], 3),
                                    "schedstat_s": round(ss - before[n][1], 3)})

    async def case_sessions(self) -> None:
        for rep in range(self.sizes.reps):
            for dialect in ("claude_code", "codex"):
                turns = await self.session(dialect, rep)
                if rep == 0:
                    self.first_sessions[dialect] = turns
                await self.replay(dialect, rep, turns, ARMS + ((BASE_ARM,) if self.a.sessions_base else ()))
            await self.replay("claude_code", rep, await self.session("claude_code", rep, "stable"),
                              ("w1-on-keep-stable",))
            # Streamed sessions in every repetition too: with one, its ratio rested on two single turns.
            for dialect in ("claude_code", "codex"):
                await self.replay(dialect, rep, await self.session(dialect, rep, "stream"),
                                  ("w1-off-keep-stream", "w1-on-keep-stream"))

    # ------------------------------------------------------------------ short requests, HEAD vs base
    def base_checkout(self, commit: str) -> Path:
        root = Path(tempfile.mkdtemp(prefix="bench-agents-base-"))
        archive = subprocess.run(["git", "archive", commit], cwd=REPO, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True)
        (root / "models").symlink_to(REPO / "models")
        return root

    async def case_short(self) -> dict[str, Any]:
        from bench.relay_ab import CheckoutGateway

        base = self.base_checkout(self.a.base)
        sides = {"base": base, "head": REPO}
        gws: dict[str, CheckoutGateway] = {}
        body = json.dumps({"model": SYNTHETIC, "messages": [{"role": "user", "content": SHORT_PROMPT}],
                           "max_tokens": 16}).encode()
        rounds: list[dict[str, Any]] = []
        out: dict[str, Any] = {"base_commit": self.a.base, "rounds": rounds}
        try:
            for name, root in sides.items():
                cfg = self.config()
                # The templates moved into the package (openai_api/chat_templates/); older checkouts keep them at
                # the root.
                template = next(p for p in (root / "openai_api" / "chat_templates" / "smollm2.jinja",
                                            root / "chat_templates" / "smollm2.jinja") if p.exists())
                for m in cfg["llm"]:
                    m["chat_template"] = str(template)
                gw = CheckoutGateway(root, cfg, self.workdir, f"short-{name}")
                await asyncio.to_thread(gw.start)
                gws[name] = gw
                out[f"{name}_openai_api"] = gw.imports_from()
            conns = {n: HTTPConnection("127.0.0.1", g.port) for n, g in gws.items()}
            for n, conn in conns.items():  # warm-up, and the prompt's size
                for _ in range(20):
                    status, answer = await conn.post_body("/v1/chat/completions", body)
                    if status != 200:
                        raise RuntimeError(f"{n}: HTTP {status} {answer[:200]!r}")
                u = json.loads(answer)["usage"]
                out["prompt_tokens"], out["completion_tokens"] = u["prompt_tokens"], u["completion_tokens"]
            for rnd in range(self.sizes.short_rounds):
                order = list(sides) if rnd % 2 == 0 else list(sides)[::-1]
                for side in order:
                    pids = [p.pid for p in gws[side].processes()]
                    n = self.sizes.short_requests
                    lat = []
                    c0 = sum(cpu_ns(pids).values())
                    for _ in range(n):
                        t0 = time.perf_counter()
                        status, answer = await conns[side].post_body("/v1/chat/completions", body)
                        lat.append((time.perf_counter() - t0) * 1e3)
                        if status != 200:
                            raise RuntimeError(f"{side}: HTTP {status} {answer[:200]!r}")
                    cpu = (sum(cpu_ns(pids).values()) - c0) / 1e3 / n
                    rounds.append({"side": side, "round": rnd, "requests": n, "cpu_us_per_request": round(cpu, 1),
                                   "p50_ms": round(statistics.median(lat), 3), "loadavg": os.getloadavg()[0]})
                    self.log(f"short round {rnd} {side}: {cpu:.0f} us CPU per request, p50 "
                             f"{statistics.median(lat):.2f} ms")
            for c in conns.values():
                c.close()
        finally:
            for gw in gws.values():
                gw.stop()
            shutil.rmtree(base, ignore_errors=True)
        out.update(agent_results.short_summary(rounds))
        return out

    # ------------------------------------------------------------------ in-process profile
    async def case_profile(self) -> dict[str, Any]:
        from bench.agent_inprocess import InProcessApp, InProcessGateway, profile_top

        out: dict[str, Any] = {"stages": {}, "decomposition": {}, "note": (
            "CPU ms of this process (`time.process_time`, so the tokenizer's own threads count) for the first "
            "repetition's sessions replayed turn by turn into fresh caches (the median of 3 replays with the cache "
            "on, 1 without), worker-thread jobs run inline. Stages "
            "(`bench.agent_inprocess.InProcessGateway.turn_stages`): the route's work from the body's bytes to "
            "the ids as the input_ids tensor's bytes (`tensor`: `wire.encode_tensor`, as the adapter does). "
            "`app`: the whole ASGI app for the same body (`InProcessApp`: every middleware, FastAPI or the JSON "
            "fast path, the route, the answer), without the tensor, uvicorn/httptools and gRPC.")}
        profiles = {}
        for dialect, turns in self.first_sessions.items():
            cells: dict[str, dict[str, Any]] = {}
            lo = min(turns, key=lambda t: abs(len(t.ids) - agent_results.LOW_TOKENS))
            hi = turns[-1]
            # Each a median of replays into fresh caches (3 with the cache on, where a turn costs ~20 ms and one
            # sample is noisy; 1 without it, whose turns cost hundreds of ms).
            for mb, replays in ((128.0, 3), (0.0, 1)):
                samples: dict[str, list[dict[str, float]]] = defaultdict(list)
                for _ in range(replays):
                    g = InProcessGateway(self.config_path, SYNTHETIC, mb)
                    app = InProcessApp(self.config_path, SYNTHETIC, mb)
                    for t in turns:
                        st = await g.turn_stages(t.path, t.body)
                        c0 = time.process_time()
                        status, _ = await app.call(t.path, t.body, t.headers)
                        app_ms = (time.process_time() - c0) * 1e3
                        if status != 200:
                            raise RuntimeError(f"in-process app: HTTP {status} at turn {t.turn}")
                        if t is lo or t is hi:
                            samples[f"{t.turn} cache {'on' if mb else 'off'}"].append({**st, "app": app_ms})
                for label, runs in samples.items():
                    turn = int(label.split()[0])
                    cells[label] = {"prompt_tokens": len(turns[turn - 1].ids), "replays": len(runs),
                                    **{k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}}
            out["stages"][dialect] = dict(sorted(cells.items(), key=lambda kv: (int(kv[0].split()[0]), kv[0])))
            out["decomposition"][dialect] = {
                f"turn {t.turn}": self.decompose(dialect, t.turn, cells[f"{t.turn} cache on"]) for t in (lo, hi)}
            # cProfile's clock is this process's CPU time (its default, the wall clock, counts whatever else
            # the shared machine runs); the last three turns through the whole app, each as it comes, in a fresh
            # cache. cProfile inflates Python-heavy code several-fold: the stages above are the figures.
            app = InProcessApp(self.config_path, SYNTHETIC, 128.0)
            prof = cProfile.Profile(time.process_time)
            for i, t in enumerate(turns):
                if i >= len(turns) - 3:
                    prof.enable()
                await app.call(t.path, t.body, t.headers)
                prof.disable()
            profiles[dialect] = profile_top(prof)
            self.log(f"profile {dialect}: {out['stages'][dialect]}; {out['decomposition'][dialect]}")
        out["cprofile_by_dialect"] = profiles
        if "claude_code" in profiles:
            out["cprofile"] = profiles["claude_code"]
            n = len(self.first_sessions["claude_code"][-3:])
            out["cprofile_what"] = (f"the last {n} Claude Code turns through the whole app, cache on, summed (CPU "
                                    "clock; cProfile inflates Python-heavy code)")
        return out

    def decompose(self, dialect: str, turn: int, cell: dict[str, Any]) -> dict[str, Any]:
        """The gateway's CPU at a turn (``--workers 1``, cache on, median over repetitions) as: the ASGI app in
        process, the input_ids tensor, the bare gRPC client's own CPU for the same ids (its exchange with
        Triton), and the rest (uvicorn/httptools, the event loop, the worker threads' hand-offs)."""
        rs = [r for r in self.records if r["dialect"] == dialect and r["arm"] == "w1-on-keep" and r["turn"] == turn
              and r.get("status") == 200]
        gateway = agent_results.median(r["cpu_ms"] for r in rs)
        grpc = agent_results.median(r.get("limit_cpu_ms") for r in rs)
        out = {"gateway_cpu_ms": gateway, "app_ms": cell["app"], "tensor_ms": cell["tensor"], "grpc_client_ms": grpc,
               "tokenize_ms": cell["tokenize"]}
        if gateway is not None and grpc is not None:
            out["rest_ms"] = round(gateway - cell["app"] - cell["tensor"] - grpc, 3)
        return out

    # ------------------------------------------------------------------ run
    async def run(self) -> dict[str, Any]:
        self.meta = {"started": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "mode": "quick" if
                     self.a.quick else "full", "git": _git(["rev-parse", "--short", "HEAD"]),
                     "dirty": bool(_git(["status", "--porcelain", "--untracked-files=no"])),
                     "cpus": os.cpu_count(), "python": platform.python_version(), "turns": self.sizes.turns,
                     "reps": self.sizes.reps, "tokens_per_turn": self.sizes.tokens_per_turn,
                     "system_tokens": self.sizes.system_tokens, "max_tokens": 1, "context": CONTEXT,
                     "loadavg_start": round(os.getloadavg()[0], 2), "base_commit": self.a.base,
                     "sessions_base": self.a.sessions_base,
                     "cases": self.a.cases}
        started = time.time()
        result: dict[str, Any] = {}
        try:
            await self.start()
            if "sessions" in self.a.cases:
                try:
                    await self.case_sessions()
                except Exception as e:  # noqa: BLE001 - recorded; the other cases still run
                    self.fail("sessions", e)
                self.meta["gateway_rss_mib"] = {
                    n: round(sum(p.memory_info().rss for p in g.processes()) / 2**20, 1) for n, g in self.gws.items()}
            if "short" in self.a.cases:
                try:
                    result["short"] = await self.case_short()
                except Exception as e:  # noqa: BLE001
                    self.fail("short", e)
            if "profile" in self.a.cases and self.first_sessions:
                try:
                    result["profile"] = await self.case_profile()
                except Exception as e:  # noqa: BLE001
                    self.fail("profile", e)
        except Exception as e:  # noqa: BLE001
            self.fail("setup", e)
        finally:
            await self.stop()
        self.meta.update(duration_s=round(time.time() - started, 1), loadavg_end=round(os.getloadavg()[0], 2),
                         idle_gateway_cpu_ms_per_s=getattr(self, "idle", None))
        if self.loads:
            self.meta["loadavg_range"] = f"{min(self.loads):.1f}-{max(self.loads):.1f}"
        result.update(meta=self.meta, records=self.records, failures=self.failures, cpu_checks=self.cpu_checks)
        return summarise(result)


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """``result`` with its summaries (re)computed from its records."""
    recs = result["records"]
    result.update(per_turn=agent_results.per_turn(recs), targets=agent_results.targets(recs),
                  worker_switches=agent_results.worker_switches(recs))
    return result


def _git(args: list[str]) -> str:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.agent_sessions", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 6 turns, one repetition, short A/B of 2 rounds")
    p.add_argument("--reps", type=int, help="repetitions of every session (default: 3, --quick 1)")
    p.add_argument("--cases", default="sessions,short,profile", help="comma-separated subset of sessions,short,"
                   "profile (profile needs sessions)")
    p.add_argument("--base", default=BASE_COMMIT, help="the commit the short-request case compares against")
    p.add_argument("--sessions-base", metavar="COMMIT", help="also replay every session turn to this commit's "
                   "gateway (--workers 1, cache on, keep-alive: arm b1-on-keep), side by side with this checkout's")
    p.add_argument("--out", type=Path, help="results path without suffix (default bench/results/agent-sessions-DATE)")
    p.add_argument("--render", type=Path, metavar="JSON", help="only re-summarise a results file's records and "
                   "rewrite it and its markdown (after a change to bench/agent_results.py)")
    p.add_argument("--limit-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--url", help=argparse.SUPPRESS)
    p.add_argument("--end-id", type=int, help=argparse.SUPPRESS)
    p.add_argument("--pad-id", type=int, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    a.cases = [c.strip() for c in a.cases.split(",") if c.strip()]
    unknown = set(a.cases) - {"sessions", "short", "profile"}
    if unknown:
        p.error(f"unknown cases: {', '.join(sorted(unknown))}")
    return a


def main(argv: list[str] | None = None) -> int:
    import uvloop

    a = parse_args(argv)
    if a.limit_child:
        uvloop.run(limit_child_main(a))
        return 0
    if a.render is not None:
        result = summarise(json.loads(a.render.read_text()))
        out = a.render.with_suffix("")
    else:
        bench = AgentBench(a)
        result = uvloop.run(bench.run())
        date = dt.date.today().isoformat()
        out = a.out or RESULTS / f"agent-sessions-{date}{'-quick' if a.quick else ''}"
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    md = agent_results.render_md(result)
    out.with_suffix(".md").write_text(md)
    print(md)
    print(f"wrote {out.with_suffix('.json')} and .md", flush=True)
    return 1 if any(f["case"] == "setup" for f in result["failures"]) else 0


if __name__ == "__main__":
    raise SystemExit(main())
