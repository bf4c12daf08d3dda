"""The SSRF policy and the URL gate: which addresses the host may reach for a model, the one way
a URL is read, and the connect-time checks of the fetcher (the whole-tool table against a
canary is tests/security/test_ssrf.py)."""

from __future__ import annotations

import ipaddress
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from pydantic import ValidationError
from yarl import URL

from trajforge.tools.netpolicy import (
    GatedConnector,
    IPAddress,
    NetPolicy,
    NetPolicyError,
    Target,
    canonical_target,
)
from trajforge.tools.web_fetch import FetchError, SafeFetcher, TooLargeError

sys.path.insert(0, str(Path(__file__).parent / "site"))
from localsite import Site, start_site  # noqa: E402

LOOPBACK = NetPolicy(allow_cidrs=["127.0.0.0/8"])


@pytest.fixture
async def site() -> AsyncIterator[Site]:
    s = await start_site()
    yield s
    await s.runner.cleanup()


@pytest.mark.parametrize(
    ("address", "words"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.20.0.1", "private"),
        ("192.168.1.1", "private"),
        ("100.64.3.4", "carrier-grade NAT"),
        ("169.254.169.254", "cloud metadata"),
        ("224.0.0.251", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("255.255.255.255", "broadcast"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fd00:ec2::254", "unique-local"),
        ("ff02::1", "multicast"),
        ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped
        ("::ffff:169.254.169.254", "cloud metadata"),
        ("2002:7f00:1::1", "loopback"),  # 6to4 embedding 127.0.0.1
        ("64:ff9b::a00:1", "private"),  # NAT64 embedding 10.0.0.1
    ],
)
def test_default_policy_denies_non_public_addresses(address: str, words: str) -> None:
    why = NetPolicy().address_denial(address)
    assert why is not None and words in why
    assert "allow_cidrs" in why  # the error says how to allow it


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "::ffff:8.8.8.8"])
def test_default_policy_allows_public_addresses(address: str) -> None:
    assert NetPolicy().address_denial(address) is None


def test_allow_and_deny_lists_in_order() -> None:
    policy = NetPolicy(
        allow_cidrs=["10.0.0.0/8"],
        deny_cidrs=["10.9.0.0/16", "8.8.8.0/24"],
        allow_hosts=["searx.internal"],
        deny_hosts=["*.evil.example"],
    )
    assert policy.address_denial("10.1.1.1") is None
    assert "deny_cidrs" in (policy.address_denial("10.9.1.1") or "")  # deny beats allow
    assert "deny_cidrs" in (policy.address_denial("8.8.8.8") or "")
    assert policy.address_denial("192.168.0.5", host="searx.internal") is None
    assert policy.address_denial("192.168.0.5", host="other.internal") is not None
    with pytest.raises(NetPolicyError, match="deny_hosts"):
        policy.gate("https://a.evil.example/x")
    with pytest.raises(NetPolicyError, match="only http and https"):
        policy.gate("file:///etc/passwd")
    with pytest.raises(NetPolicyError, match="loopback"):
        NetPolicy().gate("http://[::1]:8080/")


def test_config_errors_say_what_to_write() -> None:
    with pytest.raises(ValidationError, match="CIDR"):
        NetPolicy(allow_cidrs=["localhost"])
    with pytest.raises(ValidationError, match="host name"):
        NetPolicy(deny_hosts=["http://x.example/"])


async def test_resolution_checks_the_connected_address() -> None:
    # "localhost" is a name: only the resolver sees that it means loopback.
    with pytest.raises(NetPolicyError, match="refused host 'localhost'.*loopback"):
        await NetPolicy().resolve_checked(NetPolicy().gate("http://localhost/"))
    allowed = await LOOPBACK.resolve_checked(LOOPBACK.gate("http://localhost/"))
    assert allowed and all(a.is_loopback for a in allowed)


