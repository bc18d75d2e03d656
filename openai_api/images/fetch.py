"""Fetching an image URL without letting a request make the gateway reach what it must not (SSRF).

Every request's URL is the client's to choose, and the gateway usually sits inside a network the client
cannot see, so a URL is judged before any connection and on every redirect hop:

* **Scheme**: `http` and `https` only (`file:`, `gopher:`, `ftp:` ... are refused; `data:` URLs are the
  service's, never fetched). No `user:password@` part, no whitespace or control characters.
* **Host spelling**: an IP address must be written canonically (dotted quad, or an IPv6 literal);
  `2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1` and any name whose last label is a number are refused
  (`ip_spelling`): C resolvers read them as addresses, and they are the classic way around a filter.
* **Addresses**: the host is resolved once (`Resolver`), every address it resolves to is judged, and the
  connection goes to that same address (`Connector`): a DNS answer that changes between the check and the
  connect (rebinding) never reaches a connection. Refused unless allowed: loopback (127/8, ::1),
  private (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7, and the deprecated site-local fec0::/10),
  link-local (169.254/16, fe80::/10), cloud metadata (169.254.169.254, fd00:ec2::254, 100.100.100.200,
  169.254.170.2), multicast, the unspecified addresses, every other range of IANA's IPv4 and IPv6
  special-purpose registries that is not globally reachable (`SPECIAL`: 0/8, 192.0.0/24, the
  documentation and benchmarking ranges, 240/4, 2001::/23, 2001:db8::/32, 3fff::/20, ...), IPv6 outside
  global unicast (2000::/3), and IPv6 forms that carry an IPv4 address (IPv4-mapped ::ffff:0:0/96,
  IPv4-compatible ::/96, 6to4 2002::/16, Teredo 2001::/32, NAT64 64:ff9b::/96 and 64:ff9b:1::/48).
  The table is this module's own, not Python's `is_private`/`is_global`, whose answers differ between
  Python versions (192.0.0.0/24 passed as public before the CVE-2024-4032 fix, fec0::/10 on every one).
  `AddressPolicy.allowed`: host names, addresses or networks (`--image-allowed-hosts`) fetched whatever
  their address; `allow_private` (`--image-allow-private`) lets the private ranges through (never
  loopback, link-local or metadata, which only an explicit allowed entry opens); `allowed_only`
  (`--image-fetch allowed_only`) fetches from the allowed entries and nothing else: a host name that is
  not listed is refused before it is resolved (unless addresses or networks are listed: then it is
  resolved and judged by its addresses).
* **Refusals** name the reason (a stable word, and what it means), never the address a host resolved
  to, so a caller cannot map the gateway's internal names through them.
* **Redirects**: followed up to `max_redirects` hops (0: none), each hop judged as above.
* **Time**: one deadline (`timeout_s`) for the whole fetch, redirects, connects, headers and body
  together, so a server that answers one byte a second is cut at the deadline, not per read.
* **Size**: the body is counted while it is read and refused past `max_bytes` (a `Content-Length` over
  the cap is refused before reading; a smaller one is not trusted). `Accept-Encoding: identity`: the
  bytes counted are the bytes decoded, so no compression bomb inflates past the count.

The HTTP exchange is HTTP/1.1 over asyncio streams with `h11` as the parser (`Connection: close`, one
request per connection): nothing blocks the event loop, and a slow server costs a socket, not a thread.
TLS is verified against the URL's host name (SNI and certificate) while the TCP connection goes to the
checked address.
"""

from __future__ import annotations

import asyncio
import functools
import ipaddress
import re
import socket
import ssl
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import quote, urljoin, urlsplit

import h11

from openai_api.images import ImageRefused

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# host, port -> every address the name resolves to (as text, as getaddrinfo gives them).
Resolver = Callable[[str, int], Awaitable[list[str]]]
# address, port, TLS server name (None: plain http) -> an open stream pair to exactly that address.
Connector = Callable[[str, int, str | None], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]

METADATA = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean, Oracle
    "fd00:ec2::254",  # AWS over IPv6
    "169.254.170.2",  # AWS ECS task credentials
    "100.100.100.200",  # Alibaba Cloud
))
# IPv6 ranges whose addresses carry an IPv4 address a stack may end up reaching.
IPV4_IN_IPV6 = tuple(ipaddress.ip_network(n) for n in (
    "::ffff:0:0/96", "::/96", "2002::/16", "2001::/32", "64:ff9b::/96", "64:ff9b:1::/48"))
