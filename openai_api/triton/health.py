"""Readiness probes against Triton, over whichever transport a model is configured with."""

from __future__ import annotations

import asyncio

from openai_api.triton.client import TritonClientPool

PROBE_TIMEOUT_S = 2.0


async def server_ready(pool: TritonClientPool, transport: str, url: str) -> bool:
    try:
        client = pool.grpc(url) if transport == "grpc" else pool.http(url)
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            return bool(await client.is_server_ready())
    except Exception:  # noqa: BLE001 - any failure means "not ready"
        return False


async def model_ready(pool: TritonClientPool, transport: str, url: str, model: str, version: str = "") -> bool:
    try:
        client = pool.grpc(url) if transport == "grpc" else pool.http(url)
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            return bool(await client.is_model_ready(model, version))
    except Exception:  # noqa: BLE001
        return False