async def test_default_policy_refuses_a_loopback_server(site: Site) -> None:
    async with SafeFetcher(NetPolicy(), user_agent="t") as f:
        with pytest.raises(NetPolicyError, match=r"127\.0\.0\.1 is a loopback address"):
            await f.fetch(site.url("/page1"), max_bytes=10**6, timeout_s=10)
        # through a name, too: the check is on the resolved address, not the spelling
        with pytest.raises(NetPolicyError, match="loopback"):
            await f.fetch(site.url("/page1").replace("127.0.0.1", "localhost"), max_bytes=10**6, timeout_s=10)
    assert site.requests == []  # nothing reached the server


async def test_redirect_to_a_denied_address_is_refused(site: Site) -> None:
    async with SafeFetcher(LOOPBACK, user_agent="t") as f:
        ok = await f.fetch(site.url("/redirect"), max_bytes=10**6, timeout_s=10)
        assert ok.status == 200 and ok.url == site.url("/page1") and ok.redirects == [site.url("/redirect")]
        target = "http://169.254.169.254/latest/meta-data/"
        with pytest.raises(NetPolicyError, match=r"169\.254\.169\.254.*cloud metadata.*redirect from"):
            await f.fetch(site.url(f"/redirect-to?target={target}"), max_bytes=10**6, timeout_s=10)
        with pytest.raises(NetPolicyError, match="only http and https"):
            await f.fetch(site.url("/redirect-to?target=file:///etc/passwd"), max_bytes=10**6, timeout_s=10)


async def test_size_and_time_limits(site: Site) -> None:
    async with SafeFetcher(LOOPBACK, user_agent="t") as f:
        with pytest.raises(TooLargeError, match="larger than the 100000 bytes allowed"):
            await f.fetch(site.url("/huge"), max_bytes=100_000, timeout_s=30)
        with pytest.raises(FetchError, match="longer than the 0.5s allowed"):
            await f.fetch(site.url("/slow"), max_bytes=10**6, timeout_s=0.5)


@pytest.mark.parametrize(
    ("url", "host", "address"),
    [
        ("http://１２７．０．０．１/", "127.0.0.1", "127.0.0.1"),  # fullwidth digits and stops
        ("http://127。0。0。1/", "127.0.0.1", "127.0.0.1"),  # ideographic full stops
        ("http://①②⑦.⓪.⓪.①/", "127.0.0.1", "127.0.0.1"),  # circled digits
        ("http://2130706433/", "127.0.0.1", "127.0.0.1"),
        ("http://0177.0.0.1/", "127.0.0.1", "127.0.0.1"),
        ("http://0x7f.1/", "127.0.0.1", "127.0.0.1"),
        ("http://127.1/", "127.0.0.1", "127.0.0.1"),
        ("http://0/", "0.0.0.0", "0.0.0.0"),
        ("http://127.0.0.1./", "127.0.0.1", "127.0.0.1"),
        ("http://%31%32%37.0.0.1/", "127.0.0.1", "127.0.0.1"),
        ("http://[::ffff:127.0.0.1]/", "::ffff:7f00:1", "::ffff:7f00:1"),
        ("http://[0:0:0:0:0:0:0:1]/", "::1", "::1"),
        ("http://example.com@127.0.0.1/", "127.0.0.1", "127.0.0.1"),
        ("http://127.0.0.1\\@example.com/", "127.0.0.1", "127.0.0.1"),  # a backslash is a slash
        ("http:\\\\127.0.0.1/", "127.0.0.1", "127.0.0.1"),
        (" http://127.0.0\t.1/\n", "127.0.0.1", "127.0.0.1"),
        ("http://LOCALHOST./x", "localhost", None),
        ("http://ⓛⓞⓒⓐⓛⓗⓞⓢⓣ/", "localhost", None),
        ("http://Bücher.example/", "xn--bcher-kva.example", None),
        ("http://1.2.3.4.example/", "1.2.3.4.example", None),  # the last label is not a number
    ],
)
def test_the_gate_reads_a_host_as_the_client_connects_to_it(url: str, host: str, address: str | None) -> None:
    target = canonical_target(url)
    assert target.host == host and target.url.raw_host == host
    assert (str(target.address) if target.address else None) == address


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://127.0.0.256/", "not a valid IPv4"),  # ends in a number, so must be IPv4
        ("http://1.2.3.4.5/", "not a valid IPv4"),
        ("http://0x7g.1/", "not a valid IPv4"),
        ("http://[::1%25lo]/", "zone identifiers"),
        ("http://%2531%2532%2537.0.0.1/", "encoded more than once"),
        ("http://a b.example/", "not a valid host name"),
        ("http://", "no host"),
        ("http://:80/x", "not a valid URL"),
        ("javascript:alert(1)", "only http and https"),
    ],
)
def test_the_gate_refuses_what_it_cannot_read_one_way(url: str, words: str) -> None:
    with pytest.raises(NetPolicyError, match=words):
        NetPolicy(allow_cidrs=["0.0.0.0/0", "::/0"]).gate(url)


