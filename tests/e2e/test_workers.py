"""`--workers 2` end to end: the real CLI in a subprocess, against the session's Triton (the synthetic LLM, for
speed). Two worker processes answer on one port, /metrics adds up what both served, a worker killed with
SIGKILL is restarted while the port keeps answering, one stopped with SIGSTOP is killed on its missed
heartbeat and restarted, and SIGTERM drains: a stream in flight finishes and
the process exits 0 with no worker left behind. Which worker answered is read from the access log, whose
lines carry the process id with workers."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
import psutil
import pytest

from openai_api.config import BUNDLED_TEMPLATES
from openai_api.embedded.launcher import EmbeddedTriton
from tests.e2e.test_reliability_observability import metric
from tests.e2e.test_reliability_shutdown import AUTH, start_cli, stop, wait_healthy
from tests.e2e.test_reliability_shutdown import write_config as write_shutdown_config
from tests.helpers import MODELS, free_port, requires_models

pytestmark = requires_models("smollm2-135m-instruct")

MODEL = "synthetic-llm"
CHAT = "/v1/chat/completions"
STARTED = re.compile(r"worker (\d+) (?:started|restarted) \(pid (\d+)")


def write_config(folder: Path, triton: EmbeddedTriton) -> Path:
    """The synthetic LLM (it answers as fast as Triton takes tokens) with SmolLM2's tokenizer and template."""
    path = folder / "model_config.json"
    path.write_text(json.dumps({
        "model_infos": [{"name": MODEL, "end_id": -1, "max_len": 32768}],
        "llm": [{"name": MODEL, "url": triton.grpc_url, "path": str(MODELS / "smollm2-135m-instruct"),
                 "triton_model": MODEL, "chat_template": str(BUNDLED_TEMPLATES / "smollm2.jinja")}],
        "embedding": [], "rerank": []}), encoding="utf-8")
    return path


def chat(url: str, rid: str, max_tokens: int = 4) -> httpx.Response:
    """One request on a connection of its own: SO_REUSEPORT places each new connection by its hash."""
    return httpx.post(f"{url}{CHAT}", headers={**AUTH, "X-Request-Id": rid}, timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens})


def served_by(log: Path) -> dict[str, int]:
    """request id -> pid of the worker whose access-log line names it."""
    found = re.findall(r"\[(\d+)\] openai_api\.access: .* request_id=(\S+)", log.read_text(errors="replace"))
    return {rid: int(pid) for pid, rid in found}


def workers(log: Path) -> dict[int, int]:
    """worker index -> its current pid, from the supervisor's log."""
    return {int(i): int(pid) for i, pid in STARTED.findall(log.read_text(errors="replace"))}


def until(check: Callable[[], bool], log: Path, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:.0f} s:\n{log.read_text(errors='replace')[-3000:]}")
        time.sleep(0.1)


