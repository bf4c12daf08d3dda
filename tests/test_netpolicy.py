"""The SSRF policy: which addresses the web and browser tools may reach, and the fetcher obeying it."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from trajforge.tools.netpolicy import NetPolicy, NetPolicyError
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
        policy.check_url("https://a.evil.example/x")
    with pytest.raises(NetPolicyError, match="only http and https"):
        policy.check_url("file:///etc/passwd")
    with pytest.raises(NetPolicyError, match="loopback"):
        NetPolicy().check_url("http://[::1]:8080/")


def test_config_errors_say_what_to_write() -> None:
    with pytest.raises(ValidationError, match="CIDR"):
        NetPolicy(allow_cidrs=["localhost"])
    with pytest.raises(ValidationError, match="host name"):
        NetPolicy(deny_hosts=["http://x.example/"])


async def test_resolution_checks_the_connected_address() -> None:
    # "localhost" is a name: only the resolver sees that it means loopback.
    with pytest.raises(NetPolicyError, match="refused host 'localhost'.*loopback"):
        await NetPolicy().resolve_checked("localhost", 80)
    allowed = await LOOPBACK.resolve_checked("localhost", 80)
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
