"""The counting algorithm (`quota.store.MemoryCore`) on a clock the test moves, the keys file's checks,
and OpenAI's duration spelling. Oracles: arithmetic on the limits and on what the test sent."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from openai_api.quota.caller import Policy
from openai_api.quota.keys import KeysFileError, load_keys, parse_keys
from openai_api.quota.service import go_duration
from openai_api.quota.store import Limits, MemoryCore, seconds_to_next_month

T0 = 1_800_000_000.0  # a bucket edge for a 60 s window (1 s buckets)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def core() -> tuple[MemoryCore, Clock]:
    clock = Clock()
    return MemoryCore(clock), clock


def test_requests_per_window_hold_over_any_sliding_minute_and_retry_after_says_when() -> None:
    c, clock = core()
    lim = Limits(requests=10, tokens=None, concurrent=None, day=None, month=None, window_s=60)
    for _ in range(6):
        assert c.begin("k", lim).ok
        c.finish("k", [], True)
    clock.t += 30
    for i in range(4):
        d = c.begin("k", lim)
        assert d.ok and d.requests_remaining == 3 - i
        c.finish("k", [], True)
    d = c.begin("k", lim)
    assert not d.ok and d.reason == "requests"
    assert d.retry_after_s == pytest.approx(30.0)  # the first six leave the window at T0 + 60
    clock.t = T0 + 59.9
    assert not c.begin("k", lim).ok
    clock.t = T0 + 60.0
    d = c.begin("k", lim)
    assert d.ok and d.requests_remaining == 6 - 1  # six left the window, four still in it, one taken now


def test_tokens_are_reserved_settled_and_refused_past_the_window() -> None:
    c, _clock = core()
    lim = Limits(requests=None, tokens=1000, concurrent=None, day=None, month=None, window_s=60)
    assert c.begin("k", lim).ok
    r = c.reserve("k", lim, 600)
    assert r.ok and r.tokens_remaining == 400
    assert c.reserve("k", lim, 500).reason == "tokens"
    c.finish("k", [(r.grant, 100 - 600)], True)  # used 100 of the 600
    assert c.usage("k", lim)["tokens_in_window"] == 100
    assert c.reserve("k", lim, 900).ok
    assert c.reserve("k", lim, 1001).reason == "too_large"


def test_concurrency_and_a_dead_holders_slots() -> None:
    c, _ = core()
    lim = Limits(requests=None, tokens=None, concurrent=2, day=None, month=None, window_s=60)
    assert c.begin("k", lim, "w1").ok and c.begin("k", lim, "w2").ok
    d = c.begin("k", lim, "w1")
    assert not d.ok and d.reason == "concurrent"
    c.drop_holder("w2")
    assert c.begin("k", lim, "w1").ok


def test_budgets_stop_the_key_until_the_next_period() -> None:
    c, clock = core()
    lim = Limits(requests=None, tokens=None, concurrent=None, day=1000, month=1500, window_s=60)
    assert c.begin("k", lim).ok and c.reserve("k", lim, 1000).ok
    d = c.begin("k", lim)
    assert not d.ok and d.reason == "day"
    clock.t += 86400
    assert c.begin("k", lim).ok
    assert c.reserve("k", lim, 600).reason in ("month", "day")  # 1000 + 600 > 1500 (unless a month turned)


def test_limits_scale_per_minute_figures_to_the_window() -> None:
    p = Policy(requests_per_minute=600, tokens_per_minute=60_000)
    lim = Limits.of(p, 10)
    assert (lim.requests, lim.tokens) == (100, 10_000)


def test_month_boundary_is_utc() -> None:
    assert seconds_to_next_month(1_801_440_000.0 - 1) == pytest.approx(1.0)  # 2027-01-01T00:00:00Z


@pytest.mark.parametrize(("seconds", "text"), [(0.02, "20ms"), (1, "1s"), (6.5, "6.5s"), (360, "6m0s"),
                                               (61.25, "1m1.25s"), (0, "0ms")])
def test_durations_are_spelt_as_openai_does(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text


def sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def test_keys_file_yaml_env_secret_and_globs(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    path.write_text(f"""
window_seconds: 10
keys:
  - name: a
    secret_sha256: {sha('sk-a')}
    models: ["smollm2-*"]
    priority: low
  - name: b
    secret_env: B_KEY
""", encoding="utf-8")
    table = load_keys(path, {"B_KEY": "sk-b"})
    a = table.caller(b"sk-a")
    assert a is not None and a.allows("smollm2-vllm") and not a.allows("all-minilm-l6-v2") and a.share == 0.7
    b = table.caller(b"sk-b")
    assert b is not None and b.name == "b" and b.allows("anything")
    assert table.caller(b"sk-c") is None and table.window_s == 10


@pytest.mark.parametrize(("doc", "words"), [
    ({"keys": [{"name": "x"}]}, "keys[0] ('x')"),
    ({"keys": [{"name": "x", "secret_sha256": "abc"}]}, "secret_sha256"),
    ({"keys": [{"name": "x", "secret_env": "NOPE_NOT_SET"}]}, "NOPE_NOT_SET is not set"),
    ({"keys": [{"name": "x", "secret_sha256": sha("s")}, {"name": "x", "secret_sha256": sha("t")}]}, "twice"),
    ({"keys": [{"name": "x", "secret_sha256": sha("s")}, {"name": "y", "secret_sha256": sha("s")}]}, "same secret"),
    ({"keys": [{"name": "x", "secret_sha256": sha("s"), "requests_per_minute": 0}]}, "requests_per_minute"),
    ({"keys": [{"name": "x", "secret_sha256": sha("s"), "rpm": 5}]}, "rpm"),
])
def test_a_bad_keys_file_is_refused_naming_the_entry_never_the_secret(doc: dict[str, object], words: str) -> None:
    with pytest.raises(KeysFileError) as e:
        parse_keys(doc, "keys.json", {})
    assert words in str(e.value)
    assert sha("s") not in str(e.value)


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(json.dumps([1, 2]), encoding="utf-8")
    with pytest.raises(KeysFileError, match="mapping"):
        load_keys(path)
