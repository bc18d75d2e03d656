"""The rule every test keeps (tests/conftest.py): traffic goes to loopback only. Each guard is shown to
refuse what it must and let loopback through."""

from __future__ import annotations

import socket

import pytest

from openai_api.triton.client import TritonClientPool
from tests.conftest import loopback
from tests.helpers import free_port


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost", "LOCALHOST"])
def test_loopback_hosts(host: str) -> None:
    assert loopback(host)


@pytest.mark.parametrize("host", ["10.0.0.1", "192.168.1.1", "93.184.215.14", "::ffff:10.0.0.1", "triton",
                                  "example.com", "0.0.0.0"])
def test_other_hosts(host: str) -> None:
    assert not loopback(host)


async def test_a_triton_client_for_another_address_fails_the_test() -> None:
    pool = TritonClientPool()
    for url in ("10.0.0.1:8001", "triton-headless.ns.svc:8001", "http://192.168.1.5:8000"):
        with pytest.raises(AssertionError, match="loopback only"):
            pool.rpc(url)
        with pytest.raises(AssertionError, match="loopback only"):
            pool.http(url)
    pool.rpc("127.0.0.1:1")
    pool.grpc("[::1]:1")
    assert pool.urls() == {"127.0.0.1:1", "[::1]:1"}
    await pool.close()


def test_a_socket_to_another_address_fails_the_test() -> None:
    with socket.socket() as s, pytest.raises(AssertionError, match="loopback only"):
        s.connect(("10.255.255.1", 9))
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", free_port())) != 0  # refused: nothing listens, but it was allowed
