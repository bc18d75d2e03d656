"""What an admission policy can do for the interactive tail on the modelled engine, with no machine in the way.

``bench.priority_batch`` measures the gateway and the synthetic engine on this shared 2-core box, where the
gateway, Triton, the engine's Python stub and the client share the CPUs: its ratios carry the machine as well as
the policy. This is the same engine's arithmetic alone (``plan_step`` of ``triton_models/synthetic-llm/1/
synthetic_engine.py``, the very function its steps run: decodes first, then prompts in arrival order within the
step's token budget; at most ``--engine-batch`` requests in the batch, the rest queued first come first served),
stepped in simulated time: interactive chats arriving at random (Poisson, ``--rate`` per second; ``--arrivals
fixed``: evenly spaced, as ``bench.priority_batch`` sends them by default), and a batch job
that keeps ``K`` lines in flight (a line's next one starts ``--rtt-ms`` after it ends). Per policy and ``K``: the
interactive time to first token (p50, p90, p99) over its level alone, and the job's output tokens per second over
what the job gets with the engine to itself (``K`` = ``--engine-batch``, no chats).

Policies (each with and without ``hold``, and ``starts 1``):

* ``K`` alone: a static batch share, ``K`` = share x the model's slots (``--batch-slot-share``);
* ``hold``: no batch line starts while an interactive request waits for its first token (what the scheduler does
  under ``--batch-share-adaptive``, `http.scheduler`);
* ``starts N``: at most N batch lines starting at once (sent, no first token yet: the rest wait), what
  ``--batch-prefills-per-model N`` does (`http.scheduler`);
* ``engine priority``: the engine itself orders by class (interactive prompts first in its queue and its token
  budget), as vLLM's ``--scheduling-policy priority`` would - not what TensorRT-LLM's or vLLM's Triton backends
  do today (issue #39), shown for what it would add.

A model, not a measurement: no CPU, no network, no Triton; its figures say what the policy can reach at best.

Run: ``.venv/bin/python -m bench.priority_sim [--seconds 300] [--out bench/results/priority-sim-DATE]``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
ENGINE_DIR = REPO / "triton_models" / "synthetic-llm" / "1"


def _plan_step() -> Callable[..., tuple[float, list[int]]]:
    # The model's folder is no package (Triton puts it on sys.path); the cost model imports nothing of Triton's.
    sys.path.insert(0, str(ENGINE_DIR))
    try:
        import synthetic_engine
    finally:
        sys.path.remove(str(ENGINE_DIR))
    return synthetic_engine.plan_step  # type: ignore[no-any-return]


plan_step = _plan_step()


@dataclass
class Request:
    interactive: bool
    left: int  # prompt tokens still to prefill
    out: int  # tokens still to emit
    arrived: float
    first: bool = False


@dataclass
class Engine:
    step_s: float = 0.006
    per_seq_s: float = 0.00008
    per_token_s: float = 0.000015
    budget: int = 2048
    max_active: int = 32


@dataclass
class Load:
    rate: float = 10.0
    prompt: int = 1530
    out: int = 16
    batch_prompt: int = 1030
    batch_out: int = 128
    rtt_s: float = 0.001


@dataclass
class Result:
    ttft: list[float] = field(default_factory=list)
    batch_tokens: int = 0

    def q(self, p: float) -> float:
        ordered = sorted(self.ttft)
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))] if ordered else float("nan")


def simulate(engine: Engine, load: Load, k: int, seconds: float, *, hold: bool = False, priority: bool = False,
             chats: bool = True, seed: int = 1, poisson: bool = True, starts_limit: int = 0) -> Result:
    """Step the engine for `seconds` of simulated time with the chats (if `chats`; at random, or every 1/rate s
    when not `poisson`) and `k` batch lines in flight, at most `starts_limit` of them without their first token yet
    (0: no limit)."""
    rnd = random.Random(seed)
    arrivals: list[float] = []
    t = 0.0
    while chats and t < seconds:
        t += rnd.expovariate(load.rate) if poisson else 1 / load.rate
        arrivals.append(t)
    res = Result()
    queue: list[Request] = []
    active: list[Request] = []
    starts = [0.0] * k  # when each batch line's next request may enter
    limit = starts_limit
    now, nxt = 0.0, 0
    while now < seconds:
        while nxt < len(arrivals) and arrivals[nxt] <= now:
            queue.append(Request(True, load.prompt, load.out, arrivals[nxt]))
            nxt += 1
        waiting = hold and any(r.interactive and not r.first for r in (*queue, *active))
        starting = sum(1 for r in (*queue, *active) if not r.interactive and not r.first) if limit else 0
        for i, at in enumerate(starts):
            if at <= now and not waiting and (not limit or starting < limit):
                starting += 1
                queue.append(Request(False, load.batch_prompt, load.batch_out, now))
                starts[i] = float("inf")
        if priority:
            queue.sort(key=lambda r: not r.interactive)  # stable: arrival order within a class
        while queue and len(active) < engine.max_active:
            active.append(queue.pop(0))
        if not active:  # idle until the next chat or batch start
            pending = [a for a in starts if a != float("inf")] + arrivals[nxt:nxt + 1]
            now = max(now, min(pending)) if pending else seconds
            if waiting:
                now += 0.0005
            continue
        order = sorted(active, key=lambda r: not r.interactive) if priority else active
        took, chunks = plan_step([r.left for r in order], engine.budget, engine.step_s, engine.per_seq_s,
                                 engine.per_token_s)
        now += took
        for r, chunk in zip(order, chunks, strict=True):
            if r.left:
                r.left -= chunk
                if r.left:
                    continue
            r.out -= 1  # decoding, or the chunk that finished its prompt: a token at the step's end
            if not r.first:
                r.first = True
                if r.interactive:
                    res.ttft.append(now - r.arrived)
            if not r.interactive:
                res.batch_tokens += 1
        for r in [r for r in active if r.out <= 0]:
            active.remove(r)
            if not r.interactive:
                starts[starts.index(float("inf"))] = now + load.rtt_s
    return res


def run(args: argparse.Namespace) -> dict[str, Any]:
    engine, load = Engine(), Load(rate=args.rate)
    poisson = args.arrivals == "poisson"
    alone = simulate(engine, load, 0, args.seconds, poisson=poisson)
    job_alone = simulate(engine, load, engine.max_active, args.seconds / 4, chats=False).batch_tokens / (
        args.seconds / 4)
    # What the chats leave the job: every slot it can take, first come first served beside them (chats wait).
    leftover = simulate(engine, load, engine.max_active, args.seconds, poisson=poisson).batch_tokens / (
        args.seconds * job_alone)
    rows = []
    for priority, limit in ((False, 0), (False, 1), (True, 0)):
        for hold in (False, True):
            for k in args.k:
                r = simulate(engine, load, k, args.seconds, hold=hold, priority=priority, poisson=poisson,
                             starts_limit=limit)
                rows.append({"k": k, "share": round(k / engine.max_active, 3), "hold": hold,
                             "engine_priority": priority, "starts": limit,
                             **{f"{p}_ratio": round(r.q(q) / alone.q(q), 3)
                                for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
                             "batch_of_alone": round(r.batch_tokens / args.seconds / job_alone, 3)})
    return {"engine": vars(engine), "load": vars(load), "seconds": args.seconds, "arrivals": args.arrivals,
            "alone_ms": {p: round(alone.q(q) * 1e3, 1) for p, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))},
            "job_alone_tokens_s": round(job_alone), "job_beside_chats_of_alone": round(leftover, 3), "rows": rows}


def markdown(res: dict[str, Any]) -> str:
    a = res["alone_ms"]
    lines = [f"# Priority policies on the modelled engine ({res['seconds']:g} s simulated per row)", "",
             f"Chats at {res['load']['rate']:g}/s ({res.get('arrivals', 'poisson')} arrivals) of "
             f"{res['load']['prompt']} prompt tokens; batch lines of "
             f"{res['load']['batch_prompt']} prompt / {res['load']['batch_out']} output tokens; engine "
             f"{res['engine']}. Chats alone: TTFT p50 {a['p50']} / p90 {a['p90']} / p99 {a['p99']} ms; the job alone "
             f"{res['job_alone_tokens_s']:,} tokens/s; beside the chats with every slot (first come first served, "
             f"the chats waiting) {res.get('job_beside_chats_of_alone', float('nan')) * 100:.0f}% of that: the "
             f"capacity the chats leave. A model (`bench/priority_sim.py`), not a measurement.", "",
             "| engine priority | hold | batch starts at once | batch lines in flight (share) | p50 | p90 | p99 | "
             "job's throughput of alone |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {'yes' if r['engine_priority'] else 'no'} | {'yes' if r['hold'] else 'no'} | "
                     f"{r.get('starts') or 'any'} | {r['k']} "
                     f"({r['share']:g}) | {r['p50_ratio']:.2f}x | {r['p90_ratio']:.2f}x | {r['p99_ratio']:.2f}x | "
                     f"{r['batch_of_alone'] * 100:.0f}% |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=300.0, help="simulated seconds per row")
    p.add_argument("--rate", type=float, default=10.0, help="interactive chats per second")
    p.add_argument("--arrivals", choices=("poisson", "fixed"), default="poisson",
                   help="the chats at random (Poisson) or every 1/rate s")
    p.add_argument("--k", type=int, nargs="+", default=[4, 8, 12, 16, 24], help="batch lines in flight")
    p.add_argument("--out", type=Path, help="results path without suffix")
    args = p.parse_args(argv)
    res = run(args)
    text = markdown(res)
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(res, indent=1))
        args.out.with_suffix(".md").write_text(text)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
