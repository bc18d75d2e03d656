"""The launcher's death signal (`with_pdeathsig`): set in a fresh interpreter that then execs the command,
never by Python code between fork and exec (a `preexec_fn` crashed a child with a segfault in a long test
session). The kernel is the oracle: the child's exit status."""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from openai_api.embedded import launcher, load_watch, readiness
from openai_api.embedded.processes import PRCTL, with_pdeathsig

pytestmark = pytest.mark.skipif(PRCTL is None, reason="no prctl here (not Linux)")


def test_the_child_gets_sigterm_when_the_thread_that_started_it_ends() -> None:
    procs: list[subprocess.Popen[bytes]] = []
    started = threading.Event()

    def start() -> None:
        procs.append(subprocess.Popen(with_pdeathsig(["sleep", "60"])))
        # Past the wrapper's prctl: the command itself runs (its name is what the kernel shows).
        for _ in range(500):
            with open(f"/proc/{procs[0].pid}/comm", encoding="utf-8") as f:
                if f.read().strip() == "sleep":
                    break
            threading.Event().wait(0.01)
        started.set()

    t = threading.Thread(target=start)
    t.start()
    t.join()
    assert started.is_set()
    assert procs[0].wait(30) == -signal.SIGTERM


def test_the_command_runs_as_itself_with_its_arguments_and_environment() -> None:
    out = subprocess.run(with_pdeathsig(["sh", "-c", 'echo "$0 $1 $GREETING"', "a b", "c"]),
                         env={"GREETING": "hello", "PATH": "/usr/bin:/bin"}, capture_output=True, check=True)
    assert out.stdout.decode() == "a b c hello\n"


def test_a_start_whose_log_stops_growing_is_given_up_before_its_deadline(tmp_path: Path) -> None:
    """A Triton whose Python-backend stub missed its initialization window waits for it forever, its log silent:
    with `stall_timeout`, the start fails (and can be retried) once the log has not grown for that long, not at
    the end of `startup_timeout`. A log that keeps growing is no stall."""
    log = tmp_path / "tritonserver.log"
    log.write_text("I loading 'a'\n")
    server = launcher.EmbeddedTriton(tmp_path, startup_timeout=60, stall_timeout=0.6)
    server._log_path = log
    proc = subprocess.Popen(["sleep", "30"])
    try:
        def grow() -> None:  # progress for ~1 s (longer than the stall timeout), then silence
            for i in range(5):
                time.sleep(0.2)
                with log.open("a") as fh:
                    fh.write(f"I loading 'm{i}'\n")

        writer = threading.Thread(target=grow)
        writer.start()
        t0 = time.monotonic()
        with pytest.raises(launcher.TritonLaunchError, match="no progress for 1 s"):
            server._wait_ready(proc, time.monotonic() + 60)
        took = time.monotonic() - t0
        writer.join()
        assert 1.4 < took < 10, took  # past the second of progress plus the stall, far before the deadline
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("busy", [False, True])
def test_a_silent_start_whose_processes_are_idle_is_given_up_early_one_that_works_is_not(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, busy: bool) -> None:
    """A hung start is silent *and* idle (Triton's load thread waits on a stub that waits too); a start whose log
    is silent while a model loads still burns CPU. The kernel's CPU accounting of the process group is the oracle:
    an idle group is given up after IDLE_SILENCE + IDLE_WINDOW, far before `stall_timeout`; a busy one is not."""
    monkeypatch.setattr(readiness, "IDLE_SILENCE", 0.3)
    monkeypatch.setattr(load_watch, "IDLE_SILENCE", 0.3)
    monkeypatch.setattr(load_watch, "IDLE_WINDOW", 1.0)
    log = tmp_path / "tritonserver.log"
    log.write_text("I loading 'a'\n")
    server = launcher.EmbeddedTriton(tmp_path, startup_timeout=60, stall_timeout=100)
    server._log_path = log
    cmd = ["python3", "-c", "while True: pass"] if busy else ["sleep", "30"]
    proc = subprocess.Popen(cmd, start_new_session=True)  # its own group, as Triton's
    try:
        t0 = time.monotonic()
        deadline = 2.5 if busy else 60.0
        with pytest.raises(launcher.TritonLaunchError) as caught:
            server._wait_ready(proc, time.monotonic() + deadline)
        took = time.monotonic() - t0
        if busy:  # the start's own deadline (2.5 s here), not the idle rule
            assert "idle" not in str(caught.value) and took >= 2.4, (took, caught.value)
        else:
            assert "processes idle" in str(caught.value), caught.value
            # no list of models to load again here (`_revive` needs one): given up at once
            assert 1.2 < took < 10, took
    finally:
        proc.kill()
        proc.wait()


def test_a_hung_load_is_ended_by_killing_its_models_stubs_only(tmp_path: Path) -> None:
    """`kill_stubs` finds a stub by its command line (Triton runs `triton_python_backend_stub MODEL.py ... <instance
    name> <kind>`) and kills the stubs of the named models only; the kernel's exit status is the oracle."""
    stub = tmp_path / "triton_python_backend_stub"
    stub.write_bytes(Path("/bin/sh").read_bytes())
    stub.chmod(0o755)
    leader = subprocess.Popen([str(stub), "-c", "sleep 30; :", "llm_0_0", "DEFAULT"], process_group=0)
    procs = [leader] + [subprocess.Popen([str(stub), "-c", "sleep 30; :", name, "DEFAULT"],
                                         process_group=leader.pid)
                        for name in ("llm-other_0_0", "embed_0_0", "llm")]
    try:
        time.sleep(0.2)
        killed = load_watch.kill_stubs(leader.pid, {"llm"})
        assert sorted(killed) == sorted([procs[0].pid, procs[3].pid])
        assert procs[0].wait(5) == -signal.SIGKILL and procs[3].wait(5) == -signal.SIGKILL
        assert procs[1].poll() is None and procs[2].poll() is None
        assert load_watch.group_cpu_seconds(leader.pid) >= 0.0
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
