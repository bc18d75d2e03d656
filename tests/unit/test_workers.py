"""`--workers N` without a server: the supervisor's restart, back-off and drain over stand-in worker processes,
the listening sockets, and the metrics of several workers added up (prometheus_client's multiprocess mode)."""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import values

from openai_api.config import BUNDLED_CONFIG, load_config
from openai_api.observability import MULTIPROC_ENV, Metrics, process_ended, write_processes
from openai_api.settings import Settings
from openai_api.supervisor import (
    BOOT_FAILURE,
    REUSE_PORT,
    Supervisor,
    bind_listeners,
    describe_exit,
    heartbeat_path,
)
from tests.helpers import free_port

# A stand-in worker: writes its pid, then waits for SIGTERM and exits 0 (or exits at once with $EXIT_WITH),
# touching its heartbeat file ($BEAT: the supervisor's run directory) as a real worker's event loop does.
FAKE_WORKER = """
import os, signal, sys, time
folder = sys.argv[1]
open(os.path.join(folder, str(os.getpid())), "w").close()
if os.environ.get("EXIT_WITH"):
    sys.exit(int(os.environ["EXIT_WITH"]))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
beat = os.path.join(os.environ["BEAT"], f"alive-{os.getpid()}") if os.environ.get("BEAT") else None
while True:
    if beat:
        open(beat, "a").close()
        os.utime(beat)
    time.sleep(0.05)
"""


class FakeWorkers(Supervisor):
    """The real supervisor, starting FAKE_WORKER instead of the gateway."""

    def __init__(self, folder: Path, workers: int, *, beat: bool = False, worker_timeout_s: float = 30.0,
                 **kw: float) -> None:
        super().__init__(load_config(BUNDLED_CONFIG), Settings(workers=workers, port=free_port(), host="127.0.0.1",
                                                               shutdown_grace_s=5, worker_timeout_s=worker_timeout_s),
                         **kw)
        self.folder = folder
        self.beat = beat

    def _command(self, index: int, sockets: list[socket.socket]) -> tuple[list[str], dict[str, str]]:
        _, env = super()._command(index, sockets)
        if self.beat:
            env["BEAT"] = str(self._run_dir)
        return [sys.executable, "-c", FAKE_WORKER, str(self.folder)], env


def started_pids(folder: Path) -> set[int]:
    return {int(p.name) for p in folder.iterdir()}


