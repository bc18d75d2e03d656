"""`dns:///host:port` urls: every address `host` resolves to (A and AAAA) is a replica at `port`.

Resolution runs `socket.getaddrinfo` in a worker thread (it blocks, and may take seconds on a sick
resolver), under a deadline; the event loop never waits on DNS. A Kubernetes headless Service answers with
one record per ready pod, so re-resolving every `discovery.interval_s` follows scale-ups, scale-downs and
rescheduled pods. `replicas.ReplicaSet.refresh` turns the answer into replicas.

The resolver is replaceable (`set_resolver`): the tests point a name at loopback addresses of their own.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Callable

from openai_api.config import DNS_SCHEME

logger = logging.getLogger(__name__)

# host, port -> the addresses as "ip:port" / "[ip6]:port". Blocking; raises OSError when the name fails.
Resolver = Callable[[str, int], list[str]]


class NoSuchName(Exception):
    """The name has no address (NXDOMAIN, or no records): every replica it named is gone."""


def address(ip: str, port: int) -> str:
    """The replica url of one address: `ip:port`, with an IPv6 address in brackets."""
    return f"[{ip}]:{port}" if ipaddress.ip_address(ip).version == 6 else f"{ip}:{port}"


def system_resolver(host: str, port: int) -> list[str]:
    """Every A/AAAA record of `host` (the system's resolver: /etc/hosts, then DNS), sorted, no duplicates."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        if e.errno in (socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)):
            raise NoSuchName(host) from None
        raise
    ips = {str(info[4][0]).split("%", 1)[0] for info in infos}
    return sorted(address(ip, port) for ip in ips)


_resolver: Resolver = system_resolver


def set_resolver(resolver: Resolver | None) -> None:
    """Use `resolver` for every dns:/// url from now on (None: the system's again)."""
    global _resolver
    _resolver = resolver or system_resolver


def split(dns_url: str) -> tuple[str, int]:
    """`dns:///host:port` -> (host, port) (validated by the config already)."""
    host, _, port = dns_url[len(DNS_SCHEME):].rpartition(":")
    return host.strip("[]"), int(port)


async def resolve(dns_url: str, timeout_s: float) -> list[str] | None:
    """The replica urls `dns_url` names now; [] when the name has none; None when resolution failed (a
    timeout, a resolver error: the caller keeps what it had rather than retiring every replica)."""
    host, port = split(dns_url)
    try:
        async with asyncio.timeout(timeout_s):
            return await asyncio.to_thread(_resolver, host, port)
    except NoSuchName:
        return []
    except (OSError, TimeoutError, ValueError) as e:
        logger.warning("resolving %s failed (%s): replicas unchanged", dns_url, e or type(e).__name__)
        return None
