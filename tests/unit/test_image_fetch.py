"""The image fetcher's address policy, with the two network steps replaced: the resolver answers what each
test says, and the connector records every connection it is asked for (serving a canned HTTP answer).
Refused targets must be refused before any connection is attempted; nothing here touches the network."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from openai_api.images import ImageRefused
from openai_api.images.fetch import AddressPolicy, Fetcher, classify, split_url
from tests.image_samples import solid

# Stand-ins for public hosts: never connected to (the connector is a fake), only classified.
PUBLIC = "93.184.215.14"
PUBLIC_V6 = "2606:2800:21f:cb07:6820:80da:af6b:8b2c"
PNG = solid(8, 8, "red")


def answer(status: int = 200, body: bytes = PNG, headers: dict[str, str] | None = None,
           length: bool = True) -> bytes:
    head = [f"HTTP/1.1 {status} X"]
    fields = dict(headers or {})
    if length:
        fields.setdefault("Content-Length", str(len(body)))
    head += [f"{k}: {v}" for k, v in fields.items()]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class FakeWriter:
    def __init__(self) -> None:
        self.sent = b""
        self.transport = self
        self.aborted = False

    def write(self, data: bytes) -> None:
        self.sent += data

    async def drain(self) -> None:
        return None

    def abort(self) -> None:
        self.aborted = True


class Network:
    """The resolver and the connector of a Fetcher, scripted: `dns` maps a host to the list of answers to
    give on successive look-ups; `pages` maps an address to the raw HTTP answer it sends."""

    def __init__(self, dns: dict[str, list[list[str]]] | None = None,
                 pages: dict[str, bytes | Callable[[], bytes]] | None = None) -> None:
        self.dns = dns or {}
        self.pages = pages or {}
        self.lookups: list[str] = []
        self.connects: list[tuple[str, int, str | None]] = []
        self.writers: list[FakeWriter] = []

    async def resolve(self, host: str, port: int) -> list[str]:
        self.lookups.append(host)
        answers = self.dns[host]
        return answers[min(len(self.lookups) - 1, len(answers) - 1)] if len(answers) > 1 else answers[0]

    async def connect(self, address: str, port: int, tls_host: str | None) -> tuple[Any, Any]:
        self.connects.append((address, port, tls_host))
        page = self.pages.get(address, answer())
        reader = asyncio.StreamReader()
        reader.feed_data(page() if callable(page) else page)
        reader.feed_eof()
        writer = FakeWriter()
        self.writers.append(writer)
        return reader, writer

    def fetcher(self, **kw: Any) -> Fetcher:
        return Fetcher(resolver=self.resolve, connector=self.connect, **kw)


def refused(coro: Any) -> ImageRefused:
    with pytest.raises(ImageRefused) as info:
        asyncio.run(coro)
    return info.value


# --- addresses that are never connected to -----------------------------------------------------------------

LITERALS = {
    "http://10.0.0.1/a.png": "private", "http://10.255.255.254/": "private", "http://172.16.0.1/": "private",
    "http://172.31.255.255/": "private", "http://192.168.1.10/x.png": "private", "http://100.64.0.1/": "private",
    "http://[fd12:3456::1]/": "private",
    "http://169.254.1.1/": "link_local", "http://[fe80::1]/": "link_local",
    "http://169.254.169.254/latest/meta-data/": "metadata", "http://[fd00:ec2::254]/": "metadata",
    "http://100.100.100.200/": "metadata",
    "http://127.0.0.1/": "loopback", "http://127.8.9.10:8080/": "loopback", "http://[::1]/": "loopback",
    "http://0.0.0.0/": "unspecified", "http://[::]/": "unspecified",
    "http://224.0.0.1/": "multicast", "http://[ff02::1]/": "multicast",
    "http://[::ffff:127.0.0.1]/": "ipv4_mapped", "http://[::ffff:10.0.0.1]/": "ipv4_mapped",
    "http://[::ffff:169.254.169.254]/": "ipv4_mapped", "http://[::ffff:7f00:1]/": "ipv4_mapped",
    "http://[64:ff9b::7f00:1]/": "ipv4_mapped", "http://[2002:7f00:1::]/": "ipv4_mapped",
    "http://[::7f00:1]/": "ipv4_mapped",
    "http://2130706433/": "ip_spelling", "http://0177.0.0.1/": "ip_spelling", "http://0x7f.0.0.1/": "ip_spelling",
    "http://0x7f000001/": "ip_spelling", "http://127.1/": "ip_spelling", "http://017700000001/": "ip_spelling",
    "http://3232235777/": "ip_spelling", "http://127.0.0.1./": "ip_spelling", "http://010.0.0.1/": "ip_spelling",
    "http://169.254.169.254.nip.io.1/": "ip_spelling",
    "file:///etc/passwd": "scheme", "gopher://127.0.0.1:70/_x": "scheme", "ftp://example.com/a.png": "scheme",
    "dict://127.0.0.1:11211/": "scheme", "//example.com/a.png": "scheme", "http://user:pw@example.com/": "bad_url",
    "http://example.com/a b.png": "bad_url", "http://example.com/a\r\nX-Injected: 1": "bad_url",
    "http:///a.png": "bad_url",
}


@pytest.mark.parametrize(("url", "reason"), sorted(LITERALS.items()))
def test_a_forbidden_target_is_refused_before_any_lookup_or_connection(url: str, reason: str) -> None:
    net = Network()
    err = refused(net.fetcher().fetch(url))
    assert err.reason == reason, err.message
    assert net.connects == [] and net.lookups == []


@pytest.mark.parametrize(("answers", "reason"), [
    (["10.1.2.3"], "private"), (["172.20.0.5"], "private"), (["192.168.0.7"], "private"),
    (["169.254.169.254"], "metadata"), (["fd00:ec2::254"], "metadata"), (["127.0.0.1"], "loopback"),
    (["::1"], "loopback"), (["::ffff:10.0.0.1"], "ipv4_mapped"), (["fe80::1%eth0"], "link_local"),
    ([PUBLIC, "10.0.0.1"], "private"), (["192.168.1.1", PUBLIC], "private"),
])
def test_a_name_that_resolves_to_a_forbidden_address_is_refused_without_connecting(
        answers: list[str], reason: str) -> None:
    net = Network(dns={"images.example.com": [answers]})
    err = refused(net.fetcher().fetch("https://images.example.com/cat.png"))
    assert err.reason == reason, err.message
    assert net.lookups == ["images.example.com"] and net.connects == []


def test_dns_that_changes_between_check_and_connect_cannot_reach_the_second_answer() -> None:
    """Rebinding: the first look-up says public, every later one says loopback. The host is resolved once
    and the connection goes to the address that was checked."""
    net = Network(dns={"rebind.example.com": [[PUBLIC], ["127.0.0.1"]]})
    body = asyncio.run(net.fetcher().fetch("http://rebind.example.com/cat.png"))
    assert body == PNG
    assert net.lookups == ["rebind.example.com"]
    assert net.connects == [(PUBLIC, 80, None)]
    sent = net.writers[0].sent.decode()
    assert sent.startswith("GET /cat.png HTTP/1.1\r\n") and "host: rebind.example.com\r\n" in sent.lower()


def test_https_connects_to_the_checked_address_and_verifies_the_name() -> None:
    net = Network(dns={"cdn.example.com": [[PUBLIC_V6]]})
    asyncio.run(net.fetcher().fetch("https://cdn.example.com:8443/a.png?x=1"))
    assert net.connects == [(PUBLIC_V6, 8443, "cdn.example.com")]
    assert "GET /a.png?x=1 HTTP/1.1" in net.writers[0].sent.decode()


def test_every_redirect_hop_is_judged_like_the_first() -> None:
    redirect = answer(302, b"", {"Location": "http://169.254.169.254/latest/meta-data/"})
    net = Network(dns={"img.example.com": [[PUBLIC]]}, pages={PUBLIC: redirect})
    err = refused(net.fetcher().fetch("http://img.example.com/a.png"))
    assert err.reason == "metadata"
    assert net.connects == [(PUBLIC, 80, None)]  # the first hop only


def test_a_redirect_to_a_name_is_resolved_and_judged_again() -> None:
    redirect = answer(301, b"", {"Location": "//internal.example.com/a.png"})
    net = Network(dns={"img.example.com": [[PUBLIC]], "internal.example.com": [["10.9.8.7"]]},
                  pages={PUBLIC: redirect})
    err = refused(net.fetcher().fetch("http://img.example.com/a.png"))
    assert err.reason == "private" and len(net.connects) == 1


def test_redirects_are_followed_to_an_allowed_target_within_the_limit() -> None:
    other = "93.184.215.15"
    net = Network(dns={"a.example.com": [[PUBLIC]], "b.example.com": [[other]]},
                  pages={PUBLIC: answer(307, b"", {"Location": "http://b.example.com/real.png"})})
    assert asyncio.run(net.fetcher().fetch("http://a.example.com/a.png")) == PNG
    assert [c[0] for c in net.connects] == [PUBLIC, other]


def test_no_redirects_when_they_are_off() -> None:
    net = Network(dns={"a.example.com": [[PUBLIC]]},
                  pages={PUBLIC: answer(302, b"", {"Location": "http://a.example.com/b.png"})})
    err = refused(net.fetcher(max_redirects=0).fetch("http://a.example.com/a.png"))
    assert err.reason == "redirect" and len(net.connects) == 1


def test_a_redirect_loop_ends_at_the_hop_limit() -> None:
    net = Network(dns={"a.example.com": [[PUBLIC]]},
                  pages={PUBLIC: answer(302, b"", {"Location": "/again.png"})})
    err = refused(net.fetcher(max_redirects=3).fetch("http://a.example.com/a.png"))
    assert err.reason == "redirect" and len(net.connects) == 4


# --- what the flags open -------------------------------------------------------------------------------------


def test_allow_private_opens_the_private_ranges_and_nothing_else() -> None:
    net = Network()
    fetcher = net.fetcher(policy=AddressPolicy.build(allow_private=True))
    assert asyncio.run(fetcher.fetch("http://10.1.2.3/a.png")) == PNG
    assert asyncio.run(fetcher.fetch("http://192.168.5.5/a.png")) == PNG
    for url, reason in (("http://127.0.0.1/", "loopback"), ("http://169.254.169.254/", "metadata"),
                        ("http://[fe80::1]/", "link_local"), ("http://[::ffff:10.1.2.3]/", "ipv4_mapped")):
        assert refused(fetcher.fetch(url)).reason == reason
    assert [c[0] for c in net.connects] == ["10.1.2.3", "192.168.5.5"]


def test_allowed_hosts_open_exactly_the_named_hosts_addresses_and_networks() -> None:
    net = Network(dns={"store.internal": [["10.20.30.40"]], "other.internal": [["10.20.30.41"]]})
    policy = AddressPolicy.build(["127.0.0.2", "STORE.internal", "192.168.7.0/24"])
    fetcher = net.fetcher(policy=policy)
    assert asyncio.run(fetcher.fetch("http://127.0.0.2:9000/a.png")) == PNG
    assert asyncio.run(fetcher.fetch("http://store.internal/a.png")) == PNG
    assert asyncio.run(fetcher.fetch("http://192.168.7.9/a.png")) == PNG
    assert refused(fetcher.fetch("http://127.0.0.1:9000/a.png")).reason == "loopback"
    assert refused(fetcher.fetch("http://other.internal/a.png")).reason == "private"
    assert refused(fetcher.fetch("http://192.168.8.9/a.png")).reason == "private"
    assert [c[0] for c in net.connects] == ["127.0.0.2", "10.20.30.40", "192.168.7.9"]


def test_an_odd_ip_spelling_is_fetched_only_when_listed_itself() -> None:
    net = Network(dns={"2130706434": [["127.0.0.2"]]})
    assert refused(net.fetcher().fetch("http://2130706434/a.png")).reason == "ip_spelling"
    assert net.lookups == [] and net.connects == []
    listed = net.fetcher(policy=AddressPolicy.build(["2130706434"]))
    assert asyncio.run(listed.fetch("http://2130706434/a.png")) == PNG
    assert net.connects == [("127.0.0.2", 80, None)]


def test_a_redirect_from_an_allowed_host_to_a_refused_one_is_refused() -> None:
    net = Network(pages={"127.0.0.2": answer(302, b"", {"Location": "http://127.0.0.1:9000/a.png"})})
    err = refused(net.fetcher(policy=AddressPolicy.build(["127.0.0.2"])).fetch("http://127.0.0.2:9000/a.png"))
    assert err.reason == "loopback" and [c[0] for c in net.connects] == ["127.0.0.2"]


# --- the answer ----------------------------------------------------------------------------------------------


def test_the_byte_cap_is_counted_while_reading_not_taken_from_content_length() -> None:
    big = b"x" * 5000
    lying = answer(200, big, {"Content-Length": "5000"})
    chunked = ("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + "".join(
        f"{len(c):x}\r\n{c}\r\n" for c in ["y" * 1000] * 5) + "0\r\n\r\n").encode()
    close_delimited = answer(200, big, length=False)
    for page in (lying, chunked, close_delimited):
        net = Network(pages={PUBLIC: page})
        err = refused(net.fetcher(max_bytes=4096).fetch(f"http://{PUBLIC}/a.png"))
        assert err.reason == "too_large", err.message


def test_a_declared_length_over_the_cap_is_refused_before_the_body() -> None:
    net = Network(pages={PUBLIC: answer(200, b"", {"Content-Length": str(10**12)})})
    assert refused(net.fetcher().fetch(f"http://{PUBLIC}/a.png")).reason == "too_large"


def test_http_errors_and_malformed_answers_are_refusals() -> None:
    for page, reason in ((answer(404, b"nope"), "http_status"), (b"garbage\r\n\r\n", "bad_response"),
                         (b"", "bad_response"), (answer(200, b"short", {"Content-Length": "99"}), "bad_response")):
        net = Network(pages={PUBLIC: page})
        assert refused(net.fetcher().fetch(f"http://{PUBLIC}/a.png")).reason == reason


def test_the_deadline_covers_the_whole_fetch() -> None:
    class Slow(Network):
        async def connect(self, address: str, port: int, tls_host: str | None) -> tuple[Any, Any]:
            self.connects.append((address, port, tls_host))
            reader = asyncio.StreamReader()  # never fed: the server says nothing
            return reader, FakeWriter()

    net = Slow()
    err = refused(net.fetcher(timeout_s=0.05).fetch(f"http://{PUBLIC}/a.png"))
    assert err.reason == "timeout"


def test_a_connection_that_fails_midway_is_a_refusal() -> None:
    class Reset(Network):
        async def connect(self, address: str, port: int, tls_host: str | None) -> tuple[Any, Any]:
            reader = asyncio.StreamReader()
            reader.feed_data(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc")
            reader.set_exception(ConnectionResetError("reset by peer"))
            return reader, FakeWriter()

        async def refuse_connect(self, address: str, port: int, tls_host: str | None) -> tuple[Any, Any]:
            raise ConnectionRefusedError("refused")

    net = Reset()
    assert refused(net.fetcher().fetch(f"http://{PUBLIC}/a.png")).reason == "connect_failed"
    fetcher = Fetcher(resolver=net.resolve, connector=net.refuse_connect)
    assert refused(fetcher.fetch(f"http://{PUBLIC}/a.png")).reason == "connect_failed"


def test_an_unresolvable_host_is_a_refusal() -> None:
    class NoDNS(Network):
        async def resolve(self, host: str, port: int) -> list[str]:
            raise OSError(-2, "Name or service not known")

    assert refused(NoDNS().fetcher().fetch("http://nowhere.invalid/a.png")).reason == "resolve_failed"


def test_classify_calls_public_addresses_public() -> None:
    import ipaddress

    for a in (PUBLIC, PUBLIC_V6, "8.8.8.8", "1.1.1.1"):
        assert classify(ipaddress.ip_address(a)) is None


def test_split_url_keeps_the_path_and_query_and_encodes_what_must_be() -> None:
    assert split_url("http://Example.COM/a/b.png?x=1&y=%20")[1:] == (
        "example.com", 80, "example.com", "/a/b.png?x=1&y=%20")
    assert split_url("https://[2001:db8::1]:8443/")[3] == "[2001:db8::1]:8443"
    assert split_url("http://example.com/caf\u00e9.png")[4] == "/caf%C3%A9.png"


# --- the special-purpose table is ours, the same on every Python ---------------------------------------------

# One address inside each range of IANA's special-purpose registries that is not public, with the reason; the
# first rows are what Python's own `is_global` / `is_private` got wrong (CVE-2024-4032 before 3.11.10 / 3.12.4:
# most of 192.0.0.0/24; on every version fec0::/10, 3fff::/20, 5f00::/16, 100:0:0:1::/64, 192.88.99.0/24).
SPECIAL = [
    ("192.0.0.8", "reserved"), ("192.0.0.9", "reserved"), ("192.0.0.100", "reserved"), ("192.0.0.255", "reserved"),
    ("fec0::1", "private"), ("fefe::1", "private"), ("3fff::1", "reserved"), ("5f00::1", "reserved"),
    ("100:0:0:1::1", "reserved"), ("192.88.99.1", "reserved"), ("4000::1", "reserved"),
    ("0.0.0.0", "unspecified"), ("0.1.2.3", "reserved"), ("10.0.0.1", "private"), ("100.64.0.1", "private"),
    ("100.127.255.254", "private"), ("127.0.0.1", "loopback"), ("127.255.255.255", "loopback"),
    ("169.254.1.1", "link_local"), ("172.16.0.1", "private"), ("172.31.255.255", "private"),
    ("192.0.2.1", "reserved"), ("192.168.1.1", "private"), ("198.18.0.1", "reserved"), ("198.19.255.255", "reserved"),
    ("198.51.100.1", "reserved"), ("203.0.113.1", "reserved"), ("224.0.0.1", "multicast"),
    ("239.255.255.255", "multicast"), ("240.0.0.1", "reserved"), ("255.255.255.255", "reserved"),
    ("::", "unspecified"), ("::1", "loopback"), ("::ffff:8.8.8.8", "ipv4_mapped"), ("::8.8.8.8", "ipv4_mapped"),
    ("64:ff9b::808:808", "ipv4_mapped"), ("64:ff9b:1::1", "ipv4_mapped"), ("2002:808:808::1", "ipv4_mapped"),
    ("2001::1", "ipv4_mapped"), ("100::1", "reserved"), ("2001:2::1", "reserved"), ("2001:10::1", "reserved"),
    ("2001:1ff:ffff::1", "reserved"), ("2001:db8::1", "reserved"), ("fc00::1", "private"), ("fd12:3456::1", "private"),
    ("fe80::1", "link_local"), ("febf::1", "link_local"), ("ff02::1", "multicast"),
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"), ("100.100.100.200", "metadata"),
]
PUBLICS = [PUBLIC, PUBLIC_V6, "8.8.8.8", "1.1.1.1", "192.0.1.255", "192.0.3.0", "198.17.255.255", "198.20.0.0",
           "223.255.255.255", "2001:200::1", "2001:4860:4860::8888", "2a00:1450:4001::1", "3ffe::1"]


@pytest.mark.parametrize(("address", "reason"), SPECIAL)
def test_every_special_purpose_range_is_refused_with_its_reason(address: str, reason: str) -> None:
    import ipaddress

    assert classify(ipaddress.ip_address(address)) == reason


@pytest.mark.parametrize("address", PUBLICS)
def test_public_addresses_pass(address: str) -> None:
    import ipaddress

    assert classify(ipaddress.ip_address(address)) is None


def test_the_verdicts_do_not_depend_on_pythons_own_address_properties(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python whose `ipaddress` answers wrongly (every address global, none private, loopback, ...) changes
    nothing: the verdicts come from the fetcher's table."""
    import ipaddress

    for cls in (ipaddress.IPv4Address, ipaddress.IPv6Address):
        monkeypatch.setattr(cls, "is_global", property(lambda self: True))
        for name in ("is_private", "is_loopback", "is_link_local", "is_multicast", "is_unspecified", "is_reserved",
                     "is_site_local"):
            if hasattr(cls, name):
                monkeypatch.setattr(cls, name, property(lambda self: False))
    for address, reason in SPECIAL:
        assert classify(ipaddress.ip_address(address)) == reason, address
    assert all(classify(ipaddress.ip_address(a)) is None for a in PUBLICS)


