"""The docs' performance table (docs/performance/index.md) is what `bench.report.readme_table` renders from
the committed `bench/results/latest.json`, and that file's `summary` holds every key the issue names.

After a bench run: `.venv/bin/python scripts/docs.py` rewrites the table between the page's `bench-table`
markers (`.venv/bin/python -m bench.report` prints it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench.report import EXTRA_KEYS, SUMMARY_KEYS, TARGETS, build_summary, readme_table

REPO = Path(__file__).resolve().parents[2]
START, END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"


def latest() -> dict[str, Any]:
    return json.loads((REPO / "bench" / "results" / "latest.json").read_text())


PAGE = REPO / "docs" / "performance" / "index.md"


def test_docs_table_is_rendered_from_latest_json() -> None:
    page = PAGE.read_text()
    assert START in page and END in page
    committed = page.split(START, 1)[1].split(END, 1)[0].strip("\n")
    assert committed == readme_table(latest()).strip("\n"), (
        "docs/performance/index.md's table is not what bench/results/latest.json renders: run "
        "`.venv/bin/python scripts/docs.py` (it rewrites the table between the bench-table markers)"
    )


def test_committed_summary_has_every_key() -> None:
    summary = latest()["summary"]
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["limit_client"] is None or isinstance(summary["limit_client"], str)
    for key in SUMMARY_KEYS[1:]:
        value = summary[key]
        assert value is None or isinstance(value, int | float), key
        if value is None:
            assert summary["notes"].get(key), f"{key} is null without a reason in summary.notes"


def test_summary_reads_each_case_and_says_why_a_figure_is_missing() -> None:
    res: dict[str, Any] = {
        "meta": {"cases": ["relay", "latency", "workers", "guided"]},
        "relay_meta": {"limit_client": "TritonRPC", "limit_processes": "the best of 1 and 2 processes at c > 1"},
        "relay": {
            "c16": {
                "ratio": 0.8,
                "ratio_vs_tritonclient": 1.1,
                "gateway_cpu_us_per_token": 55.5,
                "limit": {"tokens_per_s": 5000.0},
                "gateway": {"tokens_per_s": 4000.0},
            },
        },
        "latency": {"c1": {"added_p50_ms": 0.3}, "ttft_c1": {"added_p50_ms": 0.7}},
        "workers": {"skipped": "the gateway has no --workers flag (python openai_api_cli.py --help)"},
        "failures": [{"case": "guided", "error": "RuntimeError: boom"}],
    }
    s = build_summary(res)
    assert set(s) == {*SUMMARY_KEYS, *EXTRA_KEYS, "notes"}
    assert s["limit_client"] == "TritonRPC; the best of 1 and 2 processes at c > 1"
    assert (s["relay_ratio_c16"], s["cpu_us_per_token_c16"], s["added_ttft_p50_ms"]) == (0.8, 55.5, 0.7)
    assert s["relay_ratio_c1"] is None and "did not produce" in s["notes"]["relay_ratio_c1"]
    assert s["workers2_over_workers1_tok_s"] is None
    assert s["notes"]["workers2_over_workers1_tok_s"] == res["workers"]["skipped"]
    assert "boom" in s["notes"]["guided_cpu_us_per_token_c16"]
    assert "not run in this invocation" in s["notes"]["aiperf_ttft_p50_ms"]
    table = readme_table({"summary": s, "meta": {}})
    assert "| 55.5 us | <= 40 us | **missed** |" in table  # a target missed is shown as missed
    assert "| +0.30 ms | <= 0.5 ms | met |" in table
    assert "0.8x (vs the old tritonclient limit: 1.1x)" in table


def test_every_target_is_a_summary_key() -> None:
    assert set(TARGETS) <= {*SUMMARY_KEYS, *EXTRA_KEYS}
