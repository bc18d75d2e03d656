"""The agent-sessions bench's pure parts: the replayed sessions' shape and sizes (bench/agent_traffic.py, with a
stand-in token counter: one token per 4 characters, so the expected sizes are worked out by hand) and the
results' arithmetic (bench/agent_results.py) on hand-made records."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from bench.agent_results import per_turn, render_md, short_summary, targets, worker_switches
from bench.agent_sessions import usage_of
from bench.agent_traffic import Corpus, SessionShape, billing_block, claude_code_session, codex_session


def count(texts: list[str]) -> list[int]:
    return [max(1, len(t) // 4) for t in texts]


def corpus(numbered: bool = True) -> Corpus:
    # 40 files of 300 lines of 40 characters (10 tokens by the stand-in, + 1 for the newline)
    files = [(f"/src/mod{i:02d}.py", "\n".join(f"x{i:02d}_{j:04d} = {'y' * 29}" for j in range(300)))
             for i in range(40)]
    return Corpus(files, count, numbered)


PROSE = ['"""' + "A paragraph of module documentation, long enough to count as prose. " * 6 + '"""\n'] * 50


def test_corpus_takes_about_the_tokens_asked_and_walks_on() -> None:
    c = corpus(numbered=False)
    # a plain line is 40 characters: 10 tokens, +1 for its newline -> 11; 4,500 tokens -> 410 lines (4,510)
    reads = c.take(4500)
    assert sum(r.tokens for r in reads) == 4510
    assert [(r.path, r.first, len(r.lines)) for r in reads] == [("/src/mod00.py", 1, 300), ("/src/mod01.py", 1, 110)]
    nxt = c.take(100)  # goes on where the last read stopped
    assert (nxt[0].path, nxt[0].first) == ("/src/mod01.py", 111)


def test_numbered_reads_are_cat_n() -> None:
    r = corpus().take(30)[0]
    assert r.numbered().splitlines()[1] == "     2\tx00_0001 = " + "y" * 29
    assert r.plain().splitlines()[1] == "x00_0001 = " + "y" * 29


def test_corpus_that_runs_out_says_so() -> None:
    c = Corpus([("/a.py", "a = 1\n")], count, False)
    with pytest.raises(ValueError, match="ran out"):
        c.take(100)


def test_claude_code_session_grows_by_a_turn_of_reads_and_keeps_its_shape() -> None:
    shape = SessionShape(turns=4, tokens_per_turn=2000, system_tokens=300, model="m")
    reqs = [(r, json.loads(r.encoded())) for r in claude_code_session(corpus(), PROSE, shape, "s1")]
    assert [r.turn for r, _ in reqs] == [1, 2, 3, 4]
    r1, b1 = reqs[0]
    assert r1.path == "/v1/messages" and r1.headers["x-claude-code-session-id"]
    assert b1["model"] == "m" and b1["max_tokens"] == 1 and b1["stream"] is False
    assert len(b1["tools"]) >= 12 and all("input_schema" in t for t in b1["tools"])
    assert b1["system"][0]["text"].startswith("x-anthropic-billing-header: cc_version=")
    assert b1["system"][-1]["cache_control"] == {"type": "ephemeral"}
    # turn k = 1 user message + (k - 1) x (assistant tool_use, user tool_result); the last block marked
    for k, (_, b) in enumerate(reqs, 1):
        assert len(b["messages"]) == 1 + 2 * (k - 1)
        assert b["messages"][-1]["content"][-1]["cache_control"] == {"type": "ephemeral"}
    _, b4 = reqs[3]
    assert "cache_control" not in b4["messages"][2]["content"][-1]  # earlier turns stay unmarked
    calls = [blk for m in b4["messages"] if m["role"] == "assistant" for blk in m["content"]
             if blk["type"] == "tool_use"]
    results = [blk for m in b4["messages"] if m["role"] == "user" for blk in m["content"]
               if blk["type"] == "tool_result"]
    assert [c["id"] for c in calls] == [r["tool_use_id"] for r in results]
    # each turn adds 2,000 tokens of numbered source and at most one line more: a numbered line is
    # "     1\t" + 40 characters = 47 -> 11 tokens by the stand-in, + 1 for its newline = 12
    for m in b4["messages"][2::2]:
        lines = [ln for blk in m["content"] for ln in blk["content"].splitlines()]
        assert 2000 <= 12 * len(lines) < 2012 and all(len(ln) == 47 for ln in lines)
    # the billing block's hashes change with every request; earlier turns are prefixes of later ones
    assert len({b["system"][0]["text"] for _, b in reqs}) == 4
    assert b4["messages"][:3] == [reqs[2][1]["messages"][0], reqs[2][1]["messages"][1],
                                  {**reqs[2][1]["messages"][2], "content": [
                                      {k: v for k, v in blk.items() if k != "cache_control"}
                                      for blk in reqs[2][1]["messages"][2]["content"]]}]


def test_stable_billing_header_is_one_per_session() -> None:
    assert billing_block("s", 1, stable=True) == billing_block("s", 7, stable=True)
    assert billing_block("s", 1, stable=False) != billing_block("s", 2, stable=False)
    assert billing_block("s", 3, stable=False).endswith(";") and "cch=" in billing_block("s", 3, stable=False)


def test_codex_session_items_pair_calls_with_outputs() -> None:
    shape = SessionShape(turns=3, tokens_per_turn=1500, system_tokens=300)
    reqs = [(r, json.loads(r.encoded())) for r in codex_session(corpus(numbered=False), PROSE, shape, "s2")]
    r3, b3 = reqs[-1]
    assert r3.path == "/v1/responses" and r3.headers["session_id"] == b3["prompt_cache_key"]
    assert b3["max_output_tokens"] == 1 and b3["instructions"]
    assert len(b3["tools"]) == 8 and all(t["type"] == "function" for t in b3["tools"])
    kinds = [i["type"] for i in b3["input"]]
    assert kinds[:3] == ["message"] * 3 and kinds.count("reasoning") == 2
    calls = [i["call_id"] for i in b3["input"] if i["type"] == "function_call"]
    outs = [i for i in b3["input"] if i["type"] == "function_call_output"]
    assert calls == [o["call_id"] for o in outs] and len(calls) >= 2
    assert outs[0]["output"].startswith("Exit code: 0\nWall time:")
    assert json.loads(next(i for i in b3["input"] if i["type"] == "function_call")["arguments"])["command"][0] == "bash"


def test_usage_of_reads_each_dialects_fields() -> None:
    anthropic = b'{"usage":{"input_tokens":100,"cache_creation_input_tokens":20,"cache_read_input_tokens":880,' \
                b'"output_tokens":1}}'
    assert usage_of("claude_code", anthropic) == {"prompt_tokens": 1000, "cached_tokens": 880,
                                                  "cache_creation_tokens": 20}
    responses = b'{"usage":{"input_tokens":1000,"input_tokens_details":{"cached_tokens":0},"output_tokens":1}}'
    assert usage_of("codex", responses) == {"prompt_tokens": 1000, "cached_tokens": 0, "cache_creation_tokens": None}
    # streamed: the last usage of the stream
    sse = b'data: {"usage":{"input_tokens":5}}\n\ndata: {"usage":{"input_tokens":7}}\n\n'
    assert usage_of("codex", sse)["prompt_tokens"] == 7


def rec(arm: str, rep: int, turn: int, tokens: int, cpu: float, wall: float, limit: float = 10.0,
        **extra: Any) -> dict[str, Any]:
    return {"dialect": "codex", "arm": arm, "rep": rep, "turn": turn, "status": 200, "prompt_tokens": tokens,
            "cached_tokens": 0, "cpu_ms": cpu, "wall_ms": wall, "limit_ms": limit, "added_ms": wall - limit, **extra}


RECORDS = [
    # cache on: turn 2 (~9k) 20 / 22 ms CPU, turn 26 (~117k) 26 / 30 ms, two repetitions
    rec("w1-on-keep", 0, 2, 8_900, 20.0, 40.0), rec("w1-on-keep", 1, 2, 8_950, 22.0, 44.0),
    rec("w1-on-keep", 0, 26, 117_000, 26.0, 50.0, limit=30.0),
    rec("w1-on-keep", 1, 26, 117_100, 30.0, 56.0, limit=30.0),
    rec("w1-on-keep", 0, 14, 60_000, 25.0, 45.0),
    # cache off: 25 and 290 ms at the same turns
    rec("w1-off-keep", 0, 2, 8_900, 25.0, 45.0), rec("w1-off-keep", 1, 2, 8_950, 25.0, 46.0),
    rec("w1-off-keep", 0, 26, 117_000, 290.0, 320.0, limit=30.0),
    rec("w1-off-keep", 1, 26, 117_100, 300.0, 330.0, limit=30.0),
    # a failed request does not count
    {**rec("w1-on-keep", 2, 26, 117_000, 999.0, 999.0), "status": 500},
    rec("w2-on-new", 0, 2, 8_900, 20.0, 40.0, worker=0), rec("w2-on-new", 0, 26, 117_000, 60.0, 90.0, worker=1),
    rec("w2-off-keep", 0, 26, 117_000, 240.0, 260.0),
]


def test_per_turn_medians_skip_failures() -> None:
    rows = {r["turn"]: r for r in per_turn(RECORDS)["codex"]["w1-on-keep"]}
    assert rows[26]["reps"] == 2 and rows[26]["cpu_ms"] == 28.0 and rows[26]["prompt_tokens"] == 117_050
    assert rows[26]["added_ms"] == 23.0  # (20 + 26) / 2
    assert per_turn(RECORDS)["codex"]["w2-on-new"][1]["workers"] == [1]


def test_targets_pair_by_repetition() -> None:
    t = targets(RECORDS)["codex"]
    on = t["w1-on-keep"]
    assert (on["high_turn"], on["low_turn"]) == (26, 2)
    # per repetition 26 / 20 = 1.3 and 30 / 22 = 1.3636 -> median 1.3318
    assert on["cpu_ratio_by_rep"] == [1.3, 1.364]
    assert math.isclose(on["cpu_ratio"], 1.332, abs_tol=1e-3) and on["cpu_ratio_met"] is True
    assert on["added_ms_high"] == 23.0 and on["added_wall_met"] is True
    # off / on at the high turn, paired: 290 / 26 = 11.15, 300 / 30 = 10 -> 10.577
    assert math.isclose(on["off_over_on_cpu_high"], 10.577, abs_tol=1e-3)
    off = t["w1-off-keep"]
    assert "cpu_ratio_met" not in off and math.isclose(off["cpu_ratio"], 11.8, abs_tol=1e-3)  # 11.6, 12.0
    new = t["w2-on-new"]
    # 60 / 20 = 3; added wall 90 - 10 = 80 ms
    assert new["cpu_ratio"] == 3.0 and new["cpu_ratio_met"] is False
    assert new["added_ms_high"] == 80.0 and new["added_wall_met"] is False
    # no cache-off arm with new connections: its keep-alive twin is the reference, 240 / 60
    assert new["off_over_on_cpu_high"] == 4.0


def test_worker_switches_against_the_keep_alive_gateway() -> None:
    recs = [rec("w2-on-keep", 0, t, 1000 * t, 10.0, 20.0, worker=0) for t in (1, 2, 3, 4)]
    recs += [rec("w2-on-new", 0, t, 1000 * t, cpu, 20.0, worker=w) for t, w, cpu in
             ((1, 0, 10.0), (2, 1, 30.0), (3, 1, 11.0), (4, 0, 20.0))]
    recs.append(rec("w2-off-keep", 0, 2, 2000, 50.0, 60.0, worker=1))  # without the cache: not counted
    cell = worker_switches(recs)["codex"]
    assert list(cell) == ["w2-on-new"]
    # turn 3 stayed on worker 1 (11 / 10); turns 2 (worker 1, new to the session: 30 / 10) and 4 (worker 0, last
    # seen at turn 1: 3 turns before, 20 / 10) switched
    assert cell["w2-on-new"]["same"] == {"turns": 1, "cpu_ms": 11.0, "over_keep_alive": 1.1}
    assert cell["w2-on-new"]["switched"] == {"turns": 2, "cpu_ms": 25.0, "over_keep_alive": 2.5, "never_seen": 1,
                                             "gap_turns": 3}


def test_short_summary_pairs_rounds() -> None:
    rounds = [{"side": "base", "round": 0, "cpu_us_per_request": 1000.0, "p50_ms": 2.0},
              {"side": "head", "round": 0, "cpu_us_per_request": 1100.0, "p50_ms": 2.1},
              {"side": "base", "round": 1, "cpu_us_per_request": 1200.0, "p50_ms": 2.2},
              {"side": "head", "round": 1, "cpu_us_per_request": 1080.0, "p50_ms": 2.0}]
    s = short_summary(rounds)
    assert s["head_over_base_by_round"] == [1.1, 0.9] and s["head_over_base"] == 1.0 and s["met"] is True
    assert s["base"]["cpu_us_per_request"] == 1100.0 and s["head"]["p50_ms"] == 2.05


def test_render_md_names_targets_and_turns() -> None:
    result = {"meta": {"started": "2026-11-28T10:00:00+00:00", "git": "abc1234", "mode": "full", "turns": 26,
                       "tokens_per_turn": 4500, "reps": 2, "max_tokens": 1, "cpus": 2, "loadavg_start": 1.0,
                       "loadavg_end": 2.0, "base_commit": "2bfb556"},
              "per_turn": per_turn(RECORDS), "targets": targets(RECORDS),
              "short": short_summary([{"side": "base", "round": 0, "cpu_us_per_request": 1000.0, "p50_ms": 2.0},
                                      {"side": "head", "round": 0, "cpu_us_per_request": 990.0, "p50_ms": 2.0}])}
    md = render_md(result)
    assert "| Codex over /v1/responses | --workers 1, cache on, keep-alive | 28.0 / 21.0 | 1.33 | met |" in md
    assert "| 26 | 117,050 |" in md and "0.990x" in md