# Every range that is not a public address, with the reason a refusal gives, first match wins. From IANA's
# IPv4 and IPv6 Special-Purpose Address Registries (the entries not globally reachable; a few reachable
# anycast addresses inside 192.0.0.0/24 and 2001::/23 are refused with their blocks: no image lives there),
# plus multicast and the deprecated site-local fec0::/10 (RFC 3879), which some networks still route.
SPECIAL: tuple[tuple[IPNetwork, str], ...] = tuple((ipaddress.ip_network(n), why) for n, why in (
    ("0.0.0.0/32", "unspecified"), ("0.0.0.0/8", "reserved"),  # "this network"
    ("10.0.0.0/8", "private"), ("100.64.0.0/10", "private"),  # RFC 1918; shared address space (CGN)
    ("127.0.0.0/8", "loopback"), ("169.254.0.0/16", "link_local"), ("172.16.0.0/12", "private"),
    ("192.0.0.0/24", "reserved"),  # IETF protocol assignments: DS-Lite, NAT64 discovery, PCP and TURN anycast
    ("192.0.2.0/24", "reserved"), ("198.51.100.0/24", "reserved"), ("203.0.113.0/24", "reserved"),  # TEST-NETs
    ("192.88.99.0/24", "reserved"),  # 6to4 relay anycast (deprecated, RFC 7526)
    ("192.168.0.0/16", "private"), ("198.18.0.0/15", "reserved"),  # RFC 1918; benchmarking
    ("224.0.0.0/4", "multicast"), ("240.0.0.0/4", "reserved"),  # the last: future use, limited broadcast
    ("::/128", "unspecified"), ("::1/128", "loopback"),
    ("100::/64", "reserved"), ("100:0:0:1::/64", "reserved"),  # discard-only; dummy prefix
    ("2001::/23", "reserved"),  # IETF protocol assignments: benchmarking, ORCHID, AMT, ...
    ("2001:db8::/32", "reserved"), ("3fff::/20", "reserved"),  # documentation
    ("5f00::/16", "reserved"),  # segment routing SIDs
    ("fc00::/7", "private"), ("fec0::/10", "private"),  # unique local; site-local (deprecated)
    ("fe80::/10", "link_local"), ("ff00::/8", "multicast"),
))
PRIVATE = tuple(net for net, why in SPECIAL if why == "private")
# IPv6's global unicast space: an address outside it is reserved, whatever else it is.
GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
# A last label that an IPv4 parser (inet_aton, WHATWG URL) reads as a number: decimal, octal or hex.
_NUMERIC_LABEL = re.compile(r"(0x[0-9a-f]*|[0-9]+)", re.IGNORECASE)
_HOSTNAME = re.compile(r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*\.?")
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
# Characters kept as they are in a request target (RFC 3986 unreserved, sub-delims, ':', '@', '/', '%', '?').
_TARGET_SAFE = "/%:@!$&'()*+,;=-._~?"
_READ = 65536


def classify(ip: IPAddress) -> str | None:
    """Why an address may not be fetched from (a refusal reason), or None for a public address. Decided by
    this module's tables alone (`METADATA`, `IPV4_IN_IPV6`, `SPECIAL`), the same on every Python version."""
    v6 = isinstance(ip, ipaddress.IPv6Address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.scope_id is not None:
        ip = ipaddress.IPv6Address(str(ip).split("%")[0])
    if ip in METADATA:
        return "metadata"
    if v6 and int(ip) > 1 and any(ip in net for net in IPV4_IN_IPV6):  # :: and ::1 are themselves
        return "ipv4_mapped"
    for net, why in SPECIAL:
        if ip in net:
            return why
    if v6 and ip not in GLOBAL_UNICAST_V6:
        return "reserved"
    return None


_WORDS = {"metadata": "a cloud metadata address", "loopback": "a loopback address",
          "link_local": "a link-local address", "multicast": "a multicast address",
          "unspecified": "the unspecified address", "private": "a private address",
          "reserved": "a reserved (non-public) address",
          "ipv4_mapped": "an IPv6 address that carries an IPv4 address"}


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Which hosts and addresses may be fetched from (see the module docstring). `allowed` entries are host
    names (matched case-insensitively against the URL's host), or addresses and networks (matched against
    the address the host resolves to)."""

    allowed_names: frozenset[str] = frozenset()
    allowed_networks: tuple[IPNetwork, ...] = ()
    allow_private: bool = False
    allowed_only: bool = False

    @classmethod
    def build(cls, allowed: Iterable[str] = (), allow_private: bool = False,
              allowed_only: bool = False) -> AddressPolicy:
        names: set[str] = set()
        nets: list[IPNetwork] = []
        for entry in allowed:
            entry = entry.strip().lower().strip("[]")
            if not entry:
                continue
            try:
                nets.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                names.add(entry.rstrip("."))
        return cls(frozenset(names), tuple(nets), allow_private, allowed_only)

    def name_allowed(self, host: str) -> bool:
        return host.rstrip(".") in self.allowed_names

    def check_name(self, host: str) -> None:
        """In allowed-only mode, refuse a host name that is not listed before it is resolved (an address
        literal, or a name whose addresses may be in an allowed network, is judged by `check`)."""
        if self.allowed_only and not self.allowed_networks and not self.name_allowed(host):
            raise ImageRefused("not_allowed", f"the image URL's host {host!r} is not one this gateway fetches "
                                              "images from")

    def check(self, host: str, ip: IPAddress) -> None:
        """Raise ImageRefused unless `ip` (what `host` resolved to) may be fetched from. The message names the
        reason, never `ip`: a caller must not learn what the gateway's names resolve to."""
        if self.name_allowed(host) or any(ip in net for net in self.allowed_networks):
            return
        if self.allowed_only:
            raise ImageRefused("not_allowed", f"the image URL's host {host!r} is not one this gateway fetches "
                                              "images from")
        reason = classify(ip)
        if reason is None or (reason == "private" and self.allow_private):
            return
        raise ImageRefused(reason, f"the image URL's host {host!r} is {_WORDS[reason]}, which the gateway does not "
                                   "fetch from")


@dataclass(frozen=True, slots=True)
class Target:
    """One hop, judged: connect to `address`:`port`, ask for `target` with `Host: host_header`."""

    url: str
    host: str
    address: str
    port: int
    tls: bool
    host_header: str
    target: str


async def system_resolver(host: str, port: int) -> list[str]:
    """Every address `host` resolves to (getaddrinfo, on the event loop's executor)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """One verifying context per process: building one loads the CA store (milliseconds on the loop)."""
    return ssl.create_default_context()


async def open_stream(address: str, port: int, tls_host: str | None
                      ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP connection to exactly `address` (TLS verified against `tls_host`, which is also the SNI)."""
    if tls_host is None:
        return await asyncio.open_connection(address, port)
    return await asyncio.open_connection(address, port, ssl=_tls_context(), server_hostname=tls_host)


def parse_host(host: str) -> IPAddress | None:
    """The URL host's address when it is written as one (canonically), None for a name; ImageRefused for
    a number spelled any other way, or a host that is no valid name."""
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if _NUMERIC_LABEL.fullmatch(labels[-1]) or not labels[-1]:
        raise ImageRefused("ip_spelling", f"the image URL's host {host!r} is an address written in a non-canonical "
                                          "form (decimal, octal, hexadecimal or shortened), which the gateway "
                                          "does not fetch from")
    if not _HOSTNAME.fullmatch(host):
        raise ImageRefused("bad_url", f"the image URL's host {host!r} is not a valid host name")
    return None


def split_url(url: str) -> tuple[str, str, int, str, str]:
    """(scheme, host, port, Host header, request target) of an http(s) URL; ImageRefused when it is not
    one the gateway fetches."""
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise ImageRefused("bad_url", "the image URL holds whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
        raw_host = parts.hostname
    except ValueError as e:
        raise ImageRefused("bad_url", f"the image URL is malformed ({e})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        shown = scheme or "none"
        raise ImageRefused("scheme", f"the image URL's scheme is {shown!r}; only http, https and data:image URLs "
                                     "are taken")
    if parts.username is not None or parts.password is not None:
        raise ImageRefused("bad_url", "the image URL holds credentials (user@host), which the gateway does not send")
    if not raw_host:
        raise ImageRefused("bad_url", "the image URL has no host")
    try:
        host = raw_host.encode("idna").decode("ascii").lower() if not raw_host.isascii() else raw_host.lower()
    except UnicodeError:
        raise ImageRefused("bad_url", "the image URL's host is not a valid international domain name") from None
    if port is None:
        port = 443 if scheme == "https" else 80
    shown_host = f"[{host}]" if ":" in host else host
    host_header = shown_host if port == (443 if scheme == "https" else 80) else f"{shown_host}:{port}"
    target = quote(parts.path or "/", safe=_TARGET_SAFE) + (f"?{quote(parts.query, safe=_TARGET_SAFE)}"
                                                            if parts.query else "")
    return scheme, host, port, host_header, target


@dataclass
class Fetcher:
    """`fetch(url)` -> the body of a 200 answer, within the policy and caps (see the module docstring).
    `resolver` and `connector` are the two steps that touch the network; tests replace them."""

    policy: AddressPolicy = field(default_factory=AddressPolicy)
    timeout_s: float = 5.0
    max_bytes: int = 20 * 1024 * 1024
    max_redirects: int = 3
    resolver: Resolver = system_resolver
    connector: Connector = open_stream
    user_agent: str = "openai-api-triton image fetcher"

    async def judge(self, url: str) -> Target:
        """The hop `url` as a connection target, after every check; nothing is connected to."""
        scheme, host, port, host_header, target = split_url(url)
        try:
            literal = parse_host(host)
        except ImageRefused as e:
            # An odd spelling the operator listed in --image-allowed-hosts is theirs to mean: resolve it.
            if e.reason != "ip_spelling" or not self.policy.name_allowed(host):
                raise
            literal = None
        if literal is not None:
            addresses: list[IPAddress] = [literal]
        else:
            self.policy.check_name(host)
            try:
                found = await self.resolver(host, port)
            except OSError as e:
                raise ImageRefused("resolve_failed", f"the image URL's host {host!r} could not be resolved "
                                                     f"({e.strerror or e})") from None
            try:
                addresses = [ipaddress.ip_address(a.split("%")[0]) for a in found]
            except ValueError:
                raise ImageRefused("resolve_failed", f"the image URL's host {host!r} resolved to no usable "
                                                     "address") from None
            if not addresses:
                raise ImageRefused("resolve_failed", f"the image URL's host {host!r} resolved to no address")
        for ip in addresses:  # one refused answer refuses the host: the resolver's order is not ours to trust
            self.policy.check(host, ip)
        return Target(url, host, str(addresses[0]), port, scheme == "https", host_header, target)

    async def fetch(self, url: str, timeout_s: float | None = None) -> bytes:
        """The body of `url`'s 200 answer, within `timeout_s` (default: the fetcher's) for everything."""
        budget = self.timeout_s if timeout_s is None else timeout_s
        try:
            async with asyncio.timeout(budget):
                for hop in range(self.max_redirects + 1):
                    target = await self.judge(url)
                    status, location, body = await self._exchange(target)
                    if status in _REDIRECTS and location is not None:
                        if hop >= self.max_redirects:
                            raise ImageRefused("redirect", f"the image URL redirects more than {self.max_redirects} "
                                                           "time(s)" if self.max_redirects else
                                                           "the image URL redirects, and redirects are not followed")
                        url = urljoin(url, location)
                        continue
                    if status != 200:
                        raise ImageRefused("http_status", f"the image URL answered HTTP {status}")
                    return body
        except TimeoutError:
            raise ImageRefused("timeout", f"the image could not be fetched within {self.timeout_s:g} s") from None
        raise ImageRefused("redirect", "the image URL redirects too often")  # pragma: no cover - loop returns

    async def _exchange(self, t: Target) -> tuple[int, str | None, bytes]:
        """One GET on a fresh connection: (status, Location of a redirect, body of a 200)."""
        try:
            reader, writer = await self.connector(t.address, t.port, t.host if t.tls else None)
        except (OSError, ssl.SSLError) as e:
            raise ImageRefused("connect_failed", f"the image URL's host {t.host!r} could not be reached "
                                                 f"({type(e).__name__})") from None
        try:
            return await self._talk(t, reader, writer)
        except (OSError, ssl.SSLError) as e:  # reset, broken pipe, TLS failure mid-answer
            raise ImageRefused("connect_failed", f"the connection to {t.host!r} failed ({type(e).__name__})"
                               ) from None
        finally:
            writer.transport.abort()  # no graceful close to wait on: the answer is read, or abandoned

    async def _talk(self, t: Target, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                    ) -> tuple[int, str | None, bytes]:
        conn = h11.Connection(h11.CLIENT, max_incomplete_event_size=32 * 1024)
        headers = [("Host", t.host_header), ("User-Agent", self.user_agent), ("Accept", "image/*"),
                   ("Accept-Encoding", "identity"), ("Connection", "close")]
        writer.write(conn.send(h11.Request(method="GET", target=t.target, headers=headers)))
        writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()
        status = 0
        location: str | None = None
        chunks: list[bytes] = []
        size = 0
        while True:
            try:
                event = conn.next_event()
            except h11.RemoteProtocolError as e:
                raise ImageRefused("bad_response", f"the image URL's server sent a malformed HTTP answer ({e})"
                                   ) from None
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(_READ))
                continue
            if isinstance(event, h11.Response):
                status = event.status_code
                fields = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers}
                if status in _REDIRECTS:
                    location = fields.get("location")
                    return status, location, b""
                if status != 200:
                    return status, None, b""
                declared = fields.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
                    raise ImageRefused("too_large", f"the image is {int(declared):,} bytes, over the cap of "
                                                    f"{self.max_bytes:,}")
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.max_bytes:
                    raise ImageRefused("too_large", f"the image is over the cap of {self.max_bytes:,} bytes")
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                if status == 0:
                    raise ImageRefused("bad_response", "the image URL's server closed without an answer")
                return status, None, b"".join(chunks)
            elif isinstance(event, h11.InformationalResponse):
                continue
