"""Command line: arguments -> settings -> (optionally the embedded Triton) -> uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType

from openai_api.config import BUNDLED_CONFIG, ConfigError, load_config
from openai_api.settings import Settings

logger = logging.getLogger("openai_api")

UVICORN_LEVELS = ["critical", "error", "warning", "info", "debug", "trace"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="openai-api", description="OpenAI-compatible gateway for NVIDIA Triton.")
    p.add_argument("--host", default="localhost", help="address to listen on (default: localhost)")
    p.add_argument("--port", type=int, default=5100, help="port to listen on (default: 5100)")
    p.add_argument("--config-file", type=Path, default=BUNDLED_CONFIG,
                   help="model config JSON (default: the bundled model_config.json)")
    p.add_argument("--verbose", action="store_true", help="log more about requests, models and Triton")
    p.add_argument("--uvicorn-log-level", choices=UVICORN_LEVELS, default="info", help="uvicorn's log level")
    p.add_argument("--api-key", action="append", default=[], metavar="KEY",
                   help="accept this API key (repeatable; also OPENAI_API_KEYS=k1,k2). No key: no auth.")
    p.add_argument("--embedded-triton", action="store_true",
                   help="prepare the bundled models and start tritonserver from the nvidia-pytriton wheel with "
                        "triton_models/, pointing every configured model at it")
    p.add_argument("--model-repository", type=Path, default=None, help="model repository for --embedded-triton")
    p.add_argument("--triton-grpc-port", type=int, default=None, help="gRPC port of the embedded Triton (free)")
    p.add_argument("--triton-http-port", type=int, default=None, help="HTTP port of the embedded Triton (free)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="allow cross-origin requests from ORIGIN (repeatable; default: CORS off)")
    d = Settings(config_file=Path("."))
    lim = p.add_argument_group("limits, overload and timeouts")
    lim.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                     help=f"largest request body; 413 past it (default: {d.max_body_bytes})")
    lim.add_argument("--max-messages", type=int, default=d.max_messages,
                     help=f"most chat messages per request (default: {d.max_messages})")
    lim.add_argument("--max-embedding-inputs", type=int, default=d.max_embedding_inputs,
                     help=f"most inputs per embeddings request (default: {d.max_embedding_inputs})")
    lim.add_argument("--max-rerank-documents", type=int, default=d.max_rerank_documents,
                     help=f"most documents per rerank request (default: {d.max_rerank_documents})")
    lim.add_argument("--header-timeout", type=float, default=d.header_timeout_s, metavar="SECONDS",
                     help="close a connection whose request line and headers are not complete this long after it "
                          f"opened or began its next request (0: never; default: {d.header_timeout_s:g})")
    lim.add_argument("--max-connections", type=int, default=d.max_connections, metavar="N",
                     help="close connections beyond this many open ones at once (0: no cap; kept below the "
                          f"open-files limit; default: {d.max_connections})")
    lim.add_argument("--max-in-flight", type=int, default=d.max_in_flight,
                     help=f"requests in flight in the gateway; 429 past it (default: {d.max_in_flight})")
    lim.add_argument("--max-in-flight-per-model", type=int, default=d.max_in_flight_per_model,
                     help=f"requests in flight per model; 429 past it (default: {d.max_in_flight_per_model})")
    lim.add_argument("--retry-after", type=int, default=d.retry_after_s, metavar="SECONDS",
                     help=f"Retry-After of a 429 (default: {d.retry_after_s})")
    lim.add_argument("--stream-idle-timeout", type=float, default=d.stream_idle_timeout_s, metavar="SECONDS",
                     help="end a generation that produced no token for this long with a 504 / SSE error "
                          f"(0: never; default: {d.stream_idle_timeout_s:g})")
    lim.add_argument("--shutdown-grace", type=float, default=d.shutdown_grace_s, metavar="SECONDS",
                     help="on SIGTERM, how long requests in flight may take to finish while new ones get 503 "
                          f"(default: {d.shutdown_grace_s:g})")
    lim.add_argument("--cpu-workers", type=int, default=d.cpu_workers, metavar="N",
                     help="threads that render chat templates and tokenize big inputs off the event loop "
                          f"(default: {d.cpu_workers}, up to 4 by the core count)")
    lim.add_argument("--template-timeout", type=float, default=d.template_timeout_s, metavar="SECONDS",
                     help="longest a chat-template render may take; past it the request is a 400 "
                          f"(default: {d.template_timeout_s:g})")
    lim.add_argument("--template-max-chars", type=int, default=d.template_max_chars, metavar="N",
                     help="largest value (the prompt included) a chat-template render may build; past it the "
                          f"request is a 400 (default: {d.template_max_chars})")
    p.add_argument("--stream-flush-interval", type=float, default=d.stream_flush_interval_s * 1000, metavar="MS",
                   help="SSE events that arrive within this many milliseconds of the previous write are sent "
                        "together; never delays the first event or a slower stream (0: one write per event; "
                        f"default: {d.stream_flush_interval_s * 1000:g})")
    p.add_argument("--log-prompts", action="store_true",
                   help="with --verbose, log request bodies (prompts) at debug level; never otherwise")
    p.add_argument("--no-access-log", action="store_true", help="no access-log line per request")
    return p.parse_args(argv)


def setup_logging(verbose: bool) -> None:
    level = os.environ.get("LOG_LEVEL", "DEBUG" if verbose else "INFO").upper()
    logging.basicConfig(level=level if level in logging.getLevelNamesMapping() else "INFO",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # before the server runs: unwind through `finally` (stops the embedded Triton)


def api_keys(args: argparse.Namespace) -> list[str]:
    keys = list(args.api_key)
    keys += [k.strip() for k in os.environ.get("OPENAI_API_KEYS", "").split(",") if k.strip()]
    return keys


def settings_from(args: argparse.Namespace) -> Settings:
    return Settings(config_file=args.config_file, api_keys=api_keys(args), host=args.host, port=args.port,
                    cors_origins=list(args.cors_origin), max_body_bytes=args.max_body_bytes,
                    max_messages=args.max_messages, max_embedding_inputs=args.max_embedding_inputs,
                    max_rerank_documents=args.max_rerank_documents, max_in_flight=args.max_in_flight,
                    max_in_flight_per_model=args.max_in_flight_per_model, retry_after_s=args.retry_after,
                    stream_idle_timeout_s=args.stream_idle_timeout or None, shutdown_grace_s=args.shutdown_grace,
                    stream_flush_interval_s=max(args.stream_flush_interval, 0.0) / 1000,
                    header_timeout_s=args.header_timeout, max_connections=args.max_connections,
                    cpu_workers=args.cpu_workers, template_timeout_s=args.template_timeout,
                    template_max_chars=args.template_max_chars,
                    log_prompts=args.log_prompts and args.verbose, access_log=not args.no_access_log)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.verbose)
    triton = None
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)
    try:
        if args.embedded_triton:
            from openai_api.embedded.prepare import prepare_models

            prepare_models()
        try:
            config = load_config(args.config_file)
        except ConfigError as e:
            print(f"error: bad model config: {e}", file=sys.stderr)
            return 2
        if args.embedded_triton:
            from openai_api.embedded.launcher import EmbeddedTriton, TritonLaunchError

            kwargs = {"model_repository": args.model_repository} if args.model_repository else {}
            # supervise: a crashed Triton is cleaned up and restarted on the same ports (see the launcher).
            triton = EmbeddedTriton(**kwargs, models=sorted({m.triton_name for m in config.all_models()}),
                                    grpc_port=args.triton_grpc_port, http_port=args.triton_http_port,
                                    supervise=True)
            try:
                triton.start()
            except TritonLaunchError as e:
                print(f"error: the embedded Triton failed to start: {e}", file=sys.stderr)
                return 3
            config.with_triton_endpoint(triton.grpc_url, triton.http_url)
            logger.info("embedded Triton ready: gRPC %s, HTTP %s, metrics %s", triton.grpc_url, triton.http_url,
                        triton.metrics_url)

        from openai_api.app import create_app
        from openai_api.server import DrainingServer, uvicorn_config

        settings = settings_from(args)
        app = create_app(config, settings)
        logger.info("gateway listening on http://%s:%d/v1 (%d models, API keys %s)", args.host, args.port,
                    len(config.all_models()), "required" if settings.api_keys else "off")
        # uvicorn's own access log is off: the gateway writes one structured line per request instead.
        server = DrainingServer(uvicorn_config(app, settings, log_level=args.uvicorn_log_level),
                                lifecycle=app.state.lifecycle, limiter=app.state.limiter,
                                grace_s=settings.shutdown_grace_s)
        server.run()
        logger.info("gateway stopped")
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if triton is not None:
            triton.stop()


if __name__ == "__main__":
    sys.exit(main())