def test_two_workers_share_the_port_add_up_metrics_survive_a_kill_and_drain_on_sigterm(
        triton: EmbeddedTriton, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "cli.log"
    proc = start_cli(["--port", str(port), "--config-file", str(write_config(tmp_path, triton)), "--workers", "2",
                      "--shutdown-grace", "30", "--worker-timeout", "5"], log)
    gateway = psutil.Process(proc.pid)
    try:
        wait_healthy(proc, url, log, timeout=60)
        until(lambda: len(workers(log)) == 2, log, "two workers")
        first = workers(log)
        assert all(p.pid in first.values() for p in gateway.children()), "workers are the supervisor's children"

        # 1. Both workers answer on the one port.
        sent = 0
        for i in range(24):
            r = chat(url, f"w-{i}")
            assert r.status_code == 200, r.text
            sent += 1
        until(lambda: len({r for r in served_by(log) if r.startswith("w-")}) == 24, log, "24 access-log lines")
        pids = {pid for rid, pid in served_by(log).items() if rid.startswith("w-")}
        assert pids == set(first.values()), (pids, first)

        # 2. /metrics, whichever worker answers it, counts what both served, and each process's own figures.
        for _ in range(3):
            text = httpx.get(f"{url}/metrics", headers=AUTH, timeout=30).text
            assert metric(text, "openai_api_requests_total", route=CHAT, model=MODEL, status="200") == sent
            assert metric(text, "openai_api_completion_tokens_total", model=MODEL) == 4 * sent
            for index, pid in first.items():
                assert metric(text, "process_resident_memory_bytes", worker=str(index), pid=str(pid)) > 0
            assert metric(text, "process_resident_memory_bytes", worker="supervisor", pid=str(proc.pid)) > 0

        # 3. SIGKILL one worker: the other keeps the port answering, the dead one is restarted and serves again.
        victim = first[0]
        psutil.Process(victim).kill()
        until(lambda: f"worker 0 (pid {victim}) died" in log.read_text(), log, "the supervisor sees the death")
        for i in range(10):
            r = chat(url, f"k-{i}")
            assert r.status_code == 200, r.text
            sent += 1
        until(lambda: workers(log)[0] != victim, log, "worker 0 restarted")
        reborn = workers(log)[0]
        deadline = time.monotonic() + 30
        while reborn not in served_by(log).values():  # new connections reach it once it listens
            assert time.monotonic() < deadline, f"the restarted worker never served:\n{log.read_text()[-3000:]}"
            r = chat(url, f"r-{sent}")
            assert r.status_code == 200, r.text
            sent += 1
            time.sleep(0.1)  # its access-log line is written after the response
        text = httpx.get(f"{url}/metrics", headers=AUTH, timeout=30).text
        # The dead worker's counts stay in the sums; its process figures are gone, the new one's are there.
        assert metric(text, "openai_api_requests_total", route=CHAT, model=MODEL, status="200") == sent
        assert metric(text, "process_resident_memory_bytes", pid=str(victim)) == 0
        assert metric(text, "process_resident_memory_bytes", worker="0", pid=str(reborn)) > 0

        # 3b. A worker that stops without exiting (SIGSTOP: what a blocked event loop looks like from outside)
        # misses its heartbeat, is killed after --worker-timeout and restarted; then both serve again.
        stuck = workers(log)[1]
        os.kill(stuck, signal.SIGSTOP)
        until(lambda: f"worker 1 (pid {stuck}): its event loop has not run for" in log.read_text(), log,
              "the supervisor sees the stopped worker", timeout=30)
        until(lambda: workers(log)[1] != stuck, log, "worker 1 restarted")
        assert not psutil.pid_exists(stuck) or psutil.Process(stuck).status() == psutil.STATUS_ZOMBIE
        revived = workers(log)[1]
        deadline = time.monotonic() + 30
        while revived not in served_by(log).values():
            assert time.monotonic() < deadline, f"the restarted worker never served:\n{log.read_text()[-3000:]}"
            r = chat(url, f"s-{sent}")
            assert r.status_code == 200, r.text
            sent += 1
            time.sleep(0.1)

        # 4. SIGTERM drains: a stream in flight finishes, new requests get 503, the process exits 0.
        events: list[str] = []
        at_signal: list[int] = []
        first_chunk = threading.Event()
        failure: list[BaseException] = []

        def stream() -> None:
            try:
                with httpx.stream("POST", f"{url}{CHAT}", headers=AUTH, timeout=60, json={
                        "model": MODEL, "messages": [{"role": "user", "content": "Go on."}], "stream": True,
                        "max_tokens": 30000}) as r:  # ~2 s here: still running when the drain starts
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
                            first_chunk.set()
            except BaseException as e:  # noqa: BLE001 - reported by the test thread
                failure.append(e)
                first_chunk.set()

        t = threading.Thread(target=stream)
        t.start()
        assert first_chunk.wait(60), "no first chunk"
        living = [psutil.Process(pid) for pid in workers(log).values()]
        at_signal.append(len(events))
        proc.send_signal(signal.SIGTERM)
        # The supervisor passes it on within 0.1 s; each worker says when it drains.
        until(lambda: log.read_text().count(": draining;") == 2, log, "both workers draining", timeout=10)
        r = httpx.post(f"{url}{CHAT}", headers=AUTH, timeout=30, json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
        assert r.status_code == 503 and r.json()["error"]["code"] == "shutting_down", r.text
        t.join(60)
        assert not failure, failure
        assert events[-1] == "[DONE]" and len(events) > at_signal[0] + 1, (at_signal, len(events), events[-2:])
        assert ": draining; 1 requests in flight" in log.read_text()  # the stream's worker drained it
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        assert psutil.wait_procs(living, timeout=10)[1] == [], "a worker outlived the supervisor"
        text = log.read_text()
        assert text.count("stopped: exit code 0") == 2 and "Traceback" not in text, text[-3000:]
    finally:
        stop(proc)
        for pid in STARTED.findall(log.read_text(errors="replace")):  # only if the test failed: no stray worker
            if psutil.pid_exists(int(pid[1])):
                psutil.Process(int(pid[1])).kill()


def test_stored_responses_are_shared_by_the_workers_and_owned_by_their_key(
        triton: EmbeddedTriton, tmp_path: Path) -> None:
    """`--workers 2 --responses-store N` (no URL: the supervisor gives the workers one SQLite file): a response
    made on one worker is read and continued by its key on the other, and another key gets the 404 of an id never
    issued whichever worker it reaches. Each call is a new connection (SO_REUSEPORT spreads them by hash); which
    worker answered comes from the access log."""
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"keys": [
        {"name": "team-a", "secret_sha256": hashlib.sha256(b"sk-team-a").hexdigest()},
        {"name": "team-b", "secret_sha256": hashlib.sha256(b"sk-team-b").hexdigest()}]}), encoding="utf-8")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "cli.log"
    proc = start_cli(["--port", str(port), "--config-file", str(write_config(tmp_path, triton)), "--workers", "2",
                      "--keys-file", str(keys), "--responses-store", "100"], log)

    def call(key: str, rid: str) -> openai.OpenAI:  # a new client: a new connection, the request id set
        return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60,
                             default_headers={"X-Request-Id": rid})

    try:
        wait_healthy(proc, url, log, timeout=60)
        until(lambda: len(workers(log)) == 2, log, "two workers")
        made: dict[str, str] = {}  # request id -> response id
        crossed = 0  # reads by the owner on the worker that did not make the response
        for i in range(40):
            rid = f"make-{i}"
            made[rid] = call("sk-team-a", rid).responses.create(model=MODEL, input="Hi", store=True,
                                                                 max_output_tokens=4).id
            for j in range(2):
                assert call("sk-team-a", f"read-{i}-{j}").responses.retrieve(made[rid]).id == made[rid]
                with pytest.raises(openai.NotFoundError):
                    call("sk-team-b", f"deny-{i}-{j}").responses.retrieve(made[rid])
                with pytest.raises(openai.NotFoundError):
                    call("sk-team-b", f"cont-{i}-{j}").responses.create(
                        model=MODEL, input="Go on", previous_response_id=made[rid], max_output_tokens=4)
            last = f"cont-{i}-1"
            until(lambda last=last: last in served_by(log), log, "the access-log lines")
            pids = served_by(log)
            crossed += sum(pids[f"read-{i}-{j}"] != pids[f"make-{i}"] for j in range(2))
            denied_on = {pids[f"deny-{k}-{j}"] for k in range(i + 1) for j in range(2)}
            if crossed >= 2 and len(denied_on) == 2 and i >= 3:
                break
        assert crossed >= 2 and len(denied_on) == 2, (crossed, denied_on)
        rid = next(iter(made))
        follow = call("sk-team-a", "follow").responses.create(model=MODEL, input="Go on", max_output_tokens=4,
                                                               previous_response_id=made[rid])
        assert follow.previous_response_id == made[rid]
        assert f"object_id={made[rid]}" in log.read_text()  # the log ties the response to its request id
    finally:
        stop(proc)
        for pid in STARTED.findall(log.read_text(errors="replace")):
            if psutil.pid_exists(int(pid[1])):
                psutil.Process(int(pid[1])).kill()


