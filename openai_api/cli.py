"""Command line: arguments -> settings -> (optionally the embedded Triton) -> uvicorn."""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import os
import signal
import sys
import threading
from types import FrameType

from openai_api import __version__, logs
from openai_api.config import ConfigError, load_config
from openai_api.settings import Settings, add_arguments

logger = logging.getLogger("openai_api")

def version() -> str:
    """The installed distribution's version (the package's own when it runs from a checkout)."""
    try:
        return importlib.metadata.version("openai-api-triton")
    except importlib.metadata.PackageNotFoundError:
        return __version__


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line: every flag comes from `Settings` (see `openai_api.settings`)."""
    p = argparse.ArgumentParser(prog="openai-api", description="OpenAI-compatible gateway for NVIDIA Triton.",
                                epilog="openai-api check-config FILE [--probe]: check a model config and exit "
                                       "(every problem listed; see openai-api check-config --help).")
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    add_arguments(p)
    return p.parse_args(argv)


def setup_logging(verbose: bool, *, with_pid: bool = False, log_format: str = "text") -> None:
    """The gateway's log format (`--log-format`: text lines, or one JSON object per line, `logs.JSONFormatter`);
    `with_pid` (--workers > 1) names the process on every line, so an access-log line says which worker served
    the request."""
    logs.install()  # control characters a client sent never reach a log line
    level = os.environ.get("LOG_LEVEL", "DEBUG" if verbose else "INFO").upper()
    level = level if level in logging.getLevelNamesMapping() else "INFO"
    if log_format == "json":
        handler = logging.StreamHandler()
        handler.setFormatter(logs.JSONFormatter(with_pid=with_pid))
        logging.basicConfig(level=level, handlers=[handler])
        return
    pid = " [%(process)d]" if with_pid else ""
    logging.basicConfig(level=level, format=f"%(asctime)s %(levelname)s{pid} %(name)s: %(message)s")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # before the server runs: unwind through `finally` (stops the embedded Triton)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["check-config"]:
        from openai_api.checkconfig import main as check_config

        return check_config(argv[1:])
    args = parse_args(argv)
    try:
        settings = Settings.from_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    setup_logging(settings.verbose, with_pid=settings.workers > 1, log_format=settings.log_format)
    for warning in settings.start_warnings():
        logger.warning("%s", warning)
    triton = None
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
        # SIGHUP reloads the model config (and the keys file) once the app runs; until then, not a kill.
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        if settings.embedded_triton:
            from openai_api.embedded.prepare import prepare_models

            prepare_models()
        try:
            config = load_config(settings.config_file)
        except ConfigError as e:
            print(f"error: bad model config: {e}", file=sys.stderr)
            return 2
        if settings.embedded_triton:
            from openai_api.embedded.launcher import EmbeddedTriton, TritonLaunchError

            # supervise: a crashed Triton is cleaned up and restarted on the same ports (see the launcher).
            triton = EmbeddedTriton(settings.model_repository,
                                    models=sorted({m.triton_name for m in config.all_models()}),
                                    grpc_port=settings.triton_grpc_port, http_port=settings.triton_http_port,
                                    supervise=True)
            try:
                triton.start()
            except TritonLaunchError as e:
                print(f"error: the embedded Triton failed to start: {e}", file=sys.stderr)
                return 3
            config.with_triton_endpoint(triton.grpc_url, triton.http_url)
            logger.info("embedded Triton ready: gRPC %s, HTTP %s, metrics %s", triton.grpc_url, triton.http_url,
                        triton.metrics_url)

        if settings.workers > 1:
            from openai_api.supervisor import Supervisor

            # The workers share this process's Triton (started once, above) and its config as it is now.
            return Supervisor(config, settings).run()

        from openai_api.app import create_app
        from openai_api.server import serve

        app = create_app(config, settings)
        logger.info("gateway listening on http://%s:%d/v1 (%d models, %s)", settings.host, settings.port,
                    len(config.all_models()), settings.auth_mode())
        # uvicorn's own access log is off: the gateway writes one structured line per request instead.
        serve(app, settings)
        logger.info("gateway stopped")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if triton is not None:
            triton.stop()


if __name__ == "__main__":
    sys.exit(main())
