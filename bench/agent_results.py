"""The arithmetic and the report of ``bench.agent_sessions``: per-turn medians, issue #36's targets, markdown.

Pure functions of the raw records the runner writes (unit-tested on hand-made records in
``tests/unit/test_bench_agent_sessions.py``). A record is one request of a replayed session:

``{"dialect", "arm", "rep", "turn", "status", "prompt_tokens", "cached_tokens", "wall_ms", "cpu_ms",
"limit_ms", "added_ms", "worker", "ttft_ms", "loadavg"}``

where ``arm`` names the gateway and the client's connection (``w1-on-keep``: ``--workers 1``, the prompt cache
at its default size, one keep-alive connection for the session; ``w2-on-new``: ``--workers 2``, the cache on,
a new connection per turn; ``-off-``: ``--prompt-cache-mb 0``; a ``-stable`` or ``-stream`` suffix for the
Claude Code session whose billing header is the same all session, and the streamed sessions). ``cpu_ms`` is the
gateway's CPU (all its processes) over the request, ``added_ms`` its wall minus the bare client's for the same
token ids.

Targets (issue #36), judged on each arm with the cache on:

* ``cpu_ratio``: CPU of the turn nearest ``HIGH_TOKENS`` over the turn nearest ``LOW_TOKENS`` (both add about
  as many tokens), per repetition, then the median; met at <= 1.5.
* ``added_wall``: the median added wall of the turn nearest ``HIGH_TOKENS``; met at <= 30 ms.
* ``short``: a short non-streamed chat's CPU, HEAD / the commit before the prompt cache, paired per round;
  met at <= 1 (no worse; the spread of the pairs is reported beside it).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

HIGH_TOKENS = 117_000
LOW_TOKENS = 9_000
CPU_RATIO_TARGET = 1.5
ADDED_WALL_TARGET_MS = 30.0
DIALECTS = {"claude_code": "Claude Code over /v1/messages", "codex": "Codex over /v1/responses"}
ARM_LABELS = {
    "w1-off-keep": "--workers 1, cache off, keep-alive",
    "w1-on-keep": "--workers 1, cache on, keep-alive",
    "w2-off-keep": "--workers 2, cache off, keep-alive",
    "w2-on-keep": "--workers 2, cache on, keep-alive",
    "w2-on-new": "--workers 2, cache on, new connection per turn",
    "w1-on-keep-stable": "--workers 1, cache on, billing header fixed for the session",
    "w1-off-keep-stream": "--workers 1, cache off, streamed",
    "w1-on-keep-stream": "--workers 1, cache on, streamed",
    "b1-on-keep": "the base commit's gateway (--sessions-base): --workers 1, cache on, keep-alive",
}
PER_TURN = ("prompt_tokens", "cached_tokens", "cpu_ms", "wall_ms", "added_ms", "limit_ms", "ttft_ms")


def median(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x is not None]
    return round(statistics.median(vals), 3) if vals else None


def cache_on(arm: str) -> bool:
    return "-on-" in arm


def per_turn(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """dialect -> arm -> one row per turn: the median over repetitions of each of ``PER_TURN``, the number of
    repetitions, and the serving workers seen (``--workers 2``)."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r.get("status") == 200:
            groups[(r["dialect"], r["arm"], r["turn"])].append(r)
    out: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for (dialect, arm, turn), rs in sorted(groups.items()):
        row: dict[str, Any] = {"turn": turn, "reps": len(rs)}
        for k in PER_TURN:
            row[k] = median(r.get(k) for r in rs)
            if k.endswith("_tokens") and row[k] is not None:
                row[k] = round(row[k])
        workers = [r["worker"] for r in rs if r.get("worker") is not None]
        if workers:
            row["workers"] = workers
        again = sum(1 for r in rs if r.get("reconnected"))
        if again:
            row["reconnected"] = again
        out[dialect][arm].append(row)
    return {d: dict(a) for d, a in out.items()}


def nearest_turn(rows: Sequence[dict[str, Any]], tokens: int) -> dict[str, Any] | None:
    """The row whose (median) prompt is nearest ``tokens`` tokens."""
    have = [r for r in rows if r.get("prompt_tokens") is not None]
    return min(have, key=lambda r: abs(r["prompt_tokens"] - tokens)) if have else None