def test_host_rules_match_every_spelling_of_a_name() -> None:
    policy = NetPolicy(deny_hosts=["ｅｖｉｌ.example", "*.Bad.Example."], allow_hosts=["Bücher.example"])
    assert policy.deny_hosts == ("evil.example", "*.bad.example") and policy.allow_hosts == (
        "xn--bcher-kva.example",
    )
    for url in (
        "http://EVIL.example/",
        "http://ⓔⓥⓘⓛ.example/",
        "http://evil.example./",
        "http://x.ｂａｄ.example/",
    ):
        with pytest.raises(NetPolicyError, match="deny_hosts"):
            policy.gate(url)
    assert policy.address_denial("10.0.0.1", host=policy.gate("http://bücher.example/").host) is None


def test_ipv4_compatible_and_embedded_addresses() -> None:
    policy = NetPolicy()
    assert "loopback" in (policy.address_denial("::127.0.0.1") or "")  # compatible, embeds loopback
    assert "IPv4-compatible" in (policy.address_denial("::8.8.8.8") or "")  # deprecated, whatever it embeds
    assert policy.address_denial("::ffff:8.8.8.8") is None  # mapped public: fine
    assert NetPolicy(allow_cidrs=["127.0.0.0/8"]).address_denial("::ffff:127.0.0.1") is None


async def test_connections_outside_a_gated_request_are_refused(site: Site) -> None:
    """The session itself refuses: a request that did not come through the gate connects nowhere,
    whatever its URL, even one the policy would allow."""
    fetcher = SafeFetcher(LOOPBACK, user_agent="t")
    try:
        session = fetcher._open()
        with pytest.raises(aiohttp.ClientError) as info:
            await session.get(site.url("/page1"))
        assert "outside a gated request" in str(_cause(info.value))
    finally:
        await fetcher.aclose()
    assert site.requests == []


async def test_the_socket_check_holds_without_the_gate(site: Site) -> None:
    """Layer 2 alone: a hop whose target the gate never checked (as if it had a bug) is still
    refused at connect time, by address; and a hop connects only to the address it was gated to."""
    gate = GatedConnector(NetPolicy())
    port = int(site.base.rsplit(":", 1)[1])
    unchecked = Target(
        url=URL(site.url("/page1")), host="127.0.0.1", port=port, address=ipaddress.ip_address("127.0.0.1")
    )
    elsewhere = Target(
        url=URL(site.url("/page1")),
        host="127.0.0.1",
        port=port,
        address=ipaddress.ip_address("93.184.216.34"),
    )
    connector = aiohttp.TCPConnector(
        resolver=gate.resolver, socket_factory=gate.socket_factory, happy_eyeballs_delay=None
    )
    async with aiohttp.ClientSession(connector=connector) as session:
        for target, words in ((unchecked, "loopback"), (elsewhere, "gated for")):
            token = gate.hop(target)
            try:
                with pytest.raises(aiohttp.ClientError) as info:
                    await session.get(target.url)
                assert words in str(_cause(info.value))
            finally:
                gate.done(token)
    assert site.requests == []