def until(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def run_in_background(sup: Supervisor, then: Callable[[], None]) -> int:
    """`sup.run()` here (signal handlers need the main thread) while `then` runs in a thread."""
    errors: list[BaseException] = []

    def script() -> None:
        try:
            then()
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(e)
        finally:
            if not sup.stopping:
                os.kill(os.getpid(), signal.SIGTERM)

    t = threading.Thread(target=script)
    t.start()
    code = sup.run()
    t.join(30)
    if errors:
        raise errors[0]
    return code


def test_a_worker_that_dies_is_restarted_with_back_off_and_sigterm_drains_all(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "openai_api")
    sup = FakeWorkers(tmp_path, 2, restart_delay=0.2, max_restart_delay=0.4)
    seen: dict[str, set[int]] = {}

    def script() -> None:
        until(lambda: len(started_pids(tmp_path)) == 2)
        first = started_pids(tmp_path)
        for crash in range(3):  # back-off: 0.2, 0.4, then capped at 0.4
            proc = sup.slots[1].proc
            assert proc is not None
            os.kill(proc.pid, signal.SIGKILL)
            until(lambda n=crash: len(started_pids(tmp_path)) == 3 + n)
        seen["first"], seen["all"] = first, started_pids(tmp_path)
        seen["segments"] = {sup.segments_dir.is_dir()}  # the prompt cache's shared folder (text.shared_segments)
        os.kill(os.getpid(), signal.SIGTERM)

    code = run_in_background(sup, script)
    assert code == 0
    assert seen["segments"] == {True} and not sup.segments_dir.exists()  # made for the run, removed with it
    assert len(seen["all"]) == 5 and sup.slots[0].starts == 1 and sup.slots[1].starts == 4
    text = caplog.text
    assert "worker 1 (pid" in text and "killed by SIGKILL; starting it again in 0.2 s" in text
    delays = [r.getMessage().rsplit(" in ", 1)[1] for r in caplog.records if "starting it again" in r.getMessage()]
    assert delays == ["0.2 s", "0.4 s", "0.4 s"]
    assert text.count("worker 1 restarted") == 3
    assert "worker 0 (pid" in text and "stopped: exit code 0" in text and "gateway stopped" in text
    # The back-off doubled and was capped, and no worker outlived the supervisor.
    assert sup.slots[1].delay == 0.4
    for pid in seen["all"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_a_worker_whose_loop_stops_is_killed_and_restarted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A worker that stops beating (here: SIGSTOP, as a blocked event loop looks from outside) is killed after
    --worker-timeout and started again; its neighbour, beating all along, is left alone."""
    caplog.set_level(logging.INFO, "openai_api")
    sup = FakeWorkers(tmp_path, 2, beat=True, worker_timeout_s=1.0, restart_delay=0.2)
    seen: dict[str, int] = {}

    def script() -> None:
        until(lambda: len(started_pids(tmp_path)) == 2)
        until(lambda: all(sup._run_dir is not None and slot.proc is not None
                          and heartbeat_path(sup._run_dir, slot.proc.pid).exists() for slot in sup.slots))
        proc = sup.slots[1].proc
        assert proc is not None
        seen["stopped"] = proc.pid
        os.kill(proc.pid, signal.SIGSTOP)
        until(lambda: len(started_pids(tmp_path)) == 3)
        time.sleep(2.0)  # longer than the timeout: the beating ones stay
        os.kill(os.getpid(), signal.SIGTERM)

    assert run_in_background(sup, script) == 0
    assert sup.slots[0].starts == 1 and sup.slots[1].starts == 2
    text = caplog.text
    assert f"worker 1 (pid {seen['stopped']}): its event loop has not run for" in text
    assert "(--worker-timeout 1); killing it" in text and "starting it again in 0.2 s" in text
    with pytest.raises(ProcessLookupError):
        os.kill(seen["stopped"], 0)


def test_a_worker_that_cannot_build_the_app_stops_the_gateway(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, "openai_api")
    monkeypatch.setenv("EXIT_WITH", str(BOOT_FAILURE))
    sup = FakeWorkers(tmp_path, 2, restart_delay=0.2)
    assert run_in_background(sup, lambda: until(lambda: sup.stopping)) == BOOT_FAILURE
    assert "could not build the app" in caplog.text
    assert all(slot.starts == 1 for slot in sup.slots)  # not restarted in a loop


def test_the_run_directory_and_its_metrics_are_removed(tmp_path: Path) -> None:
    sup = FakeWorkers(tmp_path, 2)
    folders: list[Path] = []

    def script() -> None:
        until(lambda: len(started_pids(tmp_path)) == 2)
        folders.append(sup.metrics_dir)
        assert (sup.metrics_dir / "processes.json").is_file()

    assert run_in_background(sup, script) == 0
    assert not folders[0].exists() and not folders[0].parent.exists()


def test_a_port_in_use_fails_start_up(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        sup = FakeWorkers(tmp_path, 2)
        sup.settings.port = taken.getsockname()[1]
        assert sup.run() == 3
    assert not list(tmp_path.iterdir())  # no worker was started


@pytest.mark.skipif(not REUSE_PORT, reason="SO_REUSEPORT balancing is Linux's")
def test_each_worker_listens_on_its_own_socket_of_one_port() -> None:
    port = free_port()
    first = bind_listeners("127.0.0.1", port, reuse_port=True)
    second = bind_listeners("127.0.0.1", port, reuse_port=True)
    try:
        # ... and the start-up probe (no SO_REUSEPORT) sees the port as taken, as another gateway's would be.
        with pytest.raises(OSError, match="cannot listen on"):
            bind_listeners("127.0.0.1", port, listen=False)
    finally:
        for sock in first + second:
            sock.close()


def test_exit_statuses_in_words() -> None:
    assert describe_exit(0) == "exit code 0" and describe_exit(4) == "exit code 4"
    assert describe_exit(-9) == "killed by SIGKILL"


def test_metrics_of_several_workers_add_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each worker's values go to its own file; /metrics on any worker shows the sums: counters and histograms
    over every worker that ran, the in-flight gauges over the live ones; process figures per process."""
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    route, model = "/v1/chat/completions", "m"
    workers = []
    for pid in (101, 102):  # two processes, as prometheus_client tells them apart
        monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda pid=pid: pid))
        m = Metrics()
        m.requests.labels(route, model, "200").inc(pid - 100)
        m.latency.labels(route, model).observe(0.02)
        m.in_flight.inc()
        m.model_in_flight.labels(model).inc(2)
        workers.append(m)
    write_processes(tmp_path, {"supervisor": os.getpid(), "0": os.getpid()})
    text = workers[0].render().decode()
    assert f'openai_api_requests_total{{model="{model}",route="{route}",status="200"}} 3.0' in text
    assert f'openai_api_request_duration_seconds_count{{model="{model}",route="{route}"}} 2.0' in text
    assert "openai_api_requests_in_flight 2.0" in text
    assert f'openai_api_model_requests_in_flight{{model="{model}"}} 4.0' in text
    for worker in ("supervisor", "0"):
        assert f'process_resident_memory_bytes{{pid="{os.getpid()}",worker="{worker}"}}' in text
    assert "\nprocess_resident_memory_bytes " not in text  # never one unlabelled figure for several processes

    process_ended(tmp_path, 102)  # the supervisor's bookkeeping for a worker that ended
    text = workers[0].render().decode()
    assert f'openai_api_requests_total{{model="{model}",route="{route}",status="200"}} 3.0' in text  # counts stay
    assert "openai_api_requests_in_flight 1.0" in text  # its in-flight requests are gone with it