def _by_rep(records: Sequence[dict[str, Any]], dialect: str, arm: str, turn: int) -> dict[int, dict[str, Any]]:
    return {r["rep"]: r for r in records
            if r["dialect"] == dialect and r["arm"] == arm and r["turn"] == turn and r.get("status") == 200}


def targets(records: Sequence[dict[str, Any]], high: int = HIGH_TOKENS, low: int = LOW_TOKENS) -> dict[str, Any]:
    """Per dialect and arm: the CPU ratio (high turn / low turn, paired per repetition), the added wall at the high
    turn, and for cache-on arms the cache's effect at the high turn (CPU of the same arm with the cache off over
    this one, paired per repetition), each with whether issue #36's target is met (cache-on arms only)."""
    table = per_turn(records)
    out: dict[str, Any] = {}
    for dialect, arms in table.items():
        for arm, rows in arms.items():
            hi, lo = nearest_turn(rows, high), nearest_turn(rows, low)
            if hi is None or lo is None:
                continue
            his, los = _by_rep(records, dialect, arm, hi["turn"]), _by_rep(records, dialect, arm, lo["turn"])
            ratios = [his[k]["cpu_ms"] / los[k]["cpu_ms"] for k in sorted(his.keys() & los.keys())
                      if los[k].get("cpu_ms")]
            cell: dict[str, Any] = {
                "high_turn": hi["turn"], "high_prompt_tokens": hi["prompt_tokens"],
                "low_turn": lo["turn"], "low_prompt_tokens": lo["prompt_tokens"],
                "cpu_ms_high": hi["cpu_ms"], "cpu_ms_low": lo["cpu_ms"],
                "cpu_ratio": median(ratios), "cpu_ratio_by_rep": [round(x, 3) for x in ratios],
                "added_ms_high": hi["added_ms"], "wall_ms_high": hi["wall_ms"],
                "cached_tokens_high": hi["cached_tokens"],
            }
            if cache_on(arm):
                ratio, added = cell["cpu_ratio"], cell["added_ms_high"]
                cell["cpu_ratio_met"] = ratio is not None and ratio <= CPU_RATIO_TARGET
                cell["added_wall_met"] = added is not None and added <= ADDED_WALL_TARGET_MS
                # the same gateway without the cache (for a new connection per turn: its keep-alive twin, as
                # without the cache the serving worker makes no difference)
                off_arm = arm.replace("-on-", "-off-", 1)
                if off_arm not in arms:
                    off_arm = off_arm.replace("-new", "-keep")
                off = _by_rep(records, dialect, off_arm, hi["turn"])
                gains = [off[k]["cpu_ms"] / his[k]["cpu_ms"] for k in sorted(off.keys() & his.keys())
                         if his[k].get("cpu_ms")]
                cell["off_over_on_cpu_high"] = median(gains)
            cell["cpu_ms_per_10k_tokens"] = growth(records, dialect, arm)
            out.setdefault(dialect, {})[arm] = cell
    return out


def growth(records: Sequence[dict[str, Any]], dialect: str, arm: str) -> float | None:
    """The least-squares slope of an arm's CPU per request against its prompt's tokens, in ms per 10k tokens,
    over every turn from the second of every repetition: what a turn pays per token of conversation, from all
    the turns at once (the ratio above rests on two turns per repetition)."""
    pts = [(r["ids"] / 1e4, r["cpu_ms"]) for r in records if r["dialect"] == dialect and r["arm"] == arm
           and r.get("status") == 200 and r["turn"] > 1 and r.get("ids")]
    if len(pts) < 3:
        return None
    mx, my = statistics.fmean(x for x, _ in pts), statistics.fmean(y for _, y in pts)
    var = sum((x - mx) ** 2 for x, _ in pts)
    return round(sum((x - mx) * (y - my) for x, y in pts) / var, 3) if var else None