def test_the_embedded_triton_is_started_once_and_shared_by_the_workers(tmp_path: Path) -> None:
    """`--embedded-triton --workers 2` (what `scripts/run.sh --workers 2` runs): one tritonserver, in the
    supervisor, serving both workers; SIGTERM stops the workers, then Triton, and exits 0."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "cli.log"
    # Only the embedding model: the embedded Triton starts in seconds.
    proc = start_cli(["--port", str(port), "--embedded-triton", "--workers", "2",
                      "--config-file", str(write_shutdown_config(tmp_path, None, ("embedding",)))], log)
    tritons: list[psutil.Process] = []
    try:
        wait_healthy(proc, url, log, timeout=240)
        until(lambda: len(workers(log)) == 2, log, "two workers")
        children = psutil.Process(proc.pid).children()
        tritons += [c for c in children if c.name() == "tritonserver"]
        assert len(tritons) == 1, [c.name() for c in psutil.Process(proc.pid).children(recursive=True)]
        assert {c.pid for c in children} == {tritons[0].pid, *workers(log).values()}
        for i in range(16):  # on connections of their own, so both workers take some
            r = httpx.post(f"{url}/v1/embeddings", headers={**AUTH, "X-Request-Id": f"e-{i}"}, timeout=60,
                           json={"model": "all-minilm-l6-v2", "input": "hello"})
            assert r.status_code == 200, r.text
        until(lambda: sum(rid.startswith("e-") for rid in served_by(log)) == 16, log, "16 access-log lines")
        assert {pid for rid, pid in served_by(log).items() if rid.startswith("e-")} == set(workers(log).values())
        living = [psutil.Process(pid) for pid in workers(log).values()]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()[-3000:]
        assert psutil.wait_procs([*living, *tritons], timeout=10)[1] == [], "a worker or Triton outlived the gateway"
    finally:
        stop(proc)
        for t in tritons:  # only if the test failed: never leave a tritonserver behind
            if t.is_running():
                os.killpg(t.pid, signal.SIGKILL)


def test_two_workers_share_the_prefix_map(triton: EmbeddedTriton, tmp_path: Path) -> None:
    """prefix_affinity with --workers 2 (#22 item 3): every turn on a new connection, so turns of one
    conversation reach both workers; every follow-up still finds its conversation's prefix (the map is
    shared), which a per-worker map would miss whenever the turn reached the other worker. Two replica urls
    name the one session Triton (127.0.0.1 and localhost)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "cli.log"
    config = write_config(tmp_path, triton)
    data = json.loads(config.read_text(encoding="utf-8"))
    data["llm"][0]["url"] = [triton.grpc_url, triton.grpc_url.replace("127.0.0.1", "localhost")]
    data["llm"][0]["routing"] = {"policy": "prefix_affinity", "block_tokens": 8}
    config.write_text(json.dumps(data), encoding="utf-8")
    proc = start_cli(["--port", str(port), "--config-file", str(config), "--workers", "2"], log)
    try:
        wait_healthy(proc, url, log, 120)
        conversations, turns = 8, 3
        # Each conversation's first tokens differ (its number comes first), so a first turn matches nothing.
        histories = [[{"role": "system", "content": f"{c}{c}{c}: you are helper {c} of a routing test."}]
                     for c in range(conversations)]
        for turn in range(turns):
            for c, messages in enumerate(histories):
                messages.append({"role": "user", "content": f"Conversation {c}, turn {turn}: go on."})
                r = httpx.post(f"{url}{CHAT}", headers={**AUTH, "X-Request-Id": f"conv{c}-turn{turn}"}, timeout=60,
                               json={"model": MODEL, "messages": messages, "max_tokens": 6})
                assert r.status_code == 200, r.text
                messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        ids = {f"conv{c}-turn{t}" for c in range(conversations) for t in range(turns)}
        until(lambda: ids <= served_by(log).keys(), log, "access-log lines")
        pids = served_by(log)
        moved = sum(pids[f"conv{c}-turn{t}"] != pids[f"conv{c}-turn{t - 1}"]
                    for c in range(conversations) for t in range(1, turns))
        assert moved >= 3, f"too few follow-ups reached the other worker to tell anything: {moved}"
        text = httpx.get(f"{url}/metrics", headers=AUTH, timeout=30).text
        decisions = {reason: metric(text, "openai_api_routing_decisions_total", model=MODEL, reason=reason)
                     for reason in ("prefix", "no_match", "imbalance")}
        assert decisions["no_match"] == conversations, decisions  # only each conversation's first turn
        assert decisions["prefix"] + decisions["imbalance"] == conversations * (turns - 1), decisions

        # The prompt cache's segments are shared through a folder of the supervisor's run directory, named in
        # the workers' environment (text.shared_segments): a long prompt's segments are published there, and
        # the folder goes with the gateway.
        folder = Path(psutil.Process(workers(log)[0]).environ()["OPENAI_API_PROMPT_SEGMENTS"])
        long = [{"role": "system", "content": "Shared segments. " + "a long system prompt " * 500},
                {"role": "user", "content": "Hi"}]
        counts = []
        for _ in range(2):
            r = httpx.post(f"{url}{CHAT}", headers=AUTH, timeout=60,
                           json={"model": MODEL, "messages": long, "max_tokens": 1})
            assert r.status_code == 200, r.text
            counts.append(r.json()["usage"]["prompt_tokens"])
        assert counts[0] == counts[1] > 2000
        assert [p for p in folder.iterdir() if not p.name.startswith(".")], "no segment published"
        proc.send_signal(signal.SIGTERM)  # nothing in flight: the drain ends at once, the run directory goes
        assert proc.wait(30) == 0
        assert not folder.exists()
    finally:
        stop(proc)
