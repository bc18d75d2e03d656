"""Command line: arguments -> settings -> (optionally the embedded Triton) -> uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

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
    return p.parse_args(argv)


def setup_logging(verbose: bool) -> None:
    level = os.environ.get("LOG_LEVEL", "DEBUG" if verbose else "INFO").upper()
    logging.basicConfig(level=level if level in logging.getLevelNamesMapping() else "INFO",
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def api_keys(args: argparse.Namespace) -> list[str]:
    keys = list(args.api_key)
    keys += [k.strip() for k in os.environ.get("OPENAI_API_KEYS", "").split(",") if k.strip()]
    return keys


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    setup_logging(args.verbose)
    triton = None
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
            triton = EmbeddedTriton(**kwargs, models=sorted({m.triton_name for m in config.all_models()}),
                                    grpc_port=args.triton_grpc_port, http_port=args.triton_http_port)
            try:
                triton.start()
            except TritonLaunchError as e:
                print(f"error: the embedded Triton failed to start: {e}", file=sys.stderr)
                return 3
            config.with_triton_endpoint(triton.grpc_url, triton.http_url)
            logger.info("embedded Triton ready: gRPC %s, HTTP %s", triton.grpc_url, triton.http_url)

        import uvicorn

        from openai_api.app import create_app

        settings = Settings(config_file=args.config_file, api_keys=api_keys(args), host=args.host, port=args.port)
        app = create_app(config, settings, cors_origins=args.cors_origin)
        logger.info("gateway listening on http://%s:%d/v1 (%d models, API keys %s)", args.host, args.port,
                    len(config.all_models()), "required" if settings.api_keys else "off")
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                    timeout_graceful_shutdown=30)
        return 0
    except KeyboardInterrupt:
        return 0
    finally:
        if triton is not None:
            triton.stop()


if __name__ == "__main__":
    sys.exit(main())