def worker_switches(records: Sequence[dict[str, Any]], reference: str = "w2-on-keep") -> dict[str, Any]:
    """For each arm whose requests name their worker and that is not ``reference``: its turns (from the second)
    served by the worker that served the session's previous turn (``same``) and by the other (``switched``), each
    with the median CPU and the median ratio to ``reference``'s CPU at the same repetition and turn (same bytes,
    keep-alive: one worker all session). A switched turn's worker last saw the session ``gap`` turns ago."""
    by: dict[tuple[str, str, int], dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in records:
        if r.get("status") == 200 and r.get("worker") is not None:
            by[(r["dialect"], r["arm"], r["rep"])][r["turn"]] = r
    out: dict[str, Any] = {}
    for (dialect, arm, rep), turns in sorted(by.items()):
        if arm == reference or not cache_on(arm):
            continue
        ref = by.get((dialect, reference, rep), {})
        cell = out.setdefault(dialect, {}).setdefault(arm, {"same": [], "switched": [], "gaps": []})
        last_seen: dict[int, int] = {}
        for t in sorted(turns):
            r = turns[t]
            prev = turns.get(t - 1)
            if prev is not None:
                kind = "same" if prev["worker"] == r["worker"] else "switched"
                base = ref.get(t, {}).get("cpu_ms")
                cell[kind].append((r["cpu_ms"], r["cpu_ms"] / base if base else None))
                if kind == "switched":
                    cell["gaps"].append(t - last_seen[r["worker"]] if r["worker"] in last_seen else None)
            last_seen[r["worker"]] = t
    for arms in out.values():
        for cell in arms.values():
            gaps = cell.pop("gaps")
            for kind in ("same", "switched"):
                xs = cell[kind]
                cell[kind] = {"turns": len(xs), "cpu_ms": median(x[0] for x in xs),
                              "over_keep_alive": median(x[1] for x in xs)}
            cell["switched"]["never_seen"] = sum(1 for g in gaps if g is None)
            cell["switched"]["gap_turns"] = median(g for g in gaps if g is not None)
    return out


def short_summary(rounds: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The short-chat A/B: per side the median CPU per request (us) and p50 wall (ms); head/base paired by round."""
    sides: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in rounds:
        sides[r["side"]][r["round"]] = r
    out: dict[str, Any] = {}
    for side, rs in sides.items():
        out[side] = {"cpu_us_per_request": median(r["cpu_us_per_request"] for r in rs.values()),
                     "p50_ms": median(r["p50_ms"] for r in rs.values()), "rounds": len(rs)}
    if "head" in sides and "base" in sides:
        pairs = [sides["head"][k]["cpu_us_per_request"] / sides["base"][k]["cpu_us_per_request"]
                 for k in sorted(sides["head"].keys() & sides["base"].keys())]
        out["head_over_base"] = median(pairs)
        out["head_over_base_by_round"] = [round(x, 3) for x in pairs]
        out["met"] = out["head_over_base"] is not None and out["head_over_base"] <= 1.0
    return out


def _fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "met" if x else "missed"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        return f"{x:,.{digits}f}"
    return str(x)


def _table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    rule = "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"
    lines = ["| " + " | ".join(head) + " |", rule]
    lines += ["| " + " | ".join(_fmt(c) if not isinstance(c, str) else c for c in row) + " |" for row in rows]
    return lines


def render_md(result: dict[str, Any]) -> str:
    """The committed report: conditions, the targets, then per dialect the turns side by side."""
    meta = result["meta"]
    tg = result["targets"]
    table = result["per_turn"]
    lines = [f"# Agent sessions through the gateway ({meta['started']}, commit {meta['git']}, {meta['mode']} run)", ""]
    lines.append(
        f"{meta['turns']} turns of ~{meta['tokens_per_turn']:,} tokens, {meta['reps']} repetition(s), "
        f"non-streamed, max_tokens {meta['max_tokens']}, `synthetic-llm` behind one tritonserver (no model maths). "
        f"Machine: {meta['cpus']} CPUs shared with other sessions; load average (1 min) {meta['loadavg_start']} at "
        f"the start, {meta['loadavg_end']} at the end, {meta.get('loadavg_range', '-')} over the sessions. "
        "CPU: the gateway's processes, summed over their threads (`/proc/<pid>/task/*/schedstat`), per request. "
        "Added wall: the gateway's wall minus the bare gRPC client's (`bench.limit.RpcLLM`) for the same token ids, "
        "measured at the same turn.")
    checks = result.get("cpu_checks") or []
    if checks:
        ps, ss = sum(c["psutil_s"] for c in checks), sum(c["schedstat_s"] for c in checks)
        lines += ["", f"Check: over all sessions the gateways' CPU by psutil (10 ms ticks, exited threads included) "
                  f"{ps:.2f} s, by the live threads' schedstat {ss:.2f} s. Idle gateway CPU (ms per s, timers and "
                  f"heartbeats; a request's window is its wall + 20 ms): {meta.get('idle_gateway_cpu_ms_per_s')}."]
    if meta.get("sessions_base"):
        lines += ["", f"Side by side: every session turn also went to the gateway of {meta['sessions_base']} (arm "
                  "`b1-on-keep`: `--workers 1`, cache on, keep-alive) in the same rotation, on the same bytes."]
    lines += ["", "## Targets (issue #36)", ""]
    rows = []
    for dialect, arms in tg.items():
        for arm, c in arms.items():
            if not cache_on(arm):
                continue
            rows.append([DIALECTS.get(dialect, dialect), ARM_LABELS.get(arm, arm),
                         f"{_fmt(c['cpu_ms_high'])} / {_fmt(c['cpu_ms_low'])}", _fmt(c["cpu_ratio"], 2),
                         _fmt(c.get("cpu_ratio_met")), _fmt(c["added_ms_high"]), _fmt(c.get("added_wall_met")),
                         _fmt(c.get("off_over_on_cpu_high"), 1) + ("x" if c.get("off_over_on_cpu_high") else ""),
                         _fmt(c.get("cpu_ms_per_10k_tokens"), 2)])
    lines += _table(["session", "gateway", "CPU ms at ~117k / ~9k", "ratio (<= 1.5)", "", "added wall ms at ~117k "
                     "(<= 30)", "", "cache off / on CPU at ~117k", "CPU growth, ms per 10k tokens"], rows)
    lines += ["", "CPU growth: the least-squares slope of CPU per turn against the prompt's tokens over every turn "
              "from the second and every repetition (the ratio rests on two turns per repetition)."]
    short = result.get("short")
    if short and "head_over_base" in short:
        lines += ["", f"Short non-streamed chat ({_fmt(short.get('prompt_tokens'))}-token prompt, "
                  f"{_fmt(short.get('completion_tokens'))} tokens out), CPU per request: HEAD "
                  f"{_fmt(short['head']['cpu_us_per_request'])} us vs {meta.get('base_commit', 'base')} "
                  f"{_fmt(short['base']['cpu_us_per_request'])} us: {_fmt(short['head_over_base'], 3)}x "
                  f"(per round {short['head_over_base_by_round']}; target <= 1: {_fmt(short['met'])})."]
    for dialect, arms in table.items():
        lines += ["", f"## {DIALECTS.get(dialect, dialect)}", ""]
        base = arms.get("w1-off-keep") or next(iter(arms.values()))
        on = {r["turn"]: r for r in arms.get("w1-on-keep", [])}
        off = {r["turn"]: r for r in base}
        head = ["turn", "prompt tokens", "cached tokens (usage)", "CPU ms off", "CPU ms on", "wall ms off",
                "wall ms on", "added ms off", "added ms on", "bare client ms"]
        rows = []
        for t in sorted(off):
            a, b = off[t], on.get(t, {})
            rows.append([str(t), a["prompt_tokens"], b.get("cached_tokens"), a["cpu_ms"], b.get("cpu_ms"),
                         a["wall_ms"], b.get("wall_ms"), a["added_ms"], b.get("added_ms"), a["limit_ms"]])
        lines += ["`--workers 1`, one keep-alive connection; off = `--prompt-cache-mb 0`, on = the default (128).",
                  "", *_table(head, rows)]
        others = [a for a in arms if not a.startswith("w1-") or a.endswith(("stable", "stream"))]
        if others:
            lines += ["", "CPU ms per turn (median over repetitions) of the other gateways and sessions:", ""]
            turns = sorted(off)
            picks = sorted({turns[0], turns[min(1, len(turns) - 1)], turns[len(turns) // 2], turns[-1]})
            rows = []
            for arm in others:
                by = {r["turn"]: r for r in arms[arm]}
                cells = []
                for t in picks:
                    r = by.get(t)
                    cells.append("-" if r is None else f"{_fmt(r['cpu_ms'])} ({_fmt(r['added_ms'])})")
                extra = ""
                ws = [w for r in arms[arm] for w in r.get("workers", [])]
                if ws:
                    extra = f"worker 0 served {ws.count(0)}, worker 1 {ws.count(1)}"
                again = sum(r.get("reconnected", 0) for r in arms[arm])
                if again:
                    extra += f"; {again} keep-alive connection(s) closed by the gateway, made again"
                rows.append([ARM_LABELS.get(arm, arm), *cells, extra])
            lines += _table(["gateway", *(f"turn {t}: CPU (added wall)" for t in picks), "requests per worker"],
                            rows)
        streamed = {a: {r["turn"]: r for r in arms[a]} for a in ("w1-off-keep-stream", "w1-on-keep-stream")
                    if a in arms}
        if len(streamed) == 2:
            last = max(streamed["w1-on-keep-stream"])
            off_r, on_r = streamed["w1-off-keep-stream"].get(last, {}), streamed["w1-on-keep-stream"][last]
            lines += ["", f"Streamed (sessions of their own, `--workers 1`, medians over repetitions), turn {last} "
                      f"({_fmt(on_r['prompt_tokens'])} tokens): time to the first text event "
                      f"{_fmt(off_r.get('ttft_ms'))} ms with the cache off, "
                      f"{_fmt(on_r.get('ttft_ms'))} ms on (the bare client's whole request: "
                      f"{_fmt(on_r.get('limit_ms'))} ms); CPU {_fmt(off_r.get('cpu_ms'))} / {_fmt(on_r.get('cpu_ms'))} "
                      "ms."]
        for arm, cell in (result.get("worker_switches") or {}).get(dialect, {}).items():
            same, sw = cell["same"], cell["switched"]
            lines += ["", f"{ARM_LABELS.get(arm, arm)}: {sw['turns']} of {same['turns'] + sw['turns']} turns after the "
                      f"first went to the other worker than the turn before ({sw['never_seen']} to a worker that had "
                      f"not seen the session, the others had last seen it a median {_fmt(sw['gap_turns'])} turns "
                      f"before); CPU per turn over the keep-alive gateway's at the same turn: "
                      f"{_fmt(same['over_keep_alive'], 2)}x same worker, {_fmt(sw['over_keep_alive'], 2)}x switched."]
    prof = result.get("profile")
    if prof:
        lines += ["", "## Where a turn's CPU goes (in-process, the gateway's own request path)", "",
                  prof.get("note", "")]
        for dialect, cells in prof.get("stages", {}).items():
            lines += ["", f"{DIALECTS.get(dialect, dialect)}: CPU ms per stage", ""]
            names = [k for k in next(iter(cells.values())) if k not in ("prompt_tokens", "replays")]
            rows = [[label, c.get("prompt_tokens"), *(c.get(k) for k in names)] for label, c in cells.items()]
            lines += _table(["turn", "prompt tokens", *names], rows)
        decomp = prof.get("decomposition", {})
        if decomp:
            lines += ["", "The gateway's CPU per turn (`--workers 1`, cache on, median of the repetitions) against its "
                      "parts: the whole ASGI app in process, the input_ids tensor, the bare gRPC client's own CPU "
                      "for the same ids; the rest is uvicorn/httptools, the event loop and the worker threads' "
                      "hand-offs.", ""]
            rows = [[DIALECTS.get(d, d), t.split()[-1], c.get("gateway_cpu_ms"), c.get("app_ms"), c.get("tokenize_ms"),
                     c.get("tensor_ms"), c.get("grpc_client_ms"), c.get("rest_ms")]
                    for d, turns in decomp.items() for t, c in turns.items()]
            lines += _table(["session", "turn", "gateway CPU ms", "app in-process", "of which tokenize",
                             "input_ids tensor", "gRPC client (bare)", "rest"], rows)
        top = prof.get("cprofile", {}).get("own", [])[:12]
        if top:
            lines += ["", f"cProfile of {prof.get('cprofile_what', 'the last turn')}: top own time", ""]
            lines += _table(["function", "calls", "own ms", "cumulative ms"],
                            [[r["function"].replace("|", "\\|"), r["calls"], r["own_ms"], r["cumulative_ms"]]
                             for r in top])
    if result.get("failures"):
        lines += ["", "## Failures", ""] + [f"* {f['case']}: {f['error']}" for f in result["failures"]]
    return "\n".join(lines) + "\n"
