"""Results as commit-friendly files: ``latest.json``, ``latest.md`` and a dated JSON in ``history/``.

``build_summary`` reduces a run to the flat ``summary`` object of ``latest.json``: ``SUMMARY_KEYS``
(always present; ``None`` where a case could not run, with the reason in ``summary["notes"][key]``)
plus ``EXTRA_KEYS``. ``readme_table`` renders the docs' performance table (docs/performance/index.md) from that
summary alone; ``tests/unit/test_bench_readme.py`` checks that the page holds exactly what it
renders from the committed ``bench/results/latest.json`` (after a run: ``python -m bench.report``
prints the table; ``python scripts/docs.py`` writes it between the page's ``bench-table`` markers).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The issue's targets: summary key -> (comparison, bound). Everything else is reported.
TARGETS: dict[str, tuple[str, float]] = {
    "cpu_us_per_token_c16": ("<=", 40.0),
    "cpu_growth_8192_vs_64": ("<=", 1.1),
    "added_p50_ms_c1": ("<=", 0.5),
    "added_p50_ms_c16": ("<=", 1.0),
    "added_p99_ms_c16": ("<=", 2.0),
    "added_ttft_p50_ms": ("<=", 1.0),
    "embeddings_ratio_single_c32": (">=", 1.0),
    "embeddings_ratio_batch32_c4": (">=", 1.0),
    # The board's terms (issue #27), on 20 ms pacing, against the bare client on the same upstream.
    "board_added_p99_ms_c1": ("<=", 0.5),
    "board_added_ttft_p99_ms": ("<=", 0.5),
    "board_added_itl_p99_ms": ("<=", 0.2),
    "board_stall_free_ratio_w1": (">=", 0.9),
}
# Not a target but a check of the bench itself: the gateway can never beat the fastest direct client.
LIMIT_SANITY_MAX = 1.0

SUMMARY_KEYS = (
    "limit_client",
    "relay_ratio_c1",
    "relay_ratio_c16",
    "relay_ratio_c64",
    "cpu_us_per_token_c16",
    "cpu_growth_8192_vs_64",
    "added_p50_ms_c1",
    "added_p50_ms_c16",
    "added_p99_ms_c16",
    "added_ttft_p50_ms",
    "workers2_over_workers1_tok_s",
    "aiperf_ttft_p50_ms",
    "aiperf_itl_p50_ms",
    "rss_kib_per_open_stream",
)
EXTRA_KEYS = (
    "relay_ratio_tritonclient_c1",
    "relay_ratio_tritonclient_c16",
    "relay_ratio_tritonclient_c64",
    "limit_tok_s_c16",
    "gateway_tok_s_c16",
    "unguided_cpu_us_per_token_c16",
    "guided_cpu_us_per_token_c16",
    "guided_tok_s_ratio",
    "tool_call_cpu_us_per_token_c16",
    "tool_call_tok_s_ratio",
    "workers1_cpu_us_per_token",
    "workers2_cpu_us_per_token",
    "aiperf_output_tok_s",
    "loadgen_ttft_p50_ms_c16",
    "loadgen_itl_p50_ms_c16",
    "loadgen_output_tok_s_c16",
    "aiperf_embeddings_req_s",
    "loadgen_embeddings_req_s",
    "embeddings_ratio_single_c32",
    "embeddings_ratio_batch32_c4",
    "perf_analyzer_responses_s_c16",
    *(f"board_{k}" for k in ("added_p50_ms_c1", "added_p99_ms_c1", "added_ttft_p50_ms", "added_ttft_p99_ms")),
    *(f"board_{k}" for k in ("added_itl_p50_ms", "added_itl_p99_ms", "cpu_us_per_request", "cpu_us_per_token")),
    *(f"board_{k}" for k in ("stall_free_w1", "stall_free_w2", "stall_free_bare", "stall_free_ratio_w1")),
    *(f"litellm_{k}" for k in ("added_p50_ms_c1", "added_p99_ms_c1", "added_ttft_p50_ms", "added_ttft_p99_ms")),
    *(f"litellm_{k}" for k in ("added_itl_p50_ms", "added_itl_p99_ms", "cpu_us_per_request", "cpu_us_per_token")),
    *(f"litellm_{k}" for k in ("stall_free", "stall_free_bare")),
)


def _get(res: dict[str, Any], *path: str) -> Any:
    cur: Any = res
    for p in path:
        if not isinstance(cur, dict) or p not in cur:
            return None
        cur = cur[p]
    return cur


def _num(v: Any, digits: int = 3) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float) or math.isnan(v):
        return None
    return round(float(v), digits)


# summary key -> (the case that measures it, how to read it from the results)
_SOURCES: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = {
    "relay_ratio_c1": ("relay", lambda r: _get(r, "relay", "c1", "ratio")),
    "relay_ratio_c16": ("relay", lambda r: _get(r, "relay", "c16", "ratio")),
    "relay_ratio_c64": ("relay", lambda r: _get(r, "relay", "c64", "ratio")),
    "cpu_us_per_token_c16": ("relay", lambda r: _get(r, "relay", "c16", "gateway_cpu_us_per_token")),
    "cpu_growth_8192_vs_64": ("long", lambda r: _get(r, "long_outputs", "ratio")),
    "added_p50_ms_c1": ("latency", lambda r: _get(r, "latency", "c1", "added_p50_ms")),
    "added_p50_ms_c16": ("latency", lambda r: _get(r, "latency", "c16", "added_p50_ms")),
    "added_p99_ms_c16": ("latency", lambda r: _get(r, "latency", "c16", "added_p99_ms")),
    "added_ttft_p50_ms": ("latency", lambda r: _get(r, "latency", "ttft_c1", "added_p50_ms")),
    "workers2_over_workers1_tok_s": ("workers", lambda r: _get(r, "workers", "tok_s_ratio")),
    "aiperf_ttft_p50_ms": ("aiperf", lambda r: _get(r, "aiperf", "chat", "aiperf", "ttft_p50_ms")),
    "aiperf_itl_p50_ms": ("aiperf", lambda r: _get(r, "aiperf", "chat", "aiperf", "itl_p50_ms")),
    "rss_kib_per_open_stream": ("streams", lambda r: _get(r, "many_streams", "rss_per_stream_kib")),
    "relay_ratio_tritonclient_c1": ("relay", lambda r: _get(r, "relay", "c1", "ratio_vs_tritonclient")),
    "relay_ratio_tritonclient_c16": ("relay", lambda r: _get(r, "relay", "c16", "ratio_vs_tritonclient")),
    "relay_ratio_tritonclient_c64": ("relay", lambda r: _get(r, "relay", "c64", "ratio_vs_tritonclient")),
    "limit_tok_s_c16": ("relay", lambda r: _get(r, "relay", "c16", "limit", "tokens_per_s")),
    "gateway_tok_s_c16": ("relay", lambda r: _get(r, "relay", "c16", "gateway", "tokens_per_s")),
    "unguided_cpu_us_per_token_c16": ("guided", lambda r: _get(r, "guided", "unguided", "gateway_cpu_us_per_token")),
    "guided_cpu_us_per_token_c16": ("guided", lambda r: _get(r, "guided", "json_schema", "gateway_cpu_us_per_token")),
    "guided_tok_s_ratio": ("guided", lambda r: _get(r, "guided", "json_schema", "tok_s_ratio")),
    "tool_call_cpu_us_per_token_c16": ("guided", lambda r: _get(r, "guided", "tool_call", "gateway_cpu_us_per_token")),
    "tool_call_tok_s_ratio": ("guided", lambda r: _get(r, "guided", "tool_call", "tok_s_ratio")),
    "workers1_cpu_us_per_token": ("workers", lambda r: _get(r, "workers", "workers1", "gateway_cpu_us_per_token")),
    "workers2_cpu_us_per_token": ("workers", lambda r: _get(r, "workers", "workers2", "gateway_cpu_us_per_token")),
    "aiperf_output_tok_s": ("aiperf", lambda r: _get(r, "aiperf", "chat", "aiperf", "output_tokens_per_s")),
    "loadgen_ttft_p50_ms_c16": ("aiperf", lambda r: _get(r, "aiperf", "chat", "loadgen", "ttft", "p50_ms")),
    "loadgen_itl_p50_ms_c16": ("aiperf", lambda r: _get(r, "aiperf", "chat", "loadgen", "itl", "p50_ms")),
    "loadgen_output_tok_s_c16": ("aiperf", lambda r: _get(r, "aiperf", "chat", "loadgen", "rate")),
    "aiperf_embeddings_req_s": ("aiperf", lambda r: _get(r, "aiperf", "embeddings", "aiperf", "requests_per_s")),
    "loadgen_embeddings_req_s": ("aiperf", lambda r: _get(r, "aiperf", "embeddings", "loadgen", "req_per_s")),
    "embeddings_ratio_single_c32": ("embeddings", lambda r: _get(r, "embeddings", "single_c32", "ratio")),
    "embeddings_ratio_batch32_c4": ("embeddings", lambda r: _get(r, "embeddings", "batch32_c4", "ratio")),
    "perf_analyzer_responses_s_c16": (
        "perf_analyzer",
        lambda r: _get(r, "perf_analyzer", "runs", "c16", "responses_per_s"),
    ),
}


# The board case (bench.board): gateway figures vs the bare client on Triton, LiteLLM's vs the stand-in.
def _board(*path: str) -> tuple[str, Callable[[dict[str, Any]], Any]]:
    def read(r: dict[str, Any]) -> Any:
        return _get(r, "board", *path)

    return ("board", read)


for _who, _side in (("board", "gateway"), ("litellm", "litellm")):
    for _key, _cell, _pct in (
        ("added_p50_ms_c1", "nonstream", "p50_ms"),
        ("added_p99_ms_c1", "nonstream", "p99_ms"),
        ("added_ttft_p50_ms", "ttft", "p50_ms"),
        ("added_ttft_p99_ms", "ttft", "p99_ms"),
        ("added_itl_p50_ms", "itl", "p50_ms"),
        ("added_itl_p99_ms", "itl", "p99_ms"),
    ):
        _SOURCES[f"{_who}_{_key}"] = _board(f"{_side}_added", _cell, _pct)
    _SOURCES[f"{_who}_cpu_us_per_request"] = _board("sides", _side, "nonstream", "cpu_us_per_request")
    _SOURCES[f"{_who}_cpu_us_per_token"] = _board("sides", _side, "itl", "cpu_us_per_token")
_SOURCES["board_stall_free_w1"] = _board("sides", "gateway", "streams", "stall_free")
_SOURCES["board_stall_free_w2"] = _board("sides", "gateway_w2", "streams", "stall_free")
_SOURCES["board_stall_free_bare"] = _board("sides", "bare", "streams", "stall_free")
_SOURCES["board_stall_free_ratio_w1"] = _board("gateway_added", "stall_free_ratio")
_SOURCES["litellm_stall_free"] = _board("sides", "litellm", "streams", "stall_free")
_SOURCES["litellm_stall_free_bare"] = _board("sides", "standin", "streams", "stall_free")
_RESULT_KEY = {"long": "long_outputs", "streams": "many_streams"}


def _why_missing(res: dict[str, Any], case: str) -> str:
    """Why a case's figure is absent: the case's own reason, its failure, or that it was not run."""
    block = res.get(_RESULT_KEY.get(case, case))
    if isinstance(block, dict):
        for key in ("skipped", "reason", "infinity_error"):
            if isinstance(block.get(key), str):
                return str(block[key])
    for f in res.get("failures", []):
        if f.get("case") in (case, "setup") or str(f.get("case", "")).startswith(case + "/"):
            return f"case {case!r} failed: {f.get('error', '')[:300]}"
    cases = res.get("meta", {}).get("cases")
    if case == "perf_analyzer":
        case_ran = cases is None or "relay" in cases
    else:
        case_ran = cases is None or case in cases
    if not case_ran:
        return f"case {case!r} not run in this invocation (--cases)"
    return f"case {case!r} did not produce this figure"


def build_summary(res: dict[str, Any]) -> dict[str, Any]:
    """The flat summary of a run (see the module docstring)."""
    out: dict[str, Any] = {}
    notes: dict[str, str] = {}
    relay_meta = res.get("relay_meta") or {}
    out["limit_client"] = f"{relay_meta['limit_client']}; {relay_meta['limit_processes']}" if relay_meta else None
    if out["limit_client"] is None:
        notes["limit_client"] = _why_missing(res, "relay")
    pa = res.get("perf_analyzer")
    pa_reason = pa.get("reason") if isinstance(pa, dict) and not pa.get("ran", True) else None
    for key in (*SUMMARY_KEYS[1:], *EXTRA_KEYS):
        case, read = _SOURCES[key]
        value = _num(read(res))
        out[key] = value
        if value is None:
            notes[key] = "see `perf_analyzer`" if case == "perf_analyzer" and pa_reason else _why_missing(res, case)
    if pa_reason:
        notes["perf_analyzer"] = pa_reason
    out["notes"] = notes
    return out


# ---------------------------------------------------------------------------------------------- rendering
def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:,.3g}" if abs(v) < 10 else f"{v:,.1f}"
    return str(v)


def _verdict(key: str, value: Any) -> str:
    if key.startswith("relay_ratio_c"):
        if value is None:
            return "-"
        return "limit ok" if value <= LIMIT_SANITY_MAX else "**limit suspect**"
    target = TARGETS.get(key)
    if target is None or value is None:
        return "-"
    op, bound = target
    met = value <= bound if op == "<=" else value >= bound
    return "met" if met else "**missed**"


def _target(key: str, unit: str) -> str:
    if key.startswith("relay_ratio_c"):
        return f"report (<= {LIMIT_SANITY_MAX:g}, or the limit is wrong)"
    t = TARGETS.get(key)
    if t is None:
        return "report"
    op, bound = t
    return f"{op} {bound:g}{unit}"


def _val(v: Any, unit: str, signed: bool = False) -> str:
    if v is None:
        return "-"
    if signed:
        return f"{v:+.2f}{unit}"
    return f"{_fmt(v)}{unit}"


def _rows(s: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    """(what, value, target, verdict) for the docs' table, from the summary alone."""

    def also(label: str, key: str, unit: str = "", signed: bool = False) -> str:
        return f" ({label}: {_val(s.get(key), unit, signed)})" if s.get(key) is not None else ""

    rows: list[tuple[str, str, str, str]] = []

    def row(what: str, key: str, unit: str = "", signed: bool = False, extra: str = "") -> None:
        rows.append(
            (f"{what} (`{key}`)", _val(s.get(key), unit, signed) + extra, _target(key, unit), _verdict(key, s.get(key)))
        )

    for c in (1, 16, 64):
        row(
            f"stream relay c={c}: gateway / limit tokens/s",
            f"relay_ratio_c{c}",
            "x",
            extra=also("vs the old tritonclient limit", f"relay_ratio_tritonclient_c{c}", "x"),
        )
    row("gateway CPU per relayed chat token, c=16", "cpu_us_per_token_c16", " us")
    row("gateway CPU per token, 8,192- vs 64-token streams", "cpu_growth_8192_vs_64", "x")
    row("non-streamed chat, added p50, c=1", "added_p50_ms_c1", " ms", signed=True)
    row("non-streamed chat, added p50, c=16", "added_p50_ms_c16", " ms", signed=True)
    row("non-streamed chat, added p99, c=16", "added_p99_ms_c16", " ms", signed=True)
    row("streamed chat, added time to first token p50, c=1", "added_ttft_p50_ms", " ms", signed=True)
    row(
        "guided (JSON schema) gateway CPU per token, c=16",
        "guided_cpu_us_per_token_c16",
        " us",
        extra=also("unguided", "unguided_cpu_us_per_token_c16", " us"),
    )
    row("guided / unguided tokens/s, c=16", "guided_tok_s_ratio", "x")
    row("forced tool call gateway CPU per token, c=16", "tool_call_cpu_us_per_token_c16", " us")
    row("forced tool call / unguided tokens/s, c=16", "tool_call_tok_s_ratio", "x")
    row("`--workers 2` / `--workers 1` streamed tokens/s, c=64", "workers2_over_workers1_tok_s", "x")
    row(
        "AIPerf TTFT p50, streamed chat c=16",
        "aiperf_ttft_p50_ms",
        " ms",
        extra=also("our load generator", "loadgen_ttft_p50_ms_c16", " ms"),
    )
    row(
        "AIPerf inter-token latency p50, c=16",
        "aiperf_itl_p50_ms",
        " ms",
        extra=also("our load generator", "loadgen_itl_p50_ms_c16", " ms"),
    )
    row(
        "AIPerf output tokens/s, c=16",
        "aiperf_output_tok_s",
        "",
        extra=also("our load generator", "loadgen_output_tok_s_c16"),
    )
    row(
        "AIPerf embeddings requests/s, 1 text, c=32",
        "aiperf_embeddings_req_s",
        "",
        extra=also("our load generator", "loadgen_embeddings_req_s"),
    )
    row("embeddings 1 text/request, c=32: gateway / Infinity", "embeddings_ratio_single_c32", "x")
    row("embeddings 32 texts/request, c=4: gateway / Infinity", "embeddings_ratio_batch32_c4", "x")
    row("gateway RSS per open stream (1,000 streams)", "rss_kib_per_open_stream", " KiB")
    return rows