async def test_a_name_is_resolved_once_per_connection_and_rebinding_is_caught(site: Site) -> None:
    """DNS rebinding: the name answers an allowed address first, loopback next. The first fetch
    connects to what it checked; the second checks its own answer and is refused."""
    port = int(site.base.rsplit(":", 1)[1])
    answers = [["127.0.0.2"], ["127.0.0.1"]]
    asked: list[str] = []

    async def rebinding(host: str, _port: int) -> list[IPAddress]:
        asked.append(host)
        return [ipaddress.ip_address(a) for a in answers.pop(0)]

    policy = NetPolicy(allow_cidrs=["127.0.0.2/32"])
    async with SafeFetcher(policy, user_agent="t", resolve=rebinding) as f:
        with pytest.raises(FetchError, match="could not fetch"):  # 127.0.0.2: nothing listens there
            await f.fetch(f"http://rebind.example:{port}/page1", max_bytes=10**6, timeout_s=10)
        with pytest.raises(NetPolicyError, match="rebind.example.*loopback"):
            await f.fetch(f"http://rebind.example:{port}/page1", max_bytes=10**6, timeout_s=10)
    assert asked == ["rebind.example", "rebind.example"] and site.requests == []


def _cause(exc: BaseException) -> BaseException:
    """The innermost exception aiohttp wrapped (the connect-time refusal)."""
    inner = getattr(exc, "os_error", None) or exc.__cause__
    return _cause(inner) if inner is not None and inner is not exc else exc


def test_trusting_admits_the_operators_endpoint_only() -> None:
    policy = NetPolicy(deny_cidrs=["10.9.0.0/16"]).trusting("http://searx.internal:8080/search")
    assert policy.allow_hosts == ("searx.internal",)
    assert policy.address_denial("10.0.0.5", host="searx.internal") is None
    assert policy.address_denial("10.0.0.5", host="other.internal") is not None
    assert policy.address_denial("10.9.0.5", host="searx.internal") is not None  # deny still wins
    literal = NetPolicy().trusting("http://127.0.0.1:8888")
    assert literal.gate("http://127.0.0.1:8888/search").address is not None
    with pytest.raises(NetPolicyError, match="loopback"):
        literal.gate("http://127.0.0.2/")


async def test_a_redirect_to_another_origin_carries_no_credentials(site: Site) -> None:
    """A search API key or a page's cookies are for the origin they were sent to: a redirect to
    another origin (here: another port) gets none of them; one within the origin keeps them."""
    seen: list[dict[str, str]] = []

    async def record(request: web.Request) -> web.Response:
        seen.append(dict(request.headers))
        return web.Response(text="ok")

    app = web.Application()
    app.add_routes([web.get("/", record)])
    runner = web.AppRunner(app)
    await runner.setup()
    other = web.TCPSite(runner, "127.0.0.1", 0)
    await other.start()
    try:
        elsewhere = f"http://127.0.0.1:{runner.addresses[0][1]}/"
        creds = {"Authorization": "Bearer sk-secret", "X-Subscription-Token": "tok", "Cookie": "s=1"}
        async with SafeFetcher(LOOPBACK, user_agent="t") as f:
            resp = await f.fetch(
                site.url(f"/redirect-to?target={elsewhere}"),
                headers={**creds, "Accept": "application/json"},
                max_bytes=10**6,
                timeout_s=10,
            )
            assert resp.status == 200 and resp.url == elsewhere
            same = await f.fetch(site.url("/redirect"), headers=creds, max_bytes=10**6, timeout_s=10)
            assert same.status == 200 and same.redirects
    finally:
        await runner.cleanup()
    [headers] = seen
    assert not {"Authorization", "X-Subscription-Token", "Cookie"} & set(headers)
    assert headers["Accept"] == "application/json"
