"""Fixtures for every tier (plain helpers live in tests/helpers.py)."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.helpers import openai_validator


@pytest.fixture(scope="session")
def openai_schema() -> Callable[[str, Any], None]:
    """`openai_schema("CreateChatCompletionResponse", payload)` raises on any violation of OpenAI's
    published schema (the copy vendored in tests/openai_spec/)."""
    return openai_validator()


def loopback(host: str) -> bool:
    """Whether `host` (a name or an address, as a URL or a socket names it) is this machine's loopback."""
    host = host.strip("[]").split("%")[0].lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(url: str) -> str:
    """The host of a Triton url (`host:port`, `[v6]:port`, `http://host:port`)."""
    rest = url.split("://", 1)[-1].split("/", 1)[0]
    return rest.rsplit("]", 1)[0] + "]" if rest.startswith("[") else rest.rsplit(":", 1)[0]


@pytest.fixture(scope="session", autouse=True)
def traffic_stays_on_loopback() -> Iterator[None]:
    """Tests send traffic to loopback only (the house rule): a Triton client built for, or a socket connected
    to, any other address fails the test that did it, before anything is sent."""
    from openai_api.triton.client import TritonClientPool

    def guarded(make: Callable[..., Any]) -> Callable[..., Any]:
        def build(self: TritonClientPool, url: str) -> Any:
            assert loopback(_url_host(url)), f"a test built a Triton client for {url}: tests use loopback only"
            return make(self, url)
        return build

    connect = socket.socket.connect
    connect_ex = socket.socket.connect_ex

    def checked(address: Any) -> None:
        if isinstance(address, tuple) and isinstance(address[0], str):
            assert loopback(address[0]), f"a test connected to {address}: tests use loopback only"

    def guarded_connect(self: socket.socket, address: Any) -> None:
        checked(address)
        connect(self, address)

    def guarded_connect_ex(self: socket.socket, address: Any) -> int:
        checked(address)
        return connect_ex(self, address)

    with pytest.MonkeyPatch.context() as mp:
        for name in ("rpc", "grpc", "http"):
            mp.setattr(TritonClientPool, name, guarded(getattr(TritonClientPool, name)))
        mp.setattr(socket.socket, "connect", guarded_connect)
        mp.setattr(socket.socket, "connect_ex", guarded_connect_ex)
        yield


# Every run ends with each pytest process's time per test file and the idle tail (tests/file_times.py).
from tests.file_times import pytest_runtest_logreport, pytest_terminal_summary  # noqa: E402, F401