def board_table(s: dict[str, Any], meta: dict[str, Any]) -> list[str]:
    """The comparison on the board's terms (issue #27): our gateway, its bare client and LiteLLM."""

    def pair(who: str, what: str) -> str:
        p50, p99 = s.get(f"{who}_added_{what}_p50_ms"), s.get(f"{who}_added_{what}_p99_ms")
        return "-" if p50 is None or p99 is None else f"{p50:+.2f} / {p99:+.2f} ms"

    def lat(who: str) -> str:
        p50, p99 = s.get(f"{who}_added_p50_ms_c1"), s.get(f"{who}_added_p99_ms_c1")
        return "-" if p50 is None or p99 is None else f"{p50:+.2f} / {p99:+.2f} ms"

    def us(key: str) -> str:
        return _val(s.get(key), " us")

    def count(key: str) -> str:
        v = s.get(key)
        return "-" if v is None else f"{v:g}"

    def target(key: str, unit: str) -> str:
        return f"{_target(key, unit)} | {_verdict(key, s.get(key))}"

    version = meta.get("litellm_version") or "?"
    sf_bare = s.get("litellm_stall_free_bare")
    rep = meta.get("board_repeat")
    repeat = (
        f" These figures are from the `board` case repeated on its own at {rep.get('started')} (commit "
        f"{rep.get('git')}, load average {rep.get('loadavg_1m_at_start')} to {rep.get('loadavg_1m_at_end')}; "
        f"{rep.get('history')}): {rep.get('why')}; the first attempt is `board_first_attempt` in latest.json."
        if isinstance(rep, dict)
        else ""
    )
    return [
        f'On the board\'s terms (20 ms pacing, c=1 unless stated; "added" = the side minus its bare client on '
        f"the same upstream: our gateway vs the bare gRPC client on Triton's `synthetic-llm-paced`, LiteLLM "
        f"{version} vs the paced stand-in it fronts called directly).{repeat}",
        "",
        f"| board metric | gateway, 1 worker | gateway, 2 workers | bare client (Triton gRPC) | LiteLLM {version} | "
        "target (gateway) | verdict |",
        "|---|---:|---:|---:|---:|---|---|",
        f"| added latency p50 / p99, non-streamed (`board_added_p99_ms_c1`) | {lat('board')} | - | 0 (reference) "
        f"| {lat('litellm')} | p99 {target('board_added_p99_ms_c1', ' ms')} |",
        f"| added TTFT p50 / p99, streamed (`board_added_ttft_p99_ms`) | {pair('board', 'ttft')} | - | "
        f"0 (reference) | {pair('litellm', 'ttft')} | p99 {target('board_added_ttft_p99_ms', ' ms')} |",
        f"| added inter-token latency p50 / p99, 64-token stream (`board_added_itl_p99_ms`) | "
        f"{pair('board', 'itl')} | - | 0 (reference) | {pair('litellm', 'itl')} | p99 "
        f"{target('board_added_itl_p99_ms', ' ms')} |",
        "| stall-free 20 ms streams, no gap > 2x pacing (`board_stall_free_w1`) | "
        f"{count('board_stall_free_w1')} | {count('board_stall_free_w2')} | {count('board_stall_free_bare')} | "
        f"{count('litellm_stall_free')}{f' (its stand-in: {sf_bare:g})' if sf_bare is not None else ''} | "
        f"w1 / bare {_val(s.get('board_stall_free_ratio_w1'), 'x')} {target('board_stall_free_ratio_w1', 'x')} |",
        f"| CPU per non-streamed request (`board_cpu_us_per_request`) | {us('board_cpu_us_per_request')} | - | - | "
        f"{us('litellm_cpu_us_per_request')} | report | - |",
        f"| CPU per streamed token (`board_cpu_us_per_token`) | {us('board_cpu_us_per_token')} | - | - | "
        f"{us('litellm_cpu_us_per_token')} | report | - |",
        "",
    ]