# --- refusals say why, never where ---------------------------------------------------------------------------

@pytest.mark.parametrize("answers", [["10.9.8.7"], ["169.254.169.254"], ["fd12:3456::77"], ["127.0.0.53"],
                                     [PUBLIC, "192.168.44.55"]])
def test_a_refusal_names_the_reason_but_never_the_address_a_name_resolved_to(answers: list[str]) -> None:
    net = Network(dns={"db.corp.internal": [answers]})
    err = refused(net.fetcher().fetch("http://db.corp.internal/a.png"))
    for address in answers:
        assert address not in err.message, err.message
    assert "db.corp.internal" in err.message and err.reason in err.message.replace(" ", "_").replace("-", "_")


# --- allowed-only ----------------------------------------------------------------------------------------------

def test_allowed_only_fetches_from_the_listed_names_and_resolves_no_other_name() -> None:
    net = Network(dns={"img.example.com": [[PUBLIC]], "store.internal": [["10.20.30.40"]]},
                  pages={"10.20.30.40": answer(302, b"", {"Location": "http://img.example.com/a.png"})})
    fetcher = net.fetcher(policy=AddressPolicy.build(["store.internal"], allowed_only=True))
    for url in ("http://img.example.com/a.png", f"http://{PUBLIC}/a.png", "http://127.0.0.2/a.png",
                "http://store.internal/a.png"):  # the last: a redirect to a public host that is not listed
        assert refused(fetcher.fetch(url)).reason == "not_allowed", url
    assert net.lookups == ["store.internal"]  # every other name refused before it was resolved
    assert [c[0] for c in net.connects] == ["10.20.30.40"]


def test_allowed_only_with_addresses_and_networks_judges_names_by_their_addresses() -> None:
    net = Network(dns={"a.internal": [["10.1.0.5"]], "b.internal": [["10.2.0.5"]], "img.example.com": [[PUBLIC]]})
    fetcher = net.fetcher(policy=AddressPolicy.build(["10.1.0.0/16", "127.0.0.2"], allowed_only=True))
    assert asyncio.run(fetcher.fetch("http://a.internal/a.png")) == PNG
    assert asyncio.run(fetcher.fetch("http://127.0.0.2:9000/a.png")) == PNG
    for url in ("http://b.internal/a.png", "http://img.example.com/a.png", "http://127.0.0.1/a.png"):
        assert refused(fetcher.fetch(url)).reason == "not_allowed", url
    assert [c[0] for c in net.connects] == ["10.1.0.5", "127.0.0.2"]
