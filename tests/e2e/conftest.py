"""End-to-end fixtures: one real tritonserver (from the launcher) and one real gateway (uvicorn in a
thread on a free port) for the whole session, the way a user runs them."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from openai_api.app import create_app
from openai_api.config import BUNDLED_CONFIG, GatewayConfig, load_config
from openai_api.embedded.launcher import EmbeddedTriton
from openai_api.embedded.prepare import prepare_models
from openai_api.settings import Settings

API_KEY = "test-key"
LLM = "smollm2-135m-instruct"
TRITON_MODELS = ["smollm2-135m-instruct", "all-minilm-l6-v2", "minilm-rerank"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GatewayServer:
    """A real uvicorn server in a background thread (as httpx's own tests do): real sockets, real
    streaming and disconnects, without a subprocess per test."""

    def __init__(self, config: GatewayConfig, api_keys: list[str]) -> None:
        self.port = free_port()
        app = create_app(config, Settings(config_file=config.source or Path("."), api_keys=api_keys))
        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, name="gateway", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> GatewayServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("gateway did not start")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture(scope="session")
def triton() -> Iterator[EmbeddedTriton]:
    prepare_models()
    with EmbeddedTriton(models=TRITON_MODELS) as server:
        yield server


def gateway_config(triton: EmbeddedTriton) -> GatewayConfig:
    return load_config(BUNDLED_CONFIG).with_triton_endpoint(triton.grpc_url, triton.http_url)


@pytest.fixture(scope="session")
def gateway(triton: EmbeddedTriton) -> Iterator[GatewayServer]:
    server = GatewayServer(gateway_config(triton), [API_KEY]).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def http(gateway: GatewayServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120) as c:
        yield c