def readme_table(res: dict[str, Any]) -> str:
    """The docs' performance table (docs/performance/index.md): rendered from ``res["summary"]`` and
    ``res["meta"]`` only; the comparison on the board's terms leads."""
    s = res.get("summary") or {}
    meta = res.get("meta") or {}
    out = [
        f"{meta.get('mode', '?')} run of {meta.get('started', '?')} at commit {meta.get('git') or '?'}: "
        f"{meta.get('cpus')} CPU cores shared by Triton, the gateway and the load generators (load average "
        f"{meta.get('loadavg_1m_at_start')} at start, {meta.get('loadavg_1m_at_end')} at end).",
        "",
        *board_table(s, meta),
        f"Limit client (`limit_client`): {s.get('limit_client') or '-'}.",
        "",
        "| figure (`summary` key) | value | target | verdict |",
        "|---|---:|---|---|",
    ]
    out += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in _rows(s)]
    notes = s.get("notes") or {}
    if notes:
        out += ["", "Not measured in this run:", ""]
        out += [f"- `{k}`: {v}" for k, v in notes.items()]
    return "\n".join(out) + "\n"


def render_markdown(res: dict[str, Any]) -> str:
    """``latest.md``: the docs' table, then every case's detail."""
    meta = res.get("meta", {})
    out = [
        f"### Gateway benchmark ({meta.get('mode', '?')} run, {meta.get('started', '?')}, commit "
        f"{meta.get('git') or '?'}, {meta.get('duration_s')} s)",
        "",
        readme_table(res).rstrip("\n"),
    ]
    relay = res.get("relay")
    if relay:
        out += [
            "",
            "Stream relay (512-token streams; tokens/s: medians of the runs; ratio: median of the paired runs; "
            "CPU % of one core over the gateway runs' windows):",
            "",
            "| concurrency | limit | tritonclient (old limit) | gateway | gateway / limit | gateway / tritonclient | "
            "gateway us CPU/token | CPU % gateway / Triton / load gen |",
            "|---|---:|---:|---:|---:|---:|---:|---|",
        ]
        for key, cell in relay.items():
            runs = sorted(cell["gateway"]["runs"], key=lambda r: r["rate"])
            cpu = runs[len(runs) // 2].get("cpu_pct", {})
            out.append(
                f"| {key[1:]} | {cell['limit']['tokens_per_s']:,.0f} | {cell['tritonclient']['tokens_per_s']:,.0f} | "
                f"{cell['gateway']['tokens_per_s']:,.0f} | {cell['ratio']:.2f} | {cell['ratio_vs_tritonclient']:.2f} | "
                f"{cell['gateway_cpu_us_per_token']} | {cpu.get('gateway')} / {cpu.get('triton')} / "
                f"{cpu.get('loadgen')} |"
            )
    lat = res.get("latency")
    if lat:
        out += [
            "",
            "Non-streamed chat, 16 tokens (ms): the gateway vs the same request (`streaming=false`) from the limit "
            "client; a per-token stream and tritonclient's request for information.",
            "",
            "| concurrency | path | p50 | p90 | p99 | req/s |",
            "|---|---|---:|---:|---:|---:|",
        ]
        for key, cell in lat.items():
            if not key.startswith("c"):
                continue
            for name in ("limit_unary", "gateway", "limit_stream", "tritonclient_unary"):
                r = cell.get(name)
                if r:
                    out.append(
                        f"| {key[1:]} | {name} | {r['p50_ms']:.2f} | {r['p90_ms']:.2f} | {r['p99_ms']:.2f} | "
                        f"{r.get('req_per_s', 0):.0f} |"
                    )
        t = lat.get("ttft_c1")
        if t:
            out += [
                "",
                f"Time to first streamed token, c=1 (ms): gateway p50 {t['gateway']['p50_ms']:.2f}, p99 "
                f"{t['gateway']['p99_ms']:.2f}; limit p50 {t['limit']['p50_ms']:.2f}, p99 {t['limit']['p99_ms']:.2f}.",
            ]
    g = res.get("guided")
    if g:
        out += [
            "",
            f"Guided vs unguided, c={g.get('concurrency')}, {g.get('tokens_per_request')}-token streams:",
            "",
            "| variant | tokens/s | gateway us CPU/token | tokens/s vs unguided | CPU/token vs unguided |",
            "|---|---:|---:|---:|---:|",
        ]
        for name in ("unguided", "json_schema", "tool_call"):
            cell = g.get(name)
            if cell:
                out.append(
                    f"| {name} | {cell['tokens_per_s']:,.0f} | {cell['gateway_cpu_us_per_token']} | "
                    f"{_fmt(cell.get('tok_s_ratio'))} | {_fmt(cell.get('cpu_per_token_ratio'))} |"
                )
    w = res.get("workers")
    if w:
        if "skipped" in w:
            out += ["", f"Workers scaling: {w['skipped']}."]
        else:
            out += [
                "",
                f"Workers scaling, c={w['concurrency']}: `--workers 1` {w['workers1']['tokens_per_s']:,.0f} tokens/s "
                f"({w['workers1']['gateway_cpu_us_per_token']} us CPU/token), `--workers 2` "
                f"{w['workers2']['tokens_per_s']:,.0f} tokens/s ({w['workers2']['gateway_cpu_us_per_token']} us "
                f"CPU/token): {w['tok_s_ratio']:.2f}x.",
            ]
    a = res.get("aiperf")
    if a and "chat" in a:
        ours, theirs = a["chat"]["loadgen"], a["chat"].get("aiperf", {})
        out += [
            "",
            f"AIPerf {a.get('version')} vs our load generator, streamed chat c={a['chat']['concurrency']}, "
            f"{a['chat']['output_tokens']} tokens:",
            "",
            "| client | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | output tokens/s |",
            "|---|---:|---:|---:|---:|",
            f"| AIPerf | {_fmt(theirs.get('ttft_p50_ms'))} | {_fmt(theirs.get('ttft_p99_ms'))} | "
            f"{_fmt(theirs.get('itl_p50_ms'))} | {_fmt(theirs.get('output_tokens_per_s'))} |",
            f"| ours | {_fmt(ours['ttft']['p50_ms'])} | {_fmt(ours['ttft']['p99_ms'])} | "
            f"{_fmt(ours['itl']['p50_ms'])} | {_fmt(ours['rate'])} |",
        ]
        e = a.get("embeddings")
        if e and "aiperf" in e:
            out += [
                f"| embeddings c={e['concurrency']}, AIPerf | req/s {_fmt(e['aiperf'].get('requests_per_s'))} | "
                f"p50 {_fmt(e['aiperf'].get('request_latency_p50_ms'))} ms | | |",
                f"| embeddings c={e['concurrency']}, ours | req/s {_fmt(e['loadgen'].get('req_per_s'))} | "
                f"p50 {_fmt(e['loadgen'].get('p50_ms'))} ms | | |",
            ]
    ms = res.get("many_streams")
    if ms:
        out += [
            "",
            f"Many streams: {ms['open']} of {ms['streams']} streams open ({ms['errors']} errors), one token per "
            f"{ms['token_delay_ms']} ms each; gateway RSS {ms['rss_before_mib']} MiB idle, {ms['rss_held_mib']} MiB "
            f"held, {ms['rss_after_close_mib']} MiB after closing; {ms['gateway_cpu_pct_while_held']} % CPU "
            f"while relaying {ms['tokens_per_s_while_held']} tokens/s.",
        ]
    emb = res.get("embeddings")
    if emb:
        for key in ("single_c32", "batch32_c4"):
            cell = emb.get(key)
            if cell and "gateway" in cell:
                inf = cell.get("infinity", {}).get("rate")
                out += [
                    "",
                    f"Embeddings {key}: gateway {cell['gateway']['rate']:.1f} texts/s, Infinity {_fmt(inf)} texts/s.",
                ]
        if emb.get("infinity_error"):
            out += ["", f"Infinity baseline unavailable: `{emb['infinity_error'][:400]}`"]
    prof = res.get("profile")
    if prof:
        for name, p in prof.items():
            out += [
                "",
                f"Gateway profile, {name} case (py-spy, {p['samples']} samples; % of samples):",
                "",
                "| self time | % | inclusive (gateway code) | % |",
                "|---|---:|---|---:|",
            ]
            for i in range(max(len(p["self"]), len(p["gateway_inclusive"]))):
                s = p["self"][i] if i < len(p["self"]) else {"function": "", "pct": ""}
                gi = p["gateway_inclusive"][i] if i < len(p["gateway_inclusive"]) else {"function": "", "pct": ""}
                out.append(f"| `{s['function']}` | {s['pct']} | `{gi['function']}` | {gi['pct']} |".replace("``", ""))
    if res.get("failures"):
        out += ["", "Failures:", ""] + [f"- {f['case']}: `{f['error'][:500]}`" for f in res["failures"]]
    return "\n".join(out) + "\n"


def write_results(res: dict[str, Any], folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "history").mkdir(exist_ok=True)
    data = json.dumps(res, indent=1, sort_keys=False) + "\n"
    md = render_markdown(res)
    stamp = res.get("meta", {}).get("started", "unknown").replace(":", "").replace("+0000", "Z")[:15]
    paths = [
        folder / "latest.json",
        folder / "latest.md",
        folder / "history" / f"{stamp}-{res.get('meta', {}).get('mode', 'run')}.json",
    ]
    paths[0].write_text(data)
    paths[1].write_text(md)
    paths[2].write_text(data)
    return paths


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.report [latest.json]``: print the docs' table rendered from a results file."""
    args = sys.argv[1:] if argv is None else argv
    path = Path(args[0]) if args else Path(__file__).resolve().parent / "results" / "latest.json"
    sys.stdout.write(readme_table(json.loads(path.read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
