"""One worker process of `--workers N`: `python -m openai_api.worker RUN_DIR INDEX FDS SUPERVISOR_PID`, started
only by `openai_api.supervisor`.

It reads the settings and model config the supervisor resolved (`RUN_DIR/worker.pickle`; a worker started
after the config file changed - a restart after a reload - loads the file as it is now, see
`openai_api.reload`), builds the app and serves it on the supervisor's listening sockets (the inherited file
descriptors FDS) with the single process's drain (`server.serve`): SIGTERM -> new requests 503, requests
in flight get --shutdown-grace, exit 0. While it serves, its event loop touches `RUN_DIR/alive-PID` once a
second: the supervisor kills and restarts a worker whose loop has stopped (`--worker-timeout`).

The supervisor dying without a word (SIGKILL, OOM) reaches the worker as SIGTERM (PR_SET_PDEATHSIG on
Linux), so an orphan drains and exits instead of serving on unsupervised.

Exit status: 0 after a drain; `BOOT_FAILURE` when the app cannot be built from the config.
"""

from __future__ import annotations

import ctypes
import logging
import os
import pickle
import signal
import socket
import sys
from pathlib import Path

from openai_api.cli import setup_logging
from openai_api.config import GatewayConfig
from openai_api.settings import Settings
from openai_api.supervisor import BOOT_FAILURE, HANDOFF, heartbeat_path

logger = logging.getLogger("openai_api")
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int) -> None:
    """SIGTERM to this process when the supervisor dies (Linux; elsewhere an orphan is left to the operator)."""
    try:
        prctl = ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
    if os.getppid() != parent:  # the supervisor died before the line above took effect: nothing to serve for
        raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    run_dir, index, fds, parent = argv if argv is not None else sys.argv[1:]
    # A SIGTERM (a drain, or the supervisor's death) while the app is still being built would kill the
    # worker outright; it is held and delivered again once the server's own drain handler is in.
    pending: list[int] = []

    def hold(sig: int, frame: object) -> None:
        pending.append(sig)

    signal.signal(signal.SIGTERM, hold)
    signal.signal(signal.SIGINT, hold)
    _die_with_parent(int(parent))
    with open(Path(run_dir) / HANDOFF, "rb") as f:
        config, settings = pickle.load(f)  # written by our own supervisor, in its private (0700) directory
    if not isinstance(config, GatewayConfig) or not isinstance(settings, Settings):
        raise TypeError(f"{run_dir}/{HANDOFF} does not hold a config and settings")
    setup_logging(settings.verbose, with_pid=True, log_format=settings.log_format)
    # SIGHUP reloads the model config (and the keys file) once the app runs; until then, not a kill.
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    # The family and type are read from each descriptor (uvicorn's own `fd=` would take them for AF_UNIX).
    sockets = [socket.socket(fileno=int(fd)) for fd in fds.split(",")]
    try:
        from openai_api.app import create_app

        app = create_app(config, settings)
    except Exception:
        logger.exception("worker %s: the app could not be built", index)
        return BOOT_FAILURE
    from openai_api.server import serve

    alive = heartbeat_path(run_dir, os.getpid())

    def beat() -> None:
        if pending:  # serving now, with the drain's handlers: the signal that came during boot
            os.kill(os.getpid(), pending.pop())
            pending.clear()
        try:
            alive.touch()
        except OSError:  # the run directory is gone with the supervisor: PR_SET_PDEATHSIG drains us anyway
            pass

    serve(app, settings, sockets, heartbeat=beat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
