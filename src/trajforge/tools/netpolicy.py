"""Where the host may fetch on a model's behalf: the allow/deny policy of the web and browser tools.

A model chooses the URLs that ``web_extract`` and the browser open, and a page or a search result
chooses redirects and subresources. Those fetches run in the host process, inside the operator's
network, so without a policy a model (or a page it reads) could reach the cloud metadata service,
the operator's router, a database on loopback: server-side request forgery.

:class:`NetPolicy` denies, unless explicitly allowed, every address that is not a public unicast
address: loopback, private (RFC 1918, unique-local), link-local (which holds the metadata service
169.254.169.254), carrier-grade NAT, multicast, reserved and documentation ranges, and the IPv6
forms that embed such an IPv4 address (mapped, 6to4, NAT64).

The check is made on the *address that is connected to*, never on a name resolved twice: the
:class:`PolicyResolver` resolves a host once, drops the denied addresses and hands aiohttp only the
checked ones, so a name that answers a public address to the check and 127.0.0.1 to the connect
(DNS rebinding) cannot slip through. IP literals never reach a resolver; :meth:`NetPolicy.check_url`
checks them (and the scheme, port and host name) before every hop, redirects included.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Sequence
from typing import Final
from urllib.parse import urlsplit

from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import BaseModel, ConfigDict, Field, field_validator

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _nets(*pairs: tuple[str, str]) -> tuple[tuple[IPNetwork, str], ...]:
    return tuple((ipaddress.ip_network(cidr), why) for cidr, why in pairs)


# Every range that is not public unicast, with the words an error uses for it.
DEFAULT_DENIED: Final = _nets(
    ("0.0.0.0/8", "'this network' (unspecified)"),
    ("10.0.0.0/8", "private (RFC 1918)"),
    ("100.64.0.0/10", "carrier-grade NAT (shared)"),
    ("127.0.0.0/8", "loopback"),
    ("169.254.0.0/16", "link-local (cloud metadata service)"),
    ("172.16.0.0/12", "private (RFC 1918)"),
    ("192.0.0.0/24", "IETF protocol assignments"),
    ("192.0.2.0/24", "documentation (TEST-NET-1)"),
    ("192.88.99.0/24", "6to4 relay anycast"),
    ("192.168.0.0/16", "private (RFC 1918)"),
    ("198.18.0.0/15", "benchmarking"),
    ("198.51.100.0/24", "documentation (TEST-NET-2)"),
    ("203.0.113.0/24", "documentation (TEST-NET-3)"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved (and broadcast)"),
    ("::/128", "unspecified"),
    ("::1/128", "loopback"),
    ("64:ff9b:1::/48", "local-use NAT64"),
    ("100::/64", "discard-only"),
    ("2001::/32", "Teredo"),
    ("2001:db8::/32", "documentation"),
    ("fc00::/7", "unique-local (private)"),
    ("fe80::/10", "link-local"),
    ("fec0::/10", "site-local (deprecated private)"),
    ("ff00::/8", "multicast"),
)

_NAT64: Final = ipaddress.ip_network("64:ff9b::/96")
_SCHEMES: Final = frozenset({"http", "https"})


class NetPolicyError(Exception):
    """A fetch the policy refuses; the message names the URL, the address, why, and how to allow it.

    Deliberately not an ``OSError``: aiohttp would wrap that into a generic DNS error and lose the
    reason.
    """


def _unembed(ip: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (mapped, 6to4, NAT64), else the address itself."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
        if ip in _NAT64:
            return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return ip


def _host_matches(host: str, patterns: Sequence[str]) -> bool:
    """``example.com`` matches itself; ``*.example.com`` matches its subdomains (not itself)."""
    for pattern in patterns:
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]):
                return True
        elif host == pattern:
            return True
    return False


class NetPolicy(BaseModel):
    """Which hosts and addresses the web and browser tools may fetch from.

    Order of the decision: ``deny_hosts`` and ``deny_cidrs`` always refuse; then ``allow_hosts``
    and ``allow_cidrs`` admit; then the built-in denied ranges (every non-public address) refuse;
    every other address is allowed. ``allow_hosts`` trusts a *name* whatever it resolves to (an
    intranet search engine); prefer ``allow_cidrs``, which admits the checked addresses only.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    allow_cidrs: tuple[IPNetwork, ...] = Field(
        (), description="address ranges admitted although non-public, e.g. ['127.0.0.0/8'] for tests"
    )
    deny_cidrs: tuple[IPNetwork, ...] = Field((), description="address ranges always refused")
    allow_hosts: tuple[str, ...] = Field(
        (), description="host names admitted whatever they resolve to ('name' or '*.domain')"
    )
    deny_hosts: tuple[str, ...] = Field((), description="host names always refused ('name' or '*.domain')")
    allowed_ports: tuple[int, ...] | None = Field(None, description="only these ports (None: any port)")

    @field_validator("allow_cidrs", "deny_cidrs", mode="before")
    @classmethod
    def _strict_cidrs(cls, value: object) -> object:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value
        out = []
        for item in items:
            try:
                out.append(ipaddress.ip_network(item, strict=False) if isinstance(item, str) else item)
            except ValueError as exc:
                raise ValueError(
                    f"{item!r} is not an address range; write it as CIDR, e.g. '10.0.0.0/8'"
                ) from exc
        return tuple(out)

    @field_validator("allow_hosts", "deny_hosts", mode="before")
    @classmethod
    def _hosts(cls, value: object) -> object:
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list | tuple):
            return value
        out = []
        for item in items:
            if not isinstance(item, str) or not item.strip(".* ") or "/" in item or ":" in item:
                raise ValueError(f"{item!r} is not a host name; write 'example.com' or '*.example.com'")
            out.append(item.strip().lower().rstrip("."))
        return tuple(out)

    def address_denial(self, ip: IPAddress | str, host: str | None = None) -> str | None:
        """Why connecting to ``ip`` (reached through the name ``host``) is refused, or None."""
        addr = _unembed(ipaddress.ip_address(ip) if isinstance(ip, str) else ip)
        name = (host or "").lower().rstrip(".")
        if name and _host_matches(name, self.deny_hosts):
            return f"host {name!r} is in deny_hosts"
        for net in self.deny_cidrs:
            if addr.version == net.version and addr in net:
                return f"{addr} is in deny_cidrs ({net})"
        if name and _host_matches(name, self.allow_hosts):
            return None
        if any(addr.version == net.version and addr in net for net in self.allow_cidrs):
            return None
        for net, why in DEFAULT_DENIED:
            if addr.version == net.version and addr in net:
                return (
                    f"{addr} is a {why} address ({net}), which the network policy denies; "
                    f"to allow it add {str(net)!r} (or a narrower range) to the policy's allow_cidrs"
                )
        return None

    def check_url(self, url: str) -> tuple[str, int]:
        """Check what can be checked before resolving: scheme, port, host name, an IP literal.

        Returns ``(host, port)``; raises :class:`NetPolicyError` with the reason.
        """
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as exc:
            raise NetPolicyError(f"refused {url!r}: not a valid URL ({exc})") from None
        scheme = parts.scheme.lower()
        if scheme not in _SCHEMES:
            raise NetPolicyError(
                f"refused {url!r}: only http and https URLs may be fetched, not {scheme or 'no scheme'!r}"
            )
        host = (parts.hostname or "").lower().rstrip(".")
        if not host:
            raise NetPolicyError(f"refused {url!r}: the URL has no host")
        port = port or (443 if scheme == "https" else 80)
        if self.allowed_ports is not None and port not in self.allowed_ports:
            raise NetPolicyError(f"refused {url!r}: port {port} is not in the policy's allowed_ports")
        if _host_matches(host, self.deny_hosts):
            raise NetPolicyError(f"refused {url!r}: host {host!r} is in the policy's deny_hosts")
        literal = _ip_literal(host)
        if literal is not None:
            why = self.address_denial(literal)
            if why is not None:
                raise NetPolicyError(f"refused {url!r}: {why}")
        return host, port

    async def resolve_checked(self, host: str, port: int) -> list[IPAddress]:
        """The allowed addresses of ``host`` (resolved once); refuses when none is allowed."""
        literal = _ip_literal(host)
        if literal is not None:
            why = self.address_denial(literal, host)
            if why is not None:
                raise NetPolicyError(f"refused {host}: {why}")
            return [literal]
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except socket.gaierror as exc:
            raise OSError(f"could not resolve host {host!r}: {exc.strerror}") from None
        allowed: list[IPAddress] = []
        denied: list[str] = []
        for _family, _type, _proto, _canon, sockaddr in infos:
            addr = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
            why = self.address_denial(addr, host)
            if why is None:
                if addr not in allowed:
                    allowed.append(addr)
            else:
                denied.append(why)
        if not allowed:
            reason = denied[0] if denied else "it has no addresses"
            raise NetPolicyError(f"refused host {host!r}: it resolves to {reason}")
        return allowed


def _ip_literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None


class PolicyResolver(AbstractResolver):
    """An aiohttp resolver that resolves once and returns only the addresses the policy allows.

    aiohttp connects to exactly the addresses a resolver returns, so the checked address is the
    connected address (no second lookup, no DNS rebinding).
    """

    def __init__(self, policy: NetPolicy) -> None:
        self._policy = policy

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        addrs = await self._policy.resolve_checked(host, port)
        wanted = [a for a in addrs if family == socket.AF_UNSPEC or _family(a) == family] or addrs
        return [
            ResolveResult(
                hostname=host,
                host=str(a),
                port=port,
                family=_family(a),
                proto=0,
                flags=socket.AI_NUMERICHOST,
            )
            for a in wanted
        ]

    async def close(self) -> None:
        return None


def _family(addr: IPAddress) -> socket.AddressFamily:
    return socket.AF_INET if addr.version == 4 else socket.AF_INET6
